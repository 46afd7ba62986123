//! What one inbound event is for the bot: the facts [`crate::decide`] reads (gathered from the
//! event, the room and the journal), the decision, and the journal row that records both.

use matrix_sdk::Room;
use matrix_sdk::ruma::events::room::message::MessageType;
use matrix_sdk::ruma::{EventId, OwnedEventId};
use protocol::ChatId;

use super::RoomFacts;
use super::act::is_bot;
use crate::context::Ctx;
use crate::decide::{self, Decision, Facts};
use crate::inbound::{Arrival, Inbound, Kind};
use crate::journal::{Disposition, EditTarget, NewEvent, Redacted, Stored};

/// An edit with new content: the message it changes, where that stands, the new content.
pub(super) struct EditOf<'a> {
    pub target: &'a EventId,
    pub standing: EditTarget,
    pub new: &'a MessageType,
}

/// Classifies `e` and builds its journal row.
pub async fn classify(
    ctx: &Ctx,
    room: &Room,
    facts: &RoomFacts,
    e: &Inbound,
) -> (NewEvent, Decision) {
    let room_id = room.room_id().as_str();
    let edit = edit_of(ctx, e);
    // A redaction: the message it removes, as the journal knows it.
    let redacted = match &e.kind {
        Kind::Redaction { target: Some(t) } => {
            ctx.journal.redaction_target(t.as_str()).ok().flatten()
        }
        _ => None,
    };
    let thread_root = conversation_root(e, edit.as_ref(), redacted.as_ref());
    let chat = ChatId::for_conversation(room_id, thread_root.as_ref().map(|t| t.as_str()));
    let moderator_wait = moderator_wait(ctx, room, facts, e).await;
    let mut f = facts_for(ctx, facts, room_id, e, &chat, edit.as_ref());
    f.waiting = f.waiting.or(moderator_wait);
    let decision = decide::decide(&f);
    let disposition = disposition_of(&decision, redacted.as_ref());
    let keep = disposition != Disposition::Skip;
    let sender_name = match keep {
        true => ctx.member_names.display_name(room, &e.sender).await,
        false => None,
    };
    let content = match disposition {
        Disposition::Skip => None,
        _ => stored_for(e, &decision, disposition, edit.as_ref(), redacted.as_ref()),
    };
    let row = NewEvent {
        event_id: e.event_id.clone(),
        room_id: room.room_id().to_owned(),
        chat_id: keep.then_some(chat),
        // Kept for skipped events too: a notice about one goes to its thread.
        thread_root,
        sender: e.sender.clone(),
        sender_name,
        origin_ts: e.origin_ts,
        content,
        disposition,
    };
    (row, decision)
}

/// With the room's `approvers: moderators`: the approval a moderator's reaction (on its prompt)
/// or reply (in its thread) decides, when `e`'s sender is one.
async fn moderator_wait(
    ctx: &Ctx,
    room: &Room,
    facts: &RoomFacts,
    e: &Inbound,
) -> Option<decide::Waiting> {
    if !facts.moderators_approve {
        return None;
    }
    let prompt = match &e.kind {
        Kind::Reaction { target, .. } => Some(target.as_str()),
        // A moderator's words in the thread decide only when they are a decision.
        _ if decide::explicit_approval(e.body()).is_none() => return None,
        _ => None,
    };
    let thread = e.place.thread_root.as_ref().map(|t| t.as_str());
    let wait = ctx
        .waits
        .approval_for_moderator(room.room_id().as_str(), prompt, thread)?;
    let level = super::notices::power_level(room, &e.sender).await;
    (level >= super::notices::MODE_POWER_LEVEL).then_some(wait)
}

/// The thread the event belongs to, as a conversation: a follow-up edit is answered under the
/// message it changes (where its first answer went), a redaction where the removed message was.
fn conversation_root(
    e: &Inbound,
    edit: Option<&EditOf<'_>>,
    redacted: Option<&Redacted>,
) -> Option<OwnedEventId> {
    if let Some(r) = redacted {
        return r.thread_root.clone();
    }
    match edit {
        Some(EditOf {
            target,
            standing: EditTarget::Ran(_),
            ..
        }) => Some((*target).to_owned()),
        _ => e.place.thread_root.clone(),
    }
}

/// The facts of `e` for [`decide::decide`].
fn facts_for<'a>(
    ctx: &'a Ctx,
    room: &'a RoomFacts,
    room_id: &str,
    e: &'a Inbound,
    chat: &ChatId,
    edit: Option<&EditOf<'_>>,
) -> Facts<'a> {
    let bot = &ctx.config.user_id;
    // A thread's messages carry a reply fallback to its latest event (MSC3440), which is no
    // reply to the bot of its own: `Place::replied_to` leaves it out.
    let reply_to_bot = e
        .place
        .replied_to()
        .is_some_and(|id| ctx.journal.is_own_post(id.as_str()).unwrap_or(false));
    let in_bot_thread = e
        .place
        .thread_root
        .as_ref()
        .is_some_and(|r| ctx.journal.bot_in_thread(r.as_str()).unwrap_or(false));
    // A reaction answers the prompt it is on, and only for the user the prompt asks.
    let (reaction, waiting) = match &e.kind {
        Kind::Reaction { target, key } => (
            Some(key.as_str()),
            ctx.waits.by_prompt_from(target.as_str(), e.sender.as_str()),
        ),
        _ => (None, ctx.waits.lookup(room_id, e.sender.as_str())),
    };
    let on_running_turn = match &e.kind {
        Kind::Reaction { target, .. } => super::stop::runs(ctx, room_id, target.as_str()),
        _ => false,
    };
    Facts {
        bot_user_id: bot.as_str(),
        bot_display_name: room.bot_display_name.as_deref(),
        sender: e.sender.as_str(),
        sender_allowed: ctx.config.is_allowed(e.sender.as_str()),
        room_allowed: room.allowed,
        sender_is_bot: is_bot(ctx, e.sender.as_str()),
        bot_streak: ctx.bot_loops.streak(chat),
        max_bot_turns: ctx.config.max_bot_turns,
        room_encrypted: room.encrypted,
        arrived_encrypted: matches!(e.arrival, Arrival::Encrypted { .. }),
        verified_device: e.arrival == (Arrival::Encrypted { verified: true }),
        approvals_need_verified: ctx.config.approvals_need_verified,
        edited: edit.and_then(|edit| match edit.standing {
            EditTarget::Queued => Some(decide::Edited::Queued),
            EditTarget::Ran(_) => Some(decide::Edited::Ran),
            EditTarget::Other => None,
        }),
        reaction,
        mentions_bot: e.mentions(bot),
        reply_to_bot,
        in_bot_thread,
        threads_need_mention: ctx.config.threads_need_mention,
        direct_chat: room.members <= 2,
        every_message: room.every_message,
        waiting,
        on_running_turn,
        ..kind_facts(e)
    }
}

/// The facts that follow from the event's kind alone (pure).
pub(super) fn kind_facts(e: &Inbound) -> Facts<'_> {
    let msgtype = e.msgtype();
    Facts {
        is_message: matches!(
            e.kind,
            Kind::Message(_) | Kind::Edit { .. } | Kind::Location | Kind::Unreadable
        ),
        undecryptable: e.is_undecryptable(),
        is_notice: matches!(msgtype, Some(MessageType::Notice(_))),
        is_edit: matches!(e.kind, Kind::Edit { .. }),
        is_redaction: matches!(e.kind, Kind::Redaction { target: Some(_) }),
        has_media: matches!(
            msgtype,
            Some(
                MessageType::Image(_)
                    | MessageType::File(_)
                    | MessageType::Audio(_)
                    | MessageType::Video(_)
            )
        ),
        unsupported: match e.kind {
            Kind::Sticker => Some("sticker"),
            Kind::Location => Some("location"),
            Kind::Poll => Some("poll"),
            Kind::Unreadable => Some("message in this format"),
            _ => None,
        },
        body: e.body(),
        ..Facts::default()
    }
}

/// What the journal does with an event, by its decision.
fn disposition_of(decision: &Decision, redacted: Option<&Redacted>) -> Disposition {
    match decision {
        Decision::Ignore(_)
        | Decision::Unsupported(_)
        | Decision::Plaintext
        | Decision::UnverifiedApproval { .. }
        | Decision::ReplaceQueued
        | Decision::Command(_) => Disposition::Skip,
        // The agent hears of removed files with the chat's next turn.
        Decision::Redaction => match redacted {
            Some(r) if !r.attachments.is_empty() => Disposition::Context,
            _ => Disposition::Skip,
        },
        Decision::Context => Disposition::Context,
        Decision::Trigger => Disposition::Trigger,
        Decision::WaitForKey => Disposition::Waiting,
        Decision::Answer(_) | Decision::Approval { .. } => Disposition::Answered,
    }
}

/// What the journal row of a kept event holds.
fn stored_for(
    e: &Inbound,
    decision: &Decision,
    disposition: Disposition,
    edit: Option<&EditOf<'_>>,
    redacted: Option<&Redacted>,
) -> Option<Stored> {
    match (&e.kind, decision, edit) {
        (Kind::Encrypted { json, .. }, _, _) => Some(Stored::Encrypted { json: json.clone() }),
        (_, Decision::Redaction, _) => redacted.map(|r| Stored::Removed {
            files: r.attachments.clone(),
        }),
        (
            _,
            _,
            Some(EditOf {
                standing: EditTarget::Ran(old),
                new,
                ..
            }),
        ) if disposition == Disposition::Trigger => Some(Stored::Edited {
            old: old.clone(),
            new: (*new).clone(),
        }),
        _ => e.msgtype().cloned().map(Stored::Message),
    }
}

/// For an edit (`m.replace`) with new content: the edited event, where it stands (only its
/// author may edit it), and the new content.
pub(super) fn edit_of<'a>(ctx: &Ctx, e: &'a Inbound) -> Option<EditOf<'a>> {
    let Kind::Edit { target, new, .. } = &e.kind else {
        return None;
    };
    let standing = ctx
        .journal
        .edit_target(target.as_str(), e.sender.as_str())
        .unwrap_or(EditTarget::Other);
    Some(EditOf {
        target,
        standing,
        new,
    })
}
