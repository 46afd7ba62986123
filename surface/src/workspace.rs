//! The surface's view of the shared `/workspace`: every access goes beneath one directory handle.
//!
//! Inbound files are written to a hidden temporary name and renamed into place only when
//! complete ([`InboxTemp`]), so the agent never sees a partial file. Files the agent names are
//! opened with [`Workspace::open_for_upload`]: the `confine` crate's rule of what a chat reaches
//! and its opener (beneath the root, no symlink in any component, type, link count and size
//! checked on the opened handle), the same the agent's tools use.

mod reader;

pub use reader::PositionedReader;

use std::fmt;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use cap_std::fs::{Dir, OpenOptions, OpenOptionsExt};
pub use confine::{ChatScope, ConfineError, PARTIAL_PREFIX};
use confine::{open_dir, open_subdir};
use protocol::{Sentinel, WorkspacePath, room_dir, surface_root};
use rand::Rng;
use rand::distr::Alphanumeric;
use rustix::fs::RenameFlags;

use crate::filename::sanitize_filename;

/// Folder (inside a room's `outbox/`) that posted files are moved to.
pub const SENT_DIR: &str = ".sent";
/// Folder (inside a room's `outbox/`) that files which could not be posted are moved to.
pub const FAILED_DIR: &str = ".failed";

/// Longest inbox file name: `<16-byte timestamp>-<8 unique>-<name>` fits one 255-byte component.
const MAX_INBOX_NAME_BYTES: usize = protocol::MAX_COMPONENT_BYTES - 26;

/// How many unique names to try before giving up on an (astonishingly) crowded folder.
const UNIQUE_ATTEMPTS: usize = 16;

/// Largest sentinel file accepted.
const MAX_SENTINEL_BYTES: u64 = 256;

/// A handle on the workspace root. Cheap to clone; all clones share one directory handle.
#[derive(Clone)]
pub struct Workspace {
    dir: Arc<Dir>,
    root: PathBuf,
}

impl fmt::Debug for Workspace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Workspace")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

/// A failure of a workspace operation the surface itself started.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// The configured root is missing, not a directory or not accessible.
    #[error("workspace root {} is not an accessible directory: {source}", path.display())]
    Root {
        /// The configured root.
        path: PathBuf,
        /// What opening it said.
        source: io::Error,
    },
    /// A filesystem operation failed.
    #[error("could not {op} `{path}`: {source}")]
    Io {
        /// What was being done, e.g. `create folder`.
        op: &'static str,
        /// The workspace path involved.
        path: String,
        /// The underlying error.
        source: io::Error,
    },
    /// [`Workspace::move_aside`] was given a path that is not a file directly in an outbox.
    #[error("`{0}` is not a file in an outbox folder")]
    NotInOutbox(WorkspacePath),
}

impl WorkspaceError {
    fn io(op: &'static str, path: impl fmt::Display, source: io::Error) -> Self {
        Self::Io {
            op,
            path: path.to_string(),
            source,
        }
    }

    /// Whether the disk (or the user's quota) is full.
    pub fn is_disk_full(&self) -> bool {
        matches!(self, Self::Io { source, .. } if is_disk_full(source))
    }
}

/// Whether `e` means the disk or quota is full.
pub fn is_disk_full(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::StorageFull
        || e.kind() == io::ErrorKind::QuotaExceeded
        || e.raw_os_error() == Some(rustix::io::Errno::NOSPC.raw_os_error())
        || e.raw_os_error() == Some(rustix::io::Errno::DQUOT.raw_os_error())
}

/// Why a file named by the agent cannot be sent, fit for the room and the agent: no path (the
/// room sees the name already), no OS details. Out-of-reach paths read like missing ones.
pub fn user_reason(e: &ConfineError) -> String {
    match e {
        ConfineError::NotFound(_) | ConfineError::InvalidPath { .. } => "file not found".to_owned(),
        ConfineError::Symlink(_) => "it is a symbolic link, which I do not follow".to_owned(),
        ConfineError::NotRegular(_) => "it is not a regular file".to_owned(),
        ConfineError::HardLinked(_) => "it has more than one hard link".to_owned(),
        ConfineError::Changing(_) => "it kept changing while I opened it".to_owned(),
        ConfineError::TooLarge { limit, .. } => {
            format!("it is larger than the {} limit", human_size(*limit))
        }
        ConfineError::NotWritable { .. } => "it is outside this chat's folders".to_owned(),
        e if e.is_permission_denied() => "permission denied".to_owned(),
        ConfineError::Io { .. } => "it could not be read".to_owned(),
    }
}

/// Formats a byte count for people, e.g. `100 MiB`, `1.5 KiB`.
pub fn human_size(bytes: u64) -> String {
    let s = bytesize::ByteSize(bytes).display().iec().to_string();
    s.replace(".0 ", " ")
}

/// A file opened for upload, checked on its handle.
#[derive(Debug)]
pub struct OpenedFile {
    file: std::fs::File,
    /// Size in bytes at open time.
    pub size: u64,
    /// The last component of the path (already a safe name: it exists in the workspace).
    pub name: String,
    /// Where it is.
    pub path: WorkspacePath,
}

impl OpenedFile {
    /// An async handle positioned at the start of the file.
    ///
    /// Each call gives a handle on the same open file (the same inode, even if the path is
    /// replaced meanwhile), so a retried upload reads the same file again. The handles share
    /// one file position: use them one after the other; for concurrent reads, use
    /// [`OpenedFile::std_reader`].
    pub fn reader(&self) -> io::Result<tokio::fs::File> {
        use std::io::Seek;
        let mut f = self.file.try_clone()?;
        f.rewind()?;
        Ok(tokio::fs::File::from_std(f))
    }

    /// Another handle on the same open file, to hand to a child process (which reopens it
    /// through `/dev/stdin` for a position of its own).
    pub fn handle(&self) -> io::Result<std::fs::File> {
        self.file.try_clone()
    }

    /// A blocking reader from the start of the same open file with a position of its own
    /// (positional reads), so several can read at once: an upload and the thumbnailer.
    pub fn std_reader(&self) -> io::Result<PositionedReader> {
        Ok(PositionedReader::new(self.file.try_clone()?))
    }

    /// What identifies this version of the file without reading it: device, inode, size and
    /// the modification and change times (ns). Any write, truncation, rename or replacement
    /// changes it.
    pub fn version_key(&self) -> io::Result<String> {
        use std::os::unix::fs::MetadataExt;
        let m = self.file.metadata()?;
        Ok(format!(
            "{}:{}:{}:{}.{}:{}.{}",
            m.dev(),
            m.ino(),
            m.size(),
            m.mtime(),
            m.mtime_nsec(),
            m.ctime(),
            m.ctime_nsec()
        ))
    }
}

/// A download in progress: a hidden temporary file in an inbox.
///
/// Write to [`InboxTemp::file`], then [`InboxTemp::commit`]. Dropped without commit (an error,
/// a size limit, a cancelled task), the temporary file is removed.
pub struct InboxTemp {
    file: Option<tokio::fs::File>,
    inbox: Arc<Dir>,
    inbox_path: WorkspacePath,
    temp_name: String,
    name: String,
    now: SystemTime,
    /// Set by [`InboxTemp::keyed`]: the unique part of the final name.
    key: Option<String>,
}

impl fmt::Debug for InboxTemp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InboxTemp")
            .field("inbox", &self.inbox_path)
            .field("temp_name", &self.temp_name)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl InboxTemp {
    /// The file to write to.
    pub fn file(&mut self) -> &mut tokio::fs::File {
        self.file.as_mut().expect("present until commit or drop")
    }

    /// The sanitized name the file will get (after the timestamp and unique part).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Names the final file after `key` (e.g. a digest of the event it came with) instead of a
    /// random part: downloading the same thing again (after a crash between the commit and its
    /// record) finds the first copy and keeps it, so an inbox never holds a file twice.
    pub fn keyed(mut self, key: &str) -> Self {
        self.key = Some(key.to_owned());
        self
    }

    /// Flushes and fsyncs the file, then renames it to
    /// `<UTC YYYYmmddTHHMMSSZ>-<8 unique>-<name>` (or `<stamp>-<key>-<name>`, see
    /// [`InboxTemp::keyed`]) without ever replacing an existing file.
    pub async fn commit(mut self) -> Result<WorkspacePath, WorkspaceError> {
        use tokio::io::AsyncWriteExt;
        let mut file = self.file.take().expect("present until commit or drop");
        let temp_path = format!("{}/{}", self.inbox_path, self.temp_name);
        file.flush()
            .await
            .map_err(|e| WorkspaceError::io("write", &temp_path, e))?;
        file.sync_all()
            .await
            .map_err(|e| WorkspaceError::io("sync", &temp_path, e))?;
        drop(file);
        let stamp = timestamp(self.now);
        let inbox = Arc::clone(&self.inbox);
        let temp_name = self.temp_name.clone();
        let name = self.name.clone();
        let key = self.key.clone();
        let final_name = tokio::task::spawn_blocking(move || {
            let final_name = match key {
                Some(key) => {
                    let to = format!("{stamp}-{key}-{name}");
                    match rename_noreplace(&inbox, &temp_name, &inbox, &to) {
                        Ok(()) => to,
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                            // Committed before: keep that copy, drop this one.
                            inbox.remove_file(&temp_name)?;
                            tracing::info!(file = %to, "already in the inbox; kept the first copy");
                            to
                        }
                        Err(e) => return Err(e),
                    }
                }
                None => rename_unique(&inbox, &temp_name, &inbox, |unique| {
                    format!("{stamp}-{unique}-{name}")
                })?,
            };
            // Make the rename itself durable.
            if let Ok(d) = inbox.try_clone() {
                let _ = d.into_std_file().sync_all();
            }
            Ok::<_, io::Error>(final_name)
        })
        .await
        .map_err(|e| WorkspaceError::io("rename", &temp_path, io::Error::other(e)))?
        .map_err(|e| WorkspaceError::io("rename", &temp_path, e))?;
        // Committed: nothing left for Drop to remove.
        self.temp_name.clear();
        self.inbox_path
            .join(&final_name)
            .map_err(|e| WorkspaceError::io("name", &final_name, io::Error::other(e)))
    }
}

impl Drop for InboxTemp {
    fn drop(&mut self) {
        if !self.temp_name.is_empty() {
            drop(self.file.take());
            if let Err(e) = self.inbox.remove_file(&self.temp_name) {
                tracing::warn!(
                    inbox = %self.inbox_path,
                    temp = %self.temp_name,
                    error = %e,
                    "could not remove a partial download"
                );
            }
        }
    }
}

/// Which outbox subfolder [`Workspace::move_aside`] moves a file to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Posted: moved to `outbox/.sent/`.
    Sent,
    /// Could not be posted: moved to `outbox/.failed/`.
    Failed,
}

impl Workspace {
    /// Opens the workspace root, which must be an existing directory.
    pub fn open(root: &Path) -> Result<Self, WorkspaceError> {
        let err = |source| WorkspaceError::Root {
            path: root.to_owned(),
            source,
        };
        let dir = Dir::open_ambient_dir(root, cap_std::ambient_authority()).map_err(err)?;
        // `open_ambient_dir` succeeds on files on some platforms: make sure.
        let meta = dir.dir_metadata().map_err(err)?;
        if !meta.is_dir() {
            return Err(err(io::Error::from(io::ErrorKind::NotADirectory)));
        }
        Ok(Self {
            dir: Arc::new(dir),
            root: root.to_owned(),
        })
    }

    /// The root as configured (for logs; never used to open anything).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `surfaces/matrix/<user>/<room>/inbox`.
    pub fn inbox_dir(user_id: &str, room_id: &str) -> WorkspacePath {
        room_dir(user_id, room_id)
            .join("inbox")
            .expect("constant component")
    }

    /// `surfaces/matrix/<user>/<room>/outbox`: files dropped here are posted to the room.
    pub fn outbox_dir(user_id: &str, room_id: &str) -> WorkspacePath {
        room_dir(user_id, room_id)
            .join("outbox")
            .expect("constant component")
    }

    /// Creates a folder (and its parents) beneath the root.
    pub fn create_dir_all(&self, path: &WorkspacePath) -> Result<(), WorkspaceError> {
        self.dir
            .create_dir_all(path.as_path())
            .map_err(|e| WorkspaceError::io("create folder", path, e))
    }

    /// Starts a download into `surfaces/matrix/<user>/<room>/inbox/`.
    ///
    /// `name` is the name the sender gave (it is sanitized here); `now` becomes the timestamp
    /// in the final name.
    pub fn create_inbox_file(
        &self,
        user_id: &str,
        room_id: &str,
        name: &str,
        now: SystemTime,
    ) -> Result<InboxTemp, WorkspaceError> {
        let inbox_path = Self::inbox_dir(user_id, room_id);
        self.create_dir_all(&inbox_path)?;
        let inbox = open_dir(&self.dir, &inbox_path)
            .map_err(|e| WorkspaceError::io("open folder", &inbox_path, e.into()))?;
        let mut options = OpenOptions::new();
        options.write(true).create_new(true).mode(0o644);
        let mut last_err = None;
        for _ in 0..UNIQUE_ATTEMPTS {
            let temp_name = format!("{PARTIAL_PREFIX}{}", random_alnum(16));
            match inbox.open_with(&temp_name, &options) {
                Ok(f) => {
                    return Ok(InboxTemp {
                        file: Some(tokio::fs::File::from_std(f.into_std())),
                        inbox: Arc::new(inbox),
                        inbox_path,
                        temp_name,
                        name: sanitize_filename(name, MAX_INBOX_NAME_BYTES),
                        now,
                        key: None,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last_err = Some(e),
                Err(e) => return Err(WorkspaceError::io("create a file in", &inbox_path, e)),
            }
        }
        Err(WorkspaceError::io(
            "create a file in",
            &inbox_path,
            last_err.unwrap_or_else(|| io::Error::from(io::ErrorKind::AlreadyExists)),
        ))
    }

    /// Opens a file the agent named, for upload to `scope`'s room, with
    /// [`confine::open_reachable`]: anything out of the chat's reach is
    /// [`ConfineError::NotFound`]; symlinks in any component, non-regular files (a FIFO cannot
    /// hang us), hard-linked files and files over `max` bytes are refused, checked on the
    /// opened handle.
    pub fn open_for_upload(
        &self,
        path: &WorkspacePath,
        scope: &ChatScope,
        max: u64,
    ) -> Result<OpenedFile, ConfineError> {
        let opened = confine::open_reachable(&self.dir, scope, path, max)?;
        Ok(OpenedFile {
            file: opened.file,
            size: opened.size,
            // A file from an inbox goes out under the name its sender gave it.
            name: protocol::original_name(path.file_name()).to_owned(),
            path: opened.path,
        })
    }

    /// Writes a fresh sentinel `surfaces/matrix/.sentinel/<nonce>` whose content is the nonce,
    /// and removes sentinels older than an hour.
    pub fn write_sentinel(&self) -> Result<Sentinel, WorkspaceError> {
        let dir = surface_root()
            .join(".sentinel")
            .expect("constant component");
        self.create_dir_all(&dir)?;
        let nonce = random_alnum(32);
        let path = dir.join(&nonce).expect("alphanumeric component");
        self.dir
            .write(path.as_path(), nonce.as_bytes())
            .map_err(|e| WorkspaceError::io("write", &path, e))?;
        if let Ok(entries) = self.dir.read_dir(dir.as_path()) {
            let cutoff = SystemTime::now() - Duration::from_secs(3600);
            for entry in entries.flatten() {
                let old = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t.into_std() < cutoff);
                if old {
                    let _ = entry.remove_file();
                }
            }
        }
        Ok(Sentinel { path, nonce })
    }

    /// Whether the sentinel the agent wrote is here with the right content.
    ///
    /// Only files in a `.sentinel` folder are considered, opened with the confined opener (no
    /// symlink, a regular file with one link, at most 256 bytes).
    pub fn check_sentinel(&self, sentinel: &Sentinel) -> bool {
        let in_sentinel_dir = sentinel
            .path
            .parent()
            .is_some_and(|p| p.file_name() == ".sentinel");
        if !in_sentinel_dir {
            return false;
        }
        let Ok(mut opened) = confine::open_file(&self.dir, &sentinel.path, MAX_SENTINEL_BYTES)
        else {
            return false;
        };
        let mut content = Vec::new();
        if opened.file.read_to_end(&mut content).is_err() {
            return false;
        }
        content == sentinel.nonce.as_bytes()
    }

    /// Moves a posted (or failed) outbox file to `outbox/.sent/` (or `.failed/`), keeping its
    /// name unless that is taken. Returns the new path.
    pub fn move_aside(
        &self,
        path: &WorkspacePath,
        outcome: Outcome,
    ) -> Result<WorkspacePath, WorkspaceError> {
        let parent = path
            .parent()
            .filter(|p| p.file_name() == "outbox" && p.starts_with(&surface_root()))
            .ok_or_else(|| WorkspaceError::NotInOutbox(path.clone()))?;
        let sub = match outcome {
            Outcome::Sent => SENT_DIR,
            Outcome::Failed => FAILED_DIR,
        };
        let outbox = open_dir(&self.dir, &parent)
            .map_err(|e| WorkspaceError::io("open folder", &parent, e.into()))?;
        match outbox.create_dir(sub) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(WorkspaceError::io("create folder", &parent, e)),
        }
        let target =
            open_subdir(&outbox, sub).map_err(|e| WorkspaceError::io("open folder", &parent, e))?;
        let name = path.file_name();
        // Room for the `<unique>-` prefix a second file of the same name gets.
        let short = crate::filename::sanitize_filename(name, protocol::MAX_COMPONENT_BYTES - 9);
        let mut first = true;
        let new_name = rename_unique(&outbox, name, &target, |unique| {
            if std::mem::take(&mut first) && short == name {
                name.to_owned()
            } else {
                format!("{unique}-{short}")
            }
        })
        .map_err(|e| WorkspaceError::io("move", path, e))?;
        parent
            .join(&format!("{sub}/{new_name}"))
            .map_err(|e| WorkspaceError::io("move", path, io::Error::other(e)))
    }

    /// Removes a file from an inbox (its message was redacted). Only a plain name directly in
    /// a `surfaces/matrix/<user>/<room>/inbox/` folder is removed, reached without following
    /// links; returns whether a file was removed.
    pub fn remove_inbox_file(&self, path: &WorkspacePath) -> Result<bool, WorkspaceError> {
        let parts: Vec<&str> = path.components().collect();
        let root: Vec<String> = surface_root().components().map(str::to_owned).collect();
        let in_inbox = parts.len() == root.len() + 4
            && parts.iter().zip(&root).all(|(a, b)| a == b)
            && parts[root.len() + 2] == "inbox";
        if !in_inbox {
            return Ok(false);
        }
        let (dir, name) = match confine::open_parent(&self.dir, path) {
            Ok(p) => p,
            Err(e) if e.is_not_found() => return Ok(false),
            Err(e) => return Err(WorkspaceError::io("open folder", path, e.into())),
        };
        match dir.remove_file(name) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(WorkspaceError::io("remove", path, e)),
        }
    }

    /// Removes temporary downloads (`.partial-*`) left in any inbox by a crash. Call at start-up,
    /// before downloads begin. Returns how many were removed.
    pub fn remove_partials(&self) -> usize {
        let mut removed = 0;
        self.for_each_inbox(|inbox, _| {
            for entry in inbox.entries().into_iter().flatten().flatten() {
                let name = entry.file_name();
                if name.to_string_lossy().starts_with(PARTIAL_PREFIX) && entry.remove_file().is_ok()
                {
                    removed += 1;
                }
            }
        });
        removed
    }

    /// Calls `f` with every `surfaces/matrix/<user>/<room>/inbox` folder handle and its path.
    /// Symlinked folders are skipped.
    pub(crate) fn for_each_inbox(&self, mut f: impl FnMut(&Dir, &WorkspacePath)) {
        let root = surface_root();
        let Ok(base) = open_dir(&self.dir, &root) else {
            return;
        };
        for user in subdirs(&base) {
            let Ok(user_dir) = open_subdir(&base, &user) else {
                continue;
            };
            for room in subdirs(&user_dir) {
                let Ok(inbox) =
                    open_subdir(&user_dir, &room).and_then(|r| open_subdir(&r, "inbox"))
                else {
                    continue;
                };
                if let Ok(path) = root.join(&format!("{user}/{room}/inbox")) {
                    f(&inbox, &path);
                }
            }
        }
    }
}

/// Names of the non-hidden subfolders of `dir` (UTF-8 names only).
fn subdirs(dir: &Dir) -> Vec<String> {
    let Ok(entries) = dir.entries() else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| !n.starts_with('.'))
        .collect()
}

/// Renames `from` (in `from_dir`) to `make(unique)` (in `to_dir`) without replacing anything,
/// trying fresh unique parts while the target exists. Returns the new name.
fn rename_unique(
    from_dir: &Dir,
    from: &str,
    to_dir: &Dir,
    mut make: impl FnMut(&str) -> String,
) -> io::Result<String> {
    for _ in 0..UNIQUE_ATTEMPTS {
        let to = make(&random_alnum(8));
        match rename_noreplace(from_dir, from, to_dir, &to) {
            Ok(()) => return Ok(to),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::from(io::ErrorKind::AlreadyExists))
}

/// `renameat2(RENAME_NOREPLACE)` between single components of two opened folders, falling back
/// to link + unlink on filesystems without it.
fn rename_noreplace(from_dir: &Dir, from: &str, to_dir: &Dir, to: &str) -> io::Result<()> {
    match rustix::fs::renameat_with(from_dir, from, to_dir, to, RenameFlags::NOREPLACE) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::INVAL) | Err(rustix::io::Errno::NOSYS) => {
            from_dir.hard_link(from, to_dir, to)?;
            from_dir.remove_file(from)
        }
        Err(e) => Err(e.into()),
    }
}

/// `YYYYmmddTHHMMSSZ` in UTC.
fn timestamp(t: SystemTime) -> String {
    humantime::format_rfc3339_seconds(t)
        .to_string()
        .replace(['-', ':'], "")
}

fn random_alnum(n: usize) -> String {
    rand::rng()
        .sample_iter(Alphanumeric)
        .take(n)
        .map(char::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use protocol::ChatId;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn a_keyed_download_committed_twice_is_one_file() {
        use tokio::io::AsyncWriteExt;
        let tmp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(tmp.path()).unwrap();
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut paths = Vec::new();
        for content in [&b"first"[..], b"second"] {
            let mut t = ws
                .create_inbox_file("@u:hs", "!r:hs", "a.txt", at)
                .unwrap()
                .keyed("k1");
            t.file().write_all(content).await.unwrap();
            paths.push(t.commit().await.unwrap());
        }
        assert_eq!(paths[0], paths[1]);
        let dir = tmp
            .path()
            .join(Workspace::inbox_dir("@u:hs", "!r:hs").as_str());
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "one file, no partial left: {names:?}");
        assert_eq!(
            std::fs::read(paths[0].to_path_under(tmp.path())).unwrap(),
            b"first"
        );
    }

    const USER: &str = "@alice:example.org";
    const ROOM: &str = "!room:example.org";

    struct Fixture {
        _tmp: tempfile::TempDir,
        root: PathBuf,
        ws: Workspace,
        scope: ChatScope,
    }

    fn fixture() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("ws");
        std::fs::create_dir(&root).unwrap();
        let ws = Workspace::open(&root).unwrap();
        let scope = ChatScope::new(ChatId::for_conversation(ROOM, None), ROOM);
        Fixture {
            _tmp: tmp,
            root,
            ws,
            scope,
        }
    }

    impl Fixture {
        fn write(&self, rel: &str, content: &[u8]) -> WorkspacePath {
            let p = self.root.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, content).unwrap();
            WorkspacePath::new(rel).unwrap()
        }
        fn chat(&self, rest: &str) -> String {
            format!("{}/{rest}", self.scope.own_dir())
        }
        fn inbox(&self, rest: &str) -> String {
            format!("{}/{rest}", Workspace::inbox_dir(USER, ROOM))
        }
        fn open(&self, rel: &str) -> Result<OpenedFile, ConfineError> {
            self.ws
                .open_for_upload(&WorkspacePath::new(rel).unwrap(), &self.scope, 1000)
        }
        fn names_in(&self, rel: &str) -> Vec<String> {
            let mut v: Vec<String> = std::fs::read_dir(self.root.join(rel))
                .map(|rd| {
                    rd.map(|e| e.unwrap().file_name().into_string().unwrap())
                        .collect()
                })
                .unwrap_or_default();
            v.sort();
            v
        }
    }

    #[test]
    fn open_requires_a_directory() {
        let f = fixture();
        assert!(matches!(
            Workspace::open(&f.root.join("missing")),
            Err(WorkspaceError::Root { .. })
        ));
        std::fs::write(f.root.join("file"), b"x").unwrap();
        assert!(Workspace::open(&f.root.join("file")).is_err());
    }

    #[tokio::test]
    async fn inbox_file_is_hidden_until_committed() {
        let f = fixture();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut temp =
            f.ws.create_inbox_file(USER, ROOM, "../Report .pdf", now)
                .unwrap();
        temp.file().write_all(b"hello").await.unwrap();
        let inbox = Workspace::inbox_dir(USER, ROOM);
        let during = f.names_in(inbox.as_str());
        assert_eq!(during.len(), 1);
        assert!(during[0].starts_with(PARTIAL_PREFIX), "{during:?}");
        let path = temp.commit().await.unwrap();
        let name = path.file_name();
        assert!(name.starts_with("20231114T221320Z-"), "{name}");
        assert!(name.ends_with("-_Report .pdf"), "{name}");
        assert_eq!(
            name.len(),
            "20231114T221320Z-".len() + 8 + 1 + "_Report .pdf".len()
        );
        assert_eq!(f.names_in(inbox.as_str()), vec![name.to_owned()]);
        assert_eq!(
            std::fs::read(path.to_path_under(&f.root)).unwrap(),
            b"hello"
        );
        // The committed file is sendable by the room's chat.
        let opened = f.open(path.as_str()).unwrap();
        assert_eq!(opened.size, 5);
    }

    #[tokio::test]
    async fn hostile_names_stay_in_the_inbox() {
        let f = fixture();
        let long = format!("{}.pdf", "x".repeat(400));
        let cases = [
            ("../../etc/passwd", "_.._etc_passwd"),
            ("\u{202e}gnp.exe", "gnp.exe"),
            ("CON.txt", "_CON.txt"),
            (".bashrc", "bashrc"),
            ("", "file"),
        ];
        for (name, expected) in cases {
            let t =
                f.ws.create_inbox_file(USER, ROOM, name, SystemTime::now())
                    .unwrap();
            let path = t.commit().await.unwrap();
            assert_eq!(path.parent().unwrap(), Workspace::inbox_dir(USER, ROOM));
            assert!(
                path.file_name().ends_with(&format!("-{expected}")),
                "{path}"
            );
        }
        let t =
            f.ws.create_inbox_file(USER, ROOM, &long, SystemTime::now())
                .unwrap();
        let path = t.commit().await.unwrap();
        assert!(path.file_name().len() <= protocol::MAX_COMPONENT_BYTES);
        assert!(path.file_name().ends_with("x.pdf"), "{path}");
        assert!(path.to_path_under(&f.root).is_file());
    }

    #[test]
    fn a_link_planted_at_the_final_name_is_never_followed_or_replaced() {
        let f = fixture();
        let inbox = Workspace::inbox_dir(USER, ROOM);
        f.ws.create_dir_all(&inbox).unwrap();
        let inbox_abs = inbox.to_path_under(&f.root);
        let outside = f.root.parent().unwrap().join("target.txt");
        std::fs::write(&outside, b"outside").unwrap();
        symlink(&outside, inbox_abs.join("planted")).unwrap();
        std::fs::hard_link(&outside, inbox_abs.join("planted-hard")).unwrap();
        std::fs::write(inbox_abs.join(".partial-new"), b"new").unwrap();
        let dir = open_dir(&f.ws.dir, &inbox).unwrap();
        let mut names = ["planted", "planted-hard", "fresh"].into_iter();
        let got = rename_unique(&dir, ".partial-new", &dir, |_| {
            names.next().unwrap().to_owned()
        })
        .unwrap();
        assert_eq!(got, "fresh");
        assert_eq!(std::fs::read(&outside).unwrap(), b"outside");
        let planted = std::fs::symlink_metadata(inbox_abs.join("planted")).unwrap();
        assert!(planted.file_type().is_symlink());
        assert_eq!(std::fs::read(inbox_abs.join("fresh")).unwrap(), b"new");
    }

    #[test]
    fn only_inbox_files_are_removed_for_a_redaction() {
        let f = fixture();
        let inbox = f.write(&f.inbox("x-cat.png"), b"cat");
        let chat = f.write(&f.chat("notes.txt"), b"n");
        assert!(f.ws.remove_inbox_file(&inbox).unwrap());
        assert!(!inbox.to_path_under(&f.root).exists());
        assert!(!f.ws.remove_inbox_file(&inbox).unwrap(), "already gone");
        assert!(!f.ws.remove_inbox_file(&chat).unwrap(), "not an inbox file");
        assert!(chat.to_path_under(&f.root).exists());
    }

    #[test]
    fn an_inbox_that_is_a_link_is_not_written_through() {
        let f = fixture();
        let elsewhere = f.root.parent().unwrap().join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        let inbox_abs = Workspace::inbox_dir(USER, ROOM).to_path_under(&f.root);
        std::fs::create_dir_all(inbox_abs.parent().unwrap()).unwrap();
        symlink(&elsewhere, &inbox_abs).unwrap();
        assert!(
            f.ws.create_inbox_file(USER, ROOM, "x.txt", SystemTime::now())
                .is_err()
        );
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    }

    #[tokio::test]
    async fn dropped_inbox_file_leaves_nothing() {
        let f = fixture();
        let mut temp =
            f.ws.create_inbox_file(USER, ROOM, "x.bin", SystemTime::now())
                .unwrap();
        temp.file().write_all(&[0; 4096]).await.unwrap();
        drop(temp);
        assert!(
            f.names_in(Workspace::inbox_dir(USER, ROOM).as_str())
                .is_empty()
        );
    }

    #[tokio::test]
    async fn commit_never_overwrites() {
        let f = fixture();
        let now = SystemTime::now();
        let mut paths = Vec::new();
        for i in 0..20u8 {
            let mut t = f.ws.create_inbox_file(USER, ROOM, "same.txt", now).unwrap();
            t.file().write_all(&[i]).await.unwrap();
            paths.push(t.commit().await.unwrap());
        }
        paths.sort();
        paths.dedup();
        assert_eq!(paths.len(), 20);
        assert_eq!(
            f.names_in(Workspace::inbox_dir(USER, ROOM).as_str()).len(),
            20
        );
    }

    #[test]
    fn stale_partials_are_removed() {
        let f = fixture();
        f.write(&f.inbox(".partial-abc"), b"x");
        f.write(&f.inbox("keep.txt"), b"x");
        assert_eq!(f.ws.remove_partials(), 1);
        assert_eq!(
            f.names_in(Workspace::inbox_dir(USER, ROOM).as_str()),
            vec!["keep.txt"]
        );
    }

    // Which files open, and every refusal, are the `confine` crate's tests; here only what the
    // surface adds on top.
    #[tokio::test]
    async fn each_reader_starts_at_the_beginning() {
        let f = fixture();
        let rel = format!(
            "{}/out.txt",
            Workspace::outbox_dir("@bob:example.org", ROOM)
        );
        f.write(&rel, b"content");
        let opened = f.open(&rel).unwrap();
        assert_eq!((opened.size, opened.name.as_str()), (7, "out.txt"));
        for _ in 0..2 {
            let mut s = String::new();
            opened
                .reader()
                .unwrap()
                .read_to_string(&mut s)
                .await
                .unwrap();
            assert_eq!(s, "content");
        }
    }

    #[tokio::test]
    async fn a_download_in_progress_cannot_be_sent() {
        let f = fixture();
        let mut temp =
            f.ws.create_inbox_file(USER, ROOM, "a.txt", SystemTime::now())
                .unwrap();
        temp.file().write_all(b"half").await.unwrap();
        let partial = f.names_in(Workspace::inbox_dir(USER, ROOM).as_str());
        let err = f.open(&f.inbox(&partial[0])).unwrap_err();
        assert!(err.is_not_found(), "{err}");
        assert_eq!(user_reason(&err), "file not found");
    }

    #[test]
    fn sentinels_round_trip() {
        let f = fixture();
        let s = f.ws.write_sentinel().unwrap();
        assert!(s.path.as_str().starts_with("surfaces/matrix/.sentinel/"));
        assert!(f.ws.check_sentinel(&s));
        let wrong = Sentinel {
            nonce: "nope".into(),
            ..s.clone()
        };
        assert!(!f.ws.check_sentinel(&wrong));
        // Another folder, even with the right content, does not count.
        let elsewhere = f.write("chats/x/nonce", s.nonce.as_bytes());
        assert!(!f.ws.check_sentinel(&Sentinel {
            path: elsewhere,
            nonce: s.nonce.clone()
        }));
        // A sentinel that is a symlink does not count either.
        let agent = f.write("chats/.sentinel/real", b"n2");
        symlink(
            agent.to_path_under(&f.root),
            f.root.join("chats/.sentinel/link"),
        )
        .unwrap();
        let ok = Sentinel {
            path: agent,
            nonce: "n2".into(),
        };
        assert!(f.ws.check_sentinel(&ok));
        let link = Sentinel {
            path: WorkspacePath::new("chats/.sentinel/link").unwrap(),
            nonce: "n2".into(),
        };
        assert!(!f.ws.check_sentinel(&link));
        // A different root does not see it.
        let g = fixture();
        assert!(!g.ws.check_sentinel(&s));
    }

    #[test]
    fn move_aside_keeps_names_unique() {
        let f = fixture();
        let outbox = Workspace::outbox_dir(USER, ROOM);
        let a = f.write(&format!("{outbox}/a.txt"), b"1");
        let moved = f.ws.move_aside(&a, Outcome::Sent).unwrap();
        assert_eq!(moved.as_str(), format!("{outbox}/.sent/a.txt"));
        let a2 = f.write(&format!("{outbox}/a.txt"), b"2");
        let moved2 = f.ws.move_aside(&a2, Outcome::Sent).unwrap();
        assert_ne!(moved, moved2);
        assert!(moved2.file_name().ends_with("-a.txt"), "{moved2}");
        assert_eq!(std::fs::read(moved.to_path_under(&f.root)).unwrap(), b"1");
        assert_eq!(std::fs::read(moved2.to_path_under(&f.root)).unwrap(), b"2");
        let b = f.write(&format!("{outbox}/b.txt"), b"3");
        let failed = f.ws.move_aside(&b, Outcome::Failed).unwrap();
        assert_eq!(failed.as_str(), format!("{outbox}/.failed/b.txt"));
        let not_outbox = f.write(&f.chat("c.txt"), b"x");
        assert!(matches!(
            f.ws.move_aside(&not_outbox, Outcome::Sent),
            Err(WorkspaceError::NotInOutbox(_))
        ));
    }

    #[test]
    fn timestamps_are_compact_utc() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(timestamp(t), "20231114T221320Z");
    }

    #[test]
    fn user_reasons() {
        let path = WorkspacePath::new("chats/c/secret.txt").unwrap();
        let denied = ConfineError::Io {
            path: path.clone(),
            source: io::Error::from(io::ErrorKind::PermissionDenied),
        };
        let cases = [
            (ConfineError::NotFound(path.clone()), "file not found"),
            (
                ConfineError::TooLarge {
                    path: path.clone(),
                    size: 2,
                    limit: 100 * 1024 * 1024,
                },
                "it is larger than the 100 MiB limit",
            ),
            (denied, "permission denied"),
        ];
        for (e, reason) in cases {
            assert_eq!(user_reason(&e), reason);
            assert!(!user_reason(&e).contains("secret"), "no path in {e:?}");
        }
    }
}
