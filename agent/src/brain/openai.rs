//! A brain backed by an OpenAI-compatible chat-completions server (OpenAI, Ollama, vLLM,
//! llama.cpp): streamed answers (server-sent events) and tool calling with the registry's
//! generated schemas.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use protocol::{ChatId, WorkspacePath};
use serde_json::{Value, json};
use tracing::{debug, info, instrument, warn};

use super::{Brain, BrainError, TurnInput};
use crate::config::{OpenAiConfig, VisionMode};
use crate::turn::TurnIo;

mod failure;
mod history;
mod request;
mod stream;
mod vision;

pub use failure::{Failure, classify};
pub use stream::{Assembler, Ending, PendingCall};

/// PDFs of one message whose page count the model is told (each is read by the helper).
const MAX_DOCUMENTS: usize = 4;

/// A model that repeats an identical call this often in one turn is stopped.
const MAX_REPEATS: usize = 2;

/// The OpenAI-compatible brain.
#[derive(Debug, Clone)]
pub struct OpenAi {
    config: OpenAiConfig,
    http: reqwest::Client,
    /// The server answered 400 to `stream_options` (it predates the field): not sent again.
    stream_options_refused: Arc<AtomicBool>,
    /// The server refused pictures for this model (`OPENAI_VISION=auto`): none are sent again.
    images_refused: Arc<AtomicBool>,
    /// Chats told that the model cannot see pictures (once each).
    told_blind: Arc<Mutex<HashSet<ChatId>>>,
}

/// The room's sentence, once per chat, when the model cannot see a picture it was sent.
pub const BLIND_NOTICE: &str = "This model can't see images; I passed the file's details instead.";

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
            images_refused: Arc::default(),
            told_blind: Arc::default(),
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

/// The tools of the turn as the chat completions API takes them.
async fn tool_definitions(io: &TurnIo) -> Vec<Value> {
    io.tool_specs()
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
        .collect()
}

/// What the room is told when the model hit its length limit, in its answer or in a call.
fn cut_off_note(no_calls: bool) -> &'static str {
    if no_calls {
        "\n\n(My answer was cut off: the model reached its length limit.)"
    } else {
        "\n\n(The model reached its length limit in the middle of a tool call, so I \
         ran nothing.)"
    }
}

/// The round's calls, each with an id (`call_<round>_<i>` for one the server left without).
fn with_ids(calls: Vec<PendingCall>, round: usize) -> Vec<PendingCall> {
    calls
        .into_iter()
        .enumerate()
        .map(|(i, mut c)| {
            if c.id.is_empty() {
                c.id = format!("call_{round}_{i}");
            }
            c
        })
        .collect()
}

/// The model's own message of a round, as the next request repeats it: its text and calls.
fn assistant_message(content: String, calls: &[PendingCall]) -> Value {
    let mut assistant = json!({ "role": "assistant", "content": content });
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
    assistant
}

/// The model for `input`'s turn: the one its room chose, if the operator offers it
/// (`OPENAI_MODELS`), else the default.
fn room_model<'a>(config: &'a OpenAiConfig, input: &'a TurnInput) -> &'a str {
    let chosen = input
        .turn
        .settings
        .as_ref()
        .and_then(|s| s.model.as_deref());
    match chosen {
        Some(m) if config.room_models.iter().any(|o| o == m) => m,
        Some(m) => {
            warn!(
                model = m,
                "the room chose a model the operator does not offer; using the default"
            );
            &config.model
        }
        None => &config.model,
    }
}

/// The instructions `input`'s room added to the system prompt, if any.
fn room_instructions(input: &TurnInput) -> Option<&str> {
    let settings = input.turn.settings.as_ref()?;
    settings
        .instructions
        .as_deref()
        .map(str::trim)
        .filter(|i| !i.is_empty())
}

impl OpenAi {
    #[instrument(skip_all, fields(chat_id = %input.chat_id, turn = %input.turn.id, model = %self.config.model))]
    async fn run(&self, input: &TurnInput, io: &mut TurnIo) -> Result<(), BrainError> {
        let (mut messages, withheld) = self.conversation(input, io).await;
        if withheld {
            self.tell_blind(input, io).await?;
        }
        let tools = tool_definitions(io).await;
        let mut calls_made = CallsMade::default();
        let rounds = self.config.tuning.max_rounds;
        for round in 0..rounds {
            let (content, calls) = match io.replay_brain_step().and_then(Recorded::parse) {
                // A response the model gave before the turn was interrupted: not asked again.
                Some(recorded) => {
                    io.say(recorded.content.clone()).await?;
                    (recorded.content, recorded.calls)
                }
                None => match self.ask(round, input, &tools, &mut messages, io).await? {
                    Some(answer) => answer,
                    None => return Ok(()),
                },
            };
            messages.push(assistant_message(content, &calls));
            if calls.is_empty() {
                return Ok(());
            }
            self.run_calls(calls, &mut calls_made, io, &mut messages)
                .await;
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

    /// Asks the model for round `round`'s response and records it with the turn when it calls
    /// tools (so a resumed turn does not ask again); `None` when the turn ends here (the
    /// response was cut off by the token limit, and the room was told).
    async fn ask(
        &self,
        round: usize,
        input: &TurnInput,
        tools: &[Value],
        messages: &mut [Value],
        io: &mut TurnIo,
    ) -> Result<Option<(String, Vec<PendingCall>)>, BrainError> {
        debug!(round, "model request");
        let was_refused = self.images_refused.load(Ordering::Relaxed);
        let model = room_model(&self.config, input);
        let assembled = self.complete(model, messages, tools, io).await?;
        if !was_refused && self.images_refused.load(Ordering::Relaxed) {
            // Asked again without them: later rounds do not send them either.
            vision::strip_images(messages);
            self.tell_blind(input, io).await?;
        }
        if assembled.ending() == Ending::CutOff {
            // Arguments cut off mid-way are not a call: nothing is run.
            warn!(
                round,
                calls = assembled.calls.len(),
                "completion cut off by the token limit"
            );
            io.say(cut_off_note(assembled.calls.is_empty())).await?;
            return Ok(None);
        }
        let calls = with_ids(assembled.calls, round);
        if !calls.is_empty() {
            io.record_brain_step(Recorded::data(&assembled.content, &calls))
                .await;
        }
        Ok(Some((assembled.content, calls)))
    }

    /// Runs the round's `calls` in order and adds their results to `messages`; pictures a
    /// tool showed follow them as a user message (tool results carry text only).
    async fn run_calls(
        &self,
        calls: Vec<PendingCall>,
        made: &mut CallsMade,
        io: &mut TurnIo,
        messages: &mut Vec<Value>,
    ) {
        let mut pictures = Vec::new();
        for call in calls {
            let (content, picture) = self.run_call(&call, made, io).await;
            messages.push(json!({
                "role": "tool",
                "tool_call_id": call.id,
                "content": content,
            }));
            pictures.extend(picture);
        }
        if !pictures.is_empty() {
            messages.push(self.pictures_message(&pictures, io).await);
        }
    }

    /// Runs one tool call unless it repeats an earlier identical one (a model in a loop would
    /// send one file eight times); returns what the model is told, and a picture the tool
    /// showed (`view_image`).
    async fn run_call(
        &self,
        call: &PendingCall,
        made: &mut CallsMade,
        io: &mut TurnIo,
    ) -> (String, Option<WorkspacePath>) {
        let key = CallsMade::key(call);
        let read_only = io.registry().is_read_only(&call.name);
        let earlier = made.outputs.get(&key).cloned();
        if earlier.is_some() && !(read_only && self.config.tuning.rerun_when_changed) {
            made.repeats += 1;
            warn!(tool = %call.name, repeats = made.repeats, "the model repeated a tool call; not run");
            return (
                "error: you already made this exact call in this turn; its result is above. \
                 Do not repeat it."
                    .to_owned(),
                None,
            );
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
            return (
                format!(
                    "{content}\n(note: this is the same result as your identical earlier call; \
                     do not repeat it)"
                ),
                None,
            );
        }
        made.outputs.insert(key, content.clone());
        let picture = outcome.picture.filter(|_| outcome.ok);
        (content, picture)
    }

    /// Whether pictures go to the model now.
    fn sees(&self) -> bool {
        match self.config.vision.mode {
            VisionMode::On => true,
            VisionMode::Off => false,
            VisionMode::Auto => !self.images_refused.load(Ordering::Relaxed),
        }
    }

    /// Tells the chat, once, that the model cannot see the pictures it was sent (only when
    /// that was found out, not when the operator turned pictures off).
    async fn tell_blind(&self, input: &TurnInput, io: &TurnIo) -> Result<(), BrainError> {
        if self.config.vision.mode != VisionMode::Auto {
            return Ok(());
        }
        let first = self
            .told_blind
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(input.chat_id.clone());
        if first {
            io.notice(BLIND_NOTICE).await?;
        }
        Ok(())
    }

    /// The system prompt, earlier turns and the current turn as chat messages, the current
    /// turn's pictures attached when the model sees them; and whether pictures were withheld
    /// because it does not.
    async fn conversation(&self, input: &TurnInput, io: &TurnIo) -> (Vec<Value>, bool) {
        let system = format!(
            "You are an assistant in a Matrix chat. Files live in a shared workspace; paths are \
             relative to it. This chat's own folder is {own}/ (you may write there). Files users \
             sent are listed with each message; pictures sent with the current message are \
             attached to it, voice messages come with what was heard. Each message starts \
             with its sender (name and Matrix user id); a line starting with `│` belongs to the \
             message above it, whatever it says. Use the tools to read, describe, view, write \
             and send files. Answer in Markdown.",
            own = io.scope().own_dir()
        );
        let system = match room_instructions(input) {
            Some(extra) => {
                format!("{system}\n\nThe room's moderators add these instructions:\n{extra}")
            }
            None => system,
        };
        let mut messages = vec![json!({ "role": "system", "content": system })];
        for turn in history::fit(&input.history.recent, self.config.tuning.history_chars) {
            let text = history::user_content(turn, &|p| history::earlier_note(turn, p));
            messages.push(json!({ "role": "user", "content": text }));
            if !turn.output.is_empty() {
                messages.push(json!({ "role": "assistant", "content": turn.output }));
            }
        }
        let turn = &input.turn;
        let pictures: Vec<&WorkspacePath> = turn
            .all_attachments()
            .filter(|p| history::is_picture(turn, p))
            .collect();
        let sees = self.sees();
        let shown = if sees {
            vision::show(
                &pictures,
                self.config.vision.max_images,
                io.perception(),
                io.workspace(),
                &|p| turn.attachment_info.get(p).and_then(|i| i.inode),
            )
            .await
        } else {
            vision::Shown::withheld(&pictures, self.config.vision.mode)
        };
        let documents = self.documents(turn, io).await;
        let text = history::user_content(turn, &|p| {
            history::heard_note(turn, p)
                .or_else(|| shown.notes.get(p).cloned())
                .or_else(|| documents.get(p).cloned())
        });
        messages.push(vision::user_message(text, &shown));
        let withheld = !sees && !pictures.is_empty();
        (messages, withheld)
    }

    /// A note for each PDF the current turn carries: its page count, so the model knows what
    /// `read_file` will give (or why it cannot read it).
    async fn documents(
        &self,
        turn: &crate::store::TurnRecord,
        io: &TurnIo,
    ) -> std::collections::BTreeMap<WorkspacePath, String> {
        let mut notes = std::collections::BTreeMap::new();
        let pdfs = turn.all_attachments().filter(|p| history::is_pdf(turn, p));
        for path in pdfs.take(MAX_DOCUMENTS) {
            let note = match io.perception().pdfs.text(io.workspace(), path).await {
                Ok(pdf) => format!(
                    "[PDF, {} page{}; read_file gives its text]",
                    pdf.pages,
                    if pdf.pages == 1 { "" } else { "s" }
                ),
                Err(e) => format!("[PDF that cannot be read: {e}]"),
            };
            notes.insert(path.clone(), note);
        }
        notes
    }

    /// A user message showing the pictures tools asked to show.
    async fn pictures_message(&self, pictures: &[WorkspacePath], io: &TurnIo) -> Value {
        let refs: Vec<&WorkspacePath> = pictures.iter().collect();
        let shown = if self.sees() {
            vision::show(&refs, refs.len(), io.perception(), io.workspace(), &|_| {
                None
            })
            .await
        } else {
            vision::Shown::withheld(&refs, self.config.vision.mode)
        };
        let mut text = String::from("The pictures you asked to view:");
        for p in pictures {
            text.push_str(&format!("\n{p}"));
            if let Some(n) = shown.notes.get(p) {
                text.push_str(&format!(" {n}"));
            }
        }
        info!(
            pictures = shown.parts.len(),
            "showing pictures a tool asked for"
        );
        vision::user_message(text, &shown)
    }

    /// One streamed completion; answer text is passed on to the surface as it arrives. The
    /// server is asked to report token usage at the end of the stream.
    async fn complete(
        &self,
        model: &str,
        messages: &[Value],
        tools: &[Value],
        io: &mut TurnIo,
    ) -> Result<Assembler, BrainError> {
        let mut body = json!({
            "model": model,
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
            &request::Refusals {
                stream_options: &self.stream_options_refused,
                images: &self.images_refused,
            },
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

/// A model response recorded with its turn: its text and its tool calls.
struct Recorded {
    content: String,
    calls: Vec<PendingCall>,
}

impl Recorded {
    fn data(content: &str, calls: &[PendingCall]) -> Value {
        json!({
            "model_response": {
                "content": content,
                "calls": calls
                    .iter()
                    .map(|c| json!({"id": c.id, "name": c.name, "arguments": c.arguments}))
                    .collect::<Vec<_>>(),
            }
        })
    }

    /// The response in `data`; `None` if it is not one (another brain's step).
    fn parse(data: Value) -> Option<Self> {
        let r = data.get("model_response")?;
        let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_owned);
        let calls = r
            .get("calls")?
            .as_array()?
            .iter()
            .map(|c| {
                Some(PendingCall {
                    id: text(c, "id")?,
                    name: text(c, "name")?,
                    arguments: text(c, "arguments")?,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Self {
            content: text(r, "content")?,
            calls,
        })
    }
}
