//! What the surface does with a journaled event: an answer goes to the waiting question or
//! approval, a redaction removes files (and stops the turn answering it), `!mode` changes the
//! room, `!stop` and ⏹️ stop a turn, `!help` is answered, the bot-loop breaker counts, and a
//! message wakes its lane.

use tracing::{debug, error, info, warn};

use super::{Pokes, notices, settings, stop};
use crate::command::{self, Change, Command};
use crate::context::Ctx;
use crate::decide::{self, Decision, IgnoreReason};
use crate::inbound::{Inbound, Kind};
use crate::journal::{ChatRef, NewEvent, Stored};
use crate::prompts;
use crate::purpose::Purpose;
use crate::render;

/// Carries out redaction `e`: the redacted message is not processed if it still waited, and the
/// files it brought leave the inbox.
fn redact(ctx: &Ctx, ev: &NewEvent, e: &Inbound) {
    let Kind::Redaction {
        target: Some(target),
    } = &e.kind
    else {
        return;
    };
    stop::redacted(ctx, ev, target);
    let target = target.as_str();
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
pub(super) fn is_bot(ctx: &Ctx, user_id: &str) -> bool {
    ctx.config.is_known_bot(user_id) || ctx.bot_loops.posts_notices(user_id)
}

/// Counts turns bots trigger in a row per chat; tells the room once when the breaker trips.
fn bot_loop_step(ctx: &Ctx, ev: &NewEvent, decision: &Decision) {
    let chat = ev.conversation();
    let max = ctx.config.max_bot_turns;
    match decision {
        Decision::Trigger if is_bot(ctx, ev.sender.as_str()) => {
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
                render::pill(ev.sender.as_str())
            );
            notices::notify(ctx, ev, text, Purpose::BotLoop);
        }
        _ => {}
    }
}

/// Acts on a journaled event: an answer goes to the waiting question or approval, a message to
/// its lane (woken by [`super::wake`]).
pub fn act(ctx: &Ctx, ev: &NewEvent, decision: Decision, e: &Inbound, pokes: &mut Pokes) {
    bot_loop_step(ctx, ev, &decision);
    match decision {
        Decision::Ignore(IgnoreReason::Notice) => ctx.bot_loops.saw_notice(ev.sender.as_str()),
        Decision::Ignore(reason) => {
            if ev.sender != ctx.config.user_id {
                debug!(event_id = %ev.event_id, reason = ?reason, "ignored");
            }
        }
        Decision::Command(Command::Mode { every_message }) => {
            settings::change(ctx, ev, e, Change::Mode(every_message))
        }
        Decision::Command(Command::Set(change)) => settings::change(ctx, ev, e, change),
        Decision::Command(Command::SetUsage) => settings::usage(ctx, ev, e),
        Decision::Command(Command::Settings) => settings::show(ctx, ev, e),
        Decision::Command(Command::Stop) => stop::request(ctx, ev, e),
        Decision::Command(Command::Help) => {
            notices::notify(ctx, ev, command::help_text(), Purpose::Help)
        }
        Decision::Redaction => {
            redact(ctx, ev, e);
            poke(ev, pokes);
        }
        Decision::ReplaceQueued => replace_queued(ctx, ev, e),
        Decision::Unsupported(kind) => unsupported(ctx, ev, kind),
        Decision::Plaintext => plaintext(ctx, ev, e),
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
            notices::notify_about(ctx, ev, e, text.to_owned(), Purpose::ApprovalUnverified);
        }
        Decision::Answer(question_id) => {
            let text = decide::strip_reply_fallback(e.body());
            let delivered = ctx.waits.answer(&question_id, text, ev.sender.as_str());
            info!(event_id = %ev.event_id, question_id = %question_id, delivered, "answer received");
        }
        Decision::Approval { request_id, choice } => {
            let decided = ctx.waits.decide(&request_id, choice, ev.sender.as_str());
            if let Some(w) = &decided {
                prompts::show_outcome(ctx, w, choice, ev.sender.as_str());
            }
            let delivered = decided.is_some();
            info!(event_id = %ev.event_id, request_id = %request_id, ?choice, delivered, "approval answered");
        }
        Decision::Trigger if let Kind::Edit { target, .. } = &e.kind => {
            stop::offer_restart(ctx, ev, target);
            poke(ev, pokes);
        }
        Decision::Context | Decision::Trigger | Decision::WaitForKey => {
            if let Some(chat) = &ev.chat_id {
                debug!(event_id = %ev.event_id, chat_id = %chat, disposition = ?ev.disposition, "journaled");
            }
            poke(ev, pokes);
        }
    }
}

/// Wakes the lane of `ev`'s chat after the batch (once per chat).
fn poke(ev: &NewEvent, pokes: &mut Pokes) {
    if let Some(chat) = &ev.chat_id {
        pokes.entry(chat.clone()).or_insert_with(|| ChatRef {
            chat_id: chat.clone(),
            room_id: ev.room_id.clone(),
            thread_root: ev.thread_root.clone(),
        });
    }
}

/// An edit of a message its lane has not processed yet: the message takes the new content.
fn replace_queued(ctx: &Ctx, ev: &NewEvent, e: &Inbound) {
    let Kind::Edit { target, new, .. } = &e.kind else {
        return;
    };
    let target = target.as_str();
    match ctx
        .journal
        .replace_queued_content(target, &Stored::Message(new.clone()))
    {
        Ok(replaced) => {
            info!(event_id = %ev.event_id, edited = %target, replaced, "edit of a queued message")
        }
        Err(e) => error!(error = %e, "journal write failed"),
    }
}

/// Content the bot cannot read yet, sent to it: the room is told once.
fn unsupported(ctx: &Ctx, ev: &NewEvent, kind: &'static str) {
    info!(event_id = %ev.event_id, kind, "content the bot cannot read");
    if ctx.bot_loops.first_notice(ev.room_id.as_str(), kind) {
        let text =
            format!("I cannot read a {kind} yet. Send a picture or a file, or say it in words.");
        notices::notify(ctx, ev, text, Purpose::Unsupported);
    }
}

/// An unencrypted event in an encrypted room: logged, and the room is told once.
fn plaintext(ctx: &Ctx, ev: &NewEvent, e: &Inbound) {
    warn!(
        room_id = %ev.room_id,
        event_id = %ev.event_id,
        sender = %ev.sender,
        "unencrypted event in an encrypted room: not acted on"
    );
    if ctx.bot_loops.first_notice(ev.room_id.as_str(), "plaintext") {
        let text = "⚠️ This room is encrypted, and I act only on what arrives \
                    encrypted in it. Reactions never are (Matrix clients send them in \
                    clear), so to answer a prompt, reply yes, always or no; an \
                    unencrypted message, edit or reaction is ignored here.";
        notices::notify_about(ctx, ev, e, text.to_owned(), Purpose::Plaintext);
    }
}
