//! The way from a running turn to the surface and back: a [`Link`] emits messages on the
//! connection's outbox (answer text in bounded chunks), and each of its requests (a question,
//! an approval, a `send_file`) waits, within its own timeout, for the reply the connection's
//! receive loop hands to [`Replies`]: the user's answer or decision, or the delivery report.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use protocol::{
    ApprovalRequest, AskUser, Decision, DeliveryResult, SendFile, ToSurface, WorkspacePath,
};
use tokio::sync::oneshot;
use tracing::{info, warn};

use crate::chat::Chat;
use crate::config::Limits;
use crate::connection::{Closed, Outbox};

/// A fresh random id with a readable prefix, for calls, requests and questions.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}-{:016x}", rand::random::<u64>())
}

/// The requests of one kind that wait for their reply, by id.
#[derive(Debug)]
struct Waiters<T>(Mutex<HashMap<String, oneshot::Sender<T>>>);

impl<T> Default for Waiters<T> {
    fn default() -> Self {
        Self(Mutex::default())
    }
}

impl<T> Waiters<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, oneshot::Sender<T>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands `reply` to the request `id`; `false` if nothing waits for it.
    fn deliver(&self, id: &str, reply: T) -> bool {
        let waiter = self.lock().remove(id);
        waiter.is_some_and(|tx| tx.send(reply).is_ok())
    }
}

/// Removes a waiter when the waiting future ends for any reason (reply, timeout, cancel).
struct Waiting<'a, T> {
    waiters: &'a Waiters<T>,
    id: &'a str,
}

impl<T> Drop for Waiting<'_, T> {
    fn drop(&mut self) {
        self.waiters.lock().remove(self.id);
    }
}

/// Requests waiting for the surface's reply (the user's answer or approval decision, or a
/// delivery report), by id; filled in by the connection's receive loop.
#[derive(Debug, Default)]
pub struct Replies {
    approvals: Waiters<Decision>,
    answers: Waiters<String>,
    deliveries: Waiters<DeliveryResult>,
}

impl Replies {
    /// Delivers an approval decision; `false` if nothing waits for `request_id`.
    pub fn approval(&self, request_id: &str, decision: Decision) -> bool {
        self.approvals.deliver(request_id, decision)
    }

    /// Delivers an answer; `false` if nothing waits for `question_id`.
    pub fn answer(&self, question_id: &str, text: String) -> bool {
        self.answers.deliver(question_id, text)
    }

    /// Delivers the surface's report on a `send_file`; `false` if nothing waits for it.
    pub fn delivery(&self, result: DeliveryResult) -> bool {
        self.deliveries.deliver(&result.request_id.clone(), result)
    }
}

/// The way from a turn to the surface and back. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Link {
    /// Where messages go.
    pub out: Outbox,
    /// Where replies come from.
    pub replies: Arc<Replies>,
    /// The chat (remembered approvals).
    pub chat: Arc<Chat>,
    /// How long each request waits for its reply.
    pub limits: Limits,
}

/// The most answer text one `text_chunk` carries, so that a frame stays far below the surface's
/// message limit (`protocol::MAX_MESSAGE_BYTES`) whatever a brain says at once.
pub const MAX_TEXT_CHUNK: usize = 16 * 1024;

/// `text` cut into pieces of at most `max` bytes, at character boundaries (pure).
pub fn text_pieces(text: &str, max: usize) -> impl Iterator<Item = &str> {
    let max = max.max(4);
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut cut = rest.len().min(max);
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        let (piece, tail) = rest.split_at(cut);
        rest = tail;
        Some(piece)
    })
}

impl Link {
    /// Sends a message to the surface.
    pub async fn emit(&self, msg: impl Into<ToSurface>) -> Result<(), Closed> {
        self.out.send(&msg.into()).await
    }

    /// Sends answer text of `turn`, in pieces of at most [`MAX_TEXT_CHUNK`] bytes.
    pub async fn emit_text(&self, turn: &str, text: &str) -> Result<(), Closed> {
        for piece in text_pieces(text, MAX_TEXT_CHUNK) {
            self.emit(protocol::TextChunk {
                turn: turn.to_owned(),
                text: piece.to_owned(),
            })
            .await?;
        }
        Ok(())
    }

    /// Sends `msg`, the request `id`, and waits at most `limit` for its reply through
    /// `waiters`: `None` when none came in time, `Closed` when the connection ended first.
    async fn request<T>(
        &self,
        waiters: &Waiters<T>,
        id: &str,
        msg: impl Into<ToSurface>,
        limit: Duration,
    ) -> Result<Option<T>, Closed> {
        let (tx, rx) = oneshot::channel();
        waiters.lock().insert(id.to_owned(), tx);
        let _waiting = Waiting { waiters, id };
        self.emit(msg).await?;
        match tokio::time::timeout(limit, rx).await {
            Ok(Ok(reply)) => Ok(Some(reply)),
            Ok(Err(_)) => Err(Closed),
            Err(_) => Ok(None),
        }
    }

    /// Asks the user; `None` when no answer came within the ask timeout.
    pub async fn ask(
        &self,
        turn: &str,
        question: &str,
        options: Vec<String>,
    ) -> Result<Option<String>, Closed> {
        let question_id = new_id("q");
        let question = AskUser {
            turn: turn.to_owned(),
            question_id: question_id.clone(),
            text: question.to_owned(),
            options,
        };
        let limit = self.limits.ask_timeout;
        let answer = self
            .request(&self.replies.answers, &question_id, question, limit)
            .await?;
        if answer.is_none() {
            info!(question_id, "question timed out");
        }
        Ok(answer)
    }

    /// Asks the user to approve a tool call; no decision within the approval timeout is a deny.
    pub async fn approve(
        &self,
        turn: &str,
        tool: &str,
        resource: &str,
        summary: &str,
    ) -> Result<Decision, Closed> {
        let request_id = new_id("approval");
        let request = ApprovalRequest {
            turn: turn.to_owned(),
            request_id: request_id.clone(),
            tool: tool.to_owned(),
            resource: resource.to_owned(),
            summary: summary.to_owned(),
        };
        let limit = self.limits.approval_timeout;
        let decision = self
            .request(&self.replies.approvals, &request_id, request, limit)
            .await?;
        if let Some(decision) = decision {
            info!(request_id, ?decision, "approval decided");
            return Ok(decision);
        }
        warn!(request_id, "approval timed out: deny");
        Ok(Decision::Deny)
    }

    /// Asks the surface to post `path` to the room and waits for its `delivery_result` (so a
    /// tool never reports "sent" for a file the room did not get); `None` when no report came
    /// within the delivery timeout. `request_id` is unique in the turn and the same when the
    /// turn runs the request again: the surface posts the file once per request id.
    pub async fn send_file(
        &self,
        turn: &str,
        request_id: String,
        path: WorkspacePath,
        caption: Option<String>,
        voice: bool,
    ) -> Result<Option<DeliveryResult>, Closed> {
        let send = SendFile {
            turn: turn.to_owned(),
            request_id: request_id.clone(),
            path,
            caption,
            voice,
        };
        let limit = self.limits.delivery_timeout;
        let result = self
            .request(&self.replies.deliveries, &request_id, send, limit)
            .await?;
        if result.is_none() {
            warn!(request_id, "no delivery report in time");
        }
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_reaches_only_a_request_still_waiting() {
        let waiters = Waiters::<String>::default();
        assert!(!waiters.deliver("q-1", "nobody asked".to_owned()));
        let (tx, mut rx) = oneshot::channel();
        waiters.lock().insert("q-1".to_owned(), tx);
        {
            let _waiting = Waiting {
                waiters: &waiters,
                id: "q-1",
            };
            assert!(!waiters.deliver("q-2", "another question".to_owned()));
        }
        // The request gave up (timeout, cancel): its reply finds nobody.
        assert!(!waiters.deliver("q-1", "late".to_owned()));
        assert!(rx.try_recv().is_err());
        let (tx, mut rx) = oneshot::channel();
        waiters.lock().insert("q-3".to_owned(), tx);
        assert!(waiters.deliver("q-3", "yes".to_owned()));
        assert_eq!(rx.try_recv().unwrap(), "yes");
    }

    #[test]
    fn text_is_cut_at_character_boundaries_within_the_bound() {
        let text = format!("{}é{}", "a".repeat(9), "€".repeat(5));
        let pieces: Vec<&str> = text_pieces(&text, 10).collect();
        assert_eq!(pieces.concat(), text, "nothing lost or doubled");
        assert!(
            pieces.iter().all(|p| p.len() <= 10 && !p.is_empty()),
            "{pieces:?}"
        );
        assert_eq!(pieces[0], "a".repeat(9), "é is not split");
        assert_eq!(text_pieces("", 10).count(), 0);
        let big = "x".repeat(1024 * 1024 - 1024);
        assert!(text_pieces(&big, MAX_TEXT_CHUNK).all(|p| p.len() <= MAX_TEXT_CHUNK));
        assert_eq!(
            text_pieces(&big, MAX_TEXT_CHUNK).count(),
            big.len().div_ceil(MAX_TEXT_CHUNK)
        );
    }
}
