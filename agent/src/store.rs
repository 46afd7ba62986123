//! Durable per-chat history behind one trait ([`ChatRecord`]), kept in PostgreSQL when the agent
//! has a database (`pg`, shared by every agent of a deployment) and otherwise in the state
//! directory, described here: an append-only log per chat under the state directory
//! (`chats/<chat>.jsonl`), one JSON line per change, each written before the change counts
//! and fsynced when it is a promise: a turn's admission (before its `ack`), what was perceived,
//! an approval remembered for good. A turn's end is not fsynced but rides on the next fsync: if
//! a power loss takes it, the turn runs again and the surface's transaction ids keep its posts
//! from appearing twice. Only a compact index of the log stays in memory (a few dozen bytes
//! per turn, whatever the messages' size); turns are read back from the log when a brain or a
//! replay needs them.
//!
//! Each line is an object tagged by `type`:
//! * `header`: the first line: format version ([`FORMAT_VERSION`]) and chat id.
//! * `room`: the chat's Matrix room and thread, written with the first turn that names them.
//! * `turn`: a [`TurnRecord`] as admitted (pending; migrated ones carry how they ended).
//! * `end`: how turn `id` ended ([`TurnEnd`]); a later one for the same id wins.
//! * `allow`: a `(tool, resource)` pair the user allowed for good.
//! * `step`: step `n` of pending turn `turn` completed ([`Step`]); fsynced. Steps of a turn
//!   that ended are skipped on load.
//!
//! Lines are only ever appended, so a crash can only leave the end of the log incomplete:
//! loading cuts a torn last line off (nothing acknowledged rests on it). An unreadable
//! line anywhere else is corruption: reported, never overwritten. A chat stored by an older
//! agent as one JSON record (`chats/<chat>.json`) is converted to a log on first load.

use std::collections::hash_map::Entry as HashEntry;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use protocol::{
    AttachmentInfo, ChatId, ContextMessage, Sender, TurnSettings, UserMessage, WorkspacePath,
};
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

pub mod admission;
mod any;
mod files;
mod lines;
mod log;
pub mod pg;
mod pgjson;
mod recent;
mod record;
#[cfg(test)]
mod suite;

pub use any::AnyChat;
use lines::*;
pub use log::{ChatLog, Exported};
pub use pg::{PgChat, PgChats};
pub use record::{Begun, ChatRecord};

use crate::db::Database;

/// Version of the log format, bumped on incompatible changes (1 was the single JSON record).
pub const FORMAT_VERSION: u32 = 2;

/// Most earlier turns a brain gets in full ([`History::recent`]).
pub const RECENT_TURNS: usize = 20;

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
    /// What the agent made of its attachments (a voice message's words), worked out once.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub perceived: BTreeMap<WorkspacePath, Perceived>,
    /// The room's settings for the turn, as the surface sent them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<Box<TurnSettings>>,
}

/// What the agent made of an attachment, kept with its turn so that it is worked out once
/// (the turn may run again after a restart, and later turns show it in their history).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Perceived {
    /// The words heard in a voice message or audio file.
    Heard {
        /// The transcript (empty: nothing could be made out).
        text: String,
    },
    /// It could not be transcribed: a sentence saying why, for the model and the room.
    NotHeard {
        /// Why.
        why: String,
    },
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
            perceived: BTreeMap::new(),
            settings: m.settings.clone(),
        }
    }

    /// Attachments of the turn and of its context messages.
    pub fn all_attachments(&self) -> impl Iterator<Item = &WorkspacePath> {
        self.attachments
            .iter()
            .chain(self.context.iter().flat_map(|c| c.attachments.iter()))
    }

    fn apply(&mut self, end: TurnEnd) {
        self.status = end.status;
        self.output = end.output;
        self.sent_files = end.sent_files;
        self.error = end.error;
        self.perceived = end.perceived;
    }
}

/// One completed step of a running turn, recorded durably the moment it completes, so that a
/// turn interrupted by a crash resumes after it instead of doing it again (a `step` line of
/// the log; a `turn_steps` row). Kept while the turn is pending.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Step {
    /// A brain's own record of a step (the OpenAI brain: a model response), opaque here.
    Brain {
        /// What the brain needs to take the step again without redoing it.
        data: serde_json::Value,
    },
    /// A tool call that completed, with its outcome.
    Tool {
        /// The tool's registry name.
        name: String,
        /// The arguments as the brain gave them.
        arguments: String,
        /// Whether it succeeded.
        ok: bool,
        /// Its output, or the error.
        output: String,
        /// A file the call delivered to the room.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sent_file: Option<WorkspacePath>,
        /// A picture the call showed the model.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        picture: Option<WorkspacePath>,
    },
}

/// How a turn ended: the `end` line of the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnEnd {
    /// The turn (message id).
    pub id: String,
    /// Where it stands now.
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
    /// What the agent made of the turn's attachments; an `end` line without it keeps what the
    /// turn's previous `end` line had.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub perceived: BTreeMap<WorkspacePath, Perceived>,
}

impl TurnEnd {
    /// Turn `current` as it stands, with what was `perceived` of its attachments.
    fn perceived(current: TurnRecord, perceived: BTreeMap<WorkspacePath, Perceived>) -> Self {
        Self {
            id: current.id,
            status: current.status,
            output: current.output,
            sent_files: current.sent_files,
            error: current.error,
            perceived,
        }
    }
}

/// What a brain sees of the turns before the one it answers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    /// How many turns came before, in arrival order.
    pub earlier: usize,
    /// How many attachments those turns had (context messages' included).
    pub attachments: usize,
    /// The last [`RECENT_TURNS`] of them in full, oldest first, with their answers.
    pub recent: Vec<TurnRecord>,
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
    /// A record on disk could not be parsed (not a torn last line: that is cut off).
    #[error("corrupt chat record {path}: {source}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// The parse error.
        source: serde_json::Error,
    },
    /// The database failed or holds something unreadable (its message, never the URL).
    #[error("database: {0}")]
    Database(String),
    /// The log was written by a newer agent.
    #[error("chat record {path} has format version {version}, newer than {FORMAT_VERSION}")]
    Version {
        /// The file.
        path: PathBuf,
        /// Its version.
        version: u32,
    },
}

/// Where chats' records are kept. Cheap to clone.
#[derive(Debug, Clone)]
pub enum Backend {
    /// The state directory, one log per chat (one agent process owns it).
    Files(Store),
    /// PostgreSQL, shared by every agent of a deployment.
    Postgres(PgChats),
}

impl Backend {
    /// Chats kept in `db`.
    pub fn postgres(db: Database) -> Self {
        Self::Postgres(PgChats::new(db))
    }

    /// The record of chat `id`: the file log is read (indexed) now, database rows when asked.
    pub fn load(&self, id: &ChatId) -> Result<AnyChat, StoreError> {
        match self {
            Self::Files(store) => store.load(id).map(|log| AnyChat::Files(Box::new(log))),
            Self::Postgres(chats) => Ok(AnyChat::Postgres(chats.chat(id))),
        }
    }
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

    fn io(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
        move |source| StoreError::Io {
            path: path.to_owned(),
            source,
        }
    }

    /// Opens a chat's log, converting a record of an older agent first and cutting off a
    /// torn last line; a chat never seen before gets an empty log (its file is created by the
    /// first change). Reads the whole log once; keeps only its index.
    pub fn load(&self, chat: &ChatId) -> Result<ChatLog, StoreError> {
        // Chat ids are filesystem-safe by construction.
        let path = self.chats.join(format!("{chat}.jsonl"));
        let legacy = self.chats.join(format!("{chat}.json"));
        let mut log = ChatLog::empty(chat.clone(), path.clone(), self.chats.clone());
        match File::options().read(true).write(true).open(&path) {
            Ok(file) => {
                if legacy.exists() {
                    // A conversion that stopped after its rename: the log is complete.
                    remove_durably(&self.chats, &legacy).map_err(Self::io(&legacy))?;
                }
                log.scan(file)?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if self.convert(chat, &legacy, &path)? {
                    let file = File::options()
                        .read(true)
                        .write(true)
                        .open(&path)
                        .map_err(Self::io(&path))?;
                    log.scan(file)?;
                }
            }
            Err(source) => return Err(StoreError::Io { path, source }),
        }
        log.last_seq = admission::plausible_last_seq(log.seqs());
        Ok(log)
    }

    /// Converts the single JSON record of an older agent into a log; false if there is none.
    /// An unreadable record is reported and left as it is.
    fn convert(&self, chat: &ChatId, legacy: &Path, path: &Path) -> Result<bool, StoreError> {
        let bytes = match std::fs::read(legacy) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(source) => return Err(Self::io(legacy)(source)),
        };
        let record: LegacyRecord =
            serde_json::from_slice(&bytes).map_err(|source| StoreError::Corrupt {
                path: legacy.to_owned(),
                source,
            })?;
        drop(bytes);
        let turns = record.turns.len();
        let mut out = Vec::new();
        let header = Entry::Header {
            version: FORMAT_VERSION,
            chat_id: chat.clone(),
        };
        push_line(&mut out, &header);
        if let Some(room_id) = record.room_id {
            let thread_root = record.thread_root;
            push_line(
                &mut out,
                &Entry::Room {
                    room_id,
                    thread_root,
                },
            );
        }
        for turn in record.turns {
            push_line(&mut out, &Entry::Turn(turn));
        }
        for (tool, resource) in record.always_allowed {
            push_line(
                &mut out,
                &Entry::Allow {
                    tool,
                    resource,
                    user: None,
                },
            );
        }
        write_atomic(&self.chats, path, &out).map_err(Self::io(path))?;
        remove_durably(&self.chats, legacy).map_err(Self::io(legacy))?;
        info!(chat_id = %chat, turns, "converted a chat record to an append-only log");
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::log::id_hash;
    use super::suite::{end, message};
    use super::*;

    fn log_path(dir: &Path) -> PathBuf {
        dir.join("chats/c1.jsonl")
    }

    #[tokio::test]
    async fn appends_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let chat = ChatId::new("c1").unwrap();
        let mut log = store.load(&chat).unwrap();
        assert!(!log.contains("$1").await.unwrap());
        assert!(
            !log_path(dir.path()).exists(),
            "created by the first change"
        );
        for seq in 1..=3 {
            log.append_turn(&message(seq, &format!("${seq}")))
                .await
                .unwrap();
        }
        log.finish(end("$1", "one")).await.unwrap();
        log.allow_always("@a:x", ("t".into(), "r".into()))
            .await
            .unwrap();

        let log = Store::open(dir.path()).unwrap().load(&chat).unwrap();
        assert!(log.contains("$2").await.unwrap());
        assert!(!log.contains("$4").await.unwrap());
        assert_eq!(log.seqs().collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(log.pending(), ["$2", "$3"]);
        assert_eq!(log.room_id(), Some("!r:x"));
        assert!(log.is_always_allowed("@a:x", &("t".into(), "r".into())));
        assert!(
            !log.is_always_allowed("@b:x", &("t".into(), "r".into())),
            "per user"
        );
        assert_eq!(log.turn("$1").await.unwrap().unwrap().output, "one");
        assert!(log.begin("$1").await.unwrap().is_none(), "finished");
        let (turn, history) = log.begin("$3").await.unwrap().unwrap();
        assert_eq!(turn.text, "text 3");
        assert_eq!((history.earlier, history.attachments), (2, 2));
        assert_eq!(history.recent.len(), 2);
        assert_eq!(history.recent[0].output, "one");
    }

    #[tokio::test]
    async fn what_was_perceived_stays_with_the_turn_through_its_end_and_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let chat = ChatId::new("c1").unwrap();
        let mut log = store.load(&chat).unwrap();
        log.append_turn(&message(1, "$1")).await.unwrap();
        let path = WorkspacePath::new("chats/c1/a").unwrap();
        let heard = BTreeMap::from([(
            path.clone(),
            Perceived::Heard {
                text: "hello there".into(),
            },
        )]);
        log.perceive("$1", heard.clone()).await.unwrap();
        assert_eq!(log.pending(), ["$1"], "still pending");
        let (turn, _) = log.begin("$1").await.unwrap().unwrap();
        assert_eq!(turn.perceived, heard);

        let mut log = Store::open(dir.path()).unwrap().load(&chat).unwrap();
        assert_eq!(log.pending(), ["$1"], "still pending after a restart");
        log.finish(end("$1", "done")).await.unwrap();
        let log = Store::open(dir.path()).unwrap().load(&chat).unwrap();
        let turn = log.turn("$1").await.unwrap().unwrap();
        assert_eq!(
            (turn.status, turn.output.as_str()),
            (TurnStatus::Completed, "done")
        );
        assert_eq!(turn.perceived, heard, "the end kept it");
        assert!(log.pending().is_empty());
    }

    #[tokio::test]
    async fn history_keeps_only_the_recent_turns_in_full() {
        let dir = tempfile::tempdir().unwrap();
        let chat = ChatId::new("c1").unwrap();
        let mut log = Store::open(dir.path()).unwrap().load(&chat).unwrap();
        let last = RECENT_TURNS as u64 + 5;
        for seq in 1..=last {
            log.append_turn(&message(seq, &format!("${seq}")))
                .await
                .unwrap();
        }
        let (_, history) = log.begin(&format!("${last}")).await.unwrap().unwrap();
        assert_eq!(history.earlier, last as usize - 1);
        assert_eq!(history.recent.len(), RECENT_TURNS);
        assert_eq!(history.recent[RECENT_TURNS - 1].seq, last - 1);
    }

    #[tokio::test]
    async fn a_torn_last_line_is_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        let chat = ChatId::new("c1").unwrap();
        let mut log = Store::open(dir.path()).unwrap().load(&chat).unwrap();
        log.append_turn(&message(1, "$1")).await.unwrap();
        drop(log);
        let path = log_path(dir.path());
        let whole = std::fs::read(&path).unwrap();
        for torn in [
            &b"{\"type\":\"turn\",\"seq\":2,\"id\":\"$"[..],
            b"\0\0\0\0",
            b"garbage\n",
        ] {
            let mut bytes = whole.clone();
            bytes.extend_from_slice(torn);
            std::fs::write(&path, &bytes).unwrap();
            let mut log = Store::open(dir.path()).unwrap().load(&chat).unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), whole, "{torn:?}");
            assert_eq!(log.pending(), ["$1"]);
            log.append_turn(&message(2, "$2")).await.unwrap();
            let log = Store::open(dir.path()).unwrap().load(&chat).unwrap();
            assert_eq!(log.pending(), ["$1", "$2"]);
            std::fs::write(&path, &whole).unwrap();
        }
    }

    #[tokio::test]
    async fn a_bad_line_before_the_end_is_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let chat = ChatId::new("c1").unwrap();
        let mut log = Store::open(dir.path()).unwrap().load(&chat).unwrap();
        log.append_turn(&message(1, "$1")).await.unwrap();
        log.append_turn(&message(2, "$2")).await.unwrap();
        drop(log);
        let path = log_path(dir.path());
        let text = std::fs::read_to_string(&path).unwrap();
        let broken = text.replacen("\"type\":\"turn\"", "\"type\":\"nonsense\"", 1);
        std::fs::write(&path, &broken).unwrap();
        let err = Store::open(dir.path()).unwrap().load(&chat).unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), broken);
    }

    #[tokio::test]
    async fn a_single_record_of_an_older_agent_is_converted() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let chat = ChatId::new("c1").unwrap();
        let mut done = TurnRecord::from_message(&message(1, "$1"));
        done.apply(end("$1", "answer"));
        let legacy = serde_json::json!({
            "version": 1,
            "chat_id": "c1",
            "room_id": "!r:x",
            "last_seq": 2,
            "turns": [done, TurnRecord::from_message(&message(2, "$2"))],
            "always_allowed": [["t", "r"]],
        });
        let legacy_path = dir.path().join("chats/c1.json");
        std::fs::write(&legacy_path, serde_json::to_vec_pretty(&legacy).unwrap()).unwrap();

        let log = store.load(&chat).unwrap();
        assert!(!legacy_path.exists());
        assert!(log_path(dir.path()).exists());
        let files = std::fs::read_dir(dir.path().join("chats")).unwrap().count();
        assert_eq!(files, 1, "no temporary files left");
        for log in [log, store.load(&chat).unwrap()] {
            assert_eq!(log.seqs().collect::<Vec<_>>(), [1, 2]);
            assert_eq!(log.pending(), ["$2"]);
            assert_eq!(log.room_id(), Some("!r:x"));
            // A grant from before grants were per user counts for everyone in the chat.
            assert!(log.is_always_allowed("@anyone:x", &("t".into(), "r".into())));
            assert_eq!(log.turn("$1").await.unwrap().unwrap().output, "answer");
            let (_, history) = log.begin("$2").await.unwrap().unwrap();
            assert_eq!((history.earlier, history.attachments), (1, 1));
        }
    }

    #[tokio::test]
    async fn ids_sharing_a_hash_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let chat = ChatId::new("c1").unwrap();
        let mut log = Store::open(dir.path()).unwrap().load(&chat).unwrap();
        log.append_turn(&message(1, "$1")).await.unwrap();
        // Make "$2" look like a collision with "$1".
        let i = log.by_hash.remove(&id_hash("$1")).unwrap();
        log.by_hash.insert(id_hash("$2"), i);
        assert!(
            !log.contains("$2").await.unwrap(),
            "checked against the log"
        );
        log.append_turn(&message(2, "$2")).await.unwrap();
        assert!(log.contains("$2").await.unwrap());
        assert_eq!(log.collided.len(), 1);
        assert_eq!(log.turn("$2").await.unwrap().unwrap().seq, 2);
    }
}
