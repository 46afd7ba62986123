//! `agent import-state`: moves a state directory (chat logs and memory, as agents without a
//! database keep them) into the database of `AGENT_DATABASE_URL`. Each chat and each memory
//! scope is one transaction; run it again and what is already there is skipped, and what the
//! database holds differently (newer data) is never overwritten: it is reported, and the
//! command exits 1. The state directory is only read (an older single-record chat is converted
//! to a log first, as an agent would on load).

use std::path::{Path, PathBuf};

use protocol::ChatId;

use crate::db::{Database, DatabaseConfig, DbError, Imported};
use crate::memory::FileMemory;
use crate::store::{PgChats, Store};

/// What the import did: one line per refusal and the totals.
#[derive(Debug, Default)]
pub struct Report {
    /// Chats stored, already there, refused.
    pub chats: [usize; 3],
    /// Turns stored.
    pub turns: usize,
    /// Memory scopes stored, already there, refused.
    pub scopes: [usize; 3],
    /// Facts stored.
    pub facts: usize,
    /// Why each refused chat or scope was refused.
    pub refusals: Vec<String>,
}

impl Report {
    /// The lines the command prints.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = self.refusals.clone();
        lines.push(format!(
            "chats: {} imported ({} turns), {} already there, {} refused",
            self.chats[0], self.turns, self.chats[1], self.chats[2]
        ));
        lines.push(format!(
            "memory: {} scopes imported ({} facts), {} already there, {} refused",
            self.scopes[0], self.facts, self.scopes[1], self.scopes[2]
        ));
        lines
    }

    fn count(totals: &mut [usize; 3], outcome: &Imported) {
        let i = match outcome {
            Imported::New => 0,
            Imported::Already => 1,
            Imported::Refused(_) => 2,
        };
        totals[i] += 1;
    }
}

/// Why the import could not run at all.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// A setting is missing or wrong.
    #[error("{0}")]
    Setting(String),
    /// The database cannot be used.
    #[error(transparent)]
    Database(#[from] DbError),
    /// The state directory cannot be read.
    #[error("AGENT_STATE_DIR: {0}")]
    State(String),
}

/// Runs the command with the settings of `get`.
pub async fn run(get: impl Fn(&str) -> Option<String>) -> Result<Report, ImportError> {
    let Some(url) = get("AGENT_DATABASE_URL").filter(|u| !u.trim().is_empty()) else {
        return Err(ImportError::Setting(
            "AGENT_DATABASE_URL (or AGENT_DATABASE_URL_FILE) names the database to import into"
                .to_owned(),
        ));
    };
    let state_dir =
        PathBuf::from(get("AGENT_STATE_DIR").unwrap_or_else(|| "/var/lib/agent".into()));
    if !state_dir.is_dir() {
        return Err(ImportError::State(format!(
            "{} is not a folder",
            state_dir.display()
        )));
    }
    let db = Database::open(&DatabaseConfig::new(protocol::Secret::new(url.trim()), 2)).await?;
    import_state(&state_dir, &db).await
}

/// Imports the chats and the memory of `state_dir` into `db`.
pub async fn import_state(state_dir: &Path, db: &Database) -> Result<Report, ImportError> {
    let mut report = Report::default();
    let state = |e: &dyn std::fmt::Display| ImportError::State(e.to_string());
    let store = Store::open(state_dir).map_err(|e| state(&e))?;
    let chats = PgChats::new(db.clone());
    for id in chat_ids(&state_dir.join("chats")).map_err(|e| state(&e))? {
        let log = store.load(&id).map_err(|e| state(&e))?;
        let exported = log.export().await.map_err(|e| state(&e))?;
        let outcome = chats
            .import(&id, &exported)
            .await
            .map_err(|e| ImportError::Database(DbError::Connect(e.to_string())))?;
        if outcome == Imported::New {
            report.turns += exported.turns.len();
        }
        if let Imported::Refused(why) = &outcome {
            report
                .refusals
                .push(format!("chat {id}: not imported: {why}"));
        }
        Report::count(&mut report.chats, &outcome);
    }
    let memory = FileMemory::open(state_dir).map_err(|e| state(&e))?;
    let pg = crate::memory::PgMemory::new(db.clone());
    for (scope, next, facts) in memory.all().map_err(|e| state(&e))? {
        let outcome = pg
            .import(&scope, next, &facts)
            .await
            .map_err(|e| ImportError::Database(DbError::Connect(e.to_string())))?;
        if outcome == Imported::New {
            report.facts += facts.len();
        }
        if let Imported::Refused(why) = &outcome {
            report
                .refusals
                .push(format!("memory of {}: not imported: {why}", scope.id()));
        }
        Report::count(&mut report.scopes, &outcome);
    }
    Ok(report)
}

/// The chats with a log (`<id>.jsonl`) or an older record (`<id>.json`) in `dir`, sorted.
fn chat_ids(dir: &Path) -> std::io::Result<Vec<ChatId>> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        let stem = name
            .strip_suffix(".jsonl")
            .or_else(|| name.strip_suffix(".json"));
        if let Some(id) = stem.and_then(|s| ChatId::new(s).ok()) {
            ids.push(id);
        }
    }
    ids.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    ids.dedup();
    Ok(ids)
}
