//! Chats: one [`Chat`] per chat id with its durable record, its turn lane (one turn at a time)
//! and its current connection; [`Chats`] loads them lazily from the store. A user message is
//! admitted here (decided and stored under one lock) before anything acknowledges it.

mod admission;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use protocol::{ChatId, UserMessage, WorkspacePath};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use self::admission::{Admission, MAX_SEQ, MAX_SEQ_AHEAD, Refusal, decide};
use crate::store::{ChatRecord, Store, StoreError, TurnRecord, TurnStatus};

/// All chats this process has seen, loaded lazily from the store.
#[derive(Debug)]
pub struct Chats {
    store: Store,
    chats: Mutex<HashMap<ChatId, Arc<Chat>>>,
}

impl Chats {
    /// The chats stored in `store`.
    pub fn new(store: Store) -> Self {
        Self {
            store,
            chats: Mutex::new(HashMap::new()),
        }
    }

    /// The chat `id`, loading its record on first use.
    pub fn chat(&self, id: &ChatId) -> Result<Arc<Chat>, StoreError> {
        let mut chats = self.chats.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(chat) = chats.get(id) {
            return Ok(chat.clone());
        }
        let mut record = self.store.load(id)?;
        record.last_seq = admission::plausible_last_seq(record.turns.iter().map(|t| t.seq));
        let chat = Arc::new(Chat {
            id: id.clone(),
            store: self.store.clone(),
            record: tokio::sync::Mutex::new(record),
            lane: tokio::sync::Mutex::new(()),
            current: Mutex::new(None),
        });
        chats.insert(id.clone(), chat.clone());
        Ok(chat)
    }
}

/// One chat: its durable record, its lane (one turn at a time) and its current connection.
#[derive(Debug)]
pub struct Chat {
    /// The chat id.
    pub id: ChatId,
    store: Store,
    record: tokio::sync::Mutex<ChatRecord>,
    /// Held while a turn runs, so turns of one chat never overlap, even across connections.
    pub(crate) lane: tokio::sync::Mutex<()>,
    /// The connection serving this chat: its id and the token that closes it.
    current: Mutex<Option<(u64, CancellationToken)>>,
}

impl Chat {
    /// Applies `change` to a copy of the record, stores it durably, then keeps it.
    async fn update<T>(&self, change: impl FnOnce(&mut ChatRecord) -> T) -> Result<T, StoreError> {
        let mut record = self.record.lock().await;
        let mut next = record.clone();
        let out = change(&mut next);
        self.store.save(&next).await?;
        *record = next;
        Ok(out)
    }

    /// Makes connection `conn` the chat's connection, closing the previous one.
    pub(crate) fn attach(&self, conn: u64, cancel: CancellationToken) {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((old, token)) = current.replace((conn, cancel)) {
            info!(
                old_conn = old,
                "a newer connection replaces the previous one"
            );
            token.cancel();
        }
    }

    /// Forgets connection `conn` if it is still the current one.
    pub(crate) fn detach(&self, conn: u64) {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if current.as_ref().is_some_and(|(c, _)| *c == conn) {
            *current = None;
        }
    }

    /// Whether `conn` is the chat's current connection.
    pub(crate) fn is_current(&self, conn: u64) -> bool {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        current.as_ref().is_some_and(|(c, _)| *c == conn)
    }

    /// Highest stored `seq` (0 before the first turn); the handshake reports it.
    pub async fn last_seq(&self) -> u64 {
        self.record.lock().await.last_seq
    }

    /// Stores a user message durably if [`decide`] admits it as new; a duplicate or a refused
    /// message leaves the record untouched. Decision and store happen under one lock, so two
    /// connections racing with the same message cannot both store it.
    pub async fn admit(&self, msg: &UserMessage) -> Result<Admission, StoreError> {
        let mut record = self.record.lock().await;
        let admission = decide(record.turn(&msg.id).is_some(), msg.seq, record.last_seq);
        if admission != Admission::New {
            return Ok(admission);
        }
        // `checked_add`: a record from an older agent may hold `last_seq == u64::MAX`.
        if record.last_seq.checked_add(1) != Some(msg.seq) {
            // Admitted all the same: the id is what identifies a message.
            warn!(
                seq = msg.seq,
                last_seq = record.last_seq,
                "sequence number out of line (a gap, or reused)"
            );
        }
        let mut next = record.clone();
        next.last_seq = next.last_seq.max(msg.seq);
        next.room_id.get_or_insert_with(|| msg.room_id.clone());
        if next.thread_root.is_none() {
            next.thread_root = msg.thread_root.clone();
        }
        next.turns.push(TurnRecord::from_message(msg));
        self.store.save(&next).await?;
        *record = next;
        Ok(Admission::New)
    }

    /// Ids of stored turns that have not finished, in order.
    pub async fn pending_turns(&self) -> Vec<String> {
        let record = self.record.lock().await;
        record
            .turns
            .iter()
            .filter(|t| t.status == TurnStatus::Pending)
            .map(|t| t.id.clone())
            .collect()
    }

    /// The pending turn `id` with the turns before it and the chat's room; `None` if it is
    /// not pending (already run).
    pub(crate) async fn begin(
        &self,
        id: &str,
    ) -> Option<(TurnRecord, Vec<TurnRecord>, Option<String>)> {
        let record = self.record.lock().await;
        let pos = record.turns.iter().position(|t| t.id == id)?;
        let turn = &record.turns[pos];
        if turn.status != TurnStatus::Pending {
            return None;
        }
        Some((
            turn.clone(),
            record.turns[..pos].to_vec(),
            record.room_id.clone(),
        ))
    }

    /// The stored turn `id` if it has finished (its answer can be replayed).
    pub(crate) async fn finished(&self, id: &str) -> Option<TurnRecord> {
        let record = self.record.lock().await;
        record
            .turn(id)
            .filter(|t| t.status != TurnStatus::Pending)
            .cloned()
    }

    /// Records how a turn ended.
    pub async fn finish(
        &self,
        id: &str,
        status: TurnStatus,
        output: String,
        sent_files: Vec<WorkspacePath>,
        error: Option<String>,
    ) -> Result<(), StoreError> {
        self.update(|r| {
            if let Some(t) = r.turn_mut(id) {
                t.status = status;
                t.output = output;
                t.sent_files = sent_files;
                t.error = error;
            }
        })
        .await
    }

    /// Whether the user allowed `(tool, resource)` for good in this chat.
    pub async fn is_always_allowed(&self, key: &(String, String)) -> bool {
        self.record.lock().await.always_allowed.contains(key)
    }

    /// Remembers durably that the user allowed `(tool, resource)` for good.
    pub async fn allow_always(&self, key: (String, String)) -> Result<(), StoreError> {
        self.update(|r| {
            r.always_allowed.insert(key);
        })
        .await
    }
}
