//! Durable per-chat history: an append-only log per chat under the state directory
//! (`chats/<chat>.jsonl`), one JSON line per change, each written and fsynced before the
//! change counts. Only a compact index of the log stays in memory (a few dozen bytes per turn,
//! whatever the messages' size); turns are read back from the log when a brain or a replay
//! needs them.
//!
//! Each line is an object tagged by `type`:
//! * `header`: the first line: format version ([`FORMAT_VERSION`]) and chat id.
//! * `room`: the chat's Matrix room and thread, written with the first turn that names them.
//! * `turn`: a [`TurnRecord`] as admitted (pending; migrated ones carry how they ended).
//! * `end`: how turn `id` ended ([`TurnEnd`]); a later one for the same id wins.
//! * `allow`: a `(tool, resource)` pair the user allowed for good.
//!
//! Every line is fsynced before the next is written, so a crash can only leave the last line
//! incomplete: loading cuts such a torn tail off (it was never acknowledged). An unreadable
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

use protocol::{AttachmentInfo, ChatId, ContextMessage, Sender, UserMessage, WorkspacePath};
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

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

    fn apply(&mut self, end: TurnEnd) {
        self.status = end.status;
        self.output = end.output;
        self.sent_files = end.sent_files;
        self.error = end.error;
    }
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

/// One line of the log.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Entry {
    Header {
        version: u32,
        chat_id: ChatId,
    },
    Room {
        room_id: String,
        #[serde(default)]
        thread_root: Option<String>,
    },
    Turn(TurnRecord),
    End(TurnEnd),
    Allow {
        tool: String,
        resource: String,
    },
}

/// A line as loading reads it: the texts are skipped, not kept.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Probe {
    Header {
        version: u32,
    },
    Room {
        room_id: String,
        #[serde(default)]
        thread_root: Option<String>,
    },
    Turn {
        id: String,
        seq: u64,
        status: TurnStatus,
        #[serde(default)]
        attachments: Vec<IgnoredAny>,
        #[serde(default)]
        context: Vec<ProbeContext>,
    },
    End {
        id: String,
        status: TurnStatus,
    },
    Allow {
        tool: String,
        resource: String,
    },
}

#[derive(Deserialize)]
struct ProbeContext {
    #[serde(default)]
    attachments: Vec<IgnoredAny>,
}

/// A chat as agents before the log stored it: one JSON document rewritten on every change.
/// Read only to convert it.
#[derive(Debug, Serialize, Deserialize)]
struct LegacyRecord {
    #[serde(default)]
    room_id: Option<String>,
    #[serde(default)]
    thread_root: Option<String>,
    turns: Vec<TurnRecord>,
    #[serde(default)]
    always_allowed: BTreeSet<(String, String)>,
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
    /// The log was written by a newer agent.
    #[error("chat record {path} has format version {version}, newer than {FORMAT_VERSION}")]
    Version {
        /// The file.
        path: PathBuf,
        /// Its version.
        version: u32,
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
            push_line(&mut out, &Entry::Allow { tool, resource });
        }
        write_atomic(&self.chats, path, &out).map_err(Self::io(path))?;
        remove_durably(&self.chats, legacy).map_err(Self::io(legacy))?;
        info!(chat_id = %chat, turns, "converted a chat record to an append-only log");
        Ok(true)
    }
}

/// Where a turn's lines are and what is known of it without reading them.
#[derive(Debug, Clone, Copy)]
struct TurnSlot {
    /// Offset of its `turn` line.
    at: u64,
    /// Offset of its latest `end` line; 0 (the header's offset) while there is none.
    end: u64,
    /// Its sequence number.
    seq: u64,
    /// Attachments of the turns before it, for [`History::attachments`].
    attachments_before: u64,
}

/// One chat's log, open, with the index that stays in memory: per turn a fixed-size slot
/// and an 8-byte hash of its id (ids sharing a hash, which takes about 2^32 turns, are kept
/// in full), the ids of unfinished turns, the chat's room and its lasting approvals.
/// Nothing grows with the size of messages or answers.
#[derive(Debug)]
pub struct ChatLog {
    chat_id: ChatId,
    path: PathBuf,
    dir: PathBuf,
    /// Opened on load or by the first change.
    file: Option<Arc<File>>,
    /// Length of the whole lines in the file: where the next line goes.
    len: u64,
    /// A failed append may have left bytes past `len`: they are cut before the next one.
    tail_dirty: bool,
    /// Turns in arrival order.
    turns: Vec<TurnSlot>,
    /// Hash of a turn's id → its index in `turns`.
    by_hash: HashMap<u64, u32>,
    /// Ids whose hash an earlier id already has → index in `turns`.
    collided: HashMap<String, u32>,
    /// Unfinished turns by index in `turns` → id.
    pending: BTreeMap<u32, String>,
    /// Attachments of all turns.
    attachments: u64,
    room_id: Option<String>,
    thread_root: Option<String>,
    always_allowed: BTreeSet<(String, String)>,
}

fn id_hash(id: &str) -> u64 {
    let mut h = DefaultHasher::new();
    id.hash(&mut h);
    h.finish()
}

impl ChatLog {
    fn empty(chat_id: ChatId, path: PathBuf, dir: PathBuf) -> Self {
        Self {
            chat_id,
            path,
            dir,
            file: None,
            len: 0,
            tail_dirty: false,
            turns: Vec::new(),
            by_hash: HashMap::new(),
            collided: HashMap::new(),
            pending: BTreeMap::new(),
            attachments: 0,
            room_id: None,
            thread_root: None,
            always_allowed: BTreeSet::new(),
        }
    }

    fn io_error(&self) -> impl FnOnce(io::Error) -> StoreError + '_ {
        Store::io(&self.path)
    }

    /// Reads the log from the start, building the index; cuts off a torn last line.
    fn scan(&mut self, file: File) -> Result<(), StoreError> {
        let mut reader = BufReader::with_capacity(1 << 16, &file);
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = reader
                .read_until(b'\n', &mut line)
                .map_err(self.io_error())?;
            if n == 0 {
                break;
            }
            let parsed = if line.ends_with(b"\n") {
                Some(serde_json::from_slice::<Probe>(&line))
            } else {
                None
            };
            match parsed {
                Some(Ok(probe)) => {
                    self.index(probe, self.len, &file)?;
                    self.len += n as u64;
                }
                Some(Err(source)) if !reader.fill_buf().map_err(self.io_error())?.is_empty() => {
                    return Err(StoreError::Corrupt {
                        path: self.path.clone(),
                        source,
                    });
                }
                _ => {
                    // The last line, written when the agent stopped: never acknowledged.
                    warn!(
                        chat_id = %self.chat_id,
                        offset = self.len,
                        bytes = n,
                        "cutting off a torn last line of the chat's log"
                    );
                    file.set_len(self.len).map_err(self.io_error())?;
                    file.sync_all().map_err(self.io_error())?;
                    break;
                }
            }
        }
        drop(reader);
        self.file = Some(Arc::new(file));
        Ok(())
    }

    /// Adds one line read at `at` to the index.
    fn index(&mut self, probe: Probe, at: u64, file: &File) -> Result<(), StoreError> {
        match probe {
            Probe::Header { version } if version > FORMAT_VERSION => {
                return Err(StoreError::Version {
                    path: self.path.clone(),
                    version,
                });
            }
            Probe::Header { .. } => {}
            Probe::Room {
                room_id,
                thread_root,
            } => {
                self.room_id = Some(room_id);
                self.thread_root = thread_root;
            }
            Probe::Turn {
                id,
                seq,
                status,
                attachments,
                context,
            } => {
                let count =
                    attachments.len() + context.iter().map(|c| c.attachments.len()).sum::<usize>();
                let known = match self.collided.contains_key(&id) {
                    true => true,
                    false => match self.by_hash.get(&id_hash(&id)) {
                        Some(&i) => {
                            let slot = self.turns[i as usize];
                            turn_id_at(file, slot.at).map_err(self.io_error())? == id
                        }
                        None => false,
                    },
                };
                if known {
                    warn!(chat_id = %self.chat_id, turn = %id, "a turn stored twice; the first counts");
                    return Ok(());
                }
                self.add_turn(id, seq, status, count as u64, at);
            }
            Probe::End { id, status } => {
                if let Some(i) = self.locate_stored(&id) {
                    self.turns[i as usize].end = at;
                    if status == TurnStatus::Pending {
                        self.pending.insert(i, id);
                    } else {
                        self.pending.remove(&i);
                    }
                }
            }
            Probe::Allow { tool, resource } => {
                self.always_allowed.insert((tool, resource));
            }
        }
        Ok(())
    }

    fn add_turn(&mut self, id: String, seq: u64, status: TurnStatus, attachments: u64, at: u64) {
        let index = u32::try_from(self.turns.len()).unwrap_or(u32::MAX);
        self.turns.push(TurnSlot {
            at,
            end: 0,
            seq,
            attachments_before: self.attachments,
        });
        self.attachments += attachments;
        match self.by_hash.entry(id_hash(&id)) {
            HashEntry::Vacant(v) => {
                v.insert(index);
            }
            HashEntry::Occupied(_) => {
                self.collided.insert(id.clone(), index);
            }
        }
        if status == TurnStatus::Pending {
            self.pending.insert(index, id);
        }
    }

    /// Index of the turn `id`, known to be stored (a hash match is not checked).
    fn locate_stored(&self, id: &str) -> Option<u32> {
        self.collided
            .get(id)
            .or_else(|| self.by_hash.get(&id_hash(id)))
            .copied()
    }

    /// Index of the turn `id`, a hash match checked against the log.
    async fn locate(&self, id: &str) -> Result<Option<u32>, StoreError> {
        if let Some(&i) = self.collided.get(id) {
            return Ok(Some(i));
        }
        let Some(&i) = self.by_hash.get(&id_hash(id)) else {
            return Ok(None);
        };
        let at = self.turns[i as usize].at;
        let stored = self.read(move |file| turn_id_at(file, at)).await?;
        Ok((stored == id).then_some(i))
    }

    /// Runs blocking reads on the log (which exists: some turn is indexed).
    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&File) -> io::Result<T> + Send + 'static,
    ) -> Result<T, StoreError> {
        let file = self.file.clone().ok_or_else(|| {
            self.io_error()(io::Error::new(io::ErrorKind::NotFound, "log not open"))
        })?;
        blocking(move || f(&file)).await.map_err(self.io_error())
    }

    /// Appends `entries` (after the header if the log is empty) and fsyncs them. Returns the
    /// offset of each entry's line; the index is the caller's to update.
    async fn append(&mut self, entries: &[Entry]) -> Result<Vec<u64>, StoreError> {
        let mut bytes = Vec::new();
        if self.len == 0 {
            let header = Entry::Header {
                version: FORMAT_VERSION,
                chat_id: self.chat_id.clone(),
            };
            push_line(&mut bytes, &header);
        }
        let mut offsets = Vec::with_capacity(entries.len());
        for entry in entries {
            offsets.push(self.len + bytes.len() as u64);
            push_line(&mut bytes, entry);
        }
        let (file, created) = match &self.file {
            Some(file) => (file.clone(), false),
            None => {
                let file = File::options()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(&self.path)
                    .map_err(self.io_error())?;
                let file = Arc::new(file);
                self.file = Some(file.clone());
                (file, true)
            }
        };
        let (at, cut, dir) = (self.len, self.tail_dirty || self.len == 0, self.dir.clone());
        let written = bytes.len() as u64;
        let result = blocking(move || {
            if cut {
                file.set_len(at)?;
            }
            file.write_all_at(&bytes, at)?;
            file.sync_data()?;
            if created {
                File::open(&dir)?.sync_all()?;
            }
            Ok(())
        })
        .await;
        match result {
            Ok(()) => {
                self.len += written;
                self.tail_dirty = false;
                Ok(offsets)
            }
            Err(e) => {
                self.tail_dirty = true;
                Err(self.io_error()(e))
            }
        }
    }

    /// Sequence numbers of the stored turns.
    pub fn seqs(&self) -> impl Iterator<Item = u64> + '_ {
        self.turns.iter().map(|t| t.seq)
    }

    /// Whether a turn with message id `id` is stored.
    pub async fn contains(&self, id: &str) -> Result<bool, StoreError> {
        Ok(self.locate(id).await?.is_some())
    }

    /// Stores a user message as a pending turn, durably; the first one also names the room.
    pub async fn append_turn(&mut self, msg: &UserMessage) -> Result<(), StoreError> {
        let mut entries = Vec::with_capacity(2);
        let room = (self.room_id.is_none()
            || (self.thread_root.is_none() && msg.thread_root.is_some()))
        .then(|| {
            (
                self.room_id.clone().unwrap_or_else(|| msg.room_id.clone()),
                self.thread_root.clone().or_else(|| msg.thread_root.clone()),
            )
        });
        if let Some((room_id, thread_root)) = room.clone() {
            entries.push(Entry::Room {
                room_id,
                thread_root,
            });
        }
        let turn = TurnRecord::from_message(msg);
        let attachments = turn.all_attachments().count() as u64;
        entries.push(Entry::Turn(turn));
        let offsets = self.append(&entries).await?;
        if let Some((room_id, thread_root)) = room {
            self.room_id = Some(room_id);
            self.thread_root = thread_root;
        }
        let at = offsets.last().copied().unwrap_or_default();
        self.add_turn(
            msg.id.clone(),
            msg.seq,
            TurnStatus::Pending,
            attachments,
            at,
        );
        Ok(())
    }

    /// Ids of the turns that have not finished, in arrival order.
    pub fn pending(&self) -> Vec<String> {
        self.pending.values().cloned().collect()
    }

    /// The pending turn `id` and what came before it; `None` if it is not pending.
    pub async fn begin(&self, id: &str) -> Result<Option<(TurnRecord, History)>, StoreError> {
        let Some(i) = self.locate(id).await? else {
            return Ok(None);
        };
        if !self.pending.contains_key(&i) {
            return Ok(None);
        }
        let pos = i as usize;
        let from = pos.saturating_sub(RECENT_TURNS);
        let slots = self.turns[from..=pos].to_vec();
        let mut turns: Vec<TurnRecord> = self
            .read(move |file| slots.iter().map(|s| read_turn(file, s)).collect())
            .await?;
        let turn = turns.pop().filter(|t| t.id == id);
        Ok(turn.map(|turn| {
            let history = History {
                earlier: pos,
                attachments: self.turns[pos].attachments_before as usize,
                recent: turns,
            };
            (turn, history)
        }))
    }

    /// The turn `id` as stored now, if there is one.
    pub async fn turn(&self, id: &str) -> Result<Option<TurnRecord>, StoreError> {
        let Some(i) = self.locate(id).await? else {
            return Ok(None);
        };
        let slot = self.turns[i as usize];
        Ok(Some(self.read(move |file| read_turn(file, &slot)).await?))
    }

    /// Records durably how turn `id` ended; nothing happens for an unknown id.
    pub async fn finish(&mut self, end: TurnEnd) -> Result<(), StoreError> {
        let Some(i) = self.locate_stored(&end.id) else {
            return Ok(());
        };
        let (id, status) = (end.id.clone(), end.status);
        let offsets = self.append(&[Entry::End(end)]).await?;
        self.turns[i as usize].end = offsets[0];
        if status == TurnStatus::Pending {
            self.pending.insert(i, id);
        } else {
            self.pending.remove(&i);
        }
        Ok(())
    }

    /// The chat's Matrix room, known from its first turn.
    pub fn room_id(&self) -> Option<&str> {
        self.room_id.as_deref()
    }

    /// Whether the user allowed `(tool, resource)` for good.
    pub fn is_always_allowed(&self, key: &(String, String)) -> bool {
        self.always_allowed.contains(key)
    }

    /// Remembers durably that the user allowed `(tool, resource)` for good.
    pub async fn allow_always(&mut self, key: (String, String)) -> Result<(), StoreError> {
        if self.always_allowed.contains(&key) {
            return Ok(());
        }
        let (tool, resource) = key.clone();
        self.append(&[Entry::Allow { tool, resource }]).await?;
        self.always_allowed.insert(key);
        Ok(())
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(io::Error::other(e)))
}

fn push_line(out: &mut Vec<u8>, entry: &Entry) {
    // Serializing these types cannot fail: every map key is a string.
    if serde_json::to_writer(&mut *out, entry).is_ok() {
        out.push(b'\n');
    }
}

/// The line starting at `at`, without its newline.
fn read_line_at(file: &File, at: u64) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    let mut chunk = vec![0; 4096];
    loop {
        let n = file.read_at(&mut chunk, at + line.len() as u64)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "log line without its end",
            ));
        }
        if let Some(end) = chunk[..n].iter().position(|&b| b == b'\n') {
            line.extend_from_slice(&chunk[..end]);
            return Ok(line);
        }
        line.extend_from_slice(&chunk[..n]);
        if chunk.len() < 1 << 20 {
            chunk.resize(chunk.len() * 2, 0);
        }
    }
}

fn read_entry(file: &File, at: u64) -> io::Result<Entry> {
    serde_json::from_slice(&read_line_at(file, at)?)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

fn unexpected(at: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("unexpected kind of line at offset {at}"),
    )
}

/// The turn of `slot` with how it ended.
fn read_turn(file: &File, slot: &TurnSlot) -> io::Result<TurnRecord> {
    let Entry::Turn(mut turn) = read_entry(file, slot.at)? else {
        return Err(unexpected(slot.at));
    };
    if slot.end != 0 {
        let Entry::End(end) = read_entry(file, slot.end)? else {
            return Err(unexpected(slot.end));
        };
        turn.apply(end);
    }
    Ok(turn)
}

fn turn_id_at(file: &File, at: u64) -> io::Result<String> {
    #[derive(Deserialize)]
    struct Id {
        id: String,
    }
    serde_json::from_slice::<Id>(&read_line_at(file, at)?)
        .map(|i| i.id)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Writes `bytes` to `path` so that a crash leaves either no file or the whole content.
fn write_atomic(dir: &Path, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension(format!("tmp-{:016x}", rand::random::<u64>()));
    let result = (|| {
        let mut file = File::options().write(true).create_new(true).open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn remove_durably(dir: &Path, path: &Path) -> io::Result<()> {
    std::fs::remove_file(path)?;
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(seq: u64, id: &str) -> UserMessage {
        UserMessage {
            seq,
            id: id.into(),
            room_id: "!r:x".into(),
            thread_root: None,
            sender: Sender {
                user_id: "@a:b".into(),
                display_name: None,
            },
            text: format!("text {seq}"),
            attachments: vec![WorkspacePath::new("chats/c1/a").unwrap()],
            attachment_info: BTreeMap::new(),
            context: vec![],
            timestamp_ms: seq,
        }
    }

    fn end(id: &str, output: &str) -> TurnEnd {
        TurnEnd {
            id: id.into(),
            status: TurnStatus::Completed,
            output: output.into(),
            sent_files: vec![],
            error: None,
        }
    }

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
        log.allow_always(("t".into(), "r".into())).await.unwrap();

        let log = Store::open(dir.path()).unwrap().load(&chat).unwrap();
        assert!(log.contains("$2").await.unwrap());
        assert!(!log.contains("$4").await.unwrap());
        assert_eq!(log.seqs().collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(log.pending(), ["$2", "$3"]);
        assert_eq!(log.room_id(), Some("!r:x"));
        assert!(log.is_always_allowed(&("t".into(), "r".into())));
        assert_eq!(log.turn("$1").await.unwrap().unwrap().output, "one");
        assert!(log.begin("$1").await.unwrap().is_none(), "finished");
        let (turn, history) = log.begin("$3").await.unwrap().unwrap();
        assert_eq!(turn.text, "text 3");
        assert_eq!((history.earlier, history.attachments), (2, 2));
        assert_eq!(history.recent.len(), 2);
        assert_eq!(history.recent[0].output, "one");
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
            assert!(log.is_always_allowed(&("t".into(), "r".into())));
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
