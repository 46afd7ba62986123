//! One completion request: sent with a deadline for the response head, tried again while the
//! server is unreachable, rate limiting (honouring `Retry-After`) or failing with a 5xx —
//! only before anything was streamed, so no answer is ever shown twice — then its stream read
//! with an idle deadline between chunks, answer text passed on as it arrives. A server that
//! refuses `stream_options` (older than the field) is asked again without it, once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use backon::Retryable;
use eventsource_stream::{EventStreamError, Eventsource};
use futures_util::StreamExt;
use serde_json::Value;
use tracing::warn;

use super::failure::{Failure, classify, refuses_images, refuses_stream_options, retry_after};
use super::stream::{self, Assembler, Ending};
use super::vision;
use crate::brain::BrainError;
use crate::config::{OpenAiConfig, VisionMode};
use crate::turn::TurnIo;

/// The longest `Retry-After` honoured; a server asking for more is treated as rate limiting.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// A failed attempt, with the wait the server asked for.
#[derive(Debug)]
struct Attempt {
    failure: Failure,
    wait: Option<Duration>,
}

/// What the server was found to refuse; such parts are not sent again.
#[derive(Debug)]
pub(super) struct Refusals<'a> {
    /// `stream_options` (servers older than the field).
    pub(super) stream_options: &'a AtomicBool,
    /// Pictures (a model without vision, with `OPENAI_VISION=auto`).
    pub(super) images: &'a AtomicBool,
}

/// Sends `body` and streams the completion into an [`Assembler`], saying answer text through
/// `io` as it comes. When the server refuses the body's `stream_options`, or its pictures
/// (with `OPENAI_VISION=auto`), it is sent again without them, once, and the refusal is
/// recorded in `refused`, so later requests leave them out.
pub(super) async fn complete(
    http: &reqwest::Client,
    config: &OpenAiConfig,
    body: &Value,
    io: &mut TurnIo,
    refused: &Refusals<'_>,
) -> Result<Assembler, BrainError> {
    let fail = |f: Failure| {
        crate::metrics::model_request(f.label(), None);
        BrainError::Model(f.message(&config.model))
    };
    let asked = std::time::Instant::now();
    let has_images = body
        .get("messages")
        .and_then(Value::as_array)
        .is_some_and(|m| vision::has_images(m));
    let response = match send(http, config, body).await {
        Err(f) if body.get("stream_options").is_some() && refuses_stream_options(&f) => {
            warn!(
                "the model server refuses stream_options; asking without them from now on \
                 (token usage is counted only if the server reports it unasked)"
            );
            refused.stream_options.store(true, Ordering::Relaxed);
            let mut plain = body.clone();
            if let Some(fields) = plain.as_object_mut() {
                fields.remove("stream_options");
            }
            send(http, config, &plain).await
        }
        Err(f) if has_images && config.vision.mode == VisionMode::Auto && refuses_images(&f) => {
            warn!(
                model = %config.model,
                refusal = %f.message(&config.model),
                "the model server refuses pictures for this model; asking without them, and \
                 sending none from now on (OPENAI_VISION=off says so from the start)"
            );
            crate::metrics::model_request(f.label(), None);
            refused.images.store(true, Ordering::Relaxed);
            let mut plain = body.clone();
            if let Some(messages) = plain.get_mut("messages").and_then(Value::as_array_mut) {
                vision::strip_images(messages);
            }
            send(http, config, &plain).await
        }
        sent => sent,
    }
    .map_err(fail)?;
    let head = asked.elapsed();
    let tuning = &config.tuning;
    let mut events = response.bytes_stream().eventsource();
    let mut assembler = Assembler::default();
    while !assembler.done {
        let next = tokio::time::timeout(tuning.idle_timeout, events.next())
            .await
            .map_err(|_| fail(Failure::Stalled(tuning.idle_timeout)))?;
        let Some(event) = next else { break };
        let event = event.map_err(|e| {
            fail(Failure::Broken(match e {
                EventStreamError::Transport(t) => t.without_url().to_string(),
                other => other.to_string(),
            }))
        })?;
        if let Some(text) = assembler.feed(&event.data)? {
            io.say(text).await?;
        }
    }
    if assembler.ending() == Ending::Broken {
        return Err(fail(Failure::Broken(
            "it ended before the answer was complete".to_owned(),
        )));
    }
    crate::metrics::model_request("ok", Some(head));
    if let Some((prompt, completion)) = assembler.tokens() {
        crate::metrics::tokens(prompt, completion);
    }
    Ok(assembler)
}

/// Sends the request until it gets a successful response head, or a failure that waiting does
/// not fix, or the attempts run out.
async fn send(
    http: &reqwest::Client,
    config: &OpenAiConfig,
    body: &Value,
) -> Result<reqwest::Response, Failure> {
    let tuning = &config.tuning;
    let attempt = || async {
        let mut request = http
            .post(format!("{}/chat/completions", config.base_url))
            .json(body);
        if let Some(key) = &config.api_key {
            request = request.bearer_auth(key.expose());
        }
        let response = match tokio::time::timeout(tuning.head_timeout, request.send()).await {
            Err(_) => {
                return Err(Attempt {
                    failure: Failure::NoAnswer(tuning.head_timeout),
                    wait: None,
                });
            }
            Ok(Err(e)) => {
                warn!(error = %e.without_url(), "model request failed");
                return Err(Attempt {
                    failure: Failure::Unreachable,
                    wait: None,
                });
            }
            Ok(Ok(r)) => r,
        };
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let wait = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| retry_after(v, SystemTime::now()));
        let text = response.text().await.unwrap_or_default();
        let said = redact(&server_said(&text), config);
        Err(Attempt {
            failure: classify(status.as_u16(), &text, &said),
            wait,
        })
    };
    attempt
        .retry(
            daemon::backoff(Duration::from_millis(500), Duration::from_secs(8))
                .with_max_times(tuning.attempts.saturating_sub(1)),
        )
        .when(|a: &Attempt| a.failure.is_passing() && a.wait.is_none_or(|w| w <= MAX_RETRY_AFTER))
        .adjust(|a: &Attempt, backoff| a.wait.or(backoff))
        .notify(|a: &Attempt, wait| {
            warn!(failure = ?a.failure, ?wait, "model request failed; trying again");
        })
        .await
        .map_err(|a| a.failure)
}

/// What a server's error body says: the `error.message` of a JSON body, else the text.
fn server_said(text: &str) -> String {
    serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| v.get("error").map(stream::error_message))
        .unwrap_or_else(|| text.chars().take(300).collect())
}

/// A server that echoes the request must not echo the key into the room.
fn redact(said: &str, config: &OpenAiConfig) -> String {
    match &config.api_key {
        Some(key) if !key.expose().is_empty() => said.replace(key.expose(), "[redacted]"),
        _ => said.to_owned(),
    }
}
