//! Posting to rooms so that nothing is lost and nothing is posted twice.
//!
//! Every post carries a transaction id derived from what caused it (see [`crate::render`]) and
//! is recorded in the journal before the first try, so a retry — in this process or after a
//! crash — reuses the id and the homeserver returns the event it already created.
//!
//! What happens when the homeserver does not accept a post is decided by
//! [`crate::retry::verdict`]:
//! * rate limited (429): wait as long as it asks (`retry_after_ms` / `Retry-After`), try again;
//! * unreachable, overloaded (5xx) or otherwise passing trouble: back off exponentially with
//!   jitter and try again, for as long as it takes — until shutdown, after which the turn
//!   resumes with the same ids;
//! * refused for good (403 forbidden, 413 too large, 400 bad event, a room the bot left): the
//!   post is *parked* — kept in the journal with the reason and the content, logged with the
//!   ids, counted in `/healthz` — and never tried again; [`report_refusal`] tells the room.
//!
//! The SDK's own retry loop is switched off for these requests: it would wait out 429s for up
//! to 15 minutes without telling us, and gives up on network errors at once.

use std::time::{Duration, SystemTime};

use backon::BackoffBuilder;
use matrix_sdk::config::RequestConfig;
use matrix_sdk::ruma::api::error::{ErrorBody, ErrorKind, RetryAfter};
use matrix_sdk::ruma::events::MessageLikeEventContent;
use matrix_sdk::ruma::events::reaction::ReactionEventContent;
use matrix_sdk::ruma::events::relation::Annotation;
use matrix_sdk::ruma::events::room::message::RoomMessageEventContent;
use matrix_sdk::ruma::{EventId, OwnedEventId, RoomId, TransactionId};
use matrix_sdk::{HttpError, Room};
use serde::Serialize;
use tracing::{error, info, warn};

use crate::context::Shared;
use crate::journal::SendState;
use crate::purpose::Purpose;
use crate::render::{self, ReplyTarget};
use crate::retry::{Observed, Verdict, verdict};

/// The longest wait a homeserver's `Retry-After` is honoured for (longer asks are clamped).
const MAX_RETRY_AFTER: Duration = Duration::from_secs(15 * 60);

/// A post the homeserver refused for good.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The HTTP status, if there was an answer.
    pub status: Option<u16>,
    /// The Matrix `errcode`.
    pub errcode: Option<String>,
    /// The server's explanation (or ours).
    pub message: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(status) = self.status {
            write!(f, "HTTP {status} ")?;
        }
        if let Some(code) = &self.errcode {
            write!(f, "{code}: ")?;
        }
        f.write_str(&self.message)
    }
}

/// Why a post did not happen.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    /// Refused for good just now; parked (see [`report_refusal`]).
    #[error("refused by the homeserver: {0}")]
    Refused(Refusal),
    /// Parked earlier; not tried again (and already reported).
    #[error("parked earlier: {0}")]
    AlreadyParked(String),
    /// Shutdown came first; the same transaction id is tried after the restart.
    #[error("interrupted by shutdown")]
    Shutdown,
    /// The journal failed.
    #[error(transparent)]
    Journal(#[from] crate::journal::JournalError),
}

/// What a post is, for the journal and the log.
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    /// Its transaction id.
    pub txn: &'a TransactionId,
    /// The thread it goes to, if any.
    pub thread_root: Option<&'a EventId>,
    /// The event it is about (the message being answered), for the log.
    pub about: Option<&'a EventId>,
    /// What it is.
    pub purpose: Purpose,
}

/// Posts `content` to `room` as `out` describes: once, retried through passing trouble, parked
/// when refused for good. Returns the event id (the earlier one if this transaction already
/// went through).
pub async fn post<C>(
    ctx: &Shared,
    room: &Room,
    content: C,
    out: Outgoing<'_>,
) -> Result<OwnedEventId, PostError>
where
    C: MessageLikeEventContent + Serialize + Clone,
{
    let room_id = room.room_id();
    let about = out.about.map(EventId::as_str).unwrap_or_default();
    match ctx.journal.begin_send(
        out.txn.as_str(),
        room_id.as_str(),
        out.thread_root.map(EventId::as_str),
        out.purpose.as_str(),
    )? {
        SendState::Posted(id) => {
            if let Ok(id) = EventId::parse(&id) {
                return Ok(id);
            }
        }
        SendState::Parked(why) => return Err(PostError::AlreadyParked(why)),
        SendState::Open => {}
    }
    let mut backoff = daemon::backoff(Duration::from_secs(1), Duration::from_secs(60)).build();
    let mut attempt = 0u32;
    loop {
        attempt += 1;
        let sent = room
            .send(content.clone())
            .with_transaction_id(out.txn.to_owned())
            .with_request_config(RequestConfig::new().disable_retry());
        let result = tokio::select! {
            _ = ctx.shutdown.cancelled() => return Err(PostError::Shutdown),
            r = sent => r,
        };
        let err = match result {
            Ok(r) => {
                ctx.journal
                    .finish_send(out.txn.as_str(), r.response.event_id.as_str())?;
                if attempt > 1 {
                    info!(room_id = %room_id, txn_id = %out.txn, purpose = %out.purpose, about, attempt, "posted after retrying");
                }
                return Ok(r.response.event_id);
            }
            Err(e) => e,
        };
        let wait = after_failure(ctx, room_id, &content, out, attempt, &err, &mut backoff)?;
        tokio::select! {
            _ = ctx.shutdown.cancelled() => return Err(PostError::Shutdown),
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// After a failed attempt of `out`: how long to wait before the next one, or, when the
/// homeserver refused it for good, the refusal (the send is parked, with its content kept).
fn after_failure<C: Serialize>(
    ctx: &Shared,
    room_id: &RoomId,
    content: &C,
    out: Outgoing<'_>,
    attempt: u32,
    err: &matrix_sdk::Error,
    backoff: &mut impl Iterator<Item = Duration>,
) -> Result<Duration, PostError> {
    let observed = observe(err);
    let about = out.about.map(EventId::as_str).unwrap_or_default();
    Ok(match verdict(&observed) {
        Verdict::RateLimited(asked) => {
            crate::metrics::send_retry("rate_limited");
            let wait = asked
                .map(|d| d.min(MAX_RETRY_AFTER))
                .or_else(|| backoff.next())
                .unwrap_or(Duration::from_secs(60));
            info!(
                room_id = %room_id, txn_id = %out.txn, purpose = %out.purpose, about, attempt,
                wait_ms = wait.as_millis() as u64,
                "rate limited by the homeserver; waiting before posting again"
            );
            wait
        }
        Verdict::Transient => {
            crate::metrics::send_retry(match observed {
                Observed::Network => "network",
                Observed::Status { .. } => "server_error",
                _ => "other",
            });
            let wait = backoff.next().unwrap_or(Duration::from_secs(60));
            warn!(
                room_id = %room_id, txn_id = %out.txn, purpose = %out.purpose, about, attempt,
                wait_ms = wait.as_millis() as u64, error = %err,
                "post failed; retrying with the same transaction id"
            );
            wait
        }
        Verdict::Permanent => {
            let refusal = refusal(&observed, err);
            error!(
                room_id = %room_id, txn_id = %out.txn, purpose = %out.purpose, about,
                status = refusal.status, errcode = refusal.errcode.as_deref(),
                reason = %refusal.message,
                "post refused by the homeserver for good; parked, not retried"
            );
            let json = serde_json::to_string(content).unwrap_or_default();
            ctx.journal
                .park_send(out.txn.as_str(), &refusal.to_string(), &json)?;
            if let Ok(n) = ctx.journal.parked_count() {
                ctx.health.set_parked_sends(n);
            }
            return Err(PostError::Refused(refusal));
        }
    })
}

/// Sends `content` once, without a journal record or retries: for updates that the next one
/// supersedes (the edits of an answer being written). On failure returns how long to hold
/// off: what a rate-limited homeserver asked for, else `None`.
pub async fn try_once<C>(room: &Room, content: C, purpose: Purpose) -> Result<(), Option<Duration>>
where
    C: MessageLikeEventContent + Serialize + Clone,
{
    let sent = room.send(content).with_request_config(
        RequestConfig::new()
            .disable_retry()
            .timeout(Duration::from_secs(20)),
    );
    match sent.await {
        Ok(_) => Ok(()),
        Err(err) => {
            let observed = observe(&err);
            let wait = match verdict(&observed) {
                Verdict::RateLimited(asked) => Some(
                    asked
                        .unwrap_or(Duration::from_secs(10))
                        .min(MAX_RETRY_AFTER),
                ),
                _ => None,
            };
            info!(room_id = %room.room_id(), %purpose, error = %err, wait_ms = wait.map(|w| w.as_millis() as u64), "update not sent; the next one replaces it");
            Err(wait)
        }
    }
}

/// Tells the room that the post `failed` was refused: a notice in the same place, or, when even
/// that is refused (e.g. the bot may not post messages there), a ⚠️ reaction on the message it
/// answered. The log line and the parked record are already written by [`post`].
pub async fn report_refusal(
    ctx: &Shared,
    room: &Room,
    failed: Outgoing<'_>,
    target: Option<&ReplyTarget>,
    refusal: &Refusal,
) {
    let text = refusal_text(failed.purpose, refusal);
    let notice = match target {
        Some(t) => t.notice(&text),
        None => RoomMessageEventContent::notice_plain(&text),
    };
    let notice_txn = render::notice_txn_id(failed.txn.as_str(), "refused");
    let notice_out = Outgoing {
        txn: &notice_txn,
        purpose: Purpose::RefusalNotice,
        ..failed
    };
    match post(ctx, room, notice, notice_out).await {
        Ok(_) | Err(PostError::Shutdown) => return,
        Err(e) => {
            warn!(error = %e, txn_id = %failed.txn, "the refusal notice was not posted either")
        }
    }
    let Some(target) = target else { return };
    let reaction = ReactionEventContent::new(Annotation::new(target.event_id.clone(), "⚠️".into()));
    let reaction_txn = render::notice_txn_id(failed.txn.as_str(), "refused-reaction");
    let reaction_out = Outgoing {
        txn: &reaction_txn,
        purpose: Purpose::RefusalReaction,
        ..failed
    };
    if let Err(e) = post(ctx, room, reaction, reaction_out).await {
        warn!(error = %e, txn_id = %failed.txn, "could not mark the message with a reaction either");
    }
}

/// The notice telling people a post was refused (pure).
pub fn refusal_text(purpose: Purpose, refusal: &Refusal) -> String {
    let what = purpose.what();
    let reason = match refusal.errcode.as_deref() {
        Some("M_TOO_LARGE") => "it is too large".to_owned(),
        Some("M_FORBIDDEN") => "I am not allowed to post it here".to_owned(),
        _ => refusal.to_string(),
    };
    format!("⚠️ The homeserver refused my {what} ({reason}); it will not be retried.")
}

fn refusal(observed: &Observed, err: &matrix_sdk::Error) -> Refusal {
    let message = match err {
        matrix_sdk::Error::Http(h) => h
            .as_client_api_error()
            .and_then(|e| match &e.body {
                ErrorBody::Standard(b) => Some(b.message.clone()),
                _ => None,
            })
            .unwrap_or_else(|| err.to_string()),
        _ => err.to_string(),
    };
    let (status, errcode) = match observed {
        Observed::Status {
            status, errcode, ..
        } => (Some(*status), errcode.clone()),
        _ => (None, None),
    };
    Refusal {
        status,
        errcode,
        message: truncate(&message, 300),
    }
}

fn truncate(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

/// Reduces an SDK error to what [`verdict`] needs.
pub fn observe(err: &matrix_sdk::Error) -> Observed {
    match err {
        matrix_sdk::Error::Http(h) => observe_http(h),
        matrix_sdk::Error::WrongRoomState(_)
        | matrix_sdk::Error::SerdeJson(_)
        | matrix_sdk::Error::Identifier(_) => Observed::Invalid,
        _ => Observed::Local,
    }
}

fn observe_http(h: &HttpError) -> Observed {
    if let Some(api) = h.as_client_api_error() {
        let kind = api.error_kind();
        let retry_after = match kind {
            Some(ErrorKind::LimitExceeded(data)) => match &data.retry_after {
                Some(RetryAfter::Delay(d)) => Some(*d),
                Some(RetryAfter::DateTime(at)) => {
                    Some(at.duration_since(SystemTime::now()).unwrap_or_default())
                }
                None => None,
            },
            _ => None,
        };
        return Observed::Status {
            status: api.status_code.as_u16(),
            errcode: kind.map(|k| k.errcode().as_str().to_owned()),
            retry_after,
        };
    }
    match h {
        HttpError::Reqwest(_) => Observed::Network,
        HttpError::Cached(inner) => observe_http(inner),
        HttpError::IntoHttp(_) => Observed::Invalid,
        _ => Observed::Local,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(status: u16, errcode: Option<&str>, retry_ms: Option<u64>) -> Observed {
        Observed::Status {
            status,
            errcode: errcode.map(str::to_owned),
            retry_after: retry_ms.map(Duration::from_millis),
        }
    }

    fn api_error(status: u16, kind: ErrorKind) -> matrix_sdk::Error {
        use matrix_sdk::RumaApiError;
        use matrix_sdk::reqwest::StatusCode;
        use matrix_sdk::ruma::api::error::{Error, FromHttpResponseError, StandardErrorBody};
        let body = ErrorBody::Standard(StandardErrorBody::new(kind, "the reason".into()));
        let e = Error::new(StatusCode::from_u16(status).unwrap(), body);
        matrix_sdk::Error::Http(Box::new(HttpError::Api(Box::new(
            FromHttpResponseError::Server(RumaApiError::MatrixError(e)),
        ))))
    }

    #[tokio::test]
    async fn sdk_errors_are_observed_with_status_code_and_wait() {
        use matrix_sdk::ruma::api::error::LimitExceededErrorData;
        let forbidden = api_error(403, ErrorKind::Forbidden);
        let seen = observe(&forbidden);
        assert_eq!(seen, status(403, Some("M_FORBIDDEN"), None));
        assert_eq!(
            refusal(&seen, &forbidden).to_string(),
            "HTTP 403 M_FORBIDDEN: the reason"
        );
        let mut data = LimitExceededErrorData::new();
        data.retry_after = Some(RetryAfter::Delay(Duration::from_millis(2500)));
        assert_eq!(
            observe(&api_error(429, ErrorKind::LimitExceeded(data))),
            status(429, Some("M_LIMIT_EXCEEDED"), Some(2500))
        );
        assert_eq!(
            observe(&api_error(413, ErrorKind::TooLarge)),
            status(413, Some("M_TOO_LARGE"), None)
        );
        // Nothing listens on port 9 of loopback here: a network failure, not a refusal.
        let refused = matrix_sdk::reqwest::get("http://127.0.0.1:9/")
            .await
            .unwrap_err();
        let err = matrix_sdk::Error::Http(Box::new(HttpError::Reqwest(refused)));
        assert_eq!(observe(&err), Observed::Network);
        assert_eq!(verdict(&observe(&err)), Verdict::Transient);
    }

    #[test]
    fn refusals_read_well() {
        let r = Refusal {
            status: Some(403),
            errcode: Some("M_FORBIDDEN".into()),
            message: "You don't have permission to post that to the room.".into(),
        };
        assert_eq!(
            r.to_string(),
            "HTTP 403 M_FORBIDDEN: You don't have permission to post that to the room."
        );
        assert_eq!(
            refusal_text(Purpose::Answer, &r),
            "⚠️ The homeserver refused my answer (I am not allowed to post it here); it will not be retried."
        );
        let big = Refusal {
            status: Some(413),
            errcode: Some("M_TOO_LARGE".into()),
            message: "event too large".into(),
        };
        assert!(refusal_text(Purpose::File, &big).contains("my file (it is too large)"));
        let odd = Refusal {
            status: Some(400),
            errcode: Some("M_BAD_JSON".into()),
            message: "bad".into(),
        };
        assert!(
            refusal_text(Purpose::Backlog, &odd).contains("my message (HTTP 400 M_BAD_JSON: bad)")
        );
    }
}
