//! The memory in the state directory: one JSON file per [`Scope`], named by a hash of it and
//! replaced atomically under the scope's lock (see the module docs of `memory`).

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::{
    FORMAT_VERSION, Fact, MAX_FACTS, MemoryError, Remembered, Scope, ScopeKind, parse_id,
    unknown_id, validate_fact,
};

/// Largest scope file read: well above [`MAX_FACTS`] facts of [`super::MAX_FACT_CHARS`]
/// characters, so a bigger file was not written by the agent.
const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

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

/// The memory folder. Cheap to clone; clones share the scope locks.
#[derive(Debug, Clone)]
pub struct FileMemory {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    dir: PathBuf,
    /// One lock per scope being changed; entries nobody holds are dropped on the next lookup,
    /// so the map stays as small as the number of concurrent changes.
    locks: Mutex<HashMap<Scope, Arc<Mutex<()>>>>,
}

impl FileMemory {
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

    /// Every scope in the folder with its next fact number and its facts (for
    /// `agent import-state`); a file that cannot be read fails the whole listing.
    pub fn all(&self) -> Result<Vec<(Scope, u64, Vec<Fact>)>, MemoryError> {
        let dir = &self.inner.dir;
        let entries = std::fs::read_dir(dir).map_err(|source| MemoryError::Io {
            path: dir.clone(),
            source,
        })?;
        let mut all = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| MemoryError::Io {
                path: dir.clone(),
                source,
            })?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || !name.ends_with(".json") {
                continue;
            }
            let probe: ScopeFile = {
                let bytes = std::fs::read(entry.path()).map_err(|source| MemoryError::Io {
                    path: entry.path(),
                    source,
                })?;
                serde_json::from_slice(&bytes).map_err(|e| MemoryError::Corrupt {
                    path: entry.path(),
                    reason: e.to_string(),
                })?
            };
            let scope = match probe.kind {
                ScopeKind::User => Scope::User(probe.owner),
                ScopeKind::Room => Scope::Room(probe.owner),
            };
            if scope.file_name() != name {
                return Err(MemoryError::Corrupt {
                    path: entry.path(),
                    reason: "it belongs to another scope".to_owned(),
                });
            }
            // Read again through the checks every load makes (version, owner, size).
            let file = self.load(&scope)?;
            all.push((scope, file.next, file.facts));
        }
        Ok(all)
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
    fn facts_persist_and_are_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let alice = Scope::User(ALICE.into());
        let room = Scope::Room("!room:example.org".into());
        {
            let memory = FileMemory::open(dir.path()).unwrap();
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
        let memory = FileMemory::open(dir.path()).unwrap();
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
        let memory = FileMemory::open(dir.path()).unwrap();
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
        let memory = FileMemory::open(dir.path()).unwrap();
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
