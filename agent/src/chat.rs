//! Chats: one [`Chat`] per chat id with its durable history, its turn lane (one turn at a time)
//! and its current connection; [`Chats`] loads them lazily from the store. A user message is
//! admitted (decided and stored in one step of the store) before anything acknowledges it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use protocol::{ChatId, UserMessage, WorkspacePath};
use tokio_util::sync::CancellationToken;
use tracing::info;

pub use crate::store::admission::{Admission, MAX_SEQ, MAX_SEQ_AHEAD, Refusal, decide};
use crate::store::{
    AnyChat, Backend, Begun, ChatRecord, Step, StoreError, TurnEnd, TurnRecord, TurnStatus,
};

/// All chats this process has seen, loaded lazily from the store.
#[derive(Debug)]
pub struct Chats {
    store: Backend,
    chats: Mutex<HashMap<ChatId, Arc<Chat>>>,
}

impl Chats {
    /// The chats stored in `store`.
    pub fn new(store: Backend) -> Self {
        Self {
            store,
            chats: Mutex::new(HashMap::new()),
        }
    }

    /// The chat `id`, loading its log on first use.
    pub fn chat(&self, id: &ChatId) -> Result<Arc<Chat>, StoreError> {
        let mut chats = self.chats.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(chat) = chats.get(id) {
            return Ok(chat.clone());
        }
        let record = self.store.load(id)?;
        let chat = Arc::new(Chat {
            id: id.clone(),
            record: tokio::sync::Mutex::new(record),
            lane: tokio::sync::Mutex::new(()),
            current: Mutex::new(None),
        });
        chats.insert(id.clone(), chat.clone());
        Ok(chat)
    }
}

/// One chat: its durable history, its lane (one turn at a time) and its current connection.
#[derive(Debug)]
pub struct Chat {
    /// The chat id.
    pub id: ChatId,
    /// The durable record; its lock orders this process's changes to it.
    record: tokio::sync::Mutex<AnyChat>,
    /// Held while a turn runs, so turns of one chat never overlap, even across connections.
    pub(crate) lane: tokio::sync::Mutex<()>,
    /// The connection serving this chat: its id and the token that closes it.
    current: Mutex<Option<(u64, CancellationToken)>>,
}

impl Chat {
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
    pub async fn last_seq(&self) -> Result<u64, StoreError> {
        self.record.lock().await.last_seq().await
    }

    /// Stores a user message durably if [`decide`] admits it as new; a duplicate or a refused
    /// message leaves the history untouched. The store decides and stores in one step, so two
    /// connections (or two agents) racing with the same message cannot both store it.
    pub async fn admit(&self, msg: &UserMessage) -> Result<Admission, StoreError> {
        self.record.lock().await.admit(msg).await
    }

    /// Ids of stored turns that have not finished, in order.
    pub async fn pending_turns(&self) -> Result<Vec<String>, StoreError> {
        self.record.lock().await.pending().await
    }

    /// The pending turn `id` with what came before it and the chat's room; `None` if it is
    /// not pending (already run).
    pub(crate) async fn begin(&self, id: &str) -> Result<Option<Begun>, StoreError> {
        self.record.lock().await.begin(id).await
    }

    /// The stored turn `id` if it has finished (its answer can be replayed).
    pub(crate) async fn finished(&self, id: &str) -> Result<Option<TurnRecord>, StoreError> {
        Ok(self
            .record
            .lock()
            .await
            .turn(id)
            .await?
            .filter(|t| t.status != TurnStatus::Pending))
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
        let end = TurnEnd {
            id: id.to_owned(),
            status,
            output,
            sent_files,
            error,
            perceived: Default::default(),
        };
        self.record.lock().await.finish(end).await
    }

    /// Records durably what the agent made of turn `id`'s attachments.
    pub async fn perceive(
        &self,
        id: &str,
        perceived: std::collections::BTreeMap<WorkspacePath, crate::store::Perceived>,
    ) -> Result<(), StoreError> {
        self.record.lock().await.perceive(id, perceived).await
    }

    /// Whether `user` allowed `(tool, resource)` for good in this chat.
    pub async fn is_always_allowed(
        &self,
        user: &str,
        key: &(String, String),
    ) -> Result<bool, StoreError> {
        self.record.lock().await.is_always_allowed(user, key).await
    }

    /// Remembers durably that `user` allowed `(tool, resource)` for good.
    pub async fn allow_always(&self, user: &str, key: (String, String)) -> Result<(), StoreError> {
        self.record.lock().await.allow_always(user, key).await
    }

    /// The chat's turns stopped running here for now (its lease was given back): what the
    /// record holds in memory to begin the next turn sooner is dropped.
    pub(crate) async fn idle(&self) {
        self.record.lock().await.idle();
    }

    /// Records durably that step `n` of pending turn `id` completed.
    pub async fn record_step(&self, id: &str, n: u32, step: &Step) -> Result<(), StoreError> {
        self.record.lock().await.record_step(id, n, step).await
    }
}
