//! A brain backed by an OpenAI-compatible chat-completions server (OpenAI, Ollama, vLLM,
//! llama.cpp): streamed answers (server-sent events) and tool calling with the registry's
//! generated schemas.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::{debug, instrument, warn};

use super::{Brain, BrainError, TurnInput};
use crate::config::OpenAiConfig;
use crate::store::TurnRecord;
use crate::turn::TurnIo;

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

/// A tool call assembled from streamed deltas.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PendingCall {
    /// The model's id for the call.
    pub id: String,
    /// Tool name.
    pub name: String,
    /// JSON arguments, concatenated from the deltas.
    pub arguments: String,
}

#[derive(Debug, Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
}

#[derive(Debug, Deserialize)]
struct Choice {
    #[serde(default)]
    delta: Delta,
}

#[derive(Debug, Default, Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<ToolCallDelta>,
}

#[derive(Debug, Deserialize)]
struct ToolCallDelta {
    #[serde(default)]
    index: usize,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Debug, Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

/// Accumulates one streamed completion.
#[derive(Debug, Default)]
pub struct Assembler {
    /// The answer text so far.
    pub content: String,
    /// Tool calls by index.
    pub calls: BTreeMap<usize, PendingCall>,
}

impl Assembler {
    /// Feeds one SSE `data:` payload; returns new answer text to show, if any.
    /// `Ok(None)` also for `[DONE]` and keep-alives.
    pub fn feed(&mut self, data: &str) -> Result<Option<String>, BrainError> {
        let data = data.trim();
        if data.is_empty() || data == "[DONE]" {
            return Ok(None);
        }
        let chunk: Chunk = serde_json::from_str(data)
            .map_err(|e| BrainError::Model(format!("unexpected stream chunk: {e}")))?;
        let mut text = None;
        for choice in chunk.choices {
            if let Some(c) = choice.delta.content.filter(|c| !c.is_empty()) {
                self.content.push_str(&c);
                text = Some(c);
            }
            for call in choice.delta.tool_calls {
                let slot = self.calls.entry(call.index).or_default();
                if let Some(id) = call.id {
                    slot.id = id;
                }
                if let Some(f) = call.function {
                    if let Some(name) = f.name {
                        slot.name.push_str(&name);
                    }
                    if let Some(args) = f.arguments {
                        slot.arguments.push_str(&args);
                    }
                }
            }
        }
        Ok(text)
    }
}

/// Splits a byte stream into SSE `data:` payloads.
#[derive(Debug, Default)]
pub struct SseLines {
    buf: Vec<u8>,
}

impl SseLines {
    /// Adds bytes; returns the complete `data:` payloads they finish.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=pos).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\r', '\n']);
            if let Some(data) = line.strip_prefix("data:") {
                out.push(data.trim_start().to_owned());
            }
        }
        out
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
            let calls: Vec<PendingCall> = assembled
                .calls
                .into_values()
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
            let text: String = text.chars().take(300).collect();
            return Err(BrainError::Model(format!(
                "server answered {status}: {text}"
            )));
        }
        let mut stream = response.bytes_stream();
        let mut lines = SseLines::default();
        let mut assembler = Assembler::default();
        loop {
            let next = tokio::time::timeout(CHUNK_TIMEOUT, stream.next())
                .await
                .map_err(|_| BrainError::Model("the stream stalled".to_owned()))?;
            let Some(bytes) = next else { break };
            let bytes = bytes
                .map_err(|e| BrainError::Model(format!("stream failed: {}", e.without_url())))?;
            for data in lines.push(&bytes) {
                if data.trim() == "[DONE]" {
                    return Ok(assembler);
                }
                if let Some(text) = assembler.feed(&data)? {
                    io.say(text).await?;
                }
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_lines_split_across_chunks() {
        let mut sse = SseLines::default();
        assert!(sse.push(b"data: {\"a\"").is_empty());
        assert_eq!(
            sse.push(b":1}\r\n\r\ndata: [DONE]\n"),
            ["{\"a\":1}", "[DONE]"]
        );
        assert!(sse.push(b": keep-alive comment\n").is_empty());
    }

    #[test]
    fn assembler_joins_tool_call_deltas() {
        let mut a = Assembler::default();
        let chunks = [
            r#"{"choices":[{"delta":{"content":"Hel"}}]}"#,
            r#"{"choices":[{"delta":{"content":"lo"}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"name":"list_","arguments":""}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":"files","arguments":"{\"di"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"r\":null}"}}]}}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"tool_calls"}]}"#,
        ];
        let mut shown = String::new();
        for c in chunks {
            if let Some(t) = a.feed(c).unwrap() {
                shown.push_str(&t);
            }
        }
        assert_eq!(shown, "Hello");
        assert_eq!(a.content, "Hello");
        assert_eq!(
            a.calls[&0],
            PendingCall {
                id: "c1".into(),
                name: "list_files".into(),
                arguments: r#"{"dir":null}"#.into()
            }
        );
        assert!(a.feed("not json").is_err());
    }
}
