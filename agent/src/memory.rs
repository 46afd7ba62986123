//! The agent's durable memory: short facts people asked it to remember, kept per Matrix user
//! and per Matrix room: in PostgreSQL when the agent has a database (`pg`), otherwise under
//! `<state dir>/memory/`, one JSON file per [`Scope`] (`files`), as described here.
//!
//! A scope's file is named by the SHA-256 of its kind and id (never the raw Matrix id, which
//! is not a safe file name) and names its scope inside, so a file is never read for another
//! scope. Every change rewrites the file atomically (temporary file, fsync, rename, fsync the
//! folder) under the scope's lock, so concurrent turns in different chats that touch the same
//! user's memory cannot lose each other's facts. A file that cannot be read is reported, never
//! overwritten.
//!
//! Fact ids are short and stable: `u<n>` in a user's memory, `r<n>` in a room's, numbered per
//! scope and never reused after a fact is forgotten.

mod files;
mod pg;
#[cfg(test)]
pub(crate) mod suite;

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use self::files::FileMemory;
pub use self::pg::PgMemory;
use crate::db::Database;

/// Version of a scope file's format, bumped on incompatible changes.
pub const FORMAT_VERSION: u32 = 1;

/// Longest fact, in characters.
pub const MAX_FACT_CHARS: usize = 1000;

/// Most facts one scope holds; remembering more is refused until some are forgotten.
pub const MAX_FACTS: usize = 200;

/// Longest unknown id quoted back in an error.
const MAX_ID_ECHO: usize = 40;

/// Whose memory a fact is in.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Scope {
    /// A Matrix user's own facts (by user id); only turns that user starts see them.
    User(String),
    /// A Matrix room's facts (by room id); every chat of the room, threads included, sees them.
    Room(String),
}

/// The kind of a [`Scope`], as stored and as fact ids show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScopeKind {
    /// [`Scope::User`]; ids start with `u`.
    User,
    /// [`Scope::Room`]; ids start with `r`.
    Room,
}

impl ScopeKind {
    /// The letter the scope's fact ids start with.
    fn id_prefix(self) -> char {
        match self {
            Self::User => 'u',
            Self::Room => 'r',
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::User => "user",
            Self::Room => "room",
        }
    }
}

impl Scope {
    /// Its kind.
    pub fn kind(&self) -> ScopeKind {
        match self {
            Self::User(_) => ScopeKind::User,
            Self::Room(_) => ScopeKind::Room,
        }
    }

    /// The Matrix user or room id.
    pub fn id(&self) -> &str {
        match self {
            Self::User(id) | Self::Room(id) => id,
        }
    }

    /// The scope's file name: hex SHA-256 of the kind, a newline and the id. The kind never
    /// contains a newline, so different scopes hash different inputs.
    pub fn file_name(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update(self.kind().as_str().as_bytes());
        hasher.update(b"\n");
        hasher.update(self.id().as_bytes());
        format!("{}.json", hex::encode(hasher.finalize()))
    }
}

/// One remembered fact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fact {
    /// Stable id within its scope (`u3`, `r1`).
    pub id: String,
    /// The fact: one line of at most [`MAX_FACT_CHARS`] characters, trimmed.
    pub text: String,
    /// When it was remembered, ms since the epoch.
    pub created_ms: u64,
}

/// What [`Memory::remember`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Remembered {
    /// Stored as a new fact with this id.
    New(String),
    /// The scope already held the same text, under this id; nothing changed.
    Already(String),
}

/// Why a memory operation failed.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// The fact is empty or only whitespace.
    #[error("the fact is empty")]
    Empty,
    /// The fact is longer than [`MAX_FACT_CHARS`].
    #[error("the fact is {chars} characters long; at most {MAX_FACT_CHARS} are allowed")]
    TooLong {
        /// Its length in characters.
        chars: usize,
    },
    /// The fact contains a control character (a line break included).
    #[error("the fact contains a control character; it must be one line of text")]
    ControlCharacter,
    /// The scope already holds [`MAX_FACTS`] facts.
    #[error("this memory already holds {MAX_FACTS} facts; forget some first")]
    Full,
    /// No fact of the scope has this id (cut to a few characters).
    #[error("no remembered fact has the id {0:?}")]
    UnknownId(String),
    /// Reading or writing the memory folder failed.
    #[error("memory i/o on {path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The database failed (its message, never the URL).
    #[error("memory database: {0}")]
    Database(String),
    /// A scope file is unreadable, too large, of a newer format or for another scope.
    #[error("corrupt memory file {path}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl MemoryError {
    /// Whether the request itself was refused (its message is for the person or model who
    /// made it), rather than the store failing (its message names files and is only logged).
    pub fn is_refusal(&self) -> bool {
        !matches!(
            self,
            Self::Io { .. } | Self::Corrupt { .. } | Self::Database(_)
        )
    }
}

/// Checks a fact and returns it trimmed.
pub fn validate_fact(text: &str) -> Result<&str, MemoryError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(MemoryError::Empty);
    }
    let chars = text.chars().count();
    if chars > MAX_FACT_CHARS {
        return Err(MemoryError::TooLong { chars });
    }
    if text.chars().any(char::is_control) {
        return Err(MemoryError::ControlCharacter);
    }
    Ok(text)
}

/// The scope kind and number of a fact id (`u3`, `r12`); `None` if it is not one.
pub fn parse_id(id: &str) -> Option<(ScopeKind, u64)> {
    let mut chars = id.chars();
    let kind = match chars.next()? {
        'u' => ScopeKind::User,
        'r' => ScopeKind::Room,
        _ => return None,
    };
    let digits = chars.as_str();
    if digits.is_empty()
        || digits.len() > 18
        || digits.starts_with('0')
        || !digits.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    digits.parse().ok().map(|n| (kind, n))
}

/// Whether `fact` matches a recall query: a case-insensitive substring; a blank query matches
/// everything.
pub fn matches(fact: &str, query: &str) -> bool {
    let query = query.trim();
    query.is_empty() || fact.to_lowercase().contains(&query.to_lowercase())
}

pub(crate) fn unknown_id(id: &str) -> MemoryError {
    MemoryError::UnknownId(id.chars().take(MAX_ID_ECHO).collect())
}

/// The memory, wherever it is kept. Cheap to clone; clones share the file backend's locks.
#[derive(Debug, Clone)]
pub enum Memory {
    /// One file per scope in the state directory.
    Files(FileMemory),
    /// Rows in PostgreSQL, shared by every agent of a deployment.
    Postgres(PgMemory),
}

impl Memory {
    /// The memory in `memory/` of the state directory (created if needed).
    pub fn open(state_dir: &Path) -> Result<Self, MemoryError> {
        FileMemory::open(state_dir).map(Self::Files)
    }

    /// The memory in the database `db`.
    pub fn postgres(db: Database) -> Self {
        Self::Postgres(PgMemory::new(db))
    }

    /// The facts of `scope`, oldest first.
    pub async fn facts(&self, scope: &Scope) -> Result<Vec<Fact>, MemoryError> {
        match self {
            Self::Files(m) => {
                let (m, scope) = (m.clone(), scope.clone());
                blocking(move || m.facts(&scope)).await
            }
            Self::Postgres(m) => m.facts(scope).await,
        }
    }

    /// Remembers `text` (validated and trimmed first) in `scope`.
    pub async fn remember(&self, scope: &Scope, text: &str) -> Result<Remembered, MemoryError> {
        match self {
            Self::Files(m) => {
                let (m, scope, text) = (m.clone(), scope.clone(), text.to_owned());
                blocking(move || m.remember(&scope, &text)).await
            }
            Self::Postgres(m) => m.remember(scope, text).await,
        }
    }

    /// Forgets the fact `id` of `scope` and returns it.
    pub async fn forget(&self, scope: &Scope, id: &str) -> Result<Fact, MemoryError> {
        match parse_id(id) {
            Some((kind, _)) if kind == scope.kind() => {}
            _ => return Err(unknown_id(id)),
        }
        match self {
            Self::Files(m) => {
                let (m, scope, id) = (m.clone(), scope.clone(), id.to_owned());
                blocking(move || m.forget(&scope, &id)).await
            }
            Self::Postgres(m) => m.forget(scope, id).await,
        }
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, MemoryError> + Send + 'static,
) -> Result<T, MemoryError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(MemoryError::Database(format!("memory task failed: {e}"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALICE: &str = "@alice:example.org";

    #[test]
    fn validate_fact_table() {
        let long = "x".repeat(MAX_FACT_CHARS);
        let too_long = "é".repeat(MAX_FACT_CHARS + 1);
        let cases: &[(&str, Result<&str, &str>)] = &[
            ("I like green tea", Ok("I like green tea")),
            ("  padded\t ", Ok("padded")),
            ("ünïcödé ✓", Ok("ünïcödé ✓")),
            (&long, Ok(&long)),
            ("", Err("the fact is empty")),
            (" \t\n ", Err("the fact is empty")),
            (&too_long, Err("the fact is 1001 characters long")),
            ("two\nlines", Err("control character")),
            ("bell\u{7}", Err("control character")),
            ("esc\u{1b}[31m", Err("control character")),
            ("nul\0", Err("control character")),
            ("c1\u{85}x", Err("control character")),
        ];
        for (input, expected) in cases {
            match (validate_fact(input), expected) {
                (Ok(got), Ok(want)) => assert_eq!(got, *want, "{input:?}"),
                (Err(e), Err(want)) => assert!(e.to_string().contains(want), "{input:?}: {e}"),
                (got, want) => panic!("{input:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn parse_id_table() {
        let cases = [
            ("u1", Some((ScopeKind::User, 1))),
            ("r42", Some((ScopeKind::Room, 42))),
            (
                "u999999999999999999",
                Some((ScopeKind::User, 999_999_999_999_999_999)),
            ),
            ("u9999999999999999999", None),
            ("u", None),
            ("u0", None),
            ("u01", None),
            ("m1", None),
            ("U1", None),
            ("u1 ", None),
            ("u-1", None),
            ("u+1", None),
            ("r1x", None),
            ("u١", None),
            ("", None),
        ];
        for (input, expected) in cases {
            assert_eq!(parse_id(input), expected, "{input:?}");
        }
    }

    #[test]
    fn matches_table() {
        let cases = [
            ("I like Green Tea", "green tea", true),
            ("I like Green Tea", "GREEN", true),
            ("I like Green Tea", "", true),
            ("I like Green Tea", "   ", true),
            ("I like Green Tea", " tea ", true),
            ("I like Green Tea", "coffee", false),
            ("Straße", "STRASSE", false),
            ("ÜBER", "über", true),
        ];
        for (fact, query, expected) in cases {
            assert_eq!(matches(fact, query), expected, "{fact:?} / {query:?}");
        }
    }

    #[test]
    fn file_names_are_hashes_and_tell_scopes_apart() {
        let user = Scope::User(ALICE.to_owned());
        let room = Scope::Room(ALICE.to_owned());
        let name = user.file_name();
        assert_eq!(name.len(), 64 + ".json".len());
        assert!(
            name.trim_end_matches(".json")
                .bytes()
                .all(|b| b.is_ascii_hexdigit())
        );
        assert_ne!(name, room.file_name());
        assert_ne!(name, Scope::User("@alice:example.org2".into()).file_name());
        assert_eq!(
            Scope::User("../../etc/passwd".into()).file_name().len(),
            name.len()
        );
    }
}
