//! The agent's durable memory: short facts people asked it to remember, kept per Matrix user
//! and per Matrix room under `<state dir>/memory/`, one JSON file per [`Scope`].
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

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Version of a scope file's format, bumped on incompatible changes.
pub const FORMAT_VERSION: u32 = 1;

/// Longest fact, in characters.
pub const MAX_FACT_CHARS: usize = 1000;

/// Most facts one scope holds; remembering more is refused until some are forgotten.
pub const MAX_FACTS: usize = 200;

/// Largest scope file read: well above [`MAX_FACTS`] facts of [`MAX_FACT_CHARS`] characters,
/// so a bigger file was not written by the agent.
const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

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
        !matches!(self, Self::Io { .. } | Self::Corrupt { .. })
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

/// One scope's file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct ScopeFile {
    version: u32,
    kind: ScopeKind,
    /// The Matrix user or room id.
    owner: String,
    /// Number of the next fact's id.
    next: u64,
    facts: Vec<Fact>,
}

impl ScopeFile {
    fn empty(scope: &Scope) -> Self {
        Self {
            version: FORMAT_VERSION,
            kind: scope.kind(),
            owner: scope.id().to_owned(),
            next: 1,
            facts: Vec::new(),
        }
    }

    /// Adds a fact (already validated), or finds the same text already there.
    fn add(&mut self, text: &str, now_ms: u64) -> Result<Remembered, MemoryError> {
        if let Some(f) = self.facts.iter().find(|f| f.text == text) {
            return Ok(Remembered::Already(f.id.clone()));
        }
        if self.facts.len() >= MAX_FACTS {
            return Err(MemoryError::Full);
        }
        // Never reuse a number, even one a hand-edited file skipped ahead of `next`.
        let highest = self
            .facts
            .iter()
            .filter_map(|f| parse_id(&f.id).map(|(_, n)| n))
            .max()
            .unwrap_or(0);
        let n = self.next.max(highest.saturating_add(1));
        let id = format!("{}{n}", self.kind.id_prefix());
        self.next = n.saturating_add(1);
        self.facts.push(Fact {
            id: id.clone(),
            text: text.to_owned(),
            created_ms: now_ms,
        });
        Ok(Remembered::New(id))
    }

    /// Removes the fact `id`.
    fn remove(&mut self, id: &str) -> Result<Fact, MemoryError> {
        let at = self
            .facts
            .iter()
            .position(|f| f.id == id)
            .ok_or_else(|| unknown_id(id))?;
        Ok(self.facts.remove(at))
    }
}

fn unknown_id(id: &str) -> MemoryError {
    MemoryError::UnknownId(id.chars().take(MAX_ID_ECHO).collect())
}

/// The memory folder. Cheap to clone; clones share the scope locks.
#[derive(Debug, Clone)]
pub struct Memory {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    /// One lock per scope being changed; entries nobody holds are dropped on the next lookup,
    /// so the map stays as small as the number of concurrent changes.
    locks: Mutex<HashMap<Scope, Arc<Mutex<()>>>>,
}

impl Memory {
    /// Opens (creating if needed) `memory/` in the state directory.
    pub fn open(state_dir: &Path) -> Result<Self, MemoryError> {
        let dir = state_dir.join("memory");
        std::fs::create_dir_all(&dir).map_err(|source| MemoryError::Io {
            path: dir.clone(),
            source,
        })?;
        Ok(Self {
            inner: Arc::new(Inner {
                dir,
                locks: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// The facts of `scope`, oldest first. Blocking I/O.
    pub fn facts(&self, scope: &Scope) -> Result<Vec<Fact>, MemoryError> {
        Ok(self.load(scope)?.facts)
    }

    /// Remembers `text` (validated and trimmed first) in `scope`. Blocking I/O.
    pub fn remember(&self, scope: &Scope, text: &str) -> Result<Remembered, MemoryError> {
        let text = validate_fact(text)?;
        let lock = self.lock_for(scope);
        let _held = lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut file = self.load(scope)?;
        let outcome = file.add(text, daemon::now_ms())?;
        if matches!(outcome, Remembered::New(_)) {
            self.save(scope, &file)?;
        }
        Ok(outcome)
    }

    /// Forgets the fact `id` of `scope` and returns it. Blocking I/O.
    pub fn forget(&self, scope: &Scope, id: &str) -> Result<Fact, MemoryError> {
        match parse_id(id) {
            Some((kind, _)) if kind == scope.kind() => {}
            _ => return Err(unknown_id(id)),
        }
        let lock = self.lock_for(scope);
        let _held = lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut file = self.load(scope)?;
        let fact = file.remove(id)?;
        self.save(scope, &file)?;
        Ok(fact)
    }

    fn lock_for(&self, scope: &Scope) -> Arc<Mutex<()>> {
        let mut locks = self.inner.locks.lock().unwrap_or_else(|e| e.into_inner());
        locks.retain(|_, lock| Arc::strong_count(lock) > 1);
        locks.entry(scope.clone()).or_default().clone()
    }

    fn path(&self, scope: &Scope) -> PathBuf {
        self.inner.dir.join(scope.file_name())
    }

    /// The scope's file; an empty one if it does not exist yet.
    fn load(&self, scope: &Scope) -> Result<ScopeFile, MemoryError> {
        let path = self.path(scope);
        let io_error = |source| MemoryError::Io {
            path: path.clone(),
            source,
        };
        let corrupt = |reason: String| MemoryError::Corrupt {
            path: path.clone(),
            reason,
        };
        let file = match File::open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(ScopeFile::empty(scope)),
            Err(e) => return Err(io_error(e)),
        };
        let mut bytes = Vec::new();
        file.take(MAX_FILE_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(io_error)?;
        if bytes.len() as u64 > MAX_FILE_BYTES {
            return Err(corrupt(format!("larger than {MAX_FILE_BYTES} bytes")));
        }
        let stored: ScopeFile =
            serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
        if stored.version > FORMAT_VERSION {
            return Err(corrupt(format!(
                "format version {} is newer than {FORMAT_VERSION}",
                stored.version
            )));
        }
        if stored.kind != scope.kind() || stored.owner != scope.id() {
            return Err(corrupt("it belongs to another scope".to_owned()));
        }
        Ok(stored)
    }

    /// Replaces the scope's file atomically and durably.
    fn save(&self, scope: &Scope, file: &ScopeFile) -> Result<(), MemoryError> {
        let dir = &self.inner.dir;
        let name = scope.file_name();
        let path = dir.join(&name);
        let mut bytes = serde_json::to_vec(file).map_err(|e| MemoryError::Io {
            path: path.clone(),
            source: io::Error::other(e),
        })?;
        bytes.push(b'\n');
        let tmp = dir.join(format!(".{name}.tmp-{:016x}", rand::random::<u64>()));
        let result = (|| {
            let mut out = File::options().write(true).create_new(true).open(&tmp)?;
            out.write_all(&bytes)?;
            out.sync_all()?;
            drop(out);
            std::fs::rename(&tmp, &path)?;
            File::open(dir)?.sync_all()
        })();
        if let Err(source) = result {
            let _ = std::fs::remove_file(&tmp);
            return Err(MemoryError::Io { path, source });
        }
        Ok(())
    }
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

    #[test]
    fn ids_are_per_scope_and_never_reused() {
        let mut file = ScopeFile::empty(&Scope::Room("!r:x".into()));
        assert_eq!(file.add("a", 1).unwrap(), Remembered::New("r1".into()));
        assert_eq!(file.add("b", 2).unwrap(), Remembered::New("r2".into()));
        assert_eq!(file.add("a", 3).unwrap(), Remembered::Already("r1".into()));
        assert_eq!(file.remove("r2").unwrap().text, "b");
        assert_eq!(file.add("c", 4).unwrap(), Remembered::New("r3".into()));
        assert!(matches!(file.remove("r2"), Err(MemoryError::UnknownId(_))));
        // A file whose counter lags behind its facts still never repeats an id.
        file.next = 1;
        assert_eq!(file.add("d", 5).unwrap(), Remembered::New("r4".into()));
    }

    #[test]
    fn a_full_scope_refuses_more() {
        let mut file = ScopeFile::empty(&Scope::User(ALICE.into()));
        for i in 0..MAX_FACTS {
            file.add(&format!("fact {i}"), 0).unwrap();
        }
        let e = file.add("one more", 0).unwrap_err();
        assert!(matches!(e, MemoryError::Full) && e.is_refusal(), "{e}");
        // Restating a known fact is not a new one.
        assert!(matches!(file.add("fact 3", 0), Ok(Remembered::Already(_))));
    }

    #[test]
    fn facts_persist_and_are_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let alice = Scope::User(ALICE.into());
        let room = Scope::Room("!room:example.org".into());
        {
            let memory = Memory::open(dir.path()).unwrap();
            assert!(memory.facts(&alice).unwrap().is_empty());
            assert_eq!(
                memory.remember(&alice, " tea, not coffee ").unwrap(),
                Remembered::New("u1".into())
            );
            memory.remember(&room, "standup at ten").unwrap();
            assert!(matches!(
                memory.remember(&alice, "line\nbreak"),
                Err(MemoryError::ControlCharacter)
            ));
        }
        let memory = Memory::open(dir.path()).unwrap();
        let facts = memory.facts(&alice).unwrap();
        assert_eq!(facts.len(), 1);
        assert_eq!(facts[0].text, "tea, not coffee");
        assert!(facts[0].created_ms > 0);
        // An id of the other scope's kind is unknown here, even if that scope has it.
        assert!(matches!(
            memory.forget(&alice, "r1"),
            Err(MemoryError::UnknownId(_))
        ));
        assert_eq!(memory.forget(&room, "r1").unwrap().text, "standup at ten");
        assert!(memory.facts(&room).unwrap().is_empty());
        let names: Vec<String> = std::fs::read_dir(dir.path().join("memory"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(
            names
                .iter()
                .all(|n| !n.contains("alice") && !n.starts_with('.'))
        );
    }

    #[test]
    fn unreadable_or_foreign_files_are_reported_not_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let memory = Memory::open(dir.path()).unwrap();
        let alice = Scope::User(ALICE.into());
        let bob = Scope::User("@bob:example.org".into());
        let path = dir.path().join("memory").join(alice.file_name());
        std::fs::write(&path, b"{ not json").unwrap();
        let e = memory.remember(&alice, "x").unwrap_err();
        assert!(
            matches!(e, MemoryError::Corrupt { .. }) && !e.is_refusal(),
            "{e}"
        );
        assert_eq!(std::fs::read(&path).unwrap(), b"{ not json");

        // Bob's file copied over Alice's name is not read as Alice's.
        memory.remember(&bob, "bob's secret").unwrap();
        let bobs = dir.path().join("memory").join(bob.file_name());
        std::fs::copy(&bobs, &path).unwrap();
        assert!(matches!(
            memory.facts(&alice),
            Err(MemoryError::Corrupt { .. })
        ));
    }

    #[test]
    fn concurrent_changes_to_one_scope_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let memory = Memory::open(dir.path()).unwrap();
        let alice = Scope::User(ALICE.into());
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let memory = memory.clone();
                let alice = alice.clone();
                std::thread::spawn(move || {
                    for i in 0..5 {
                        memory.remember(&alice, &format!("fact {t}-{i}")).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let facts = memory.facts(&alice).unwrap();
        assert_eq!(facts.len(), 40);
        let mut ids: Vec<_> = facts.iter().map(|f| f.id.clone()).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 40);
        assert!(memory.inner.locks.lock().unwrap().len() <= 1);
    }
}
