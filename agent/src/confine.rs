//! Confinement: every workspace file is opened beneath a directory handle, one component at a
//! time, never following a symlink, and checked on the opened handle.
//!
//! [`Workspace`] knows how to open, write and list safely; [`ChatScope`] knows which parts of the
//! workspace one chat may touch. A path outside the scope is reported exactly like a missing file
//! so a chat cannot probe for other chats' or rooms' files.

use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::Arc;

use cap_fs_ext::{DirExt, FollowSymlinks, OpenOptionsFollowExt};
use cap_std::fs::{Dir, OpenOptions, OpenOptionsExt};
use protocol::{ChatId, WorkspacePath, WorkspacePathError, chat_dir, matrix_id_component};

/// Why a workspace path could not be used. The messages are meant for the brain and the user:
/// they name the workspace-relative path and never an absolute host path.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    /// Missing, or outside what this chat may touch (deliberately indistinguishable).
    #[error("not found: {0}")]
    NotFound(WorkspacePath),
    /// The last component, or a folder on the way, is a symbolic link.
    #[error("refused: {0} is or passes through a symbolic link")]
    Symlink(WorkspacePath),
    /// A FIFO, socket, device or directory where a regular file was expected.
    #[error("refused: {0} is not a regular file")]
    NotRegular(WorkspacePath),
    /// The file has several hard links, so it may be a copy of something outside the scope.
    #[error("refused: {0} has more than one hard link")]
    HardLinked(WorkspacePath),
    /// The file is larger than the configured limit.
    #[error("refused: {path} is {size} bytes, over the limit of {limit} bytes")]
    TooLarge {
        /// The file.
        path: WorkspacePath,
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The path is not a valid workspace path (absolute, `..`, empty, control characters...).
    #[error("invalid path {input:?}: {reason}")]
    InvalidPath {
        /// What was asked for.
        input: String,
        /// Why it is invalid.
        reason: WorkspacePathError,
    },
    /// Writing is only allowed below the chat's own `chats/<chat_id>/` folder.
    #[error("refused: {path} is outside this chat's own folder {own}/")]
    NotWritable {
        /// The path asked for.
        path: WorkspacePath,
        /// The chat's own folder.
        own: WorkspacePath,
    },
    /// Any other I/O failure.
    #[error("could not access {path}: {source}")]
    Io {
        /// The path.
        path: WorkspacePath,
        /// The underlying error (no host path in it: all opens are relative).
        source: io::Error,
    },
}

impl ConfineError {
    /// Whether this is a refusal for safety reasons (as opposed to "not found" or an I/O error).
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            Self::Symlink(_)
                | Self::NotRegular(_)
                | Self::HardLinked(_)
                | Self::TooLarge { .. }
                | Self::InvalidPath { .. }
                | Self::NotWritable { .. }
        )
    }
}

/// Parses a path given by a brain or a user into a [`WorkspacePath`], with a clear error.
pub fn parse_path(input: &str) -> Result<WorkspacePath, ConfineError> {
    WorkspacePath::new(input).map_err(|reason| ConfineError::InvalidPath {
        input: input.to_owned(),
        reason,
    })
}

/// A directory handle on the workspace root. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Workspace {
    root: Arc<Dir>,
    max_file_size: u64,
}

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

/// One file found by [`Workspace::list_files`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEntry {
    /// Workspace-relative path.
    pub path: WorkspacePath,
    /// Size in bytes.
    pub size: u64,
}

/// Deepest folder nesting [`Workspace::list_files`] descends into.
const MAX_LIST_DEPTH: usize = 8;

impl Workspace {
    /// Opens the workspace root. This is the only ambient-authority open in the agent.
    pub fn open(root: &Path, max_file_size: u64) -> io::Result<Self> {
        let root = Dir::open_ambient_dir(root, cap_std::ambient_authority())?;
        Ok(Self {
            root: Arc::new(root),
            max_file_size,
        })
    }

    /// The largest file [`Workspace::open_file`] accepts.
    pub fn max_file_size(&self) -> u64 {
        self.max_file_size
    }

    /// Opens every folder of `path` (all components but the last) without following symlinks.
    /// With `create`, missing folders are created. Returns the parent folder and the last name.
    fn parent_dir<'p>(
        &self,
        path: &'p WorkspacePath,
        create: bool,
    ) -> Result<(Dir, &'p str), ConfineError> {
        let mut components: Vec<&str> = path.components().collect();
        let name = components.pop().unwrap_or_default();
        let mut dir = self.root.try_clone().map_err(|e| io_err(path, e))?;
        for component in components {
            dir = match dir.open_dir_nofollow(component) {
                Ok(next) => next,
                Err(e) if e.kind() == io::ErrorKind::NotFound && create => {
                    match dir.create_dir(component) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                        Err(e) => return Err(io_err(path, e)),
                    }
                    dir.open_dir_nofollow(component)
                        .map_err(|e| classify(&dir, component, path, e))?
                }
                Err(e) => return Err(classify(&dir, component, path, e)),
            };
        }
        Ok((dir, name))
    }

    /// Opens a regular file for reading: no symlink anywhere on the way, never blocks on a
    /// FIFO, and the opened handle must be a regular file with one link within the size limit.
    pub fn open_file(&self, path: &WorkspacePath) -> Result<ConfinedFile, ConfineError> {
        let (dir, name) = self.parent_dir(path, false)?;
        let mut options = OpenOptions::new();
        options
            .read(true)
            .follow(FollowSymlinks::No)
            // Opening a FIFO for reading would block until a writer appears.
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
        let file = dir
            .open_with(name, &options)
            .map_err(|e| classify(&dir, name, path, e))?
            .into_std();
        let meta = file.metadata().map_err(|e| io_err(path, e))?;
        check_metadata(&meta, path, self.max_file_size)?;
        Ok(ConfinedFile {
            file,
            size: meta.len(),
            path: path.clone(),
        })
    }

    /// Reads at most `limit` bytes of a confined file; also returns whether it was cut short.
    pub fn read_prefix(
        &self,
        path: &WorkspacePath,
        limit: u64,
    ) -> Result<(Vec<u8>, bool), ConfineError> {
        let opened = self.open_file(path)?;
        let mut buf = Vec::new();
        opened
            .file
            .take(limit)
            .read_to_end(&mut buf)
            .map_err(|e| io_err(path, e))?;
        Ok((buf, opened.size > limit))
    }

    /// Writes `contents` to `path` atomically: a temporary file in the same folder, fsync,
    /// rename over the name (which replaces a symlink instead of following it), fsync the folder.
    pub fn write_file(&self, path: &WorkspacePath, contents: &[u8]) -> Result<(), ConfineError> {
        let (dir, name) = self.parent_dir(path, true)?;
        if let Ok(meta) = dir.symlink_metadata(name)
            && meta.is_dir()
        {
            return Err(ConfineError::NotRegular(path.clone()));
        }
        let tmp = format!(".{name}.tmp-{:016x}", rand::random::<u64>());
        let tmp = truncate_name(&tmp);
        let result = (|| -> io::Result<()> {
            let mut options = OpenOptions::new();
            options
                .write(true)
                .create_new(true)
                .follow(FollowSymlinks::No);
            let mut file = dir.open_with(&tmp, &options)?;
            file.write_all(contents)?;
            file.sync_all()?;
            drop(file);
            dir.rename(&tmp, &dir, name)?;
            // The folder handle may be `O_PATH`; fsync needs a readable descriptor.
            dir.open(".")?.sync_all()
        })();
        if let Err(e) = result {
            let _ = dir.remove_file(&tmp);
            return Err(io_err(path, e));
        }
        Ok(())
    }

    /// Lists the regular files below the folder `path` (recursively, skipping symlinks, hidden
    /// names and anything that is not a plain file or folder), sorted by path.
    pub fn list_files(
        &self,
        path: &WorkspacePath,
        max_entries: usize,
    ) -> Result<Vec<FileEntry>, ConfineError> {
        let (parent, name) = self.parent_dir(path, false)?;
        let dir = parent
            .open_dir_nofollow(name)
            .map_err(|e| classify(&parent, name, path, e))?;
        let mut out = Vec::new();
        walk(&dir, path, 0, max_entries, &mut out);
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// Names of the sub-folders of `path` (no symlinks, no hidden names); empty if it is missing.
    pub fn subdirs(&self, path: &WorkspacePath) -> Vec<String> {
        let Ok((parent, name)) = self.parent_dir(path, false) else {
            return Vec::new();
        };
        let Ok(dir) = parent.open_dir_nofollow(name) else {
            return Vec::new();
        };
        let Ok(entries) = dir.entries() else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| !n.starts_with('.'))
            .collect();
        names.sort();
        names
    }
}

fn walk(dir: &Dir, at: &WorkspacePath, depth: usize, max_entries: usize, out: &mut Vec<FileEntry>) {
    let Ok(entries) = dir.entries() else { return };
    for entry in entries.filter_map(Result::ok) {
        if out.len() >= max_entries {
            return;
        }
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if name.starts_with('.') {
            continue;
        }
        let Ok(path) = at.join(&name) else { continue };
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() && depth < MAX_LIST_DEPTH {
            if let Ok(sub) = dir.open_dir_nofollow(&name) {
                walk(&sub, &path, depth + 1, max_entries, out);
            }
        } else if kind.is_file()
            && let Ok(meta) = entry.metadata()
        {
            out.push(FileEntry {
                path,
                size: meta.len(),
            });
        }
    }
}

fn check_metadata(
    meta: &std::fs::Metadata,
    path: &WorkspacePath,
    limit: u64,
) -> Result<(), ConfineError> {
    use std::os::unix::fs::MetadataExt;
    if !meta.file_type().is_file() {
        return Err(ConfineError::NotRegular(path.clone()));
    }
    if meta.nlink() != 1 {
        return Err(ConfineError::HardLinked(path.clone()));
    }
    if meta.len() > limit {
        return Err(ConfineError::TooLarge {
            path: path.clone(),
            size: meta.len(),
            limit,
        });
    }
    Ok(())
}

/// Turns an open failure into a clear reason by looking at the entry without following it.
fn classify(dir: &Dir, name: &str, path: &WorkspacePath, e: io::Error) -> ConfineError {
    match dir.symlink_metadata(name) {
        Ok(meta) if meta.file_type().is_symlink() => ConfineError::Symlink(path.clone()),
        // A file where a folder was expected: nothing can be beneath it.
        Ok(meta) if meta.is_file() && e.raw_os_error() == Some(libc::ENOTDIR) => {
            ConfineError::NotFound(path.clone())
        }
        Ok(meta) if !meta.is_file() && !meta.is_dir() => ConfineError::NotRegular(path.clone()),
        Err(m) if m.kind() == io::ErrorKind::NotFound => ConfineError::NotFound(path.clone()),
        _ if e.kind() == io::ErrorKind::NotFound => ConfineError::NotFound(path.clone()),
        _ => io_err(path, e),
    }
}

fn io_err(path: &WorkspacePath, source: io::Error) -> ConfineError {
    ConfineError::Io {
        path: path.clone(),
        source,
    }
}

/// Keeps a generated temporary name within `NAME_MAX`.
fn truncate_name(name: &str) -> String {
    if name.len() <= 255 {
        return name.to_owned();
    }
    let cut = name.len() - 255;
    let mut keep_from = cut;
    while !name.is_char_boundary(keep_from) {
        keep_from += 1;
    }
    format!(".{}", &name[keep_from + 1..])
}

/// The parts of the workspace one chat may touch:
/// `chats/<chat_id>/**` (read and write) and `surfaces/matrix/*/<room>/{inbox,outbox}/**` (read).
#[derive(Debug, Clone)]
pub struct ChatScope {
    chat: ChatId,
    own: WorkspacePath,
    room_component: Option<String>,
}

impl ChatScope {
    /// The scope of `chat`, whose Matrix room is `room_id` (unknown before its first turn).
    pub fn new(chat: ChatId, room_id: Option<&str>) -> Self {
        Self {
            own: chat_dir(&chat),
            chat,
            room_component: room_id.map(matrix_id_component),
        }
    }

    /// The chat.
    pub fn chat(&self) -> &ChatId {
        &self.chat
    }

    /// `chats/<chat_id>`: the chat's own folder.
    pub fn own_dir(&self) -> &WorkspacePath {
        &self.own
    }

    /// The folder component of the chat's room, if known.
    pub fn room_component(&self) -> Option<&str> {
        self.room_component.as_deref()
    }

    /// Whether the chat may read `path`.
    pub fn may_read(&self, path: &WorkspacePath) -> bool {
        if path.starts_with(&self.own) && path != &self.own {
            return true;
        }
        let Some(room) = &self.room_component else {
            return false;
        };
        let parts: Vec<&str> = path.components().collect();
        matches!(
            parts.as_slice(),
            ["surfaces", "matrix", _user, r, "inbox" | "outbox", _, ..] if r == room
        )
    }

    /// Whether the chat may write `path` (only below its own folder).
    pub fn may_write(&self, path: &WorkspacePath) -> bool {
        path.starts_with(&self.own) && path != &self.own
    }
}

/// A [`Workspace`] seen through one chat's [`ChatScope`]: what tools get.
#[derive(Debug, Clone)]
pub struct ScopedWorkspace {
    /// The workspace.
    pub workspace: Workspace,
    /// The chat's scope.
    pub scope: ChatScope,
}

/// Most entries `list_files` reports.
pub const MAX_LIST_ENTRIES: usize = 500;

impl ScopedWorkspace {
    /// Opens a file the chat may read; anything outside the scope is "not found".
    pub fn open_file(&self, path: &WorkspacePath) -> Result<ConfinedFile, ConfineError> {
        if !self.scope.may_read(path) {
            return Err(ConfineError::NotFound(path.clone()));
        }
        self.workspace.open_file(path)
    }

    /// Reads at most `limit` bytes of a file the chat may read.
    pub fn read_prefix(
        &self,
        path: &WorkspacePath,
        limit: u64,
    ) -> Result<(Vec<u8>, bool), ConfineError> {
        if !self.scope.may_read(path) {
            return Err(ConfineError::NotFound(path.clone()));
        }
        self.workspace.read_prefix(path, limit)
    }

    /// Writes a file below the chat's own folder.
    pub fn write_file(&self, path: &WorkspacePath, contents: &[u8]) -> Result<(), ConfineError> {
        if !self.scope.may_write(path) {
            return Err(ConfineError::NotWritable {
                path: path.clone(),
                own: self.scope.own_dir().clone(),
            });
        }
        self.workspace.write_file(path, contents)
    }

    /// Every file the chat may read: its own folder, then its room's inboxes and outboxes.
    pub fn list_files(&self) -> Vec<FileEntry> {
        let mut out = self
            .workspace
            .list_files(self.scope.own_dir(), MAX_LIST_ENTRIES)
            .unwrap_or_default();
        if let Some(room) = self.scope.room_component() {
            let users = protocol::surface_root();
            for user in self.workspace.subdirs(&users) {
                for box_name in ["inbox", "outbox"] {
                    let Ok(dir) = users.join(&format!("{user}/{room}/{box_name}")) else {
                        continue;
                    };
                    let left = MAX_LIST_ENTRIES.saturating_sub(out.len());
                    out.extend(self.workspace.list_files(&dir, left).unwrap_or_default());
                }
            }
        }
        out
    }

    /// Files below `dir` (which must be inside the scope or the chat's own folder itself).
    pub fn list_dir(&self, dir: &WorkspacePath) -> Result<Vec<FileEntry>, ConfineError> {
        let probe = dir.join("x").map_err(|reason| ConfineError::InvalidPath {
            input: dir.to_string(),
            reason,
        })?;
        if !self.scope.may_read(&probe) {
            return Err(ConfineError::NotFound(dir.clone()));
        }
        self.workspace.list_files(dir, MAX_LIST_ENTRIES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> WorkspacePath {
        WorkspacePath::new(s).unwrap()
    }

    #[test]
    fn scope_table() {
        let chat = ChatId::new("room1-r-abc").unwrap();
        let room = "!room1:hs";
        let rc = matrix_id_component(room);
        let scope = ChatScope::new(chat, Some(room));
        let cases = [
            ("chats/room1-r-abc/a.txt", true, true),
            ("chats/room1-r-abc/sub/a.txt", true, true),
            ("chats/room1-r-abc", false, false),
            ("chats/room1-r-abcd/a.txt", false, false),
            ("chats/other/a.txt", false, false),
            (
                &format!("surfaces/matrix/@u%3Ahs/{rc}/inbox/f.png"),
                true,
                false,
            ),
            (
                &format!("surfaces/matrix/@v%3Ahs/{rc}/outbox/f.png"),
                true,
                false,
            ),
            (&format!("surfaces/matrix/@u%3Ahs/{rc}/inbox"), false, false),
            (
                &format!("surfaces/matrix/@u%3Ahs/{rc}/other/f"),
                false,
                false,
            ),
            (
                "surfaces/matrix/@u%3Ahs/!other%3Ahs/inbox/f.png",
                false,
                false,
            ),
            ("surfaces/matrix/.sentinel/x", false, false),
            ("etc/passwd", false, false),
        ];
        for (path, read, write) in cases {
            assert_eq!(scope.may_read(&p(path)), read, "read {path}");
            assert_eq!(scope.may_write(&p(path)), write, "write {path}");
        }
        let no_room = ChatScope::new(ChatId::new("c").unwrap(), None);
        assert!(!no_room.may_read(&p(&format!("surfaces/matrix/@u%3Ahs/{rc}/inbox/f"))));
    }

    #[test]
    fn parse_path_reasons() {
        assert!(matches!(
            parse_path("/etc/passwd"),
            Err(ConfineError::InvalidPath {
                reason: WorkspacePathError::Absolute,
                ..
            })
        ));
        let e = parse_path("chats/../x").unwrap_err().to_string();
        assert!(e.contains("`..`"), "{e}");
    }

    #[test]
    fn write_then_open_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(dir.path(), 1024).unwrap();
        ws.write_file(&p("chats/c/sub/a.txt"), b"hello").unwrap();
        ws.write_file(&p("chats/c/sub/a.txt"), b"hello again")
            .unwrap();
        let (bytes, cut) = ws.read_prefix(&p("chats/c/sub/a.txt"), 5).unwrap();
        assert_eq!((bytes.as_slice(), cut), (&b"hello"[..], true));
        let listed = ws.list_files(&p("chats/c"), 10).unwrap();
        assert_eq!(
            listed,
            vec![FileEntry {
                path: p("chats/c/sub/a.txt"),
                size: 11
            }]
        );
        // No temporary file left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path().join("chats/c/sub"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1);
        std::fs::write(dir.path().join("big"), vec![0u8; 2000]).unwrap();
        assert!(matches!(
            ws.open_file(&p("big")),
            Err(ConfineError::TooLarge { size: 2000, .. })
        ));
    }
}
