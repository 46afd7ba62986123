//! The sync loop: every timeline event is decided and journaled before anything acts on it
//! (record and return: downloads and turns happen in the lanes), gaps are backfilled with
//! `/messages` (after a `limited` sync and at start-up, since matrix-sdk saves its sync token
//! before our code runs), and invites from allowed users are joined.

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use matrix_sdk::config::SyncSettings;
use matrix_sdk::deserialized_responses::TimelineEvent;
use matrix_sdk::event_handler::Ctx as HandlerCtx;
use matrix_sdk::room::MessagesOptions;
use matrix_sdk::ruma::UInt;
use matrix_sdk::ruma::events::room::member::{MembershipState, StrippedRoomMemberEvent};
use matrix_sdk::ruma::events::room::message::RoomMessageEventContent;
use matrix_sdk::{LoopCtrl, Room, RoomMemberships};
use protocol::ChatId;
use serde::Deserialize;
use tracing::{debug, error, info, instrument, warn};

use crate::context::Ctx;
use crate::decide::{self, Decision, Facts};
use crate::journal::{ChatRef, Disposition, NewEvent};
use crate::render;
use crate::send::{self, Outgoing};

/// Events fetched per `/messages` page while backfilling.
const PAGE: u32 = 50;
/// Most events a single backfill walks back before giving up (and logging the gap).
const BACKFILL_HORIZON: usize = 500;

/// The fields of a timeline event the surface looks at.
#[derive(Debug, Clone, Deserialize)]
pub struct RawEvent {
    /// Event id.
    pub event_id: String,
    /// Sender.
    pub sender: String,
    /// `origin_server_ts`.
    #[serde(default)]
    pub origin_server_ts: u64,
    /// Event type.
    #[serde(rename = "type")]
    pub kind: String,
    /// Content (kept raw for the journal).
    #[serde(default)]
    pub content: serde_json::Value,
    /// State key for state events.
    #[serde(default)]
    pub state_key: Option<String>,
    /// Unsigned data (`prev_content` for membership transitions).
    #[serde(default)]
    pub unsigned: serde_json::Value,
}

impl RawEvent {
    /// Parses a timeline event; `None` for events without the basic fields (e.g. redacted
    /// beyond recognition).
    pub fn parse(ev: &TimelineEvent) -> Option<Self> {
        serde_json::from_str(ev.raw().json().get()).ok()
    }

    /// The thread root, when the event is in a thread.
    pub fn thread_root(&self) -> Option<String> {
        let rel = self.content.get("m.relates_to")?;
        (rel.get("rel_type")?.as_str()? == "m.thread")
            .then(|| rel.get("event_id")?.as_str().map(str::to_owned))
            .flatten()
    }

    fn rel_type(&self) -> Option<&str> {
        self.content.get("m.relates_to")?.get("rel_type")?.as_str()
    }

    fn in_reply_to(&self) -> Option<&str> {
        self.content
            .get("m.relates_to")?
            .get("m.in_reply_to")?
            .get("event_id")?
            .as_str()
    }

    fn body(&self) -> &str {
        self.content
            .get("body")
            .and_then(|b| b.as_str())
            .unwrap_or_default()
    }

    fn msgtype(&self) -> &str {
        self.content
            .get("msgtype")
            .and_then(|b| b.as_str())
            .unwrap_or_default()
    }

    fn mentions(&self, user_id: &str) -> bool {
        self.content
            .get("m.mentions")
            .and_then(|m| m.get("user_ids"))
            .and_then(|u| u.as_array())
            .is_some_and(|ids| ids.iter().any(|i| i.as_str() == Some(user_id)))
    }

    /// Whether this is `user_id` joining (not a profile change while joined).
    pub fn is_join_of(&self, user_id: &str) -> bool {
        let membership = |v: &serde_json::Value| {
            v.get("membership")
                .and_then(|m| m.as_str())
                .map(str::to_owned)
        };
        self.kind == "m.room.member"
            && self.state_key.as_deref() == Some(user_id)
            && membership(&self.content).as_deref() == Some("join")
            && self
                .unsigned
                .get("prev_content")
                .and_then(membership)
                .as_deref()
                != Some("join")
    }
}

/// Invites being joined right now (the SDK may deliver a stripped state event twice).
#[derive(Debug, Default)]
pub struct Joining(Mutex<HashSet<String>>);

/// Registers the invite handler.
pub fn register_handlers(ctx: &Ctx) {
    ctx.client.add_event_handler_context(ctx.clone());
    ctx.client.add_event_handler(on_invite);
}

async fn on_invite(ev: StrippedRoomMemberEvent, room: Room, HandlerCtx(ctx): HandlerCtx<Ctx>) {
    let own = ctx.client.user_id().map(|u| u.to_string());
    if own.as_deref() != Some(ev.state_key.as_str())
        || ev.content.membership != MembershipState::Invite
    {
        return;
    }
    let room_id = room.room_id().to_owned();
    if !ctx.config.is_allowed(ev.sender.as_str()) {
        info!(room_id = %room_id, sender = %ev.sender, "ignoring invite from a user who is not allowed");
        return;
    }
    {
        let mut joining = ctx.joining.0.lock().unwrap_or_else(|p| p.into_inner());
        if !joining.insert(room_id.to_string()) {
            return;
        }
    }
    let ctx2 = ctx.clone();
    // Joining is a network round trip (with retries): never inside the handler.
    ctx.tracker.spawn(async move {
        let mut delay = Duration::from_millis(500);
        for attempt in 1..=6 {
            match room.join().await {
                Ok(()) => {
                    info!(room_id = %room_id, sender = %ev.sender, "joined room on invite");
                    break;
                }
                Err(e) if attempt < 6 => {
                    warn!(room_id = %room_id, error = %e, attempt, "join failed, retrying");
                    tokio::select! {
                        _ = ctx2.shutdown.cancelled() => break,
                        _ = tokio::time::sleep(delay) => {}
                    }
                    delay *= 2;
                }
                Err(e) => error!(room_id = %room_id, error = %e, "could not join room"),
            }
        }
        ctx2.joining
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(room_id.as_str());
    });
}

/// Catches up every joined room from its live end back to the last journaled event (events
/// lost between the SDK saving its token and our journal, e.g. in a crash).
pub async fn catch_up_all(ctx: &Ctx) {
    for room in ctx.client.joined_rooms() {
        if ctx.shutdown.is_cancelled() {
            return;
        }
        let events = collect_new(ctx, &room, Vec::new(), true, None).await;
        if !events.is_empty() {
            info!(room_id = %room.room_id(), count = events.len(), "caught up on missed events");
        }
        record(ctx, &room, events).await;
    }
}

/// Runs the sync loop until shutdown.
pub async fn run(ctx: Ctx) -> Result<(), matrix_sdk::Error> {
    // The first sync returns at once (no long-poll), so a restarted bot is ready without waiting
    // for traffic; later syncs long-poll.
    let settings = SyncSettings::default()
        .timeout(Duration::from_secs(30))
        .ignore_timeout_on_first_sync(true);
    let ready_logged = std::sync::atomic::AtomicBool::new(false);
    let ctx2 = ctx.clone();
    let sync = ctx.client.sync_with_result_callback(settings, |result| {
        let ctx = ctx2.clone();
        let ready_logged = &ready_logged;
        async move {
            if ctx.shutdown.is_cancelled() {
                return Ok(LoopCtrl::Break);
            }
            match result {
                Ok(response) => {
                    for (room_id, update) in response.rooms.joined {
                        let Some(room) = ctx.client.get_room(&room_id) else {
                            continue;
                        };
                        let events: Vec<RawEvent> =
                            update.timeline.events.iter().filter_map(RawEvent::parse).collect();
                        let new = collect_new(
                            &ctx,
                            &room,
                            events,
                            update.timeline.limited,
                            update.timeline.prev_batch,
                        )
                        .await;
                        record(&ctx, &room, new).await;
                    }
                    ctx.health.set_synced();
                    if !ready_logged.swap(true, std::sync::atomic::Ordering::SeqCst) {
                        info!(
                            user_id = %ctx.client.user_id().map(|u| u.to_string()).unwrap_or_default(),
                            device_id = %ctx.client.device_id().map(|d| d.to_string()).unwrap_or_default(),
                            "surface ready"
                        );
                    }
                }
                Err(e) => {
                    warn!(error = %e, "sync failed; retrying");
                    tokio::select! {
                        _ = ctx.shutdown.cancelled() => return Ok(LoopCtrl::Break),
                        _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                    }
                }
            }
            Ok(LoopCtrl::Continue)
        }
    });
    tokio::select! {
        _ = ctx.shutdown.cancelled() => Ok(()),
        r = sync => r,
    }
}

/// The events of `room` not journaled yet, oldest first: the `newest` page (from sync; may be
/// empty) and, if it does not reach back to known ground and `more_before`, older pages from
/// `/messages`. On a room's first sight only events after the bot's own join count (or, if
/// the join is out of reach, events newer than this process).
#[instrument(skip_all, fields(room_id = %room.room_id()))]
async fn collect_new(
    ctx: &Ctx,
    room: &Room,
    newest: Vec<RawEvent>,
    more_before: bool,
    prev_batch: Option<String>,
) -> Vec<RawEvent> {
    let room_id = room.room_id().as_str();
    let own = ctx.config.user_id.as_str();
    let known = ctx.journal.room_known(room_id).unwrap_or(false);
    let is_stop =
        |e: &RawEvent| e.is_join_of(own) || ctx.journal.contains(&e.event_id).unwrap_or(false);

    let mut newest_first: Vec<RawEvent> = Vec::new();
    let mut stopped = false;
    for e in newest.into_iter().rev() {
        if is_stop(&e) {
            stopped = true;
            break;
        }
        newest_first.push(e);
    }
    if !stopped && more_before {
        let mut token = prev_batch;
        'pages: while newest_first.len() < BACKFILL_HORIZON {
            let mut options = MessagesOptions::backward().from(token.as_deref());
            options.limit = UInt::from(PAGE);
            let page = match room.messages(options).await {
                Ok(p) => p,
                Err(e) => {
                    warn!(error = %e, "backfill failed; some events may be missing");
                    break;
                }
            };
            if page.chunk.is_empty() {
                break;
            }
            for ev in &page.chunk {
                let Some(e) = RawEvent::parse(ev) else {
                    continue;
                };
                if is_stop(&e) {
                    stopped = true;
                    break 'pages;
                }
                newest_first.push(e);
            }
            match page.end {
                Some(t) => token = Some(t),
                None => break,
            }
        }
        if !stopped && newest_first.len() >= BACKFILL_HORIZON {
            warn!(
                horizon = BACKFILL_HORIZON,
                "backfill horizon reached; older events are skipped"
            );
        }
    }
    let mut events: Vec<RawEvent> = newest_first.into_iter().rev().collect();
    if !stopped && !known {
        let before = events.len();
        events.retain(|e| e.origin_server_ts >= ctx.started_ms);
        if before != events.len() {
            info!(
                skipped = before - events.len(),
                "first sight of room: older history is not answered"
            );
        }
    }
    events
}

/// Decides and journals `events` of `room` (one transaction), then acts: answers go to the
/// waiting turn, lanes are woken.
async fn record(ctx: &Ctx, room: &Room, events: Vec<RawEvent>) {
    let room_id = room.room_id().as_str();
    if events.is_empty() {
        // Still mark the room as seen: its later gaps are then real gaps.
        if let Err(e) = ctx.journal.record(room_id, &[]) {
            error!(error = %e, "journal write failed");
        }
        return;
    }
    let mut members = room.joined_members_count();
    if members == 0 {
        members = room
            .members_no_sync(RoomMemberships::JOIN)
            .await
            .map(|m| m.len() as u64)
            .unwrap_or(0);
    }
    let bot = ctx.config.user_id.as_str();
    let display_name = ctx.bot_display_name();
    let mut news = Vec::with_capacity(events.len());
    let mut decisions = Vec::with_capacity(events.len());
    for e in &events {
        let thread_root = e.thread_root();
        let reply_to_bot = e
            .in_reply_to()
            .is_some_and(|id| ctx.journal.is_own_post(id).unwrap_or(false))
            || thread_root
                .as_deref()
                .is_some_and(|r| ctx.journal.bot_in_thread(r).unwrap_or(false));
        let facts = Facts {
            bot_user_id: bot,
            bot_display_name: display_name.as_deref(),
            sender: &e.sender,
            sender_allowed: ctx.config.is_allowed(&e.sender),
            is_message: e.kind == "m.room.message",
            is_notice: e.msgtype() == "m.notice",
            is_edit: e.rel_type() == Some("m.replace"),
            body: e.body(),
            mentions_bot: e.mentions(bot),
            reply_to_bot,
            direct_chat: members <= 2,
            waiting: ctx.waits.lookup(room_id, &e.sender),
        };
        let decision = decide::decide(&facts);
        let disposition = match &decision {
            Decision::Ignore(_) => Disposition::Skip,
            Decision::Context => Disposition::Context,
            Decision::Trigger => Disposition::Trigger,
            Decision::Answer(_) | Decision::Approval { .. } => Disposition::Answered,
        };
        let keep = disposition != Disposition::Skip;
        let sender_name = if keep {
            match room
                .get_member_no_sync(e.sender.as_str().try_into().unwrap_or(&ctx.config.user_id))
                .await
            {
                Ok(Some(m)) => m.display_name().map(str::to_owned),
                _ => None,
            }
        } else {
            None
        };
        news.push(NewEvent {
            event_id: e.event_id.clone(),
            room_id: room_id.to_owned(),
            chat_id: keep.then(|| ChatId::for_conversation(room_id, thread_root.as_deref())),
            thread_root: if keep { thread_root } else { None },
            sender: e.sender.clone(),
            sender_name,
            origin_ts: e.origin_server_ts,
            content: keep.then(|| e.content.to_string()),
            disposition,
        });
        decisions.push(decision);
    }
    let inserted = match ctx.journal.record(room_id, &news) {
        Ok(i) => i,
        Err(e) => {
            // Nothing acts on unrecorded events; the next start-up catch-up finds them again.
            error!(error = %e, "journal write failed; events will be caught up later");
            return;
        }
    };
    if let Some(after) = ctx.config.offline_notice_after {
        let fresh_triggers: Vec<u64> = news
            .iter()
            .zip(&inserted)
            .filter(|(ev, new)| **new && ev.disposition == Disposition::Trigger)
            .map(|(ev, _)| ev.origin_ts)
            .collect();
        let missed = missed_while_offline(&fresh_triggers, ctx.started_ms, now_ms(), after);
        if missed > 0 {
            announce_catch_up(ctx, room, missed).await;
        }
    }
    let mut poke: BTreeMap<ChatId, ChatRef> = BTreeMap::new();
    for ((ev, decision), new) in news.iter().zip(decisions).zip(inserted) {
        if !new {
            continue;
        }
        match decision {
            Decision::Ignore(reason) => {
                if ev.sender != bot {
                    debug!(event_id = %ev.event_id, reason = ?reason, "ignored");
                }
            }
            Decision::Answer(question_id) => {
                let text = events
                    .iter()
                    .find(|e| e.event_id == ev.event_id)
                    .map(|e| decide::strip_reply_fallback(e.body()).to_owned())
                    .unwrap_or_default();
                let delivered = ctx.waits.answer(&question_id, &text, &ev.sender);
                info!(event_id = %ev.event_id, question_id = %question_id, delivered, "answer received");
            }
            Decision::Approval { request_id, choice } => {
                let delivered = ctx.waits.decide(&request_id, choice, &ev.sender);
                info!(event_id = %ev.event_id, request_id = %request_id, ?choice, delivered, "approval answered");
            }
            Decision::Context | Decision::Trigger => {
                if let Some(chat) = &ev.chat_id {
                    debug!(event_id = %ev.event_id, chat_id = %chat, disposition = ?ev.disposition, "journaled");
                    poke.entry(chat.clone()).or_insert_with(|| ChatRef {
                        chat_id: chat.clone(),
                        room_id: room_id.to_owned(),
                        thread_root: ev.thread_root.clone(),
                    });
                }
            }
        }
    }
    for chat in poke.into_values() {
        ctx.lanes.poke(ctx, chat);
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

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// Tells `room` that messages sent while the bot was down are being answered now. Once per
/// room and process start (the transaction id says so); a courtesy, so it does not hold up
/// the sync loop for long.
async fn announce_catch_up(ctx: &Ctx, room: &Room, missed: usize) {
    let room_id = room.room_id().as_str();
    info!(
        room_id,
        missed, "messages arrived while the surface was down; catching up"
    );
    let text = if missed == 1 {
        "👋 I was offline and missed a message; answering it now.".to_owned()
    } else {
        format!("👋 I was offline and missed {missed} messages; answering them now, in order.")
    };
    let txn = render::notice_txn_id(&format!("{room_id}:{}", ctx.started_ms), "offline");
    let out = Outgoing {
        txn: &txn,
        thread_root: None,
        about: None,
        purpose: "offline",
    };
    let content = RoomMessageEventContent::notice_plain(text);
    match tokio::time::timeout(Duration::from_secs(10), send::post(ctx, room, content, out)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => warn!(room_id, error = %e, "could not post the catch-up notice"),
        Err(_) => warn!(room_id, "the catch-up notice took too long; skipped"),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn raw(v: serde_json::Value) -> RawEvent {
        serde_json::from_value(v).unwrap()
    }

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

    #[test]
    fn joins_and_threads() {
        let join = raw(json!({
            "event_id": "$j", "sender": "@bot:hs", "origin_server_ts": 1, "type": "m.room.member",
            "state_key": "@bot:hs", "content": {"membership": "join"},
            "unsigned": {"prev_content": {"membership": "invite"}}
        }));
        assert!(join.is_join_of("@bot:hs"));
        assert!(!join.is_join_of("@alice:hs"));
        let rename = raw(json!({
            "event_id": "$r", "sender": "@bot:hs", "origin_server_ts": 1, "type": "m.room.member",
            "state_key": "@bot:hs", "content": {"membership": "join", "displayname": "B"},
            "unsigned": {"prev_content": {"membership": "join"}}
        }));
        assert!(!rename.is_join_of("@bot:hs"));
        let threaded = raw(json!({
            "event_id": "$t", "sender": "@alice:hs", "origin_server_ts": 1, "type": "m.room.message",
            "content": {"msgtype": "m.text", "body": "hi",
                "m.mentions": {"user_ids": ["@bot:hs"]},
                "m.relates_to": {"rel_type": "m.thread", "event_id": "$root",
                    "m.in_reply_to": {"event_id": "$prev"}}}
        }));
        assert_eq!(threaded.thread_root().as_deref(), Some("$root"));
        assert_eq!(threaded.in_reply_to(), Some("$prev"));
        assert!(threaded.mentions("@bot:hs"));
        assert_eq!(threaded.body(), "hi");
        let edit = raw(json!({
            "event_id": "$e", "sender": "@alice:hs", "origin_server_ts": 1, "type": "m.room.message",
            "content": {"msgtype": "m.text", "body": "* hi", "m.relates_to": {"rel_type": "m.replace", "event_id": "$t"}}
        }));
        assert_eq!(edit.rel_type(), Some("m.replace"));
        assert_eq!(edit.thread_root(), None);
    }
}
