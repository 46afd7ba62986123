//! A brain backed by an OpenAI-compatible chat-completions server (OpenAI, Ollama, vLLM,
//! llama.cpp): streamed answers (server-sent events) and tool calling with the registry's
//! generated schemas.

use std::time::Duration;

use eventsource_stream::{EventStreamError, Eventsource};
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use serde_json::{Value, json};
use tracing::{debug, instrument, warn};

use super::{Brain, BrainError, TurnInput};
use crate::config::OpenAiConfig;
use crate::store::{TurnRecord, TurnStatus};
use crate::turn::TurnIo;

mod stream;

pub use stream::{Assembler, Ending, PendingCall};

/// Most model round trips (answer, tool calls, answer...) in one turn.
const MAX_ROUNDS: usize = 8;
/// Earlier turns sent along as conversation history.
const MAX_HISTORY_TURNS: usize = 20;
const _: () = assert!(MAX_HISTORY_TURNS <= crate::store::RECENT_TURNS);
/// A stream silent for this long is abandoned.
const CHUNK_TIMEOUT: Duration = Duration::from_secs(120);
/// A server that has not answered with response headers by then is given up on (a frozen
/// server must not leave the room waiting in silence for minutes).
const HEADERS_TIMEOUT: Duration = Duration::from_secs(60);
/// Attempts of one request while the server is unreachable, loading (503) or rate limiting
/// (429): nothing has been shown yet, so trying again is safe.
const ATTEMPTS: usize = 4;
/// Most tokens one completion may use (`max_tokens`), so a runaway answer ends.
const MAX_TOKENS: u32 = 4096;

/// The OpenAI-compatible brain.
#[derive(Debug, Clone)]
pub struct OpenAi {
    config: OpenAiConfig,
    http: reqwest::Client,
}

impl OpenAi {
    /// A brain for the server in `config`.
    pub fn new(config: OpenAiConfig) -> Self {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .user_agent(concat!("mxbridge-agent/", env!("CARGO_PKG_VERSION")))
            .build()
            .unwrap_or_default();
        Self { config, http }
    }
}

impl Brain for OpenAi {
    fn run_turn<'a>(
        &'a self,
        input: &'a TurnInput,
        io: &'a mut TurnIo,
    ) -> BoxFuture<'a, Result<(), BrainError>> {
        Box::pin(self.run(input, io))
    }
}

impl OpenAi {
    #[instrument(skip_all, fields(chat_id = %input.chat_id, turn = %input.turn.id, model = %self.config.model))]
    async fn run(&self, input: &TurnInput, io: &mut TurnIo) -> Result<(), BrainError> {
        let mut messages = self.conversation(input, io);
        let tools: Vec<Value> = io
            .registry()
            .specs()
            .into_iter()
            .map(|s| {
                json!({
                    "type": "function",
                    "function": {
                        "name": s.name,
                        "description": s.description,
                        "parameters": s.parameters,
                    }
                })
            })
            .collect();
        let mut made: std::collections::HashSet<(String, String)> = Default::default();
        let mut repeats = 0;
        for round in 0..MAX_ROUNDS {
            if repeats >= 2 {
                warn!(round, "the model keeps repeating tool calls; stopping");
                io.say("\n(I stopped: the model kept repeating the same tool call.)")
                    .await?;
                return Ok(());
            }
            debug!(round, "model request");
            let assembled = self.complete(&messages, &tools, io).await?;
            if assembled.ending() == Ending::CutOff {
                // Arguments cut off mid-way are not a call: nothing is run.
                warn!(
                    round,
                    calls = assembled.calls.len(),
                    "completion cut off by the token limit"
                );
                let note = if assembled.calls.is_empty() {
                    "\n\n(My answer was cut off: the model reached its length limit.)"
                } else {
                    "\n\n(The model reached its length limit in the middle of a tool call, so I \
                     ran nothing.)"
                };
                io.say(note).await?;
                return Ok(());
            }
            let calls: Vec<PendingCall> = assembled
                .calls
                .into_iter()
                .enumerate()
                .map(|(i, mut c)| {
                    if c.id.is_empty() {
                        c.id = format!("call_{round}_{i}");
                    }
                    c
                })
                .collect();
            let mut assistant = json!({ "role": "assistant", "content": assembled.content });
            if !calls.is_empty() {
                assistant["tool_calls"] = calls
                    .iter()
                    .map(|c| {
                        json!({
                            "id": c.id,
                            "type": "function",
                            "function": { "name": c.name, "arguments": c.arguments },
                        })
                    })
                    .collect();
            }
            messages.push(assistant);
            if calls.is_empty() {
                return Ok(());
            }
            let mut this_round = Vec::new();
            for call in calls {
                // The same call as in an earlier round (a model in a loop would send one file
                // eight times): not run; the model is told, and a second repeat ends the turn.
                // Identical calls within one round are parallel calls and run.
                let args: Value = serde_json::from_str(&call.arguments)
                    .unwrap_or_else(|_| Value::String(call.arguments.clone()));
                let key = (call.name.clone(), args.to_string());
                let repeated = made.contains(&key);
                this_round.push(key);
                let content = if repeated {
                    repeats += 1;
                    warn!(tool = %call.name, repeats, "the model repeated a tool call; not run");
                    "error: you already made this exact call in this turn; its result is above. \
                     Do not repeat it."
                        .to_owned()
                } else {
                    let outcome = io.call_tool(&call.name, &call.arguments).await;
                    if outcome.ok {
                        outcome.output
                    } else {
                        format!("error: {}", outcome.output)
                    }
                };
                messages.push(json!({
                    "role": "tool",
                    "tool_call_id": call.id,
                    "content": content,
                }));
            }
            made.extend(this_round);
        }
        warn!("too many tool rounds; stopping");
        io.say("\n(I stopped after too many tool calls.)").await?;
        Ok(())
    }

    /// The system prompt, earlier turns and the current turn as chat messages.
    fn conversation(&self, input: &TurnInput, io: &TurnIo) -> Vec<Value> {
        let system = format!(
            "You are an assistant in a Matrix chat. Files live in a shared workspace; paths are \
             relative to it. This chat's own folder is {own}/ (you may write there). Files users \
             sent are listed with each message. Use the tools to read, describe, write and send \
             files. Answer in Markdown.",
            own = io.scope().own_dir()
        );
        let mut messages = vec![json!({ "role": "system", "content": system })];
        let recent = &input.history.recent;
        // A failed turn (an over-long message, a server error) is left out: sent again, it would
        // make every later turn fail the same way.
        let recent: Vec<&TurnRecord> = recent
            .iter()
            .filter(|t| t.status != TurnStatus::Failed)
            .collect();
        for turn in &recent[recent.len().saturating_sub(MAX_HISTORY_TURNS)..] {
            messages.push(json!({ "role": "user", "content": user_content(turn) }));
            if !turn.output.is_empty() {
                messages.push(json!({ "role": "assistant", "content": turn.output }));
            }
        }
        messages.push(json!({ "role": "user", "content": user_content(&input.turn) }));
        messages
    }

    /// One streamed completion; answer text is passed on to the surface as it arrives.
    async fn complete(
        &self,
        messages: &[Value],
        tools: &[Value],
        io: &mut TurnIo,
    ) -> Result<Assembler, BrainError> {
        let mut body = json!({
            "model": self.config.model,
            "messages": messages,
            "stream": true,
            "max_tokens": MAX_TOKENS,
        });
        if !tools.is_empty() {
            body["tools"] = Value::from(tools.to_vec());
        }
        let response = self.send_with_retries(&body).await?;
        let status = response.status();
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            let said = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v.get("error").map(stream::error_message))
                .unwrap_or_else(|| text.chars().take(300).collect());
            // A server that echoes the request must not echo the key into the room.
            let said = match &self.config.api_key {
                Some(key) if !key.expose().is_empty() => said.replace(key.expose(), "[redacted]"),
                _ => said,
            };
            return Err(BrainError::Model(format!(
                "the model server answered {status}: {said}"
            )));
        }
        let mut events = response.bytes_stream().eventsource();
        let mut assembler = Assembler::default();
        while !assembler.done {
            let next = tokio::time::timeout(CHUNK_TIMEOUT, events.next())
                .await
                .map_err(|_| BrainError::Model("the stream stalled".to_owned()))?;
            let Some(event) = next else { break };
            let event = event.map_err(|e| {
                BrainError::Model(match e {
                    EventStreamError::Transport(t) => format!("stream failed: {}", t.without_url()),
                    other => format!("stream failed: {other}"),
                })
            })?;
            if let Some(text) = assembler.feed(&event.data)? {
                io.say(text).await?;
            }
        }
        if assembler.ending() == Ending::Broken {
            return Err(BrainError::Model(
                "the stream ended before the answer was complete".to_owned(),
            ));
        }
        Ok(assembler)
    }
}

impl OpenAi {
    /// Sends one completion request, waiting at most [`HEADERS_TIMEOUT`] for the response head,
    /// and tries again (with jittered backoff) while the server cannot be reached, is loading
    /// (503) or asks to slow down (429).
    async fn send_with_retries(&self, body: &Value) -> Result<reqwest::Response, BrainError> {
        use backon::{ExponentialBuilder, Retryable};
        let attempt = || async {
            let mut request = self
                .http
                .post(format!("{}/chat/completions", self.config.base_url))
                .json(body);
            if let Some(key) = &self.config.api_key {
                request = request.bearer_auth(key.expose());
            }
            let response = tokio::time::timeout(HEADERS_TIMEOUT, request.send())
                .await
                .map_err(|_| {
                    Attempt::Again(format!("no answer within {}s", HEADERS_TIMEOUT.as_secs()))
                })?
                .map_err(|e| Attempt::Again(format!("request failed: {}", e.without_url())))?;
            let status = response.status().as_u16();
            if status == 429 || status == 503 {
                return Err(Attempt::Again(format!(
                    "the model server answered {status} (busy or loading)"
                )));
            }
            Ok(response)
        };
        attempt
            .retry(
                ExponentialBuilder::default()
                    .with_min_delay(Duration::from_millis(500))
                    .with_max_delay(Duration::from_secs(8))
                    .with_max_times(ATTEMPTS - 1)
                    .with_jitter(),
            )
            .notify(
                |e: &Attempt, wait| warn!(error = %e, ?wait, "model request failed; trying again"),
            )
            .await
            .map_err(|Attempt::Again(why)| BrainError::Model(why))
    }
}

/// A failed attempt worth repeating.
#[derive(Debug, thiserror::Error)]
enum Attempt {
    #[error("{0}")]
    Again(String),
}

fn user_content(turn: &TurnRecord) -> String {
    let mut content = String::new();
    for c in &turn.context {
        content.push_str(&format!("(earlier, {}): {}\n", c.sender.user_id, c.text));
        for a in &c.attachments {
            content.push_str(&format!("  attachment: {a}\n"));
        }
    }
    content.push_str(&format!("{}: {}", turn.sender.user_id, turn.text));
    for a in &turn.attachments {
        content.push_str(&format!("\nattachment: {a}"));
        if let Some(info) = turn.attachment_info.get(a) {
            content.push_str(&format!(
                " (name {}, {}, {} bytes)",
                info.name, info.mime, info.size
            ));
        }
    }
    content
}
