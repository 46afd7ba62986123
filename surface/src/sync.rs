//! The sync loop: every timeline event is decided and journaled before anything acts on it
//! (record and return: downloads and turns happen in the lanes), gaps are backfilled with
//! `/messages` (after a `limited` sync and at start-up, since matrix-sdk saves its sync token
//! before our code runs), and invites from allowed users are joined.

use std::time::Duration;

use backon::BackoffBuilder;
use matrix_sdk::Room;
use matrix_sdk::config::SyncSettings;
use matrix_sdk::event_handler::Ctx as HandlerCtx;
use matrix_sdk::room::MessagesOptions;
use matrix_sdk::ruma::UInt;
use matrix_sdk::ruma::api::client::membership::leave_room;
use matrix_sdk::ruma::api::error::ErrorKind;
use matrix_sdk::ruma::events::room::member::{MembershipState, StrippedRoomMemberEvent};
use matrix_sdk::sync::RoomUpdates;
use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio_util::task::AbortOnDropHandle;
use tracing::{error, info, instrument, warn};

use crate::context::Ctx;
use crate::event::{self, Landmark};
use crate::inbound::Inbound;
use crate::retry::{self, Verdict};
use crate::{ingest, send};

/// Events fetched per `/messages` page while backfilling.
const PAGE: u32 = 50;
/// Most events a single backfill walks back before giving up (and logging the gap).
const BACKFILL_HORIZON: usize = 500;
/// How long one `/sync` long-polls for news.
const LONG_POLL: Duration = Duration::from_secs(30);

/// Registers the invite handler.
pub fn register_handlers(ctx: &Ctx) {
    ctx.client.add_event_handler_context(ctx.clone());
    ctx.client.add_event_handler(on_invite);
}

/// Why the bot declines an invite to a room outside `SURFACE_ALLOWED_ROOMS`, in the leave event.
pub const DECLINE_REASON: &str =
    "This bot only joins the rooms its operator allows (SURFACE_ALLOWED_ROOMS).";

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
    let alias = room.canonical_alias().map(|a| a.to_string());
    if !ctx
        .config
        .is_room_allowed(room_id.as_str(), alias.as_deref())
    {
        info!(room_id = %room_id, sender = %ev.sender, "declining invite to a room that is not allowed");
        let client = ctx.client.clone();
        ctx.tracker.spawn(async move {
            // The reason shows in the inviter's client beside "declined the invite" (matrix-sdk's
            // `Room::leave` sends none).
            let mut request = leave_room::v3::Request::new(room_id.clone());
            request.reason = Some(DECLINE_REASON.to_owned());
            if let Err(e) = client.send(request).await {
                warn!(room_id = %room_id, error = %e, "could not decline the invite");
            }
        });
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
                    if let Some(joined) = ctx2.client.get_room(&room_id) {
                        crate::announce::on_join(&ctx2, &joined).await;
                    }
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
    // The rooms' command descriptions, kept current (only what changed is sent), meanwhile.
    let ctx2 = ctx.clone();
    ctx.tracker.spawn(async move {
        for room in ctx2.client.joined_rooms() {
            if ctx2.shutdown.is_cancelled() {
                return;
            }
            crate::announce::publish_commands(&ctx2, &room).await;
        }
    });
    for room in ctx.client.joined_rooms() {
        if ctx.shutdown.is_cancelled() {
            return;
        }
        let events = collect_new(ctx, &room, Vec::new(), true, None).await;
        if !events.is_empty() {
            info!(room_id = %room.room_id(), count = events.len(), "caught up on missed events");
        }
        ingest::record(ctx, &room, events).await;
    }
}

/// Runs the sync loop until shutdown: one `sync_once` after the other, waiting only after an
/// error (matrix-sdk's own loop sleeps a second after every quick sync, which a user answering
/// right after the bot's reply would feel as lag).
///
/// A sync's rooms are taken from matrix-sdk's room-update broadcast, not from what `sync_once`
/// returns: the SDK broadcasts them once it has stored the response, and only then sends its own
/// end-to-end encryption requests (one-time key claims and uploads, key queries, to-device
/// messages), each a round trip to the homeserver, before `sync_once` returns. Taken from the
/// broadcast, a message is journaled and on its way to the agent before those; the next sync
/// still starts only after both. `sync_once` runs as its own task meanwhile: suspended, it could
/// hold one of the SDK's locks (the key-claim lock, say) that the surface's own sends wait for.
pub async fn run(ctx: Ctx) -> Result<(), matrix_sdk::Error> {
    // The first sync returns at once (no long-poll), so a restarted bot is ready without waiting
    // for traffic; later syncs long-poll.
    let mut settings = SyncSettings::default()
        .filter(sync_filter())
        .timeout(Duration::ZERO);
    let new_backoff = || daemon::backoff(Duration::from_secs(1), Duration::from_secs(30)).build();
    let mut backoff = new_backoff();
    let mut ready = false;
    let mut locked = false;
    // `None` once the broadcast is closed (the client holds its sending end as long as it
    // lives, so never expected): then the rooms come from what `sync_once` returns.
    let mut updates = Some(ctx.client.subscribe_to_all_room_updates());
    loop {
        let Some(result) = sync_round(&ctx, &settings, &mut updates).await else {
            return Ok(());
        };
        match result {
            Ok(()) => {
                ctx.health.set_synced();
                if locked {
                    locked = false;
                    crate::session::report_logged_in(&ctx.health);
                }
                if !ready {
                    ready = true;
                    crate::logging::set_new_device(false);
                    settings = SyncSettings::default()
                        .filter(sync_filter())
                        .timeout(LONG_POLL);
                    info!(
                        user_id = %ctx.client.user_id().map(|u| u.to_string()).unwrap_or_default(),
                        device_id = %ctx.client.device_id().map(|d| d.to_string()).unwrap_or_default(),
                        "surface ready"
                    );
                }
                backoff = new_backoff();
            }
            Err(e) => {
                let delay = backoff.next().unwrap_or(Duration::from_secs(30));
                // A locked account (`M_USER_LOCKED`) keeps its token: syncing resumes by itself
                // once an admin unlocks it, and meanwhile `/healthz` says why nothing happens.
                if e.locked {
                    locked = true;
                    crate::session::report_logged_out(
                        &ctx.health,
                        crate::session::LoggedOut::Locked,
                    );
                }
                let e = e.why;
                warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "sync failed; retrying");
                tokio::select! {
                    _ = ctx.shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// A failed sync: why, and whether the homeserver said the bot's account is locked.
struct Failed {
    why: String,
    locked: bool,
}

impl From<String> for Failed {
    fn from(why: String) -> Self {
        Self { why, locked: false }
    }
}

/// One `sync_once`, journaling the rooms it brings from the broadcast meanwhile. `None` on
/// shutdown; else whether it worked.
async fn sync_round(
    ctx: &Ctx,
    settings: &SyncSettings,
    updates: &mut Option<tokio::sync::broadcast::Receiver<RoomUpdates>>,
) -> Option<Result<(), Failed>> {
    let client = ctx.client.clone();
    let request = settings.clone();
    let mut sync =
        AbortOnDropHandle::new(tokio::spawn(async move { client.sync_once(request).await }));
    let result = loop {
        let broadcast = async {
            match updates.as_mut() {
                Some(rx) => rx.recv().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = ctx.shutdown.cancelled() => return None,
            update = broadcast => take(ctx, updates, update).await,
            r = &mut sync => break r,
        }
    };
    // The broadcast can come in the very poll that finished the sync.
    while let Some(rx) = updates.as_mut() {
        let update = match rx.try_recv() {
            Err(TryRecvError::Empty) => break,
            Ok(rooms) => Ok(rooms),
            Err(TryRecvError::Lagged(n)) => Err(RecvError::Lagged(n)),
            Err(TryRecvError::Closed) => Err(RecvError::Closed),
        };
        take(ctx, updates, update).await;
    }
    Some(match result {
        Ok(Ok(response)) if updates.is_none() => {
            handle(ctx, response.rooms).await;
            Ok(())
        }
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(Failed {
            locked: matches!(e.client_api_error_kind(), Some(ErrorKind::UserLocked)),
            why: e.to_string(),
        }),
        // A panic inside matrix-sdk: a failed sync, tried again after the backoff.
        Err(e) => Err(format!("the sync task ended: {e}").into()),
    })
}

/// One item of the room-update broadcast: journals the rooms, or, when updates were missed
/// (never expected: one sync at a time, each taken before the next starts), walks every room
/// back to its last journaled event instead. A closed broadcast is dropped (`updates` becomes
/// `None`).
async fn take(
    ctx: &Ctx,
    updates: &mut Option<tokio::sync::broadcast::Receiver<RoomUpdates>>,
    update: Result<RoomUpdates, RecvError>,
) {
    match update {
        Ok(rooms) => handle(ctx, rooms).await,
        Err(RecvError::Lagged(missed)) => {
            warn!(
                missed,
                "room updates were missed; catching up every room from the journal"
            );
            catch_up_all(ctx).await;
        }
        Err(RecvError::Closed) => {
            error!("matrix-sdk's room-update broadcast closed; taking rooms from sync_once");
            *updates = None;
        }
    }
}

/// What the bot syncs: everything but typing notices, read receipts and presence. It needs
/// none of them, and each would end a long-poll early: a user's next message then waits for
/// the sync that a typing notice (often the bot's own) woke to be processed first.
fn sync_filter() -> matrix_sdk::ruma::api::client::sync::sync_events::v3::Filter {
    use matrix_sdk::ruma::api::client::filter::{Filter, FilterDefinition, RoomEventFilter};
    let mut def = FilterDefinition::default();
    def.room.ephemeral = RoomEventFilter::ignore_all();
    def.presence = Filter::ignore_all();
    matrix_sdk::ruma::api::client::sync::sync_events::v3::Filter::FilterDefinition(def)
}

/// Journals what one sync brought: every room's new events are decided, then journaled in one
/// transaction (one fsync per sync, not per room that spoke), then acted on.
async fn handle(ctx: &Ctx, rooms: RoomUpdates) {
    let handed = std::time::Instant::now();
    let response_at = crate::latency::take_sync_response().unwrap_or(handed);
    let sdk_parts = crate::latency::take_sdk_parts();
    let mut batches = Vec::with_capacity(rooms.joined.len());
    for (room_id, update) in rooms.joined {
        let Some(room) = ctx.client.get_room(&room_id) else {
            continue;
        };
        let events: Vec<Inbound> = update
            .timeline
            .events
            .iter()
            .filter_map(Inbound::parse)
            .collect();
        crate::latency::arrived(
            events.iter().map(|e| e.event_id.as_str()),
            response_at,
            handed,
            sdk_parts,
        );
        // A membership change may rename a sender: the room's remembered names go. The timeline's
        // types come from its parsed events (one that did not parse counts as a change).
        let (matrix_sdk::sync::State::Before(state) | matrix_sdk::sync::State::After(state)) =
            &update.state;
        let unparsed = update.timeline.events.len() - events.len();
        let timeline = events
            .iter()
            .map(|e| {
                Some(if e.is_membership() {
                    "m.room.member"
                } else {
                    ""
                })
            })
            .chain(std::iter::repeat_n(None, unparsed));
        if crate::members::membership_changed(
            state
                .iter()
                .map(|e| e.get_field::<String>("type").ok().flatten()),
        ) || crate::members::membership_changed(timeline)
        {
            ctx.member_names.forget_room(room_id.as_str());
        }
        if update.timeline.limited {
            metrics::counter!(crate::metrics::LIMITED_SYNCS).increment(1);
        }
        let new = collect_new(
            ctx,
            &room,
            events,
            update.timeline.limited,
            update.timeline.prev_batch,
        )
        .await;
        batches.push(ingest::prepare(ctx, &room, new).await);
    }
    ingest::record_all(ctx, batches).await;
}

/// One `/messages` page back from `token`. A failure that waiting can fix (the homeserver is
/// down or busy) is tried again until it works: the sync has already moved past these events,
/// so giving up would lose them (the faults test found exactly that: a restart of the
/// homeserver during a limited sync's backfill). `None` when the server refuses for good (the
/// gap is logged) or on shutdown (a restarted surface walks back to its last journaled event).
async fn messages_page(
    ctx: &Ctx,
    room: &Room,
    token: Option<&str>,
) -> Option<matrix_sdk::room::Messages> {
    let mut backoff = daemon::backoff(Duration::from_millis(500), Duration::from_secs(30)).build();
    loop {
        let mut options = MessagesOptions::backward().from(token);
        options.limit = UInt::from(PAGE);
        let e = match room.messages(options).await {
            Ok(page) => return Some(page),
            Err(e) => e,
        };
        let delay = match retry::verdict(&send::observe(&e)) {
            Verdict::Permanent => {
                warn!(error = %e, "backfill refused; events before this point may be missing");
                return None;
            }
            Verdict::RateLimited(Some(d)) => d,
            Verdict::RateLimited(None) | Verdict::Transient => {
                backoff.next().unwrap_or(Duration::from_secs(30))
            }
        };
        warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "backfill failed; trying again");
        tokio::select! {
            _ = ctx.shutdown.cancelled() => return None,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// The events of `room` not journaled yet, oldest first: the `newest` page (from sync; may be
/// empty) and, if it does not reach back to a landmark and `more_before`, older pages from
/// `/messages`. On a room's first sight the walk goes back to the bot's invite, so a message
/// sent before the bot joined (Element's new DM) or while it was down is answered.
#[instrument(skip_all, fields(room_id = %room.room_id()))]
async fn collect_new(
    ctx: &Ctx,
    room: &Room,
    newest: Vec<Inbound>,
    more_before: bool,
    prev_batch: Option<String>,
) -> Vec<Inbound> {
    let own = &ctx.config.user_id;
    let known = ctx
        .journal
        .room_known(room.room_id().as_str())
        .unwrap_or(false);
    let landmark_of = |e: &Inbound| {
        let journaled = ctx.journal.contains(e.event_id.as_str()).unwrap_or(false);
        event::landmark(e, own, known, journaled)
    };

    let mut newest_first: Vec<Inbound> = Vec::new();
    let mut found: Option<Landmark> = None;
    for e in newest.into_iter().rev() {
        found = landmark_of(&e);
        if found.is_some() {
            break;
        }
        newest_first.push(e);
    }
    // A room seen for the first time always walks back: sync's page may start after the invite.
    if found.is_none() && (more_before || !known) {
        let mut token = prev_batch;
        'pages: while newest_first.len() < BACKFILL_HORIZON {
            let Some(page) = messages_page(ctx, room, token.as_deref()).await else {
                break;
            };
            for ev in &page.chunk {
                let Some(e) = Inbound::parse(ev) else {
                    continue;
                };
                found = landmark_of(&e);
                if found.is_some() {
                    break 'pages;
                }
                metrics::counter!(crate::metrics::BACKFILLED).increment(1);
                newest_first.push(e);
            }
            match page.end {
                Some(t) if !page.chunk.is_empty() => token = Some(t),
                _ => break,
            }
        }
        if found.is_none() && newest_first.len() >= BACKFILL_HORIZON {
            warn!(
                horizon = BACKFILL_HORIZON,
                "backfill horizon reached; older events are skipped"
            );
        }
    }
    let mut events: Vec<Inbound> = newest_first.into_iter().rev().collect();
    match found {
        Some(Landmark::Invite | Landmark::OwnPost) => {
            info!(landmark = ?found, count = events.len(), "first sight of room: answering what came after the invite");
        }
        None if !known => {
            let skipped = event::unanchored_first_sight(&events, own, ctx.started_ms);
            if skipped > 0 {
                info!(
                    skipped,
                    "first sight of room without its invite: older history is not answered"
                );
            }
            events.drain(..skipped);
        }
        _ => {}
    }
    events
}
