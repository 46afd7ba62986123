//! A chat's record in whichever backend the agent was configured with, as one type.

use std::collections::BTreeMap;

use protocol::{UserMessage, WorkspacePath};

use super::admission::Admission;
use super::pg::PgChat;
use super::record::{Begun, ChatRecord};
use super::{ChatLog, Perceived, Step, StoreError, TurnEnd, TurnRecord};

/// A chat's record in whichever backend the agent was configured with.
#[derive(Debug)]
pub enum AnyChat {
    /// The append-only log in the state directory (boxed: its index is much larger than a
    /// database handle).
    Files(Box<ChatLog>),
    /// Rows in PostgreSQL.
    Postgres(PgChat),
}

/// Forwards a [`ChatRecord`] method to the backend's implementation.
macro_rules! forward {
    ($self:ident . $method:ident ( $($arg:expr),* )) => {
        match $self {
            AnyChat::Files(c) => ChatRecord::$method(&mut **c, $($arg),*).await,
            AnyChat::Postgres(c) => ChatRecord::$method(c, $($arg),*).await,
        }
    };
}

impl ChatRecord for AnyChat {
    async fn admit(&mut self, msg: &UserMessage) -> Result<Admission, StoreError> {
        forward!(self.admit(msg))
    }

    async fn last_seq(&mut self) -> Result<u64, StoreError> {
        forward!(self.last_seq())
    }

    async fn pending(&mut self) -> Result<Vec<String>, StoreError> {
        forward!(self.pending())
    }

    async fn begin(&mut self, id: &str) -> Result<Option<Begun>, StoreError> {
        forward!(self.begin(id))
    }

    async fn turn(&mut self, id: &str) -> Result<Option<TurnRecord>, StoreError> {
        forward!(self.turn(id))
    }

    async fn finish(&mut self, end: TurnEnd) -> Result<(), StoreError> {
        forward!(self.finish(end))
    }

    async fn perceive(
        &mut self,
        id: &str,
        perceived: BTreeMap<WorkspacePath, Perceived>,
    ) -> Result<(), StoreError> {
        forward!(self.perceive(id, perceived))
    }

    async fn is_always_allowed(
        &mut self,
        user: &str,
        key: &(String, String),
    ) -> Result<bool, StoreError> {
        forward!(self.is_always_allowed(user, key))
    }

    async fn allow_always(&mut self, user: &str, key: (String, String)) -> Result<(), StoreError> {
        forward!(self.allow_always(user, key))
    }

    async fn steps(&mut self, id: &str) -> Result<Vec<Step>, StoreError> {
        forward!(self.steps(id))
    }

    async fn record_step(&mut self, id: &str, n: u32, step: &Step) -> Result<(), StoreError> {
        forward!(self.record_step(id, n, step))
    }

    fn idle(&mut self) {
        match self {
            AnyChat::Files(c) => ChatRecord::idle(&mut **c),
            AnyChat::Postgres(c) => ChatRecord::idle(c),
        }
    }
}
