//! Sizes meant to break a download: a declared size that lies in either direction, and a disk
//! that fills up half way (a small tmpfs mounted over the inbox). Each is refused in the room,
//! and nothing, partial or whole, stays in the inbox.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::Result;
use e2e::{E2eeUser, Stack};
use matrix_sdk::ruma::events::room::message::{
    FileInfo, FileMessageEventContent, MessageType, RoomMessageEventContent,
};
use matrix_sdk::ruma::{RoomId, UInt};

use super::{MAX_FILE, Room, Tally, partial_files};
use crate::TURN;

/// Sends `bytes` as an encrypted `m.file` whose `info.size` says `declared`.
async fn send_declaring(
    user: &E2eeUser,
    room: &str,
    name: &str,
    bytes: Vec<u8>,
    declared: u64,
) -> Result<String> {
    let client = user.client();
    let mut reader = std::io::Cursor::new(bytes);
    let file = client.upload_encrypted_file(&mut reader).await?;
    let mut info = FileInfo::new();
    info.size = UInt::new(declared);
    info.mimetype = Some("application/octet-stream".into());
    let content = FileMessageEventContent::encrypted(name.to_owned(), file).info(Box::new(info));
    let room = client
        .get_room(&RoomId::parse(room)?)
        .ok_or_else(|| anyhow::anyhow!("unknown room"))?;
    let sent = room
        .send(RoomMessageEventContent::new(MessageType::File(content)))
        .await?;
    Ok(sent.response.event_id.to_string())
}

/// A tmpfs of `size` mounted at `at` until dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Self {
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "mounting a tmpfs at {} (the test runs as root)",
            at.display()
        );
        Self(at.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Waits for a bot message about `name` (answering `id`, or naming the file) with one of
/// `markers`; returns its text.
async fn told(
    attacker: &Room,
    bot: &str,
    id: &str,
    name: &str,
    markers: &[&str],
) -> Option<String> {
    let start = Instant::now();
    while start.elapsed() < TURN {
        let all = attacker.user.messages_from(&attacker.id, bot).await.ok()?;
        let found = all.iter().find(|m| {
            let body = m.body.to_lowercase();
            (m.answers() == Some(id)
                || m.thread_root.as_deref() == Some(id)
                || m.body.contains(name))
                && markers.iter().any(|k| body.contains(k))
        });
        if let Some(m) = found {
            return Some(m.body.clone());
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    None
}

pub async fn lies_and_a_full_disk(stack: &Stack, attacker: &Room, tally: &mut Tally) {
    let bot = &stack.bot.user_id;
    let inbox_rel = format!("{}/inbox/", attacker.room_dir());
    let inbox = stack.workspace.join(&inbox_rel);
    let refusal = [
        "could not",
        "couldn't",
        "failed",
        "too large",
        "larger",
        "limit",
    ];
    let big = usize::try_from(MAX_FILE).unwrap() + 64 * 1024;
    let cases = [
        ("liar.bin", vec![7u8; big], 10u64),
        ("huge-claim.bin", vec![1u8; 100], 5 << 30),
    ];
    for (name, bytes, declared) in cases {
        let id = send_declaring(&attacker.user, &attacker.id, name, bytes, declared)
            .await
            .expect("send");
        let answer = told(attacker, bot, &id, name, &refusal).await;
        let stored = stack
            .files_under(&inbox_rel)
            .iter()
            .any(|f| f.ends_with(name));
        tally.record(
            format!("{name} declared {declared} bytes: told {answer:?}, stored {stored}"),
            answer.is_some() && !stored,
        );
    }

    // The disk fills up during the download.
    let tmpfs = Tmpfs::mount(&inbox, "256k");
    let id = attacker
        .user
        .send_file(
            &attacker.id,
            "fill.bin",
            "application/octet-stream",
            vec![9u8; 600 * 1024],
            None,
        )
        .await
        .expect("send");
    let answer = told(attacker, bot, &id, "fill.bin", &["disk", "space", "full"]).await;
    let partials = partial_files(&inbox);
    let stored = std::fs::read_dir(&inbox).map(|d| d.count()).unwrap_or(0);
    drop(tmpfs);
    tally.record(
        format!("disk full: told {answer:?}, partial files {partials:?}, files {stored}"),
        answer.is_some() && partials.is_empty() && stored == 0,
    );
}
