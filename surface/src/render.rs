//! Turning agent output into room events: threaded replies with markdown, notices, prompts,
//! and idempotent sends whose transaction ids derive from the triggering event.

use matrix_sdk::Room;
use matrix_sdk::ruma::events::relation::Thread;
use matrix_sdk::ruma::events::room::message::{Relation, RoomMessageEventContent};
use matrix_sdk::ruma::{EventId, OwnedEventId, OwnedTransactionId, TransactionId};
use protocol::{ApprovalRequest, AskUser, WorkspacePath};
use sha2::{Digest, Sha256};
use tracing::warn;

use crate::journal::Journal;

/// The transaction id of output number `index` of the turn started by `trigger_event_id`.
///
/// Deterministic, so a retry after a crash reuses it and the homeserver returns the event it
/// already created instead of posting twice.
pub fn txn_id(trigger_event_id: &str, index: u32) -> OwnedTransactionId {
    hashed_txn("turn", &[trigger_event_id.as_bytes(), &index.to_be_bytes()])
}

/// The transaction id for posting an outbox file: its path plus its content hash, so the same
/// file is posted once and a changed file under the same name is posted again.
pub fn outbox_txn_id(path: &WorkspacePath, sha256_hex: &str) -> OwnedTransactionId {
    hashed_txn("outbox", &[path.as_str().as_bytes(), sha256_hex.as_bytes()])
}

/// The transaction id of a notice about event `event_id` (`kind` tells notices apart).
pub fn notice_txn_id(event_id: &str, kind: &str) -> OwnedTransactionId {
    hashed_txn(kind, &[event_id.as_bytes()])
}

fn hashed_txn(kind: &str, parts: &[&[u8]]) -> OwnedTransactionId {
    let mut h = Sha256::new();
    h.update(kind.as_bytes());
    for p in parts {
        h.update([0u8]);
        h.update((p.len() as u64).to_be_bytes());
        h.update(p);
    }
    let digest = hex::encode(h.finalize());
    OwnedTransactionId::from(format!("mxb{}", &digest[..40]))
}

/// Where replies of a turn go: a thread under the trigger, or the trigger's own thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyTarget {
    /// The triggering event.
    pub event_id: OwnedEventId,
    /// The thread the trigger is in, if any.
    pub thread_root: Option<OwnedEventId>,
}

impl ReplyTarget {
    /// The root of the thread replies go to.
    pub fn root(&self) -> &EventId {
        self.thread_root.as_deref().unwrap_or(&self.event_id)
    }

    /// Puts `content` in the thread, with an `m.in_reply_to` fallback to the trigger for
    /// clients without thread support.
    pub fn apply(&self, mut content: RoomMessageEventContent) -> RoomMessageEventContent {
        content.relates_to = Some(Relation::Thread(Thread::plain(
            self.root().to_owned(),
            self.event_id.clone(),
        )));
        content
    }

    /// A markdown reply (rendered to HTML).
    pub fn markdown(&self, text: &str) -> RoomMessageEventContent {
        self.apply(RoomMessageEventContent::text_markdown(text))
    }

    /// A compact `m.notice` reply.
    pub fn notice(&self, text: &str) -> RoomMessageEventContent {
        self.apply(RoomMessageEventContent::notice_markdown(text))
    }
}

/// The prompt posted for an approval request.
pub fn approval_prompt(req: &ApprovalRequest, user_id: &str) -> String {
    format!(
        "**Approval needed** for `{}` on `{}`: {}\n\n{user_id}, reply **yes**, **no** or **always**.",
        req.tool, req.resource, req.summary
    )
}

/// The text posted for an `ask_user` question.
pub fn question_prompt(q: &AskUser, user_id: &str) -> String {
    let mut s = format!("**Question** for {user_id}: {}", q.text);
    if !q.options.is_empty() {
        s.push_str("\n\nOptions: ");
        s.push_str(&q.options.join(" / "));
    }
    s
}

/// A compact line describing a finished tool call.
pub fn tool_notice(name: &str, arguments: &str, ok: bool, output: &str) -> String {
    let args = truncate(arguments.trim(), 200);
    let out = truncate(output.trim(), 300);
    let status = if ok { "ok" } else { "failed" };
    format!("🔧 `{name}` `{args}` → {status}: {out}")
}

fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut t: String = s.chars().take(max).collect();
    t.push('…');
    t
}

/// Sends `content` to `room` with `txn`, recording the intent in the journal first. Returns the
/// event id (the earlier one if this transaction already went through).
pub async fn post(
    room: &Room,
    journal: &Journal,
    content: RoomMessageEventContent,
    txn: &TransactionId,
    thread_root: Option<&EventId>,
    purpose: &str,
) -> Result<OwnedEventId, PostError> {
    let done = journal.begin_send(
        txn.as_str(),
        room.room_id().as_str(),
        thread_root.map(EventId::as_str),
        purpose,
    )?;
    if let Some(id) = done.and_then(|d| EventId::parse(&d).ok()) {
        return Ok(id);
    }
    // The SDK already waits out 429s (Retry-After) and retries transient errors; this outer
    // loop covers the rest (e.g. a connection reset) with the same transaction id.
    let mut attempt = 0u32;
    let response = loop {
        attempt += 1;
        match room
            .send(content.clone())
            .with_transaction_id(txn.to_owned())
            .await
        {
            Ok(r) => break r,
            Err(e) if attempt < 3 => {
                warn!(error = %e, attempt, room_id = %room.room_id(), "send failed, retrying");
                tokio::time::sleep(std::time::Duration::from_secs(u64::from(attempt) * 2)).await;
            }
            Err(e) => return Err(PostError::Matrix(Box::new(e))),
        }
    };
    journal.finish_send(txn.as_str(), response.response.event_id.as_str())?;
    Ok(response.response.event_id)
}

/// Why posting failed.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    /// The homeserver refused or could not be reached.
    #[error("matrix: {0}")]
    Matrix(Box<matrix_sdk::Error>),
    /// The journal failed.
    #[error(transparent)]
    Journal(#[from] crate::journal::JournalError),
}

#[cfg(test)]
mod tests {
    use matrix_sdk::ruma::event_id;
    use serde_json::json;

    use super::*;

    #[test]
    fn txn_ids_are_stable_and_distinct() {
        let a = txn_id("$e1", 0);
        assert_eq!(a, txn_id("$e1", 0));
        assert_ne!(a, txn_id("$e1", 1));
        assert_ne!(a, txn_id("$e2", 0));
        assert!(a.as_str().starts_with("mxb") && a.as_str().len() == 43);
        let p = WorkspacePath::new("surfaces/matrix/u/r/outbox/a.txt").unwrap();
        assert_eq!(outbox_txn_id(&p, "ab"), outbox_txn_id(&p, "ab"));
        assert_ne!(outbox_txn_id(&p, "ab"), outbox_txn_id(&p, "cd"));
        assert_ne!(notice_txn_id("$e1", "a"), notice_txn_id("$e1", "b"));
    }

    #[test]
    fn replies_start_a_thread_under_the_trigger() {
        let target = ReplyTarget {
            event_id: event_id!("$trigger").to_owned(),
            thread_root: None,
        };
        let json = serde_json::to_value(target.markdown("**hi**")).unwrap();
        assert_eq!(json["body"], "**hi**");
        assert_eq!(json["format"], "org.matrix.custom.html");
        assert_eq!(json["formatted_body"], "<strong>hi</strong>");
        assert_eq!(
            json["m.relates_to"],
            json!({
                "rel_type": "m.thread",
                "event_id": "$trigger",
                "is_falling_back": true,
                "m.in_reply_to": {"event_id": "$trigger"}
            })
        );
    }

    #[test]
    fn replies_in_a_thread_stay_there() {
        let target = ReplyTarget {
            event_id: event_id!("$msg").to_owned(),
            thread_root: Some(event_id!("$root").to_owned()),
        };
        let json = serde_json::to_value(target.notice("done")).unwrap();
        assert_eq!(json["msgtype"], "m.notice");
        assert_eq!(json["m.relates_to"]["rel_type"], "m.thread");
        assert_eq!(json["m.relates_to"]["event_id"], "$root");
        assert_eq!(json["m.relates_to"]["m.in_reply_to"]["event_id"], "$msg");
    }

    #[test]
    fn prompts() {
        let req = ApprovalRequest {
            turn: "$t".into(),
            request_id: "r".into(),
            tool: "dangerous_action".into(),
            resource: "x".into(),
            summary: "Do x".into(),
        };
        let p = approval_prompt(&req, "@alice:hs");
        assert!(p.contains("yes") && p.contains("always") && p.contains("@alice:hs"));
        assert!(tool_notice("t", &"a".repeat(500), true, "out").contains('…'));
    }
}
