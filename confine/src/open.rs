//! The confined opener: beneath a directory handle, one component at a time, never following a
//! symlink, and checked on the opened handle rather than on a path that could change under us.

use std::io;

use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
use cap_std::fs::{Dir, OpenOptions, OpenOptionsExt};
use protocol::WorkspacePath;
use rustix::fs::OFlags;
use rustix::io::Errno;

use crate::{ChatScope, ConfineError};

/// A regular file opened beneath the workspace and checked on its handle.
#[derive(Debug)]
pub struct ConfinedFile {
    /// The open file.
    pub file: std::fs::File,
    /// Its size in bytes at open time.
    pub size: u64,
    /// Its workspace path.
    pub path: WorkspacePath,
}

/// Opens a file `scope` reaches (see [`ChatScope::may_read`]) with [`open_file`]; anything out
/// of reach is [`ConfineError::NotFound`], exactly like a missing file.
pub fn open_reachable(
    root: &Dir,
    scope: &ChatScope,
    path: &WorkspacePath,
    max_size: u64,
) -> Result<ConfinedFile, ConfineError> {
    if !scope.may_read(path) {
        return Err(ConfineError::NotFound(path.clone()));
    }
    open_file(root, path, max_size)
}

/// Opens `path` beneath `root` for reading: no symlink in any component, never blocking on a
/// FIFO or device, and the opened handle must be a regular file with exactly one link and at
/// most `max_size` bytes.
pub fn open_file(
    root: &Dir,
    path: &WorkspacePath,
    max_size: u64,
) -> Result<ConfinedFile, ConfineError> {
    let (dir, name) = open_parent(root, path)?;
    let mut options = OpenOptions::new();
    options.read(true).follow(FollowSymlinks::No).custom_flags(
        // Opening a FIFO for reading would block until a writer appears.
        (OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC).bits() as i32,
    );
    let file = dir
        .open_with(name, &options)
        .map_err(|e| classify(&dir, name, path, e))?
        .into_std();
    let meta = file.metadata().map_err(|e| ConfineError::io(path, e))?;
    check_opened(&Opened::of(&meta), path, max_size)?;
    Ok(ConfinedFile {
        file,
        size: meta.len(),
        path: path.clone(),
    })
}

/// Opens the folder `path` beneath `root`, never following a symlink.
pub fn open_dir(root: &Dir, path: &WorkspacePath) -> Result<Dir, ConfineError> {
    let (parent, name) = open_parent(root, path)?;
    open_subdir(&parent, name).map_err(|e| classify(&parent, name, path, e))
}

/// Opens every folder of `path` but the last component, never following a symlink. Returns
/// the folder holding the last component, and that component.
pub fn open_parent<'p>(
    root: &Dir,
    path: &'p WorkspacePath,
) -> Result<(Dir, &'p str), ConfineError> {
    walk_parent(root, path, false)
}

/// Like [`open_parent`], creating missing folders on the way (never through a symlink).
pub fn create_parent<'p>(
    root: &Dir,
    path: &'p WorkspacePath,
) -> Result<(Dir, &'p str), ConfineError> {
    walk_parent(root, path, true)
}

/// Opens the folder `name` (one component) beneath `dir` without following a symlink. The
/// handle is readable, so it can list entries and be fsynced.
///
/// `follow(No)` matters where `openat2` is unavailable (old kernels, some seccomp profiles):
/// cap-std then resolves names itself and would follow a final symlink despite `O_NOFOLLOW`.
pub fn open_subdir(dir: &Dir, name: &str) -> io::Result<Dir> {
    let mut options = OpenOptions::new();
    options
        .read(true)
        .follow(FollowSymlinks::No)
        .custom_flags((OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC).bits() as i32);
    Ok(Dir::from_std_file(
        dir.open_with(name, &options)?.into_std(),
    ))
}

fn walk_parent<'p>(
    root: &Dir,
    path: &'p WorkspacePath,
    create: bool,
) -> Result<(Dir, &'p str), ConfineError> {
    let mut components: Vec<&str> = path.components().collect();
    // A `WorkspacePath` has at least one component.
    let name = components.pop().unwrap_or_default();
    let mut dir = root.try_clone().map_err(|e| ConfineError::io(path, e))?;
    for component in components {
        dir = match open_subdir(&dir, component) {
            Ok(next) => next,
            Err(e) if e.kind() == io::ErrorKind::NotFound && create => {
                match dir.create_dir(component) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(ConfineError::io(path, e)),
                }
                open_subdir(&dir, component).map_err(|e| classify(&dir, component, path, e))?
            }
            Err(e) => return Err(classify(&dir, component, path, e)),
        };
    }
    Ok((dir, name))
}

/// What [`check_opened`] looks at on an opened handle.
#[derive(Debug, Clone, Copy)]
struct Opened {
    is_file: bool,
    links: u64,
    size: u64,
}

impl Opened {
    fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            is_file: meta.file_type().is_file(),
            links: meta.nlink(),
            size: meta.len(),
        }
    }
}

/// A regular file with exactly one link, within the limit. No link at all means the file was
/// removed after it was opened: it is gone, so it is reported missing.
fn check_opened(opened: &Opened, path: &WorkspacePath, limit: u64) -> Result<(), ConfineError> {
    if !opened.is_file {
        return Err(ConfineError::NotRegular(path.clone()));
    }
    match opened.links {
        0 => return Err(ConfineError::NotFound(path.clone())),
        1 => {}
        _ => return Err(ConfineError::HardLinked(path.clone())),
    }
    if opened.size > limit {
        return Err(ConfineError::TooLarge {
            path: path.clone(),
            size: opened.size,
            limit,
        });
    }
    Ok(())
}

/// Turns an open failure of `name` in `dir` into a clear reason by looking at the entry without
/// following it; the error number decides when the entry changed in between.
fn classify(dir: &Dir, name: &str, path: &WorkspacePath, e: io::Error) -> ConfineError {
    let errno = e.raw_os_error().map(Errno::from_raw_os_error);
    match dir.symlink_metadata(name) {
        Ok(meta) if meta.file_type().is_symlink() => ConfineError::Symlink(path.clone()),
        // A file where a folder was expected: nothing can be beneath it.
        Ok(meta) if meta.is_file() && errno == Some(Errno::NOTDIR) => {
            ConfineError::NotFound(path.clone())
        }
        Ok(meta) if !meta.is_file() && !meta.is_dir() => ConfineError::NotRegular(path.clone()),
        _ => match errno {
            Some(Errno::LOOP | Errno::MLINK) => ConfineError::Symlink(path.clone()),
            Some(Errno::NOENT | Errno::NOTDIR | Errno::XDEV | Errno::NAMETOOLONG) => {
                ConfineError::NotFound(path.clone())
            }
            _ if e.kind() == io::ErrorKind::NotFound => ConfineError::NotFound(path.clone()),
            _ => ConfineError::io(path, e),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;
    use std::path::{Path, PathBuf};
    use std::time::Duration;

    use protocol::{ChatId, room_dir};

    use super::*;

    const USER: &str = "@alice:example.org";
    const ROOM: &str = "!room:example.org";
    const LIMIT: u64 = 1000;

    struct Fixture {
        _tmp: tempfile::TempDir,
        /// The workspace root; its parent stands for "outside the workspace".
        root: PathBuf,
        dir: Dir,
        scope: ChatScope,
    }

    fn fixture() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("ws");
        std::fs::create_dir(&root).unwrap();
        std::fs::write(tmp.path().join("secret.txt"), b"outside").unwrap();
        let dir = Dir::open_ambient_dir(&root, cap_std::ambient_authority()).unwrap();
        let scope = ChatScope::new(ChatId::for_conversation(ROOM, None), ROOM);
        Fixture {
            _tmp: tmp,
            root,
            dir,
            scope,
        }
    }

    impl Fixture {
        fn outside(&self) -> &Path {
            self.root.parent().unwrap()
        }
        fn write(&self, rel: &str, content: &[u8]) -> WorkspacePath {
            let p = self.root.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, content).unwrap();
            WorkspacePath::new(rel).unwrap()
        }
        /// `chats/<chat>/<rest>`, with the chat folder created.
        fn chat(&self, rest: &str) -> String {
            let own = self.scope.own_dir();
            std::fs::create_dir_all(self.root.join(own.as_str())).unwrap();
            format!("{own}/{rest}")
        }
        fn open(&self, rel: &str) -> Result<ConfinedFile, ConfineError> {
            open_reachable(
                &self.dir,
                &self.scope,
                &WorkspacePath::new(rel).unwrap(),
                LIMIT,
            )
        }
    }

    #[test]
    fn opens_reachable_files() {
        let f = fixture();
        let outbox = room_dir("@bob:example.org", ROOM).join("outbox/out.txt");
        for rel in [
            f.chat("notes.txt"),
            f.chat("deep/er/notes.txt"),
            format!("{}/inbox/a.txt", room_dir(USER, ROOM)),
            outbox.unwrap().to_string(),
        ] {
            f.write(&rel, b"content");
            let opened = f.open(&rel).unwrap_or_else(|e| panic!("{rel}: {e}"));
            assert_eq!((opened.size, opened.path.as_str()), (7, rel.as_str()));
            let mut s = String::new();
            io::Read::read_to_string(&mut &opened.file, &mut s).unwrap();
            assert_eq!(s, "content");
        }
    }

    #[test]
    fn out_of_reach_looks_missing() {
        let f = fixture();
        let other = ChatId::for_conversation("!other:example.org", None);
        let cases = [
            format!("chats/{other}/secret.txt"),
            format!("{}/inbox/secret.txt", room_dir(USER, "!other:example.org")),
            format!("{}/secret.txt", room_dir(USER, ROOM)),
            format!("{}/inbox/.partial-abcdef", room_dir(USER, ROOM)),
            "secret.txt".to_owned(),
            f.chat("missing.txt"),
        ];
        for rel in &cases {
            if !rel.ends_with("missing.txt") {
                f.write(rel, b"secret");
            }
            let err = f.open(rel).unwrap_err();
            assert!(err.is_not_found(), "{rel} must look missing: {err}");
            assert_eq!(err.to_string(), format!("not found: {rel}"));
        }
        // Not reachable as a file either: the chat folder itself.
        assert!(
            f.open(f.scope.own_dir().as_str())
                .unwrap_err()
                .is_not_found()
        );
        // A file where a folder is expected: nothing beneath it exists.
        f.write(&f.chat("file"), b"x");
        assert!(f.open(&f.chat("file/below")).unwrap_err().is_not_found());
    }

    #[test]
    fn symlink_in_last_component_is_refused() {
        let f = fixture();
        let inside = f.write(&f.chat("real.txt"), b"inside");
        let other = f.write("chats/other/s.txt", b"s");
        let links = [
            ("out.txt", f.outside().join("secret.txt")),
            ("in.txt", inside.to_path_under(&f.root)),
            ("rel.txt", PathBuf::from("real.txt")),
            (
                "sibling.txt",
                PathBuf::from(format!(
                    "../{}",
                    other.as_str().trim_start_matches("chats/")
                )),
            ),
        ];
        for (name, target) in links {
            symlink(&target, f.root.join(f.chat(name))).unwrap();
            let err = f.open(&f.chat(name)).unwrap_err();
            assert!(matches!(err, ConfineError::Symlink(_)), "{name}: {err}");
            assert!(err.to_string().contains("symbolic link"), "{err}");
        }
    }

    #[test]
    fn symlink_in_a_middle_folder_is_refused() {
        let f = fixture();
        f.write("chats/other/secret.txt", b"secret");
        symlink(f.root.join("chats/other"), f.root.join(f.chat("peek"))).unwrap();
        symlink(f.outside(), f.root.join(f.chat("up"))).unwrap();
        for rel in [f.chat("peek/secret.txt"), f.chat("up/secret.txt")] {
            let err = f.open(&rel).unwrap_err();
            assert!(matches!(err, ConfineError::Symlink(_)), "{rel}: {err}");
            let path = WorkspacePath::new(rel.rsplit_once('/').unwrap().0).unwrap();
            let err = open_dir(&f.dir, &path).unwrap_err();
            assert!(matches!(err, ConfineError::Symlink(_)), "{path}: {err}");
        }
        // The chat folder itself replaced by a link.
        let linked = ChatScope::new(ChatId::new("linked").unwrap(), ROOM);
        symlink(f.root.join("chats/other"), f.root.join("chats/linked")).unwrap();
        let path = WorkspacePath::new("chats/linked/secret.txt").unwrap();
        let err = open_reachable(&f.dir, &linked, &path, LIMIT).unwrap_err();
        assert!(matches!(err, ConfineError::Symlink(_)), "{err}");
        // Creating folders does not go through a link either.
        let path = WorkspacePath::new(f.chat("up/new/x.txt")).unwrap();
        let err = create_parent(&f.dir, &path).unwrap_err();
        assert!(matches!(err, ConfineError::Symlink(_)), "{err}");
        assert!(!f.outside().join("new").exists());
    }

    #[test]
    fn hard_links_are_refused() {
        let f = fixture();
        let other = f.write("chats/other/secret.txt", b"s");
        std::fs::hard_link(other.to_path_under(&f.root), f.root.join(f.chat("hl.txt"))).unwrap();
        let err = f.open(&f.chat("hl.txt")).unwrap_err();
        assert!(matches!(err, ConfineError::HardLinked(_)), "{err}");
        assert!(err.to_string().contains("hard link"), "{err}");
        // The original has two links now as well.
        let err = open_file(&f.dir, &other, LIMIT).unwrap_err();
        assert!(matches!(err, ConfineError::HardLinked(_)), "{err}");
    }

    #[test]
    fn directories_are_not_files() {
        let f = fixture();
        std::fs::create_dir_all(f.root.join(f.chat("dir"))).unwrap();
        let err = f.open(&f.chat("dir")).unwrap_err();
        assert!(matches!(err, ConfineError::NotRegular(_)), "{err}");
    }

    #[test]
    fn the_size_limit_is_inclusive() {
        let f = fixture();
        f.write(&f.chat("edge.bin"), &[0; LIMIT as usize]);
        assert_eq!(f.open(&f.chat("edge.bin")).unwrap().size, LIMIT);
        f.write(&f.chat("big.bin"), &[0; LIMIT as usize + 1]);
        let err = f.open(&f.chat("big.bin")).unwrap_err();
        assert!(
            matches!(
                err,
                ConfineError::TooLarge {
                    size: 1001,
                    limit: 1000,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn fifo_is_refused_without_hanging() {
        let f = fixture();
        let rel = f.chat("pipe");
        let dir = open_dir(&f.dir, f.scope.own_dir()).unwrap();
        rustix::fs::mknodat(
            &dir,
            "pipe",
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        // Run the open elsewhere, so a regression fails the test instead of hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        let scope = f.scope.clone();
        let root = f.dir.try_clone().unwrap();
        std::thread::spawn(move || {
            let path = WorkspacePath::new(rel).unwrap();
            let _ = tx.send(open_reachable(&root, &scope, &path, LIMIT).map(|_| ()));
        });
        let result = rx
            .recv_timeout(Duration::from_secs(20))
            .expect("opening a FIFO must not block");
        let err = result.unwrap_err();
        assert!(matches!(err, ConfineError::NotRegular(_)), "{err}");
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }

    #[test]
    fn parent_paths_never_become_workspace_paths() {
        let f = fixture();
        for input in [
            "/etc/passwd".to_owned(),
            "..".to_owned(),
            format!("{}/../../secret.txt", f.scope.own_dir()),
            format!("{}/./x", f.scope.own_dir()),
        ] {
            assert!(WorkspacePath::new(input.as_str()).is_err(), "{input}");
        }
    }

    #[test]
    fn create_parent_makes_missing_folders() {
        let f = fixture();
        let path = WorkspacePath::new(f.chat("a/b/c.txt")).unwrap();
        let (dir, name) = create_parent(&f.dir, &path).unwrap();
        assert_eq!(name, "c.txt");
        dir.write(name, b"x").unwrap();
        assert_eq!(open_file(&f.dir, &path, LIMIT).unwrap().size, 1);
        // Opening (without creating) a missing folder says so.
        let missing = WorkspacePath::new(f.chat("nope/c.txt")).unwrap();
        assert!(open_parent(&f.dir, &missing).unwrap_err().is_not_found());
        assert!(!f.root.join(f.chat("nope")).exists());
    }

    #[test]
    fn opened_handle_checks() {
        let path = WorkspacePath::new("a").unwrap();
        let check = |is_file, links, size| {
            check_opened(
                &Opened {
                    is_file,
                    links,
                    size,
                },
                &path,
                10,
            )
        };
        assert!(check(true, 1, 10).is_ok());
        assert!(matches!(
            check(false, 1, 0),
            Err(ConfineError::NotRegular(_))
        ));
        assert!(matches!(
            check(true, 2, 0),
            Err(ConfineError::HardLinked(_))
        ));
        // Removed after it was opened.
        assert!(matches!(check(true, 0, 0), Err(ConfineError::NotFound(_))));
        assert!(matches!(
            check(true, 1, 11),
            Err(ConfineError::TooLarge { size: 11, .. })
        ));
    }

    /// Swaps what a reachable path is, as fast as it can, while another thread keeps opening it:
    /// the file itself flips between a regular file and a symlink to a file outside the
    /// workspace; a folder on the way flips (atomically, `RENAME_EXCHANGE`) between a real
    /// folder and a symlink to a folder outside. Whatever the interleaving, the opener never
    /// hands out the outside file.
    ///
    /// Not covered, on purpose: a *hard link* to an outside file swapped in and out. The
    /// one-link check runs on the opened handle, after the open, so a link removed in between
    /// passes it (measured: 47 of 6,139 opens in such a race). Planting that link takes write
    /// access to the workspace and access to the outside file on the same filesystem, which
    /// neither the agent's tools nor a room member have.
    #[test]
    fn swapping_links_in_a_race_never_reaches_outside() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};

        use rustix::fs::{CWD, RenameFlags, renameat_with};

        const CANARY: &[u8] = b"CANARY-outside-the-workspace";
        let f = fixture();
        let outside = f.outside().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        let canary = outside.join("f.txt");
        std::fs::write(&canary, CANARY).unwrap();

        let file_rel = f.chat("race.txt");
        let file = f.root.join(&file_rel);
        let sub_rel = f.chat("sub/f.txt");
        let sub = f.root.join(f.chat("sub"));
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(sub.join("f.txt"), b"inside").unwrap();
        let sub_link = f.root.join(f.chat("sub-link"));
        std::os::unix::fs::symlink(&outside, &sub_link).unwrap();
        std::fs::write(&file, b"inside").unwrap();

        let stop = Arc::new(AtomicBool::new(false));
        let swapper = {
            let (stop, file, sub, sub_link, canary) = (
                stop.clone(),
                file.clone(),
                sub.clone(),
                sub_link.clone(),
                canary.clone(),
            );
            std::thread::spawn(move || {
                let dir = file.parent().unwrap().to_owned();
                let mut swaps = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let tmp = dir.join(".swap");
                    let _ = std::fs::remove_file(&tmp);
                    if swaps.is_multiple_of(2) {
                        std::fs::write(&tmp, b"inside").unwrap();
                    } else {
                        std::os::unix::fs::symlink(&canary, &tmp).unwrap();
                    }
                    std::fs::rename(&tmp, &file).unwrap();
                    renameat_with(CWD, &sub, CWD, &sub_link, RenameFlags::EXCHANGE).unwrap();
                    swaps += 1;
                }
                swaps
            })
        };

        let (mut opened, mut refused, mut canary_reads) = (0u64, 0u64, 0u64);
        let attempts = 20_000;
        for i in 0..attempts {
            let rel = if i % 2 == 0 { &file_rel } else { &sub_rel };
            match f.open(rel) {
                Ok(mut c) => {
                    opened += 1;
                    let mut content = Vec::new();
                    std::io::Read::read_to_end(&mut c.file, &mut content).unwrap();
                    if content == CANARY {
                        canary_reads += 1;
                    }
                }
                Err(_) => refused += 1,
            }
        }
        stop.store(true, Ordering::Relaxed);
        let swaps = swapper.join().unwrap();
        println!(
            "race: attempts={attempts} swaps={swaps} opened={opened} refused={refused} canary_reads={canary_reads}"
        );
        assert_eq!(canary_reads, 0, "the outside file was read");
        assert!(
            opened > 0 && refused > 0,
            "both states were seen: {opened} opened, {refused} refused"
        );
    }
}
