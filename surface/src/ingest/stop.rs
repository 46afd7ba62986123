//! `!stop`, a ⏹️ reaction on the answer being written (or on the message it answers), and the
//! redaction of that message: which running turn is meant ([`lane_registry::pick`]), whether
//! the sender may stop it (its requester, a moderator, or whoever the homeserver let redact the
//! message), and then the lane is told. Whatever stops nothing is answered in the room.

use matrix_sdk::ruma::EventId;
use protocol::ChatId;
use tracing::info;

use super::notices;
use crate::context::Ctx;
use crate::inbound::{Inbound, Kind};
use crate::journal::NewEvent;
use crate::lane_registry::{self, Pick, StopAt};
use crate::purpose::Purpose;
use crate::render;

/// Whether `event_id` in `room_id` is the message a running turn answers, or its answer.
pub(super) fn runs(ctx: &Ctx, room_id: &str, event_id: &str) -> bool {
    let running: Vec<_> = ctx
        .lanes
        .running_in(room_id)
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    matches!(
        lane_registry::pick(&running, StopAt::Event(event_id)),
        Pick::One(_)
    )
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
