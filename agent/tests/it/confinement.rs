//! Confinement against a real temporary directory: every way out is refused with a clear error.

use std::os::unix::fs::symlink;
use std::process::Command;
use std::time::Duration;

use agent::confine::{ChatScope, ConfineError, ScopedWorkspace, Workspace, parse_path};
use protocol::{ChatId, WorkspacePath, chat_dir};

use crate::support::{ROOM, inbox, write};

struct Fixture {
    _root: tempfile::TempDir,
    _outside: tempfile::TempDir,
    root: std::path::PathBuf,
    outside: std::path::PathBuf,
    ws: ScopedWorkspace,
    own: String,
}

fn fixture() -> Fixture {
    let root_dir = tempfile::tempdir().unwrap();
    let outside_dir = tempfile::tempdir().unwrap();
    let root = root_dir.path().to_owned();
    let outside = outside_dir.path().to_owned();
    std::fs::write(outside.join("secret.txt"), b"top secret").unwrap();
    let chat = ChatId::for_conversation(ROOM, None);
    let own = chat_dir(&chat).to_string();
    write(&root, &format!("{own}/ok.txt"), b"fine");
    let ws = ScopedWorkspace {
        workspace: Workspace::open(&root, 1024 * 1024).unwrap(),
        scope: ChatScope::new(chat, Some(ROOM)),
    };
    Fixture {
        _root: root_dir,
        _outside: outside_dir,
        root,
        outside,
        ws,
        own,
    }
}

fn p(s: &str) -> WorkspacePath {
    WorkspacePath::new(s).unwrap()
}

#[test]
fn a_plain_file_in_scope_opens() {
    let f = fixture();
    let (bytes, _) =
        f.ws.read_prefix(&p(&format!("{}/ok.txt", f.own)), 100)
            .unwrap();
    assert_eq!(bytes, b"fine");
}

#[test]
fn symlink_in_last_component_is_refused() {
    let f = fixture();
    symlink(
        f.outside.join("secret.txt"),
        f.root.join(&f.own).join("link.txt"),
    )
    .unwrap();
    // Also a symlink to a file inside the workspace: never followed either.
    symlink("ok.txt", f.root.join(&f.own).join("inner-link.txt")).unwrap();
    for name in ["link.txt", "inner-link.txt"] {
        let err =
            f.ws.open_file(&p(&format!("{}/{name}", f.own)))
                .unwrap_err();
        assert!(matches!(err, ConfineError::Symlink(_)), "{name}: {err}");
        assert!(err.to_string().contains("symbolic link"));
    }
}

#[test]
fn symlink_in_a_middle_folder_is_refused() {
    let f = fixture();
    symlink(&f.outside, f.root.join(&f.own).join("escape")).unwrap();
    let err =
        f.ws.open_file(&p(&format!("{}/escape/secret.txt", f.own)))
            .unwrap_err();
    assert!(matches!(err, ConfineError::Symlink(_)), "{err}");
    // A middle symlink to another chat's folder inside the workspace is refused too.
    write(&f.root, "chats/other/theirs.txt", b"theirs");
    symlink(f.root.join("chats/other"), f.root.join(&f.own).join("peek")).unwrap();
    let err =
        f.ws.open_file(&p(&format!("{}/peek/theirs.txt", f.own)))
            .unwrap_err();
    assert!(matches!(err, ConfineError::Symlink(_)), "{err}");
    // And writing through a symlinked folder does not land outside.
    let err =
        f.ws.write_file(&p(&format!("{}/escape/new.txt", f.own)), b"x")
            .unwrap_err();
    assert!(matches!(err, ConfineError::Symlink(_)), "{err}");
    assert!(!f.outside.join("new.txt").exists());
}

#[test]
fn hard_link_is_refused() {
    let f = fixture();
    let target = f.root.join(&f.own).join("hard.txt");
    // A hard link to a file elsewhere in the workspace (another chat's file).
    write(&f.root, "chats/other/theirs.txt", b"theirs");
    std::fs::hard_link(f.root.join("chats/other/theirs.txt"), &target).unwrap();
    let err =
        f.ws.open_file(&p(&format!("{}/hard.txt", f.own)))
            .unwrap_err();
    assert!(matches!(err, ConfineError::HardLinked(_)), "{err}");
    assert!(err.to_string().contains("hard link"));
}

#[tokio::test]
async fn fifo_is_refused_without_hanging() {
    let f = fixture();
    let fifo = f.root.join(&f.own).join("pipe");
    let status = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(status.success());
    let ws = f.ws.clone();
    let path = p(&format!("{}/pipe", f.own));
    let result = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::task::spawn_blocking(move || ws.open_file(&path).map(|_| ())),
    )
    .await
    .expect("opening a FIFO must not block")
    .unwrap();
    let err = result.unwrap_err();
    assert!(matches!(err, ConfineError::NotRegular(_)), "{err}");
    assert!(err.to_string().contains("not a regular file"));
}

#[test]
fn directories_are_not_files() {
    let f = fixture();
    std::fs::create_dir_all(f.root.join(&f.own).join("sub")).unwrap();
    let err = f.ws.open_file(&p(&format!("{}/sub", f.own))).unwrap_err();
    assert!(matches!(err, ConfineError::NotRegular(_)), "{err}");
}

#[test]
fn absolute_and_parent_paths_are_invalid() {
    for (input, needle) in [
        ("/etc/passwd", "absolute"),
        ("chats/../../etc/passwd", "`..`"),
        ("..", "`..`"),
        ("chats/x/../../y", "`..`"),
    ] {
        let err = parse_path(input).unwrap_err();
        assert!(
            matches!(err, ConfineError::InvalidPath { .. }),
            "{input}: {err}"
        );
        assert!(err.to_string().contains(needle), "{input}: {err}");
    }
}

#[test]
fn other_chats_and_rooms_look_missing() {
    let f = fixture();
    write(&f.root, "chats/other-chat/theirs.txt", b"theirs");
    let other_inbox = format!(
        "{}/20260101T120000Z-abcd1234-x.txt",
        inbox("!other:test.local")
    );
    write(&f.root, &other_inbox, b"x");
    let own_inbox = format!("{}/20260101T120000Z-abcd1234-mine.txt", inbox(ROOM));
    write(&f.root, &own_inbox, b"mine");

    let missing =
        f.ws.open_file(&p(&format!("{}/nothing.txt", f.own)))
            .unwrap_err();
    let other_chat =
        f.ws.open_file(&p("chats/other-chat/theirs.txt"))
            .unwrap_err();
    let other_room = f.ws.open_file(&p(&other_inbox)).unwrap_err();
    let outside_layout = f.ws.open_file(&p("etc/passwd")).unwrap_err();
    for err in [&missing, &other_chat, &other_room, &outside_layout] {
        assert!(matches!(err, ConfineError::NotFound(_)), "{err}");
        assert!(err.to_string().starts_with("not found: "), "{err}");
    }
    // Its own room's inbox is fine.
    assert_eq!(f.ws.open_file(&p(&own_inbox)).unwrap().size, 4);
    // And listing shows only what the chat may see.
    let listed: Vec<String> =
        f.ws.list_files()
            .into_iter()
            .map(|e| e.path.to_string())
            .collect();
    assert_eq!(listed, [format!("{}/ok.txt", f.own), own_inbox]);
}

#[test]
fn writes_stay_in_the_chat_folder() {
    let f = fixture();
    let err =
        f.ws.write_file(&p("chats/other-chat/x.txt"), b"x")
            .unwrap_err();
    assert!(matches!(err, ConfineError::NotWritable { .. }), "{err}");
    let err =
        f.ws.write_file(&p(&inbox(ROOM)).join("x.txt").unwrap(), b"x")
            .unwrap_err();
    assert!(matches!(err, ConfineError::NotWritable { .. }), "{err}");
    // Replacing a symlink in the chat folder replaces the link, not its target.
    symlink(
        f.outside.join("secret.txt"),
        f.root.join(&f.own).join("swap.txt"),
    )
    .unwrap();
    f.ws.write_file(&p(&format!("{}/swap.txt", f.own)), b"new")
        .unwrap();
    assert_eq!(
        std::fs::read(f.outside.join("secret.txt")).unwrap(),
        b"top secret"
    );
    assert_eq!(
        std::fs::read(f.root.join(&f.own).join("swap.txt")).unwrap(),
        b"new"
    );
}
