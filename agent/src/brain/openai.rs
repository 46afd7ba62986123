//! A brain backed by an OpenAI-compatible chat-completions server (OpenAI, Ollama, vLLM,
//! llama.cpp): streamed answers (server-sent events) and tool calling with the registry's
//! generated schemas.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures_util::future::BoxFuture;
use serde_json::{Value, json};
use tracing::{debug, instrument, warn};

use super::{Brain, BrainError, TurnInput};
use crate::config::OpenAiConfig;
use crate::turn::TurnIo;

mod failure;
mod history;
mod request;
mod stream;

pub use failure::{Failure, classify};
pub use stream::{Assembler, Ending, PendingCall};

/// A model that repeats an identical call this often in one turn is stopped.
const MAX_REPEATS: usize = 2;

/// The OpenAI-compatible brain.
#[derive(Debug, Clone)]
pub struct OpenAi {
    config: OpenAiConfig,
    http: reqwest::Client,
    /// The server answered 400 to `stream_options` (it predates the field): not sent again.
    stream_options_refused: Arc<AtomicBool>,
}

impl OpenAi {
    /// A brain for the server in `config`.
    pub fn new(config: OpenAiConfig) -> Self {
        let http = reqwest::Client::builder()
            .connect_timeout(config.tuning.connect_timeout)
            .user_agent(concat!("mxbridge-agent/", env!("CARGO_PKG_VERSION")))
            .build()
            .unwrap_or_default();
        Self {
            config,
            http,
            stream_options_refused: Arc::default(),
        }
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
            .tool_specs()
            .await
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
        let mut calls_made = CallsMade::default();
        let rounds = self.config.tuning.max_rounds;
        for round in 0..rounds {
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
                let content = self.run_call(&call, &mut calls_made, io).await;
                messages.push(json!({
                    "role": "tool",
                    "tool_call_id": call.id,
                    "content": content,
                }));
            }
            if calls_made.repeats >= MAX_REPEATS {
                warn!(round, "the model keeps repeating tool calls; stopping");
                return Err(BrainError::Stopped(
                    "the model kept repeating the same tool call, so I stopped it".to_owned(),
                ));
            }
        }
        warn!(rounds, "too many tool rounds; stopping");
        Err(BrainError::Stopped(format!(
            "the model was still calling tools after {rounds} rounds, so I stopped it"
        )))
    }

    /// Runs one tool call unless it repeats an earlier identical one (a model in a loop would
    /// send one file eight times); returns what the model is told.
    async fn run_call(&self, call: &PendingCall, made: &mut CallsMade, io: &mut TurnIo) -> String {
        let key = CallsMade::key(call);
        let read_only = io.registry().is_read_only(&call.name);
        let earlier = made.outputs.get(&key).cloned();
        if earlier.is_some() && !(read_only && self.config.tuning.rerun_when_changed) {
            made.repeats += 1;
            warn!(tool = %call.name, repeats = made.repeats, "the model repeated a tool call; not run");
            return "error: you already made this exact call in this turn; its result is above. \
                    Do not repeat it."
                .to_owned();
        }
        let outcome = io.call_tool(&call.name, &call.arguments).await;
        let content = if outcome.ok {
            outcome.output
        } else {
            format!("error: {}", outcome.output)
        };
        if earlier.as_ref() == Some(&content) {
            made.repeats += 1;
            warn!(tool = %call.name, repeats = made.repeats, "the model repeated a tool call; same result");
            return format!(
                "{content}\n(note: this is the same result as your identical earlier call; do not \
                 repeat it)"
            );
        }
        made.outputs.insert(key, content.clone());
        content
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
        for turn in history::fit(&input.history.recent, self.config.tuning.history_chars) {
            messages.push(json!({ "role": "user", "content": history::user_content(turn) }));
            if !turn.output.is_empty() {
                messages.push(json!({ "role": "assistant", "content": turn.output }));
            }
        }
        messages.push(json!({ "role": "user", "content": history::user_content(&input.turn) }));
        messages
    }

    /// One streamed completion; answer text is passed on to the surface as it arrives. The
    /// server is asked to report token usage at the end of the stream.
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
            "max_tokens": self.config.tuning.max_tokens,
        });
        if !tools.is_empty() {
            body["tools"] = Value::from(tools.to_vec());
        }
        if !self.stream_options_refused.load(Ordering::Relaxed) {
            body["stream_options"] = json!({ "include_usage": true });
        }
        request::complete(
            &self.http,
            &self.config,
            &body,
            io,
            &self.stream_options_refused,
        )
        .await
    }
}

/// The calls made in this turn, by tool and canonical arguments, with what each returned.
#[derive(Debug, Default)]
struct CallsMade {
    outputs: HashMap<(String, String), String>,
    repeats: usize,
}

impl CallsMade {
    fn key(call: &PendingCall) -> (String, String) {
        let args: Value = serde_json::from_str(&call.arguments)
            .unwrap_or_else(|_| Value::String(call.arguments.clone()));
        (call.name.clone(), args.to_string())
    }
}
