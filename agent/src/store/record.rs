//! What a chat's durable record offers, whichever backend keeps it: the append-only log in the
//! state directory ([`ChatLog`]) or PostgreSQL ([`PgChat`]). Chats hold an [`AnyChat`]; the
//! shared test suite (`store::suite`) runs every case against both.
//!
//! Every method that changes the record is durable when it returns, except [`ChatRecord::finish`]
//! on the file log (see the module docs of `store`): nothing is acknowledged before it is stored.

use std::collections::BTreeMap;
use std::future::Future;

use protocol::{UserMessage, WorkspacePath};

use super::admission::Admission;
use super::{History, Perceived, Step, StoreError, TurnEnd, TurnRecord};

/// A pending turn as a brain gets it, read in one go.
#[derive(Debug)]
pub struct Begun {
    /// The turn as admitted.
    pub turn: TurnRecord,
    /// What came before it.
    pub history: History,
    /// The chat's room, known from its first turn.
    pub room_id: Option<String>,
    /// The steps an interrupted earlier run of the turn completed, in order.
    pub steps: Vec<Step>,
}

/// One chat's durable record.
pub trait ChatRecord: Send {
    /// Decides on `msg` by its id and `seq` ([`super::admission::decide`]) and stores it as a
    /// pending turn if it is new, as one atomic step: two agents racing with the same message
    /// cannot both store it.
    fn admit(
        &mut self,
        msg: &UserMessage,
    ) -> impl Future<Output = Result<Admission, StoreError>> + Send;

    /// Highest plausible stored `seq` (0 before the first turn).
    fn last_seq(&mut self) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Ids of stored turns that have not finished, in arrival order.
    fn pending(&mut self) -> impl Future<Output = Result<Vec<String>, StoreError>> + Send;

    /// The pending turn `id` with what came before it and its recorded steps; `None` if it is
    /// not pending.
    fn begin(&mut self, id: &str)
    -> impl Future<Output = Result<Option<Begun>, StoreError>> + Send;

    /// The turn `id` as stored now, if there is one.
    fn turn(
        &mut self,
        id: &str,
    ) -> impl Future<Output = Result<Option<TurnRecord>, StoreError>> + Send;

    /// Records how a turn ended (nothing happens for an unknown id). What was perceived earlier
    /// is kept when `end` says nothing of it.
    fn finish(&mut self, end: TurnEnd) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Records what the agent made of turn `id`'s attachments; the turn stays as it stands.
    fn perceive(
        &mut self,
        id: &str,
        perceived: BTreeMap<WorkspacePath, Perceived>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Whether `user` allowed `(tool, resource)` for good in this chat.
    fn is_always_allowed(
        &mut self,
        user: &str,
        key: &(String, String),
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Remembers durably that `user` allowed `(tool, resource)` for good.
    fn allow_always(
        &mut self,
        user: &str,
        key: (String, String),
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The completed steps of pending turn `id`, in order (none once it ended).
    fn steps(&mut self, id: &str) -> impl Future<Output = Result<Vec<Step>, StoreError>> + Send;

    /// Records durably that step `n` (counted from 0) of pending turn `id` completed; a step
    /// already recorded under `n` is kept (the first record counts).
    fn record_step(
        &mut self,
        id: &str,
        n: u32,
        step: &Step,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The chat's turns stopped running in this process for now: what is held in memory to
    /// begin the next one sooner is dropped (nothing durable changes).
    fn idle(&mut self) {}
}
