//! From timeline events to journal rows: each event is classified by the pure
//! [`crate::decide`], the batch is journaled in one transaction before anything acts on it, and
//! then answers go to the waiting turn and lanes are woken. Also used when an event that could
//! not be decrypted finally can be ([`crate::undecrypted`]).

mod act;
mod classify;
mod notices;
mod settings;
mod stop;

use std::collections::BTreeMap;
use std::time::Duration;

use matrix_sdk::{Room, RoomMemberships};
use protocol::ChatId;
use tracing::{error, info, warn};

pub use act::act;
pub use classify::classify;

use crate::command::Command;
use crate::context::Ctx;
use crate::decide::Decision;
use crate::inbound::{Inbound, Kind};
use crate::journal::{ChatRef, Disposition, NewEvent, Stored};
use crate::lanes;

/// What [`classify`] needs to know about the room, read once per batch.
#[derive(Debug, Clone)]
pub struct RoomFacts {
    /// Joined members (a DM has at most two).
    pub members: u64,
    /// The bot's display name, for mentions.
    pub bot_display_name: Option<String>,
    /// The room (by id or one of its aliases) matches `SURFACE_ALLOWED_ROOMS`.
    pub allowed: bool,
    /// Its moderators set the bot to answer every message.
    pub every_message: bool,
    /// Its settings let moderators decide approval prompts too.
    pub moderators_approve: bool,
    /// Encryption is on.
    pub encrypted: bool,
}

impl RoomFacts {
    /// Reads them from the client's store.
    pub async fn read(ctx: &Ctx, room: &Room) -> Self {
        let mut members = room.joined_members_count();
        if members == 0 {
            members = room
                .members_no_sync(RoomMemberships::JOIN)
                .await
                .map(|m| m.len() as u64)
                .unwrap_or(0);
        }
        let mut aliases: Vec<String> = room.alt_aliases().iter().map(ToString::to_string).collect();
        aliases.extend(room.canonical_alias().map(|a| a.to_string()));
        // The room's settings state event decides; `!mode` in the journal where it cannot.
        let settings = crate::room_settings::read(room).await.0;
        Self {
            members,
            bot_display_name: ctx.bot_display_name(),
            allowed: ctx
                .config
                .is_room_allowed(room.room_id().as_str(), aliases.iter().map(String::as_str)),
            every_message: settings.every_message.unwrap_or_else(|| {
                ctx.journal
                    .every_message(room.room_id().as_str())
                    .unwrap_or(false)
            }),
            encrypted: room.encryption_state().is_encrypted(),
            moderators_approve: settings.moderators_approve == Some(true),
        }
    }
}

/// Chats to wake after a batch, each once.
pub type Pokes = BTreeMap<ChatId, ChatRef>;

/// Wakes the lanes of `pokes`.
pub fn wake(ctx: &Ctx, pokes: Pokes) {
    for chat in pokes.into_values() {
        lanes::poke(ctx, chat);
    }
}

/// Decides and journals `events` of `room` (one transaction), then acts: answers go to the
/// waiting turn, lanes are woken.
pub async fn record(ctx: &Ctx, room: &Room, events: Vec<Inbound>) {
    let batch = prepare(ctx, room, events).await;
    record_all(ctx, vec![batch]).await;
}

/// One room's new events, decided and ready to be journaled.
#[derive(Debug)]
pub struct Prepared {
    room: Room,
    events: Vec<Inbound>,
    rows: Vec<NewEvent>,
    decisions: Vec<Decision>,
}

/// Decides what each of `events` of `room` is (nothing is written yet).
pub async fn prepare(ctx: &Ctx, room: &Room, events: Vec<Inbound>) -> Prepared {
    let mut rows: Vec<NewEvent> = Vec::with_capacity(events.len());
    let mut decisions = Vec::with_capacity(events.len());
    if !events.is_empty() {
        let room_id = room.room_id().as_str();
        let facts = RoomFacts::read(ctx, room).await;
        for e in &events {
            let (row, decision) = classify(ctx, room, &facts, e).await;
            if let (Decision::WaitForKey, Kind::Encrypted { session_id, .. }) = (&decision, &e.kind)
            {
                warn!(
                    room_id,
                    event_id = %e.event_id,
                    sender = %e.sender,
                    session_id = %session_id,
                    "message not decryptable yet; its chat waits for the room key"
                );
            }
            // An edit of a message in this very batch: the message is not journaled yet, so the
            // edit's lookup found nothing; it takes the new text before it is recorded.
            if let Kind::Edit { target, new, .. } = &e.kind
                && let Some(edited) = rows.iter_mut().find(|r| {
                    r.event_id == target.as_str()
                        && r.sender == e.sender.as_str()
                        && matches!(r.disposition, Disposition::Trigger | Disposition::Context)
                })
            {
                info!(event_id = %e.event_id, edited = %target, "edit of a message in the same batch");
                edited.content = Some(Stored::Message(new.clone()));
            }
            rows.push(row);
            decisions.push(decision);
        }
    }
    Prepared {
        room: room.clone(),
        events,
        rows,
        decisions,
    }
}

/// Journals the rooms of `batches` in one transaction (one fsync for a whole sync, however
/// many rooms spoke; a room without new events is still marked seen, so its later gaps are
/// real gaps), then acts on the new events room by room and wakes their lanes.
pub async fn record_all(ctx: &Ctx, batches: Vec<Prepared>) {
    let rooms: Vec<(&str, &[NewEvent])> = batches
        .iter()
        .map(|b| (b.room.room_id().as_str(), b.rows.as_slice()))
        .collect();
    let inserted = match ctx.journal.record_rooms(&rooms) {
        Ok(i) => i,
        Err(e) => {
            // Nothing acts on unrecorded events; the next start-up catch-up finds them again.
            let room_ids: Vec<&str> = rooms.iter().map(|(r, _)| *r).collect();
            let events: usize = rooms.iter().map(|(_, e)| e.len()).sum();
            error!(error = %e, ?room_ids, events, "journal write failed; events will be caught up later");
            return;
        }
    };
    crate::latency::journaled(
        batches
            .iter()
            .flat_map(|b| b.events.iter().map(|e| e.event_id.as_str())),
    );
    let mut pokes = Pokes::new();
    for (batch, inserted) in batches.into_iter().zip(inserted) {
        act_on_new(ctx, batch, inserted, &mut pokes).await;
    }
    wake(ctx, pokes);
}

/// After `batch` was journaled (`inserted`: which of its events were new): the offline
/// notice, the metrics, and [`act`] for each new event.
async fn act_on_new(ctx: &Ctx, batch: Prepared, inserted: Vec<bool>, pokes: &mut Pokes) {
    let Prepared {
        room,
        events,
        rows,
        decisions,
    } = batch;
    if let Some(after) = ctx.config.offline_notice_after {
        let fresh_triggers: Vec<u64> = rows
            .iter()
            .zip(&inserted)
            .filter(|(ev, new)| {
                **new && matches!(ev.disposition, Disposition::Trigger | Disposition::Waiting)
            })
            .map(|(ev, _)| ev.origin_ts)
            .collect();
        let missed = missed_while_offline(&fresh_triggers, ctx.started_ms, now_ms(), after);
        if missed > 0 {
            notices::announce_catch_up(ctx, &room, missed).await;
        }
    }
    for (((row, decision), new), e) in rows.iter().zip(decisions).zip(inserted).zip(&events) {
        if new {
            crate::metrics::event(event_kind(e), decision_label(&decision));
            act(ctx, row, decision, e, pokes);
        }
    }
}

/// The `kind` label of an event (a handful of values).
fn event_kind(e: &Inbound) -> &'static str {
    match &e.kind {
        Kind::Message(_) if classify::kind_facts(e).has_media => "media",
        Kind::Message(_) | Kind::Edit { .. } | Kind::Location | Kind::Unreadable => "message",
        Kind::Encrypted { .. } => "encrypted",
        Kind::Reaction { .. } => "reaction",
        Kind::Redaction { .. } => "redaction",
        Kind::Membership { .. } => "member",
        Kind::Sticker | Kind::Poll | Kind::Other(_) => "other",
    }
}

/// The `outcome` label of a decision.
fn decision_label(d: &Decision) -> &'static str {
    match d {
        Decision::Ignore(_) => "ignore",
        Decision::Context => "context",
        Decision::Trigger => "trigger",
        Decision::WaitForKey => "wait_for_key",
        Decision::Answer(_) => "answer",
        Decision::Redaction => "redaction",
        Decision::ReplaceQueued => "edit",
        Decision::Plaintext => "plaintext",
        Decision::UnverifiedApproval { .. } => "approval_unverified",
        Decision::Command(Command::Mode { .. }) => "set_mode",
        Decision::Command(Command::Stop) => "stop",
        Decision::Command(Command::Help) => "help",
        Decision::Command(Command::Set(_) | Command::SetUsage | Command::Settings) => "settings",
        Decision::Unsupported(_) => "unsupported",
        Decision::Approval { .. } => "approval",
    }
}

/// How many of the newly journaled triggers (their send times in ms) arrived while this
/// process was not running and waited at least `after` (pure).
fn missed_while_offline(
    trigger_ts: &[u64],
    started_ms: u64,
    now_ms: u64,
    after: Duration,
) -> usize {
    let after = after.as_millis() as u64;
    trigger_ts
        .iter()
        .filter(|ts| **ts < started_ms && now_ms.saturating_sub(**ts) >= after)
        .count()
}

pub use daemon::now_ms;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_missed_while_offline() {
        let min = Duration::from_secs(60);
        let start = 1_000_000;
        let now = start + 5_000;
        let table: &[(&[u64], usize)] = &[
            (&[], 0),
            // Sent while running: not missed.
            (&[start + 1_000], 0),
            // Sent just before a quick restart: not worth a notice.
            (&[start - 2_000], 0),
            // Waited over a minute for a surface that was down.
            (
                &[start - 120_000, start - 90_000, start - 1_000, start + 10],
                2,
            ),
        ];
        for (ts, expected) in table {
            assert_eq!(
                missed_while_offline(ts, start, now, min),
                *expected,
                "{ts:?}"
            );
        }
    }
}
