//! `!settings`, `!set …`, `!reset` and `!mode`: a room's settings shown or changed. Changing
//! them takes what the homeserver asks for sending the settings state event (the sender's power
//! level, moderators by default); the bot writes the event, so it needs that power too, and
//! where it lacks it `!mode` still works through the journal, as it always has. A model must be
//! one the agent offers. Every outcome is answered in the room.

use matrix_sdk::Room;
use matrix_sdk::ruma::events::StateEventType;
use tracing::{error, info, warn};

use super::notices;
use crate::command::Change;
use crate::context::Ctx;
use crate::inbound::Inbound;
use crate::journal::NewEvent;
use crate::purpose::Purpose;
use crate::room_settings::{self, EVENT_TYPE, policy_word};

/// `!settings`: shows the room's settings.
pub(super) fn show(ctx: &Ctx, ev: &NewEvent, e: &Inbound) {
    let Some(room) = ctx.client.get_room(&ev.room_id) else {
        return;
    };
    let (ctx2, ev2, e2) = (ctx.clone(), ev.clone(), e.clone());
    ctx.tracker.spawn(async move {
        let (settings, problems) = room_settings::read(&room).await;
        let mut text = settings.show();
        if !problems.is_empty() {
            text.push_str(&format!(
                "\n\n⚠️ Ignored, because they make no sense: {}.",
                problems.join(", ")
            ));
        }
        notices::notify_about(&ctx2, &ev2, &e2, text, Purpose::Settings);
    });
}

/// `!set …` without a setting it understands: the usage.
pub(super) fn usage(ctx: &Ctx, ev: &NewEvent, e: &Inbound) {
    let text = "Usage: `!set model <name>`, `!set instructions <text>`, `!set tool <name> \
                allow|ask|deny`, `!set mode all|mentions`, `!set streaming on|off`, `!set queue \
                each|collect`, `!set approvers requester|moderators`; `!reset` \
                goes back to the defaults, `!settings` shows them."
        .to_owned();
    notices::notify_about(ctx, ev, e, text, Purpose::Settings);
}

/// `!set …`, `!reset` or `!mode …` from `ev`'s sender.
pub(super) fn change(ctx: &Ctx, ev: &NewEvent, e: &Inbound, change: Change) {
    let Some(room) = ctx.client.get_room(&ev.room_id) else {
        return;
    };
    let (ctx2, ev2, e2) = (ctx.clone(), ev.clone(), e.clone());
    ctx.tracker.spawn(async move {
        let Some(text) = changed(&ctx2, &room, &ev2, &change).await else {
            return;
        };
        notices::notify_about(&ctx2, &ev2, &e2, text, Purpose::Settings);
    });
}

/// Makes `change` if the sender may and it is valid; what to tell the room (`None`: told
/// already).
async fn changed(ctx: &Ctx, room: &Room, ev: &NewEvent, change: &Change) -> Option<String> {
    let event_type = StateEventType::from(EVENT_TYPE);
    let levels = room.power_levels().await.ok();
    let may = |user| {
        levels
            .as_ref()
            .is_some_and(|l| l.user_can_send_state(user, event_type.clone()))
    };
    if !may(&ev.sender) {
        info!(room_id = %ev.room_id, sender = %ev.sender, ?change, "settings change refused: power level");
        return Some(
            "Only the room's moderators (members who may change its settings) can do that."
                .to_owned(),
        );
    }
    if !may(&ctx.config.user_id) {
        if let Change::Mode(every_message) = change {
            // As before room settings: kept in the journal.
            notices::set_mode(ctx, ev, *every_message);
            return None;
        }
        warn!(room_id = %ev.room_id, "the bot may not write its settings event here");
        return Some(format!(
            "I may not store settings in this room: give me the power level to send \
             `{EVENT_TYPE}` events (moderator), then try again."
        ));
    }
    if let Change::Model(model) = change
        && let Some(refusal) = model_refusal(ctx.health.agent_models(), model)
    {
        return Some(refusal);
    }
    let (current, _) = room_settings::read(room).await;
    let next = current.with(change);
    let content = next.to_content();
    match room.send_state_event_raw(EVENT_TYPE, "", content).await {
        Ok(r) => {
            info!(room_id = %ev.room_id, sender = %ev.sender, event_id = %r.event_id, ?change, "room settings changed");
            Some(done(change))
        }
        Err(err) => {
            error!(room_id = %ev.room_id, error = %err, "could not write the room settings");
            Some("I could not save that setting (the homeserver refused it); try again.".into())
        }
    }
}

/// Why `model` may not be chosen, given the models the agent offers (`None`: not known yet).
fn model_refusal(offered: Option<Vec<String>>, model: &str) -> Option<String> {
    match offered {
        None => Some("I have not reached the agent yet; try again in a moment.".into()),
        Some(list) if list.is_empty() => {
            Some("The operator offers no choice of model here.".into())
        }
        Some(list) if !list.iter().any(|m| m == model) => Some(format!(
            "Unknown model `{model}`. Choose one of: {}.",
            list.iter()
                .map(|m| format!("`{m}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
        Some(_) => None,
    }
}

/// What the room is told once `change` is made.
fn done(change: &Change) -> String {
    match change {
        Change::Model(m) => format!("Model set to `{m}` for this room."),
        Change::Instructions(i) if i.trim().is_empty() => {
            "Instructions removed for this room.".into()
        }
        Change::Instructions(_) => "Instructions set for this room.".into(),
        Change::Tool(name, p) => format!(
            "Tool `{name}`: {} in this room (never looser than the operator allows).",
            policy_word(*p)
        ),
        Change::Mode(true) => {
            "From now on I answer every message in this room (`!mode mentions` to undo).".into()
        }
        Change::Mode(false) => {
            "From now on I answer only when mentioned here (`!mode all` to undo).".into()
        }
        Change::Streaming(true) => "Answers are shown while they are written here.".into(),
        Change::Streaming(false) => "Answers are shown only when they are done here.".into(),
        Change::Collect(true) => {
            "Messages sent while I answer are collected into my next answer here.".into()
        }
        Change::ModeratorsApprove(true) => {
            "Moderators may decide approval prompts here too.".into()
        }
        Change::ModeratorsApprove(false) => {
            "Only whoever asked decides approval prompts here.".into()
        }
        Change::Collect(false) => {
            "Messages sent while I answer are answered each in turn here.".into()
        }
        Change::Reset => "This room's settings are back to the operator's defaults.".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn which_models_a_room_may_choose() {
        let list = || Some(vec!["a".to_owned(), "b".to_owned()]);
        assert_eq!(model_refusal(list(), "a"), None);
        let unknown = model_refusal(list(), "c").unwrap();
        assert!(unknown.contains("`a`, `b`"), "{unknown}");
        assert!(
            model_refusal(Some(vec![]), "a")
                .unwrap()
                .contains("no choice")
        );
        assert!(model_refusal(None, "a").unwrap().contains("not reached"));
    }
}
