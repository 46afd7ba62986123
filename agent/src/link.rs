//! The way from a running turn to the surface and back: a [`Link`] emits messages on the
//! connection's outbox and waits for the user's answers and approval decisions ([`Replies`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

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

/// Requests waiting for the user, by id; filled in by the connection's receive loop.
#[derive(Debug, Default)]
pub struct Replies {
    approvals: Mutex<HashMap<String, oneshot::Sender<Decision>>>,
    answers: Mutex<HashMap<String, oneshot::Sender<String>>>,
    deliveries: Mutex<HashMap<String, oneshot::Sender<DeliveryResult>>>,
}

impl Replies {
    /// Delivers an approval decision; `false` if nothing waits for `request_id`.
    pub fn approval(&self, request_id: &str, decision: Decision) -> bool {
        let waiter = lock(&self.approvals).remove(request_id);
        waiter.is_some_and(|tx| tx.send(decision).is_ok())
    }

    /// Delivers an answer; `false` if nothing waits for `question_id`.
    pub fn answer(&self, question_id: &str, text: String) -> bool {
        let waiter = lock(&self.answers).remove(question_id);
        waiter.is_some_and(|tx| tx.send(text).is_ok())
    }

    /// Delivers the surface's report on a `send_file`; `false` if nothing waits for it.
    pub fn delivery(&self, result: DeliveryResult) -> bool {
        let waiter = lock(&self.deliveries).remove(&result.request_id);
        waiter.is_some_and(|tx| tx.send(result).is_ok())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Removes a waiter when the waiting future ends for any reason (answer, timeout, cancel).
struct Waiting<'a, T> {
    map: &'a Mutex<HashMap<String, oneshot::Sender<T>>>,
    id: String,
}

impl<T> Drop for Waiting<'_, T> {
    fn drop(&mut self) {
        lock(self.map).remove(&self.id);
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
    /// Timeouts.
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

    /// Asks the user; `None` when no answer came within the ask timeout.
    pub async fn ask(
        &self,
        turn: &str,
        question: &str,
        options: Vec<String>,
    ) -> Result<Option<String>, Closed> {
        let question_id = new_id("q");
        let (tx, rx) = oneshot::channel();
        lock(&self.replies.answers).insert(question_id.clone(), tx);
        let _waiting = Waiting {
            map: &self.replies.answers,
            id: question_id.clone(),
        };
        self.emit(AskUser {
            turn: turn.to_owned(),
            question_id: question_id.clone(),
            text: question.to_owned(),
            options,
        })
        .await?;
        match tokio::time::timeout(self.limits.ask_timeout, rx).await {
            Ok(Ok(answer)) => Ok(Some(answer)),
            Ok(Err(_)) => Err(Closed),
            Err(_) => {
                info!(question_id, "question timed out");
                Ok(None)
            }
        }
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
        let (tx, rx) = oneshot::channel();
        lock(&self.replies.approvals).insert(request_id.clone(), tx);
        let _waiting = Waiting {
            map: &self.replies.approvals,
            id: request_id.clone(),
        };
        self.emit(ApprovalRequest {
            turn: turn.to_owned(),
            request_id: request_id.clone(),
            tool: tool.to_owned(),
            resource: resource.to_owned(),
            summary: summary.to_owned(),
        })
        .await?;
        match tokio::time::timeout(self.limits.approval_timeout, rx).await {
            Ok(Ok(decision)) => {
                info!(request_id, ?decision, "approval decided");
                Ok(decision)
            }
            Ok(Err(_)) => Err(Closed),
            Err(_) => {
                warn!(request_id, "approval timed out: deny");
                Ok(Decision::Deny)
            }
        }
    }

    /// Asks the surface to post `path` to the room and waits for its `delivery_result` (so a
    /// tool never reports "sent" for a file the room did not get); `None` when no report came
    /// within the delivery timeout.
    pub async fn send_file(
        &self,
        turn: &str,
        path: WorkspacePath,
        caption: Option<String>,
        voice: bool,
    ) -> Result<Option<DeliveryResult>, Closed> {
        let request_id = new_id("send");
        let (tx, rx) = oneshot::channel();
        lock(&self.replies.deliveries).insert(request_id.clone(), tx);
        let _waiting = Waiting {
            map: &self.replies.deliveries,
            id: request_id.clone(),
        };
        self.emit(SendFile {
            turn: turn.to_owned(),
            request_id: request_id.clone(),
            path,
            caption,
            voice,
        })
        .await?;
        match tokio::time::timeout(self.limits.delivery_timeout, rx).await {
            Ok(Ok(result)) => Ok(Some(result)),
            Ok(Err(_)) => Err(Closed),
            Err(_) => {
                warn!(request_id, "no delivery report in time");
                Ok(None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
