//! What ingesting tells a room: a notice in reply to an event (in its thread, or in the room
//! when the event relates to another), the outcome of `!mode`, and the catch-up notice after
//! downtime. All in the background or briefly, never holding up the sync loop for long.

use std::time::Duration;

use matrix_sdk::Room;
use matrix_sdk::ruma::events::room::message::RoomMessageEventContent;
use tracing::{error, info, warn};

use crate::context::Ctx;
use crate::inbound::Inbound;
use crate::journal::NewEvent;
use crate::purpose::Purpose;
use crate::render::{self, ReplyTarget};
use crate::send::{self, Outgoing};

/// Posts notice `text` in reply to `ev` (its thread), in the background.
pub(super) fn notify(ctx: &Ctx, ev: &NewEvent, text: String, kind: Purpose) {
    let Some(room) = ctx.client.get_room(&ev.room_id) else {
        return;
    };
    let target = ReplyTarget {
        event_id: ev.event_id.clone(),
        thread_root: ev.thread_root.clone(),
    };
    let ctx2 = ctx.clone();
    ctx.tracker.spawn(async move {
        let txn = render::notice_txn_id(target.event_id.as_str(), kind);
        let out = Outgoing {
            txn: &txn,
            thread_root: Some(target.root()),
            about: Some(&target.event_id),
            purpose: kind,
        };
        if let Err(e) = send::post(&ctx2, &room, target.notice(&text), out).await {
            warn!(error = %e, "could not post the {kind} notice");
        }
    });
}

/// Like [`notify`], for an event that may relate to another (a reaction, an edit): no thread can
/// start from such an event (the homeserver refuses), so the notice goes to the room itself.
pub(super) fn notify_about(ctx: &Ctx, ev: &NewEvent, e: &Inbound, text: String, kind: Purpose) {
    if !e.place.other_relation {
        return notify(ctx, ev, text, kind);
    }
    let Some(room) = ctx.client.get_room(&ev.room_id) else {
        return;
    };
    let about = ev.event_id.clone();
    let ctx2 = ctx.clone();
    ctx.tracker.spawn(async move {
        let txn = render::notice_txn_id(about.as_str(), kind);
        let out = Outgoing {
            txn: &txn,
            thread_root: None,
            about: Some(&about),
            purpose: kind,
        };
        let content = RoomMessageEventContent::notice_plain(text);
        if let Err(e) = send::post(&ctx2, &room, content, out).await {
            warn!(error = %e, "could not post the {kind} notice");
        }
    });
}

/// `user`'s power level in `room` (0 when unknown).
pub(super) async fn power_level(room: &Room, user: &matrix_sdk::ruma::UserId) -> i64 {
    use matrix_sdk::ruma::events::room::power_levels::UserPowerLevel;
    match room.get_member_no_sync(user).await {
        Ok(Some(m)) => match m.power_level() {
            UserPowerLevel::Infinite => i64::MAX,
            UserPowerLevel::Int(n) => n.into(),
            _ => 0,
        },
        _ => 0,
    }
}

/// The power level a sender needs to change how the bot is triggered in a room (moderator).
pub(super) const MODE_POWER_LEVEL: i64 = 50;

/// `!mode`: a room moderator switches the bot between answering mentions and every message;
/// anyone else is told who may. In the background (the power level is looked up).
pub(super) fn set_mode(ctx: &Ctx, ev: &NewEvent, every_message: bool) {
    let Some(room) = ctx.client.get_room(&ev.room_id) else {
        return;
    };
    let user = ev.sender.clone();
    let (ctx2, ev2) = (ctx.clone(), ev.clone());
    ctx.tracker.spawn(async move {
        let level = power_level(&room, &user).await;
        let text = if level < MODE_POWER_LEVEL {
            info!(room_id = %ev2.room_id, sender = %ev2.sender, level, "!mode refused");
            "Only the room's moderators can change when I answer here.".to_owned()
        } else {
            match ctx2.journal.set_every_message(ev2.room_id.as_str(), every_message) {
                Ok(()) => {
                    info!(room_id = %ev2.room_id, sender = %ev2.sender, every_message, "room mode set");
                    if every_message {
                        "From now on I answer every message in this room (`!mode mentions` to undo)."
                            .to_owned()
                    } else {
                        "From now on I answer only when mentioned here (`!mode all` to undo)."
                            .to_owned()
                    }
                }
                Err(e) => {
                    error!(error = %e, "journal write failed");
                    "I could not save that setting; try again.".to_owned()
                }
            }
        };
        notify(&ctx2, &ev2, text, Purpose::Mode);
    });
}

/// Tells `room` that messages sent while the bot was down are being answered now. Once per
/// room and process start (the transaction id says so, and the journal remembers it across a
/// crash); a courtesy, so it does not hold up the sync loop for long.
pub(super) async fn announce_catch_up(ctx: &Ctx, room: &Room, missed: usize) {
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
    let txn = render::notice_txn_id(&format!("{room_id}:{}", ctx.started_ms), Purpose::Offline);
    let out = Outgoing {
        txn: &txn,
        thread_root: None,
        about: None,
        purpose: Purpose::Offline,
    };
    let content = RoomMessageEventContent::notice_plain(text);
    match tokio::time::timeout(Duration::from_secs(10), send::post(ctx, room, content, out)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => warn!(room_id, error = %e, "could not post the catch-up notice"),
        Err(_) => warn!(room_id, "the catch-up notice took too long; skipped"),
    }
}
