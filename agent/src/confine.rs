//! Confinement for tools: every workspace file is opened beneath a directory handle, one
//! component at a time, never following a symlink, and checked on the opened handle.
//!
//! The rule of what a chat reaches ([`ChatScope`]) and the opener are the `confine` crate's,
//! shared with the surface. Here are what only the agent does: atomic writes below the chat's
//! own folder, listings, and [`ScopedWorkspace`], the handle tools get. A path out of reach is
//! reported exactly like a missing file so a chat cannot probe for other chats' or rooms' files.

use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::Arc;

pub use ::confine::{ChatScope, ConfineError, ConfinedFile, parse_path};
use ::confine::{create_parent, open_dir, open_file, open_reachable, open_reachable_as};
use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt};
use cap_std::fs::{Dir, OpenOptions};
use protocol::WorkspacePath;

/// A directory handle on the workspace root. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Workspace {
    root: Arc<Dir>,
    max_file_size: u64,
}

/// One file found by [`Workspace::list_files`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEntry {
    /// Workspace-relative path.
    pub path: WorkspacePath,
    /// Size in bytes.
    pub size: u64,
    /// Last modification, when the file system tells.
    pub modified: Option<std::time::SystemTime>,
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

    /// Opens a regular file for reading with [`confine::open_file`](::confine::open_file), within
    /// the size limit.
    pub fn open_file(&self, path: &WorkspacePath) -> Result<ConfinedFile, ConfineError> {
        open_file(&self.root, path, self.max_file_size)
    }

    /// Reads at most `limit` bytes of a confined file; also returns whether it was cut short.
    pub fn read_prefix(
        &self,
        path: &WorkspacePath,
        limit: u64,
    ) -> Result<(Vec<u8>, bool), ConfineError> {
        read_prefix(self.open_file(path)?, limit)
    }

    /// Writes `contents` to `path` atomically: a temporary file in the same folder, fsync,
    /// rename over the name (which replaces a symlink instead of following it), fsync the folder.
    /// Missing folders are created, never through a symlink.
    pub fn write_file(&self, path: &WorkspacePath, contents: &[u8]) -> Result<(), ConfineError> {
        let (dir, name) = create_parent(&self.root, path)?;
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
            // The root handle may be `O_PATH`; fsync needs a readable descriptor.
            dir.open(".")?.sync_all()
        })();
        if let Err(e) = result {
            let _ = dir.remove_file(&tmp);
            return Err(ConfineError::Io {
                path: path.clone(),
                source: e,
            });
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
        let dir = open_dir(&self.root, path)?;
        let mut out = Vec::new();
        walk(&dir, path, 0, max_entries, &mut out);
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    /// Names of the sub-folders of `path` (no symlinks, no hidden names); empty if it is missing.
    pub fn subdirs(&self, path: &WorkspacePath) -> Vec<String> {
        let Ok(dir) = open_dir(&self.root, path) else {
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

fn read_prefix(opened: ConfinedFile, limit: u64) -> Result<(Vec<u8>, bool), ConfineError> {
    let mut buf = Vec::new();
    (&opened.file)
        .take(limit)
        .read_to_end(&mut buf)
        .map_err(|source| ConfineError::Io {
            path: opened.path.clone(),
            source,
        })?;
    Ok((buf, opened.size > limit))
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
            if let Ok(sub) = ::confine::open_subdir(dir, &name) {
                walk(&sub, &path, depth + 1, max_entries, out);
            }
        } else if kind.is_file()
            && let Ok(meta) = entry.metadata()
        {
            out.push(FileEntry {
                path,
                size: meta.len(),
                modified: meta.modified().ok().map(|t| t.into_std()),
            });
        }
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
    /// Opens a file the chat may read; anything out of its reach is "not found".
    pub fn open_file(&self, path: &WorkspacePath) -> Result<ConfinedFile, ConfineError> {
        open_reachable(
            &self.workspace.root,
            &self.scope,
            path,
            self.workspace.max_file_size,
        )
    }

    /// Opens a file the chat may read that the surface has just sent, by the inode number it
    /// gave (`AttachmentInfo::inode`): that very file opens at once, without waiting for it to
    /// be still (see `confine::open_file_as`); anything else as [`Self::open_file`].
    pub fn open_sent(
        &self,
        path: &WorkspacePath,
        inode: Option<u64>,
    ) -> Result<ConfinedFile, ConfineError> {
        open_reachable_as(
            &self.workspace.root,
            &self.scope,
            path,
            self.workspace.max_file_size,
            inode,
        )
    }

    /// Reads at most `limit` bytes of a file the chat may read.
    pub fn read_prefix(
        &self,
        path: &WorkspacePath,
        limit: u64,
    ) -> Result<(Vec<u8>, bool), ConfineError> {
        read_prefix(self.open_file(path)?, limit)
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
        let mut out = self.list_reachable(self.scope.own_dir(), MAX_LIST_ENTRIES);
        if let Some(room) = self.scope.room_component() {
            let users = protocol::surface_root();
            for user in self.workspace.subdirs(&users) {
                for box_name in ["inbox", "outbox"] {
                    let Ok(dir) = users.join(&format!("{user}/{room}/{box_name}")) else {
                        continue;
                    };
                    let left = MAX_LIST_ENTRIES.saturating_sub(out.len());
                    out.extend(self.list_reachable(&dir, left));
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
        Ok(self.reachable(self.workspace.list_files(dir, MAX_LIST_ENTRIES)?))
    }

    /// The files below `dir` the chat may read; none if it is missing.
    fn list_reachable(&self, dir: &WorkspacePath, max_entries: usize) -> Vec<FileEntry> {
        let listed = self.workspace.list_files(dir, max_entries);
        self.reachable(listed.unwrap_or_default())
    }

    /// Keeps what the scope's rule reaches: a listing never shows what opening would refuse.
    fn reachable(&self, mut entries: Vec<FileEntry>) -> Vec<FileEntry> {
        entries.retain(|e| self.scope.may_read(&e.path));
        entries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> WorkspacePath {
        WorkspacePath::new(s).unwrap()
    }

    #[test]
    fn write_then_list_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspace::open(dir.path(), 1024).unwrap();
        ws.write_file(&p("chats/c/sub/a.txt"), b"hello").unwrap();
        ws.write_file(&p("chats/c/sub/a.txt"), b"hello again")
            .unwrap();
        let (bytes, cut) = ws.read_prefix(&p("chats/c/sub/a.txt"), 5).unwrap();
        assert_eq!((bytes.as_slice(), cut), (&b"hello"[..], true));
        let listed = ws.list_files(&p("chats/c"), 10).unwrap();
        let listed: Vec<_> = listed.into_iter().map(|e| (e.path, e.size)).collect();
        assert_eq!(listed, vec![(p("chats/c/sub/a.txt"), 11)]);
        // No temporary file left behind.
        let names: Vec<_> = std::fs::read_dir(dir.path().join("chats/c/sub"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn partial_download_names_are_not_writable_or_listable() {
        let dir = tempfile::tempdir().unwrap();
        let scoped = ScopedWorkspace {
            workspace: Workspace::open(dir.path(), 1024).unwrap(),
            scope: ChatScope::new(protocol::ChatId::new("c").unwrap(), "!r:hs"),
        };
        let err = scoped
            .write_file(&p("chats/c/.partial-x"), b"x")
            .unwrap_err();
        assert!(matches!(err, ConfineError::NotWritable { .. }), "{err}");
        std::fs::create_dir_all(dir.path().join("chats/c/.partial-x")).unwrap();
        let err = scoped.list_dir(&p("chats/c/.partial-x")).unwrap_err();
        assert!(err.is_not_found(), "{err}");
    }
}
