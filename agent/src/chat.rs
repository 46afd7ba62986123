//! Chats: one [`Chat`] per chat id with its durable history, its turn lane (one turn at a time)
//! and its current connection; [`Chats`] loads them lazily from the store. A user message is
//! admitted here (decided and stored under one lock) before anything acknowledges it.

mod admission;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use protocol::{ChatId, UserMessage, WorkspacePath};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use self::admission::{Admission, MAX_SEQ, MAX_SEQ_AHEAD, Refusal, decide};
use crate::store::{ChatLog, History, Store, StoreError, TurnEnd, TurnRecord, TurnStatus};

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

    /// The chat `id`, loading its log on first use.
    pub fn chat(&self, id: &ChatId) -> Result<Arc<Chat>, StoreError> {
        let mut chats = self.chats.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(chat) = chats.get(id) {
            return Ok(chat.clone());
        }
        let log = self.store.load(id)?;
        let last_seq = admission::plausible_last_seq(log.seqs());
        let chat = Arc::new(Chat {
            id: id.clone(),
            state: tokio::sync::Mutex::new(State { log, last_seq }),
            lane: tokio::sync::Mutex::new(()),
            current: Mutex::new(None),
        });
        chats.insert(id.clone(), chat.clone());
        Ok(chat)
    }
}

/// A chat's stored history and what admission derives from it.
#[derive(Debug)]
struct State {
    log: ChatLog,
    /// Highest plausible stored `seq` (0 while there are no turns). Messages are identified
    /// by id, so a new id with a lower `seq` is stored too and leaves this unchanged.
    last_seq: u64,
}

/// One chat: its durable history, its lane (one turn at a time) and its current connection.
#[derive(Debug)]
pub struct Chat {
    /// The chat id.
    pub id: ChatId,
    state: tokio::sync::Mutex<State>,
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
    pub async fn last_seq(&self) -> u64 {
        self.state.lock().await.last_seq
    }

    /// Stores a user message durably if [`decide`] admits it as new; a duplicate or a refused
    /// message leaves the history untouched. Decision and store happen under one lock, so two
    /// connections racing with the same message cannot both store it.
    pub async fn admit(&self, msg: &UserMessage) -> Result<Admission, StoreError> {
        let mut state = self.state.lock().await;
        let stored = state.log.contains(&msg.id).await?;
        let admission = decide(stored, msg.seq, state.last_seq);
        if admission != Admission::New {
            return Ok(admission);
        }
        // `checked_add`: a record from an older agent may hold `last_seq == u64::MAX`.
        if state.last_seq.checked_add(1) != Some(msg.seq) {
            // Admitted all the same: the id is what identifies a message.
            warn!(
                seq = msg.seq,
                last_seq = state.last_seq,
                "sequence number out of line (a gap, or reused)"
            );
        }
        state.log.append_turn(msg).await?;
        state.last_seq = state.last_seq.max(msg.seq);
        Ok(Admission::New)
    }

    /// Ids of stored turns that have not finished, in order.
    pub async fn pending_turns(&self) -> Vec<String> {
        self.state.lock().await.log.pending()
    }

    /// The pending turn `id` with what came before it and the chat's room; `None` if it is
    /// not pending (already run).
    pub(crate) async fn begin(
        &self,
        id: &str,
    ) -> Result<Option<(TurnRecord, History, Option<String>)>, StoreError> {
        let state = self.state.lock().await;
        let room_id = state.log.room_id().map(str::to_owned);
        Ok(state
            .log
            .begin(id)
            .await?
            .map(|(turn, history)| (turn, history, room_id)))
    }

    /// The stored turn `id` if it has finished (its answer can be replayed).
    pub(crate) async fn finished(&self, id: &str) -> Result<Option<TurnRecord>, StoreError> {
        let state = self.state.lock().await;
        Ok(state
            .log
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
        self.state.lock().await.log.finish(end).await
    }

    /// Records durably what the agent made of turn `id`'s attachments.
    pub async fn perceive(
        &self,
        id: &str,
        perceived: std::collections::BTreeMap<WorkspacePath, crate::store::Perceived>,
    ) -> Result<(), StoreError> {
        self.state.lock().await.log.perceive(id, perceived).await
    }

    /// Whether `user` allowed `(tool, resource)` for good in this chat.
    pub async fn is_always_allowed(&self, user: &str, key: &(String, String)) -> bool {
        self.state.lock().await.log.is_always_allowed(user, key)
    }

    /// Remembers durably that `user` allowed `(tool, resource)` for good.
    pub async fn allow_always(&self, user: &str, key: (String, String)) -> Result<(), StoreError> {
        self.state.lock().await.log.allow_always(user, key).await
    }
}
