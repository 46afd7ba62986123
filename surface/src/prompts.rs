//! What the room sees of an approval prompt around its answer: the reactions that answer it,
//! seeded by the bot under the prompt, and the outcome shown on the prompt (an edit) once it is
//! decided by reaction, by text or by the timeout.

use matrix_sdk::Room;
use matrix_sdk::ruma::events::reaction::ReactionEventContent;
use matrix_sdk::ruma::events::relation::Annotation;
use matrix_sdk::ruma::events::room::message::{ReplacementMetadata, RoomMessageEventContent};
use matrix_sdk::ruma::{EventId, OwnedEventId, RoomId};
use protocol::Decision as ApprovalChoice;
use tracing::{debug, warn};

use crate::context::Ctx;
use crate::decide::APPROVAL_REACTIONS;
use crate::purpose::Purpose;
use crate::render;
use crate::send::{self, Outgoing};
use crate::waits::Wait;

/// The line that replaces a decided prompt (pure).
pub fn outcome_text(tool: &str, resource: &str, choice: ApprovalChoice, by: &str) -> String {
    let what = match choice {
        ApprovalChoice::AllowOnce => "✅ Allowed once",
        ApprovalChoice::AllowAlways => "♾️ Always allowed",
        ApprovalChoice::Deny => "❌ Denied",
    };
    format!(
        "{what} by {}: {} on {}.",
        render::pill(by),
        render::code_span(tool),
        render::code_span(resource)
    )
}

/// Reacts to the prompt with the answers it accepts (✅ ♾️ ❌), so one tap answers it. The
/// transaction ids come from the prompt, so a resumed turn does not react twice.
pub async fn seed_reactions(ctx: &Ctx, room: &Room, prompt: &EventId) {
    for (key, _) in APPROVAL_REACTIONS {
        let content = ReactionEventContent::new(Annotation::new(prompt.to_owned(), key.into()));
        let txn = render::notice_txn_id(prompt.as_str(), format!("seed-{key}"));
        let out = Outgoing {
            txn: &txn,
            thread_root: None,
            about: Some(prompt),
            purpose: Purpose::ApprovalReaction,
        };
        if let Err(e) = send::post(ctx, room, content, out).await {
            warn!(error = %e, prompt = %prompt, "could not seed a reaction on the prompt");
        }
    }
}

/// Shows the outcome on the prompt of `wait` (an edit), in the background.
pub fn show_outcome(ctx: &Ctx, wait: &Wait, choice: ApprovalChoice, by: &str) {
    let (Some(prompt), Some((tool, resource))) = (&wait.prompt_event, &wait.approval) else {
        return;
    };
    let Ok(prompt) = OwnedEventId::try_from(prompt.as_str()) else {
        return;
    };
    let Some(room) = RoomId::parse(&wait.room_id)
        .ok()
        .and_then(|id| ctx.client.get_room(&id))
    else {
        debug!(room_id = %wait.room_id, "no such room for the outcome of a prompt");
        return;
    };
    let text = outcome_text(tool, resource, choice, by);
    let ctx2 = ctx.clone();
    ctx.tracker.spawn(async move {
        let content = render::safe_markdown(&text)
            .make_replacement(ReplacementMetadata::new(prompt.clone(), None));
        let txn = render::notice_txn_id(prompt.as_str(), "outcome");
        let out = Outgoing {
            txn: &txn,
            thread_root: None,
            about: Some(&prompt),
            purpose: Purpose::ApprovalOutcome,
        };
        if let Err(e) = send::post(&ctx2, &room, content, out).await {
            warn!(error = %e, prompt = %prompt, "could not show the outcome on the prompt");
        }
    });
}

/// A prompt's content: the text, with the asked user in `m.mentions` (so their client notifies
/// them even when the pill is not rendered).
pub fn with_mention(
    mut content: RoomMessageEventContent,
    user_id: &str,
) -> RoomMessageEventContent {
    if let Ok(user) = matrix_sdk::ruma::OwnedUserId::try_from(user_id) {
        content = content.add_mentions(matrix_sdk::ruma::events::Mentions::with_user_ids([user]));
    }
    content
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes() {
        let cases = [
            (ApprovalChoice::AllowOnce, "✅ Allowed once by "),
            (ApprovalChoice::AllowAlways, "♾️ Always allowed by "),
            (ApprovalChoice::Deny, "❌ Denied by "),
        ];
        for (choice, start) in cases {
            let text = outcome_text("write_file", "chats/c/a.txt", choice, "@alice:hs");
            assert!(text.starts_with(start), "{text}");
            assert!(
                text.contains("[@alice:hs](https://matrix.to/#/@alice:hs)"),
                "{text}"
            );
            assert!(text.ends_with("`write_file` on `chats/c/a.txt`."), "{text}");
        }
    }
}
