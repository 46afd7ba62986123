//! From timeline events to journal rows: each event is classified by the pure
//! [`crate::decide`], the batch is journaled in one transaction before anything acts on it, and
//! then answers go to the waiting turn and lanes are woken. Also used when an event that could
//! not be decrypted finally can be ([`crate::undecrypted`]).

mod notices;

use std::collections::BTreeMap;
use std::time::Duration;

use matrix_sdk::{Room, RoomMemberships};
use protocol::ChatId;
use tracing::{debug, error, info, warn};

use crate::context::Ctx;
use crate::decide::{self, Decision, Facts, IgnoreReason};
use crate::event::{Arrival, RawEvent};
use crate::journal::{ChatRef, Disposition, EditTarget, NewEvent};
use crate::lanes;
use crate::prompts;
use crate::render;

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
        Self {
            members,
            bot_display_name: ctx.bot_display_name(),
            allowed: ctx
                .config
                .is_room_allowed(room.room_id().as_str(), aliases.iter().map(String::as_str)),
            every_message: ctx
                .journal
                .every_message(room.room_id().as_str())
                .unwrap_or(false),
            encrypted: room.encryption_state().is_encrypted(),
        }
    }
}

/// Classifies `e` and builds its journal row.
pub async fn classify(
    ctx: &Ctx,
    room: &Room,
    facts: &RoomFacts,
    e: &RawEvent,
) -> (NewEvent, Decision) {
    let room_id = room.room_id().as_str();
    let bot = ctx.config.user_id.as_str();
    let thread_root = e.thread_root();
    // A thread's messages carry a reply fallback to its latest event (MSC3440), which is no
    // reply to the bot of its own: `is_falling_back` tells them apart.
    let reply_to_bot = e
        .replied_to()
        .is_some_and(|id| ctx.journal.is_own_post(id).unwrap_or(false));
    let in_bot_thread = thread_root
        .as_deref()
        .is_some_and(|r| ctx.journal.bot_in_thread(r).unwrap_or(false));
    // A reaction answers the prompt it is on, and only for the user the prompt asks.
    let annotation = e.annotation();
    let waiting = match annotation {
        Some((target, _)) => ctx.waits.by_prompt_from(target, &e.sender),
        None => ctx.waits.lookup(room_id, &e.sender),
    };
    // An edit: where the edited message stands, and the text a follow-up turn would get.
    let edit = edit_of(ctx, e);
    let thread_root = match &edit {
        // A follow-up is answered under the message it changes, where its first answer went.
        Some((target, EditTarget::Ran(_), _)) => Some(target.clone()),
        _ => thread_root,
    };
    // A redaction: the message it removes, as the journal knows it.
    let redacted = e
        .redacted_event()
        .and_then(|t| ctx.journal.redaction_target(t).ok().flatten());
    let thread_root = match &redacted {
        Some(r) => r.thread_root.clone(),
        None => thread_root,
    };
    let chat = ChatId::for_conversation(room_id, thread_root.as_deref());
    let decision = decide::decide(&Facts {
        bot_user_id: bot,
        bot_display_name: facts.bot_display_name.as_deref(),
        sender: &e.sender,
        sender_allowed: ctx.config.is_allowed(&e.sender),
        room_allowed: facts.allowed,
        sender_is_bot: is_bot(ctx, &e.sender),
        bot_streak: ctx.bot_loops.streak(&chat),
        max_bot_turns: ctx.config.max_bot_turns,
        is_message: e.kind == "m.room.message",
        undecryptable: e.is_undecryptable(),
        room_encrypted: facts.encrypted,
        arrived_encrypted: matches!(e.arrival, Arrival::Encrypted { .. }),
        verified_device: e.arrival == (Arrival::Encrypted { verified: true }),
        approvals_need_verified: ctx.config.approvals_need_verified,
        is_notice: e.msgtype() == "m.notice",
        is_edit: e.rel_type() == Some("m.replace"),
        is_redaction: e.redacted_event().is_some(),
        edited: edit.as_ref().and_then(|(_, t, _)| match t {
            EditTarget::Queued => Some(decide::Edited::Queued),
            EditTarget::Ran(_) => Some(decide::Edited::Ran),
            EditTarget::Other => None,
        }),
        has_media: e.has_media(),
        unsupported: e.unsupported(),
        reaction: annotation.map(|(_, key)| key),
        body: e.body(),
        mentions_bot: e.mentions(bot),
        reply_to_bot,
        in_bot_thread,
        threads_need_mention: ctx.config.threads_need_mention,
        direct_chat: facts.members <= 2,
        every_message: facts.every_message,
        waiting,
    });
    let disposition = match &decision {
        Decision::Ignore(_)
        | Decision::Unsupported(_)
        | Decision::Plaintext
        | Decision::UnverifiedApproval { .. }
        | Decision::ReplaceQueued
        | Decision::SetMode { .. } => Disposition::Skip,
        // The agent hears of removed files with the chat's next turn.
        Decision::Redaction => match &redacted {
            Some(r) if !r.attachments.is_empty() => Disposition::Context,
            _ => Disposition::Skip,
        },
        Decision::Context => Disposition::Context,
        Decision::Trigger => Disposition::Trigger,
        Decision::WaitForKey => Disposition::Waiting,
        Decision::Answer(_) | Decision::Approval { .. } => Disposition::Answered,
    };
    let keep = disposition != Disposition::Skip;
    let sender_name = if keep {
        let sender: &matrix_sdk::ruma::UserId =
            e.sender.as_str().try_into().unwrap_or(&ctx.config.user_id);
        ctx.member_names.display_name(room, sender).await
    } else {
        None
    };
    let content = match (disposition, &edit) {
        (Disposition::Context, _) if decision == Decision::Redaction => {
            let names: Vec<&str> = redacted
                .iter()
                .flat_map(|r| &r.attachments)
                .map(|p| protocol::original_name(p.file_name()))
                .collect();
            Some(
                serde_json::json!({
                    "msgtype": "m.text",
                    "body": format!(
                        "(I deleted a message I sent; its file {} was removed from the inbox.)",
                        names.join(", ")
                    ),
                })
                .to_string(),
            )
        }
        (Disposition::Trigger, Some((_, EditTarget::Ran(old), new))) => Some(
            serde_json::json!({
                "msgtype": "m.text",
                "body": format!("I edited my message \"{old}\" to: {}", new.body()),
            })
            .to_string(),
        ),
        // What replaces a queued message's content (acted on in `act`).
        (_, Some((_, EditTarget::Queued, new))) if decision == Decision::ReplaceQueued => {
            Some(new.content.to_string())
        }
        _ => match disposition {
            // The whole encrypted event: what decrypting it again needs.
            Disposition::Waiting => serde_json::to_string(e).ok(),
            _ => Some(e.content.to_string()),
        },
    };
    let row = NewEvent {
        event_id: e.event_id.clone(),
        room_id: room_id.to_owned(),
        chat_id: keep.then(|| ChatId::for_conversation(room_id, thread_root.as_deref())),
        // Kept for skipped events too: a notice about one goes to its thread.
        thread_root,
        sender: e.sender.clone(),
        sender_name,
        origin_ts: e.origin_server_ts,
        content,
        disposition,
    };
    (row, decision)
}

/// For an edit (`m.replace`) with new content: the edited event, where it stands, and the new
/// content as an event of its own.
fn edit_of(ctx: &Ctx, e: &RawEvent) -> Option<(String, EditTarget, RawEvent)> {
    if e.rel_type() != Some("m.replace") {
        return None;
    }
    let target = e
        .content
        .get("m.relates_to")?
        .get("event_id")?
        .as_str()?
        .to_owned();
    let new_content = e.content.get("m.new_content")?.clone();
    let standing = ctx
        .journal
        .edit_target(&target, &e.sender)
        .unwrap_or(EditTarget::Other);
    let new = RawEvent {
        content: new_content,
        ..e.clone()
    };
    Some((target, standing, new))
}

/// Carries out redaction `e`: the redacted message is not processed if it still waited, and the
/// files it brought leave the inbox.
fn redact(ctx: &Ctx, e: &RawEvent) {
    let Some(target) = e.redacted_event() else {
        return;
    };
    let dropped = ctx.journal.drop_pending(target).unwrap_or(false);
    let files = match ctx.journal.redaction_target(target) {
        Ok(Some(r)) => r.attachments,
        _ => Vec::new(),
    };
    let mut removed = 0;
    for path in &files {
        match ctx.workspace.remove_inbox_file(path) {
            Ok(true) => removed += 1,
            Ok(false) => {}
            Err(err) => warn!(error = %err, path = %path, "could not remove a redacted file"),
        }
    }
    info!(event_id = %e.event_id, redacted = %target, dropped, removed, "redaction");
}

/// Whether `user_id` is a bot: configured as one, or seen posting notices.
fn is_bot(ctx: &Ctx, user_id: &str) -> bool {
    ctx.config.is_known_bot(user_id) || ctx.bot_loops.posts_notices(user_id)
}

/// Counts turns bots trigger in a row per chat; tells the room once when the breaker trips.
fn bot_loop_step(ctx: &Ctx, ev: &NewEvent, decision: &Decision) {
    let chat = ChatId::for_conversation(&ev.room_id, ev.thread_root.as_deref());
    let max = ctx.config.max_bot_turns;
    match decision {
        Decision::Trigger if is_bot(ctx, &ev.sender) => {
            ctx.bot_loops
                .set_streak(&chat, ctx.bot_loops.streak(&chat) + 1);
        }
        Decision::Trigger => ctx.bot_loops.set_streak(&chat, 0),
        Decision::Ignore(IgnoreReason::BotLoop) if ctx.bot_loops.streak(&chat) == max => {
            // Once per streak: the count moves past the allowance.
            ctx.bot_loops.set_streak(&chat, max + 1);
            warn!(event_id = %ev.event_id, sender = %ev.sender, max, "bot loop: not answering another bot here");
            let text = format!(
                "🤖 {} is a bot and has had {max} answers in a row here; I stop answering it in \
                 this conversation until a person writes.",
                render::pill(&ev.sender)
            );
            notices::notify(ctx, ev, text, "bot-loop");
        }
        _ => {}
    }
}

/// Chats to wake after a batch, each once.
pub type Pokes = BTreeMap<ChatId, ChatRef>;

/// Acts on a journaled event: an answer goes to the waiting question or approval, a message to
/// its lane (woken by [`wake`]).
pub fn act(ctx: &Ctx, ev: &NewEvent, decision: Decision, e: &RawEvent, pokes: &mut Pokes) {
    let body = e.body();
    bot_loop_step(ctx, ev, &decision);
    match decision {
        Decision::Ignore(IgnoreReason::Notice) => ctx.bot_loops.saw_notice(&ev.sender),
        Decision::Ignore(reason) => {
            if ev.sender != ctx.config.user_id.as_str() {
                debug!(event_id = %ev.event_id, reason = ?reason, "ignored");
            }
        }
        Decision::SetMode { every_message } => notices::set_mode(ctx, ev, every_message),
        Decision::Redaction => {
            redact(ctx, e);
            if let Some(chat) = &ev.chat_id {
                pokes.entry(chat.clone()).or_insert_with(|| ChatRef {
                    chat_id: chat.clone(),
                    room_id: ev.room_id.clone(),
                    thread_root: ev.thread_root.clone(),
                });
            }
        }
        Decision::ReplaceQueued => {
            let target = e
                .content
                .get("m.relates_to")
                .and_then(|r| r.get("event_id"))
                .and_then(|t| t.as_str());
            let (Some(target), Some(new)) = (target, ev.content.as_deref()) else {
                return;
            };
            match ctx.journal.replace_queued_content(target, new) {
                Ok(replaced) => {
                    info!(event_id = %ev.event_id, edited = %target, replaced, "edit of a queued message")
                }
                Err(e) => error!(error = %e, "journal write failed"),
            }
        }
        Decision::Unsupported(kind) => {
            info!(event_id = %ev.event_id, kind, "content the bot cannot read");
            if ctx.bot_loops.first_notice(&ev.room_id, kind) {
                let text = format!(
                    "I cannot read a {kind} yet. Send a picture or a file, or say it in words."
                );
                notices::notify(ctx, ev, text, "unsupported");
            }
        }
        Decision::Plaintext => {
            warn!(
                room_id = %ev.room_id,
                event_id = %ev.event_id,
                sender = %ev.sender,
                "unencrypted event in an encrypted room: not acted on"
            );
            if ctx.bot_loops.first_notice(&ev.room_id, "plaintext") {
                let text = "⚠️ This room is encrypted, and I act only on what arrives \
                            encrypted in it. Reactions never are (Matrix clients send them in \
                            clear), so to answer a prompt, reply yes, always or no; an \
                            unencrypted message, edit or reaction is ignored here.";
                notices::notify_about(ctx, ev, e, text.to_owned(), "plaintext");
            }
        }
        Decision::UnverifiedApproval { request_id } => {
            warn!(
                room_id = %ev.room_id,
                event_id = %ev.event_id,
                sender = %ev.sender,
                request_id = %request_id,
                "approval from an unverified device: it does not count (SURFACE_APPROVALS=verified)"
            );
            let text = "⚠️ Approvals count only from a verified session here. Verify this \
                        session (or answer from one that is), then answer the prompt again; \
                        it is still waiting.";
            notices::notify_about(ctx, ev, e, text.to_owned(), "approval-unverified");
        }
        Decision::Answer(question_id) => {
            let text = decide::strip_reply_fallback(body);
            let delivered = ctx.waits.answer(&question_id, text, &ev.sender);
            info!(event_id = %ev.event_id, question_id = %question_id, delivered, "answer received");
        }
        Decision::Approval { request_id, choice } => {
            let decided = ctx.waits.decide(&request_id, choice, &ev.sender);
            if let Some(w) = &decided {
                prompts::show_outcome(ctx, w, choice, &ev.sender);
            }
            let delivered = decided.is_some();
            info!(event_id = %ev.event_id, request_id = %request_id, ?choice, delivered, "approval answered");
        }
        Decision::Context | Decision::Trigger | Decision::WaitForKey => {
            if let Some(chat) = &ev.chat_id {
                debug!(event_id = %ev.event_id, chat_id = %chat, disposition = ?ev.disposition, "journaled");
                pokes.entry(chat.clone()).or_insert_with(|| ChatRef {
                    chat_id: chat.clone(),
                    room_id: ev.room_id.clone(),
                    thread_root: ev.thread_root.clone(),
                });
            }
        }
    }
}

/// Wakes the lanes of `pokes`.
pub fn wake(ctx: &Ctx, pokes: Pokes) {
    for chat in pokes.into_values() {
        lanes::poke(ctx, chat);
    }
}

/// Decides and journals `events` of `room` (one transaction), then acts: answers go to the
/// waiting turn, lanes are woken.
pub async fn record(ctx: &Ctx, room: &Room, events: Vec<RawEvent>) {
    let batch = prepare(ctx, room, events).await;
    record_all(ctx, vec![batch]).await;
}

/// One room's new events, decided and ready to be journaled.
#[derive(Debug)]
pub struct Prepared {
    room: Room,
    events: Vec<RawEvent>,
    rows: Vec<NewEvent>,
    decisions: Vec<Decision>,
}

/// Decides what each of `events` of `room` is (nothing is written yet).
pub async fn prepare(ctx: &Ctx, room: &Room, events: Vec<RawEvent>) -> Prepared {
    let mut rows: Vec<NewEvent> = Vec::with_capacity(events.len());
    let mut decisions = Vec::with_capacity(events.len());
    if !events.is_empty() {
        let room_id = room.room_id().as_str();
        let facts = RoomFacts::read(ctx, room).await;
        for e in &events {
            let (row, decision) = classify(ctx, room, &facts, e).await;
            if decision == Decision::WaitForKey {
                warn!(
                    room_id,
                    event_id = %e.event_id,
                    sender = %e.sender,
                    session_id = %e.str_field("session_id"),
                    "message not decryptable yet; its chat waits for the room key"
                );
            }
            // An edit of a message in this very batch: the message is not journaled yet, so the
            // edit's lookup found nothing; it takes the new text before it is recorded.
            if let Some((target, _, new)) = edit_of(ctx, e)
                && let Some(edited) = rows.iter_mut().find(|r| {
                    r.event_id == target
                        && r.sender == e.sender
                        && matches!(r.disposition, Disposition::Trigger | Disposition::Context)
                })
            {
                info!(event_id = %e.event_id, edited = %target, "edit of a message in the same batch");
                edited.content = Some(new.content.to_string());
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
fn event_kind(e: &RawEvent) -> &'static str {
    match e.kind.as_str() {
        "m.room.message" => match e.content["msgtype"].as_str() {
            Some("m.image" | "m.file" | "m.audio" | "m.video") => "media",
            _ => "message",
        },
        "m.room.encrypted" => "encrypted",
        "m.reaction" => "reaction",
        "m.room.redaction" => "redaction",
        "m.room.member" => "member",
        _ => "other",
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
        Decision::SetMode { .. } => "set_mode",
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

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

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
