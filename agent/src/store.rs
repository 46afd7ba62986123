//! Durable per-chat records: one JSON file per chat under the state directory, replaced
//! atomically (temporary file, fsync, rename, fsync of the folder) on every change.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use protocol::{AttachmentInfo, ChatId, ContextMessage, Sender, UserMessage, WorkspacePath};
use serde::{Deserialize, Serialize};

/// Version of the record format, bumped on incompatible changes.
pub const FORMAT_VERSION: u32 = 1;

/// Everything the agent remembers about one chat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRecord {
    /// Format version ([`FORMAT_VERSION`]).
    pub version: u32,
    /// The chat.
    pub chat_id: ChatId,
    /// The Matrix room the chat belongs to (known from its first turn).
    #[serde(default)]
    pub room_id: Option<String>,
    /// The thread root, when the chat is a thread.
    #[serde(default)]
    pub thread_root: Option<String>,
    /// Highest `seq` stored (0 while there are no turns). Messages are identified by id, so
    /// a new id with a lower `seq` is stored too and leaves this unchanged.
    pub last_seq: u64,
    /// Every turn, in arrival order (not necessarily `seq` order).
    pub turns: Vec<TurnRecord>,
    /// `(tool, resource)` pairs the user allowed for good.
    #[serde(default)]
    pub always_allowed: BTreeSet<(String, String)>,
}

/// Where a stored turn stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnStatus {
    /// Stored and acknowledged, not finished yet (runs on the next connection after a crash).
    Pending,
    /// Ran to the end.
    Completed,
    /// Failed.
    Failed,
    /// Cancelled by the user.
    Cancelled,
}

/// One turn: what the user sent and what the agent answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnRecord {
    /// Sequence number given by the surface.
    pub seq: u64,
    /// Message id (Matrix event id); also the turn id.
    pub id: String,
    /// Who sent it.
    pub sender: Sender,
    /// The text.
    pub text: String,
    /// Attachment paths, relative to the workspace.
    #[serde(default)]
    pub attachments: Vec<WorkspacePath>,
    /// What the surface learned while downloading each attachment.
    #[serde(default)]
    pub attachment_info: BTreeMap<WorkspacePath, AttachmentInfo>,
    /// Non-triggering messages that came with the turn.
    #[serde(default)]
    pub context: Vec<ContextMessage>,
    /// Origin server timestamp, ms since the epoch.
    pub timestamp_ms: u64,
    /// Where the turn stands.
    pub status: TurnStatus,
    /// The agent's answer text.
    #[serde(default)]
    pub output: String,
    /// Files the agent sent during the turn.
    #[serde(default)]
    pub sent_files: Vec<WorkspacePath>,
    /// Why it failed, if it did.
    #[serde(default)]
    pub error: Option<String>,
}

impl TurnRecord {
    /// A pending turn from a user message.
    pub fn from_message(m: &UserMessage) -> Self {
        Self {
            seq: m.seq,
            id: m.id.clone(),
            sender: m.sender.clone(),
            text: m.text.clone(),
            attachments: m.attachments.clone(),
            attachment_info: m.attachment_info.clone(),
            context: m.context.clone(),
            timestamp_ms: m.timestamp_ms,
            status: TurnStatus::Pending,
            output: String::new(),
            sent_files: Vec::new(),
            error: None,
        }
    }

    /// Attachments of the turn and of its context messages.
    pub fn all_attachments(&self) -> impl Iterator<Item = &WorkspacePath> {
        self.attachments
            .iter()
            .chain(self.context.iter().flat_map(|c| c.attachments.iter()))
    }
}

impl ChatRecord {
    /// An empty record for a chat never seen before.
    pub fn new(chat_id: ChatId) -> Self {
        Self {
            version: FORMAT_VERSION,
            chat_id,
            room_id: None,
            thread_root: None,
            last_seq: 0,
            turns: Vec::new(),
            always_allowed: BTreeSet::new(),
        }
    }

    /// The turn with this message id.
    pub fn turn(&self, id: &str) -> Option<&TurnRecord> {
        self.turns.iter().find(|t| t.id == id)
    }

    /// Mutable access to the turn with this message id.
    pub fn turn_mut(&mut self, id: &str) -> Option<&mut TurnRecord> {
        self.turns.iter_mut().find(|t| t.id == id)
    }
}

/// Why the store failed. Fatal for the operation: nothing is acknowledged without it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Reading or writing the state directory failed.
    #[error("state directory i/o on {path}: {source}")]
    Io {
        /// The file or folder.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// A record on disk could not be parsed.
    #[error("corrupt chat record {path}: {source}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The parse error.
        source: serde_json::Error,
    },
}

/// The state directory. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Store {
    chats: PathBuf,
}

impl Store {
    /// Opens (creating if needed) the state directory.
    pub fn open(state_dir: &Path) -> Result<Self, StoreError> {
        let chats = state_dir.join("chats");
        std::fs::create_dir_all(&chats).map_err(|source| StoreError::Io {
            path: chats.clone(),
            source,
        })?;
        Ok(Self { chats })
    }

    fn path_of(&self, chat: &ChatId) -> PathBuf {
        // Chat ids are filesystem-safe by construction.
        self.chats.join(format!("{chat}.json"))
    }

    /// Loads a chat's record; a chat never seen before gets an empty one.
    pub fn load(&self, chat: &ChatId) -> Result<ChatRecord, StoreError> {
        let path = self.path_of(chat);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|source| StoreError::Corrupt { path, source }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(ChatRecord::new(chat.clone())),
            Err(source) => Err(StoreError::Io { path, source }),
        }
    }

    /// Replaces a chat's record durably. Returns once the data and the rename are on disk.
    pub async fn save(&self, record: &ChatRecord) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec_pretty(record).map_err(|source| StoreError::Corrupt {
            path: self.path_of(&record.chat_id),
            source,
        })?;
        let path = self.path_of(&record.chat_id);
        let dir = self.chats.clone();
        tokio::task::spawn_blocking(move || write_atomic(&dir, &path, &bytes))
            .await
            .unwrap_or_else(|e| Err(io::Error::other(e)))
            .map_err(|source| StoreError::Io {
                path: self.path_of(&record.chat_id),
                source,
            })
    }
}

/// Writes `bytes` to `path` so that a crash leaves either the old or the new content.
fn write_atomic(dir: &Path, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension(format!("json.tmp-{:016x}", rand::random::<u64>()));
    let result = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn round_trip_and_missing() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let chat = ChatId::new("c1").unwrap();
        assert_eq!(store.load(&chat).unwrap(), ChatRecord::new(chat.clone()));
        let mut rec = ChatRecord::new(chat.clone());
        rec.last_seq = 3;
        rec.always_allowed
            .insert(("dangerous_action".into(), "x".into()));
        rec.turns.push(TurnRecord {
            seq: 3,
            id: "$e".into(),
            sender: Sender {
                user_id: "@a:b".into(),
                display_name: None,
            },
            text: "hi".into(),
            attachments: vec![WorkspacePath::new("chats/c1/a").unwrap()],
            attachment_info: BTreeMap::new(),
            context: vec![],
            timestamp_ms: 1,
            status: TurnStatus::Pending,
            output: String::new(),
            sent_files: vec![],
            error: None,
        });
        store.save(&rec).await.unwrap();
        store.save(&rec).await.unwrap();
        let reopened = Store::open(dir.path()).unwrap();
        assert_eq!(reopened.load(&chat).unwrap(), rec);
        let files: Vec<_> = std::fs::read_dir(dir.path().join("chats"))
            .unwrap()
            .collect();
        assert_eq!(files.len(), 1, "no temporary files left");
    }
}
