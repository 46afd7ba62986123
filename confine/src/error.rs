//! Why a workspace path could not be reached, with classifiers for callers that only need the kind.

use std::io;

use protocol::{WorkspacePath, WorkspacePathError};

/// Why a workspace path could not be used. The messages are meant for a model and its user:
/// they name the workspace-relative path and never an absolute host path.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    /// Missing, or outside what this chat may reach (deliberately indistinguishable).
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
    /// The file's links or contents kept changing while it was being opened, so it may have
    /// been swapped for something outside the scope in between.
    #[error("refused: {0} kept changing while it was being opened; try again when it is still")]
    Changing(WorkspacePath),
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
    /// Writing is only allowed below the chat's own `chats/<chat_id>/` folder, and never to an
    /// in-progress download name (`.partial-*`).
    #[error("refused: {path} is not writable: this chat writes only below {own}/")]
    NotWritable {
        /// The path asked for.
        path: WorkspacePath,
        /// The chat's own folder.
        own: WorkspacePath,
    },
    /// Any other I/O failure (permissions, disk errors).
    #[error("could not access {path}: {source}")]
    Io {
        /// The path.
        path: WorkspacePath,
        /// The underlying error (no host path in it: all opens are relative).
        source: io::Error,
    },
}

impl ConfineError {
    /// Whether the path is missing or out of reach (the two look alike on purpose).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound(_))
    }

    /// Whether this is a refusal for safety reasons (as opposed to "not found" or an I/O error).
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            Self::Symlink(_)
                | Self::NotRegular(_)
                | Self::HardLinked(_)
                | Self::Changing(_)
                | Self::TooLarge { .. }
                | Self::InvalidPath { .. }
                | Self::NotWritable { .. }
        )
    }

    /// Whether the operating system refused access (as opposed to a rule of this crate).
    pub fn is_permission_denied(&self) -> bool {
        matches!(self, Self::Io { source, .. } if source.kind() == io::ErrorKind::PermissionDenied)
    }

    pub(crate) fn io(path: &WorkspacePath, source: io::Error) -> Self {
        Self::Io {
            path: path.clone(),
            source,
        }
    }
}

/// For callers whose own errors wrap `io::Error`: an I/O failure passes through unchanged, "not
/// found" keeps its kind, every refusal becomes an `Other` error carrying this one.
impl From<ConfineError> for io::Error {
    fn from(e: ConfineError) -> Self {
        match e {
            ConfineError::Io { source, .. } => source,
            e @ ConfineError::NotFound(_) => io::Error::new(io::ErrorKind::NotFound, e),
            e => io::Error::other(e),
        }
    }
}

/// Parses a path given by a person or a model into a [`WorkspacePath`], with a clear error.
pub fn parse_path(input: &str) -> Result<WorkspacePath, ConfineError> {
    WorkspacePath::new(input).map_err(|reason| ConfineError::InvalidPath {
        input: input.to_owned(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> WorkspacePath {
        WorkspacePath::new(s).unwrap()
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
        for input in ["chats/../x", "..", "chats/x/../../y"] {
            let e = parse_path(input).unwrap_err();
            assert!(e.to_string().contains("`..`"), "{input}: {e}");
        }
        assert_eq!(parse_path("chats/c/a.txt").unwrap(), p("chats/c/a.txt"));
    }

    #[test]
    fn classifiers() {
        let denied = ConfineError::io(&p("a"), io::Error::from(io::ErrorKind::PermissionDenied));
        let cases = [
            (ConfineError::NotFound(p("a")), true, false, false),
            (ConfineError::Symlink(p("a")), false, true, false),
            (ConfineError::HardLinked(p("a")), false, true, false),
            (ConfineError::Changing(p("a")), false, true, false),
            (denied, false, false, true),
        ];
        for (e, not_found, refusal, denied) in cases {
            assert_eq!(e.is_not_found(), not_found, "{e}");
            assert_eq!(e.is_refusal(), refusal, "{e}");
            assert_eq!(e.is_permission_denied(), denied, "{e}");
        }
    }

    #[test]
    fn into_io_error_keeps_the_kind() {
        let e: io::Error = ConfineError::NotFound(p("a")).into();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert_eq!(e.to_string(), "not found: a");
        let e: io::Error = ConfineError::io(&p("a"), io::Error::from_raw_os_error(28)).into();
        assert_eq!(e.raw_os_error(), Some(28));
        let e: io::Error = ConfineError::Symlink(p("a")).into();
        assert_eq!(e.kind(), io::ErrorKind::Other);
        assert!(e.to_string().contains("symbolic link"), "{e}");
    }
}
