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
        for round in 0..MAX_ROUNDS {
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
            for call in calls {
                let outcome = io.call_tool(&call.name, &call.arguments).await;
                let content = if outcome.ok {
                    outcome.output
                } else {
                    format!("error: {}", outcome.output)
                };
                messages.push(json!({
                    "role": "tool",
                    "tool_call_id": call.id,
                    "content": content,
                }));
            }
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
        });
        if !tools.is_empty() {
            body["tools"] = Value::from(tools.to_vec());
        }
        let mut request = self
            .http
            .post(format!("{}/chat/completions", self.config.base_url))
            .json(&body);
        if let Some(key) = &self.config.api_key {
            request = request.bearer_auth(key.expose());
        }
        let response = request
            .send()
            .await
            .map_err(|e| BrainError::Model(format!("request failed: {}", e.without_url())))?;
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
