//! The homeserver speaks when the bot cannot (MSC4140 delayed events). While a turn runs, the
//! homeserver holds a notice for its thread ("I was interrupted while answering this; I will
//! answer when I am back") that it posts only if the surface stops restarting it: the surface
//! restarts it every third of the delay for as long as it runs the turn (also while the turn
//! waits for a person), and cancels it when the turn is over. If the surface dies, the room
//! hears it from the homeserver; when the surface is back and the turn is over, that notice is
//! edited to say so. The scheduled notice is journaled, so a restarted surface finds it.
//!
//! A delayed event is sent as it is scheduled: the homeserver cannot encrypt it later, and the
//! bot cannot encrypt it for a future room key, so in an encrypted room the notice goes in
//! clear. It is a fixed sentence that carries nothing of the conversation (the relation to the
//! thread is in clear for encrypted messages too). Off with `SURFACE_INTERRUPTED_NOTICE=off`,
//! and off by itself on a homeserver that does not offer delayed events.

use std::time::Duration;

use matrix_sdk::deserialized_responses::TimelineEvent;
use matrix_sdk::room::MessagesOptions;
use matrix_sdk::ruma::api::client::delayed_events::{
    DelayParameters, delayed_message_event, update_delayed_event,
};
use matrix_sdk::ruma::api::client::discovery::get_capabilities;
use matrix_sdk::ruma::events::MessageLikeEventType;
use matrix_sdk::ruma::events::room::message::{
    ReplacementMetadata, RoomMessageEventContentWithoutRelation,
};
use matrix_sdk::ruma::serde::Raw;
use matrix_sdk::ruma::{OwnedEventId, TransactionId, UInt};
use matrix_sdk::{Client, Room};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::context::Ctx;
use crate::purpose::Purpose;
use crate::render::{self, ReplyTarget};
use crate::send::{self, Outgoing};

/// What the homeserver posts if the surface dies mid-turn.
pub const INTERRUPTED_TEXT: &str =
    "⚠️ I was interrupted while answering this; I will answer when I am back.";
/// What that notice becomes once the surface is back and the turn is over.
pub const BACK_TEXT: &str = "✅ I am back: the answer is in this thread.";
/// The key marking the notice as the interrupted notice of a turn (its value: the turn).
const MARKER: &str = "org.mxbridge.interrupted";

/// The longest delay the homeserver allows (`None`: it offers none), asked once per process.
async fn offered(ctx: &Ctx) -> Option<Duration> {
    *ctx.delayed_events
        .get_or_init(|| max_delay(&ctx.client))
        .await
}

/// The longest delay `client`'s homeserver allows, from its capabilities (`None`: it offers
/// no delayed events, or could not say).
pub async fn max_delay(client: &Client) -> Option<Duration> {
    let caps = match client.send(get_capabilities::v3::Request::new()).await {
        Ok(r) => r.capabilities,
        Err(e) => {
            warn!(error = %e, "could not read the homeserver's capabilities");
            return None;
        }
    };
    let capability = caps.get(crate::capabilities::DELAYED_EVENTS)?;
    crate::capabilities::max_delay_of(capability.as_ref())
}

/// The content of the notice for `turn` (pure).
fn notice_content(target: &ReplyTarget, turn: &str) -> Value {
    let mut content = serde_json::to_value(target.notice(INTERRUPTED_TEXT)).unwrap_or_default();
    content[MARKER] = json!(turn);
    content
}

/// How long a turn runs before its notice is scheduled: a quick answer costs the homeserver
/// nothing extra.
const GRACE: Duration = Duration::from_secs(3);

/// A turn's notice: scheduled after [`GRACE`], kept alive until [`Holding::finish`].
#[derive(Debug)]
pub struct Holding {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Held>,
}

/// What the holding task did.
#[derive(Debug, Default)]
struct Held {
    /// The notice scheduled, if one was.
    delay_id: Option<String>,
    /// The notice an earlier run of the turn left had been posted by the homeserver.
    posted_before: bool,
}

/// Starts holding the notice for `turn` (answering `target` in `room`).
pub fn start(ctx: &Ctx, room: &Room, target: &ReplyTarget, turn: &str) -> Holding {
    let stop = ctx.shutdown.child_token();
    let task = ctx.tracker.spawn(hold(
        ctx.clone(),
        room.clone(),
        target.clone(),
        turn.to_owned(),
        stop.clone(),
    ));
    Holding { stop, task }
}

/// Cancels the notice an earlier run of `turn` left, then (after the grace, unless `stop`)
/// schedules a new one and restarts it every third of its delay until `stop`.
async fn hold(
    ctx: Ctx,
    room: Room,
    target: ReplyTarget,
    turn: String,
    stop: CancellationToken,
) -> Held {
    let mut held = Held::default();
    if let Ok(Some(old)) = ctx.journal.delayed_notice(&turn) {
        held.posted_before = !cancel(&ctx.client, &old).await;
        let _ = ctx.journal.clear_delayed_notice(&turn);
    }
    let Some(delay) = ctx.config.interrupted_notice else {
        return held;
    };
    tokio::select! {
        _ = stop.cancelled() => return held,
        _ = tokio::time::sleep(GRACE) => {}
    }
    let Some(max) = offered(&ctx).await else {
        return held;
    };
    let delay = delay.min(max);
    let Ok(body) = serde_json::value::to_raw_value(&notice_content(&target, &turn)) else {
        return held;
    };
    let request = delayed_message_event::unstable::Request::new_raw(
        room.room_id().to_owned(),
        TransactionId::new(),
        MessageLikeEventType::RoomMessage,
        DelayParameters::Timeout { timeout: delay },
        Raw::from_json(body),
    );
    let delay_id = match ctx.client.send(request).await {
        Ok(r) => r.delay_id,
        Err(e) => {
            warn!(error = %e, "could not schedule the interrupted notice");
            return held;
        }
    };
    if let Err(e) = ctx
        .journal
        .set_delayed_notice(&turn, room.room_id().as_str(), &delay_id)
    {
        warn!(error = %e, "could not journal the interrupted notice");
    }
    debug!(delay_id = %delay_id, delay_ms = delay.as_millis() as u64, "interrupted notice held");
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(delay / 3) => {}
        }
        let request = update_delayed_event::unstable::Request::new(
            delay_id.clone(),
            update_delayed_event::unstable::UpdateAction::Restart,
        );
        if let Err(e) = ctx.client.send(request).await {
            warn!(delay_id = %delay_id, error = %e, "could not restart the interrupted notice");
        }
    }
    held.delay_id = Some(delay_id);
    held
}

/// Cancels the delayed notice `delay_id`; false when the homeserver no longer has it (posted).
async fn cancel(client: &Client, delay_id: &str) -> bool {
    let request = update_delayed_event::unstable::Request::new(
        delay_id.to_owned(),
        update_delayed_event::unstable::UpdateAction::Cancel,
    );
    match client.send(request).await {
        Ok(_) => true,
        Err(e) => {
            let gone = e
                .as_client_api_error()
                .is_some_and(|c| c.status_code.as_u16() == 404);
            if !gone {
                warn!(delay_id, error = %e, "could not cancel the interrupted notice");
            }
            !gone
        }
    }
}

impl Holding {
    /// The turn's run ends: `over` (finished for the journal) cancels the notice and, if the
    /// homeserver had posted one for the turn, edits it to say the bot is back; otherwise (a
    /// shutdown) the notice is left to the homeserver, and the next run finds it. Runs in the
    /// background: the chat's next turn never waits on the homeserver for this.
    pub fn finish(self, ctx: &Ctx, room: &Room, turn: &str, over: bool) {
        self.stop.cancel();
        let (ctx2, room, turn) = (ctx.clone(), room.clone(), turn.to_owned());
        ctx.tracker.spawn(async move {
            let Ok(held) = self.task.await else { return };
            if !over {
                return;
            }
            let mut posted = held.posted_before;
            if let Some(id) = held.delay_id {
                posted |= !cancel(&ctx2.client, &id).await;
                let _ = ctx2.journal.clear_delayed_notice(&turn);
            }
            if posted {
                back(&ctx2, &room, &turn).await;
            }
        });
    }
}

/// After a turn the homeserver's notice was posted for is over: edits that notice to say the
/// bot is back (found among the room's latest events by its marker).
pub async fn back(ctx: &Ctx, room: &Room, turn: &str) {
    let Some(notice) = find_notice(room, turn).await else {
        info!(
            turn,
            "the interrupted notice was posted, but is not among the latest events"
        );
        return;
    };
    let content = RoomMessageEventContentWithoutRelation::notice_plain(BACK_TEXT)
        .make_replacement(ReplacementMetadata::new(notice.clone(), None));
    let txn = render::notice_txn_id(&format!("{turn}:back"), Purpose::Interrupted);
    let out = Outgoing {
        txn: &txn,
        thread_root: None,
        about: Some(&notice),
        purpose: Purpose::Interrupted,
    };
    match send::post(ctx, room, content, out).await {
        Ok(_) => info!(turn, notice = %notice, "the interrupted notice now says the bot is back"),
        Err(e) => warn!(turn, error = %e, "could not edit the interrupted notice"),
    }
}

/// The interrupted notice of `turn` among `room`'s latest 200 events.
async fn find_notice(room: &Room, turn: &str) -> Option<OwnedEventId> {
    let mut options = MessagesOptions::backward();
    options.limit = UInt::from(200u32);
    let page = room.messages(options).await.ok()?;
    page.chunk.iter().find_map(|ev| is_notice_of(ev, turn))
}

fn is_notice_of(ev: &TimelineEvent, turn: &str) -> Option<OwnedEventId> {
    let v: Value = serde_json::from_str(ev.raw().json().get()).ok()?;
    if v["content"][MARKER] != turn {
        return None;
    }
    OwnedEventId::try_from(v["event_id"].as_str()?).ok()
}

#[cfg(test)]
mod tests {
    use matrix_sdk::ruma::owned_event_id;

    use super::*;

    #[test]
    fn the_notice_names_its_turn_and_answers_in_its_thread() {
        let target = ReplyTarget {
            event_id: owned_event_id!("$m:hs"),
            thread_root: None,
        };
        let c = notice_content(&target, "$m:hs");
        assert_eq!(c[MARKER], "$m:hs");
        assert_eq!(c["msgtype"], "m.notice");
        assert_eq!(c["body"], INTERRUPTED_TEXT);
        assert_eq!(c["m.relates_to"]["rel_type"], "m.thread");
        assert_eq!(c["m.relates_to"]["event_id"], "$m:hs");
    }
}
