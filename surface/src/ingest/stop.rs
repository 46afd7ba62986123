//! `!stop`, a ⏹️ reaction on the answer being written (or on the message it answers), and the
//! redaction of that message: which running turn is meant ([`lane_registry::pick`]), whether
//! the sender may stop it (its requester, a moderator, or whoever the homeserver let redact the
//! message), and then the lane is told. Whatever stops nothing is answered in the room.

use matrix_sdk::ruma::EventId;
use protocol::ChatId;
use tracing::{info, warn};

use super::notices;
use crate::context::Ctx;
use crate::inbound::{Inbound, Kind};
use crate::journal::NewEvent;
use crate::lane_registry::{self, Pick, StopAt};
use crate::purpose::Purpose;
use crate::render::{self, ReplyTarget};
use crate::send::{self, Outgoing};

/// Whether `event_id` in `room_id` is the message a running turn answers, its answer, or an
/// offer to answer an edit of it instead.
pub(super) fn runs(ctx: &Ctx, room_id: &str, event_id: &str) -> bool {
    ctx.lanes.running_for(room_id, event_id).is_some()
}

/// What the room is told when the message being answered is edited (pure).
pub fn offer_text(encrypted: bool) -> &'static str {
    if encrypted {
        "✏️ You edited the message I am answering. I answer the edited version when this \
         answer is done; to have it answered now instead, send `!stop`."
    } else {
        "✏️ You edited the message I am answering. I answer the edited version when this \
         answer is done; to have it answered now instead, react 🔁 here (or send `!stop`)."
    }
}

/// `ev` edits the message a turn is answering now: the edit waits for that turn (its lane
/// holds it), and the room is offered to stop the turn so the edit is answered at once.
pub(super) fn offer_restart(ctx: &Ctx, ev: &NewEvent, target: &EventId) {
    let Some((turn, handle)) = ctx.lanes.running_for(ev.room_id.as_str(), target.as_str()) else {
        return;
    };
    if turn.turn != target.as_str() {
        return;
    }
    let Some(room) = ctx.client.get_room(&ev.room_id) else {
        return;
    };
    let ctx2 = ctx.clone();
    let edit_id = ev.event_id.clone();
    ctx.tracker.spawn(async move {
        let (Ok(root), Ok(about)) = (
            EventId::parse(turn.answer_thread()),
            EventId::parse(turn.turn.as_str()),
        ) else {
            return;
        };
        let target = ReplyTarget {
            event_id: about.clone(),
            thread_root: Some(root.clone()),
        };
        let encrypted = room.encryption_state().is_encrypted();
        let txn = render::notice_txn_id(edit_id.as_str(), Purpose::EditOffer);
        let out = Outgoing {
            txn: &txn,
            thread_root: Some(&root),
            about: Some(&about),
            purpose: Purpose::EditOffer,
        };
        match send::post(&ctx2, &room, target.notice(offer_text(encrypted)), out).await {
            Ok(id) => {
                info!(turn = %turn.turn, edit = %edit_id, offer = %id, "the message being answered was edited; the edit waits, stopping is offered");
                handle.offered(&turn.turn, id.as_str());
            }
            Err(e) => warn!(error = %e, "could not post the offer to answer the edit now"),
        }
    });
}

/// `!stop` or a ⏹️ reaction from `ev`'s sender: stops the turn it means if the sender may,
/// else says why not. In the background (the power level is looked up).
pub(super) fn request(ctx: &Ctx, ev: &NewEvent, e: &Inbound) {
    let Some(room) = ctx.client.get_room(&ev.room_id) else {
        return;
    };
    let (ctx2, ev2, e2) = (ctx.clone(), ev.clone(), e.clone());
    ctx.tracker.spawn(async move {
        let running = ctx2.lanes.running_in(ev2.room_id.as_str());
        let turns: Vec<_> = running.iter().map(|(r, _)| r.clone()).collect();
        let chat = ChatId::for_conversation(
            ev2.room_id.as_str(),
            ev2.thread_root.as_ref().map(|t| t.as_str()),
        );
        let at = match &e2.kind {
            Kind::Reaction { target, .. } => StopAt::Event(target.as_str()),
            _ => StopAt::Command {
                chat: &chat,
                thread_root: ev2.thread_root.as_ref().map(|t| t.as_str()),
            },
        };
        let refusal = match lane_registry::pick(&turns, at) {
            Pick::Nothing => "Nothing is being answered here right now.".to_owned(),
            Pick::Several => "Answers are being written in several threads here: send `!stop` \
                              in the thread of the one to stop, or react ⏹️ to it."
                .to_owned(),
            Pick::One(turn) => {
                let level = notices::power_level(&room, &ev2.sender).await;
                let sender = ev2.sender.as_str();
                if lane_registry::may_stop(&turn.requester, sender, level) {
                    let handle = running.iter().find(|(r, _)| r.turn == turn.turn);
                    let stopped = handle.is_some_and(|(_, h)| h.request_stop(&turn.turn, sender));
                    info!(
                        room_id = %ev2.room_id, event_id = %ev2.event_id, sender,
                        turn = %turn.turn, stopped, "stop asked for"
                    );
                    if stopped {
                        return;
                    }
                    "That answer is already over.".to_owned()
                } else {
                    info!(
                        room_id = %ev2.room_id, event_id = %ev2.event_id, sender, level,
                        turn = %turn.turn, "stop refused: neither the requester nor a moderator"
                    );
                    format!(
                        "Only {} (who asked) or a moderator can stop this answer.",
                        render::pill(&turn.requester)
                    )
                }
            }
        };
        notices::notify_about(&ctx2, &ev2, &e2, refusal, Purpose::Stop);
    });
}

/// The message `target` was redacted by `ev`'s sender (the homeserver checked they may): the
/// turn answering it, if one runs, stops.
pub(super) fn redacted(ctx: &Ctx, ev: &NewEvent, target: &EventId) {
    for (turn, handle) in ctx.lanes.running_in(ev.room_id.as_str()) {
        if turn.turn == target.as_str() && handle.request_stop(&turn.turn, ev.sender.as_str()) {
            info!(
                room_id = %ev.room_id, event_id = %ev.event_id, sender = %ev.sender,
                turn = %turn.turn, "the message being answered was redacted: stopping its turn"
            );
        }
    }
}
