//! The confined opener: beneath a directory handle, one component at a time, never following a
//! symlink, and checked on the opened handle rather than on a path that could change under us.

use std::io;
use std::time::{Duration, SystemTime};

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
    open_reachable_as(root, scope, path, max_size, None)
}

/// [`open_reachable`] with the inode number the file's writer gave (see [`open_file_as`]).
pub fn open_reachable_as(
    root: &Dir,
    scope: &ChatScope,
    path: &WorkspacePath,
    max_size: u64,
    inode: Option<u64>,
) -> Result<ConfinedFile, ConfineError> {
    if !scope.may_read(path) {
        return Err(ConfineError::NotFound(path.clone()));
    }
    open_file_as(root, path, max_size, inode)
}

/// How long a file's links and metadata must have been still before an open may hand it out.
///
/// A hard link to an outside file can be put at a workspace name, opened through, and removed
/// again before the one-link check looks at the handle: the count is back to one by then. Every
/// link or unlink sets the file's change time (`ctime`), which nobody but the clock can set, so
/// a handle whose `ctime` is not well before the open began may have been swapped under it; the
/// open is tried again once that moment has passed.
///
/// The kernel stamps with a clock that lags the fine one by up to a tick (at most 10 ms), so
/// 50 ms covers it on filesystems with fine timestamps. A stamp with no fraction of a second
/// may come from a filesystem that keeps whole seconds (or two, FAT): it must be older.
pub const SETTLE: Duration = Duration::from_millis(50);
/// [`SETTLE`] for a change time with no fraction of a second.
pub const SETTLE_COARSE: Duration = Duration::from_millis(2100);

/// How many times [`open_file`] tries a file that keeps changing before refusing it.
const SETTLE_TRIES: u32 = 4;

/// Opens `path` beneath `root` for reading: no symlink in any component, never blocking on a
/// FIFO or device, and the opened handle must be a regular file with exactly one link, at
/// most `max_size` bytes, whose links have not changed since well before the open (see
/// [`SETTLE`]). A file changed within that time is tried again after it; one that keeps
/// changing is refused.
pub fn open_file(
    root: &Dir,
    path: &WorkspacePath,
    max_size: u64,
) -> Result<ConfinedFile, ConfineError> {
    open_file_as(root, path, max_size, None)
}

/// [`open_file`] for a file whose inode number the caller was told by the one who wrote it (the
/// surface, for a download it has just put in an inbox): when the opened handle is that very
/// file, it is handed out without waiting for it to be still. The wait exists to catch a hard
/// link to another file put at the name and taken away around the open; a handle on the
/// expected inode is the file that was written, whatever links came and went. Any other handle
/// goes through [`open_file`]'s checks unchanged.
pub fn open_file_as(
    root: &Dir,
    path: &WorkspacePath,
    max_size: u64,
    inode: Option<u64>,
) -> Result<ConfinedFile, ConfineError> {
    let (dir, name) = open_parent(root, path)?;
    let mut options = OpenOptions::new();
    options.read(true).follow(FollowSymlinks::No).custom_flags(
        // Opening a FIFO for reading would block until a writer appears.
        (OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC).bits() as i32,
    );
    for _ in 0..SETTLE_TRIES {
        let began = SystemTime::now();
        let file = dir
            .open_with(name, &options)
            .map_err(|e| classify(&dir, name, path, e))?
            .into_std();
        let meta = file.metadata().map_err(|e| ConfineError::io(path, e))?;
        let opened = Opened::of(&meta);
        check_opened(&opened, path, max_size)?;
        let ino = std::os::unix::fs::MetadataExt::ino(&meta);
        match may_hand_out(inode, ino, opened.changed, began) {
            Ok(()) => {
                return Ok(ConfinedFile {
                    file,
                    size: meta.len(),
                    path: path.clone(),
                });
            }
            Err(wait) => std::thread::sleep(wait),
        }
    }
    Err(ConfineError::Changing(path.clone()))
}

/// Whether an opened handle (inode `ino`, changed at `changed`) may be handed out by an open
/// that began at `began`, its writer having named inode `expected`: at once when it is that
/// very inode, else as [`settled`] says.
fn may_hand_out(
    expected: Option<u64>,
    ino: u64,
    changed: SystemTime,
    began: SystemTime,
) -> Result<(), Duration> {
    if expected == Some(ino) {
        return Ok(());
    }
    settled(changed, began)
}

/// `Ok` when a file last changed at `changed` had been still for [`SETTLE`] (or
/// [`SETTLE_COARSE`]) when an open began at `began`; otherwise how long to wait until it would
/// have been.
fn settled(changed: SystemTime, began: SystemTime) -> Result<(), Duration> {
    let whole_seconds = changed
        .duration_since(SystemTime::UNIX_EPOCH)
        .is_ok_and(|d| d.subsec_nanos() == 0);
    let needed = if whole_seconds { SETTLE_COARSE } else { SETTLE };
    match began.duration_since(changed) {
        Ok(still) if still >= needed => Ok(()),
        Ok(still) => Err(needed - still),
        // Changed "after" the open began: the clock is ahead of it, or it moved back.
        Err(_) => Err(needed),
    }
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
    /// The change time (`ctime`): set by the kernel on every link, unlink, write or chmod.
    changed: SystemTime,
}

impl Opened {
    fn of(meta: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            is_file: meta.file_type().is_file(),
            links: meta.nlink(),
            size: meta.len(),
            changed: change_time(meta.ctime(), meta.ctime_nsec()),
        }
    }
}

/// `ctime` as a `SystemTime`; a time before 1970 counts as 1970 (long settled).
fn change_time(secs: i64, nanos: i64) -> SystemTime {
    u64::try_from(secs)
        .ok()
        .map(|s| Duration::new(s, u32::try_from(nanos).unwrap_or(0).min(999_999_999)))
        .and_then(|d| SystemTime::UNIX_EPOCH.checked_add(d))
        .unwrap_or(SystemTime::UNIX_EPOCH)
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
                    changed: SystemTime::UNIX_EPOCH,
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

    #[test]
    fn a_file_must_have_been_still_before_the_open() {
        let at = |secs: u64, millis: u64| {
            SystemTime::UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(millis)
        };
        let ms = Duration::from_millis;
        // (changed, began, expected)
        let cases = [
            (at(100, 1), at(100, 51), Ok(())),
            (at(100, 1), at(200, 0), Ok(())),
            (at(100, 1), at(100, 31), Err(ms(20))),
            (at(100, 1), at(100, 1), Err(SETTLE)),
            // Changed after the open began (a link removed in between, or clocks apart).
            (at(100, 9), at(100, 1), Err(SETTLE)),
            // Whole seconds: the filesystem may round, so it must be older.
            (at(100, 0), at(100, 51), Err(ms(2049))),
            (at(100, 0), at(102, 100), Ok(())),
            (at(100, 0), at(99, 0), Err(SETTLE_COARSE)),
        ];
        for (changed, began, expected) in cases {
            assert_eq!(settled(changed, began), expected, "{changed:?} {began:?}");
        }
        assert_eq!(change_time(-5, 0), SystemTime::UNIX_EPOCH);
        assert_eq!(change_time(100, 1_000_000), at(100, 1));
    }

    #[test]
    fn only_the_inode_its_writer_named_skips_the_wait() {
        let t = |millis: u64| SystemTime::UNIX_EPOCH + Duration::from_millis(100_000 + millis);
        // (named inode, opened inode, changed, began, expected)
        let cases = [
            (Some(7), 7, t(1), t(1), Ok(())),
            (Some(7), 7, t(9), t(1), Ok(())),
            (Some(7), 8, t(1), t(1), Err(SETTLE)),
            (Some(7), 8, t(1), t(51), Ok(())),
            (None, 7, t(1), t(1), Err(SETTLE)),
            (None, 7, t(1), t(31), Err(Duration::from_millis(20))),
        ];
        for (named, ino, changed, began, expected) in cases {
            assert_eq!(
                may_hand_out(named, ino, changed, began),
                expected,
                "{named:?} {ino} {changed:?} {began:?}"
            );
        }
    }
}
