//! One streamed chat completion, decoded as real servers send it: OpenAI's mid-stream
//! `{"error": …}` chunks, `"tool_calls": null`, Ollama's `index: 0` for every parallel call,
//! function names repeated in every delta, and `finish_reason` (a completion cut off by the
//! token limit is not a finished one). The SSE framing itself is `eventsource-stream`'s.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::Value;

use crate::brain::BrainError;

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
    #[serde(default)]
    error: Option<Value>,
    /// Sent by servers asked for it (`stream_options.include_usage`), in a last chunk with no
    /// choices.
    #[serde(default)]
    usage: Option<Usage>,
    /// llama.cpp's own statistics, in the last chunk even when usage was not asked for.
    #[serde(default)]
    timings: Option<Timings>,
}

#[derive(Debug, Deserialize)]
struct Timings {
    /// Prompt tokens evaluated now.
    #[serde(default)]
    prompt_n: u64,
    /// Prompt tokens taken from the cache.
    #[serde(default)]
    cache_n: u64,
    /// Tokens generated.
    #[serde(default)]
    predicted_n: u64,
}

#[derive(Debug, Deserialize)]
struct Usage {
    #[serde(default)]
    prompt_tokens: u64,
    #[serde(default)]
    completion_tokens: u64,
}

#[derive(Debug, Deserialize)]
struct Choice {
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCallDelta>>,
}

#[derive(Debug, Deserialize)]
struct ToolCallDelta {
    #[serde(default)]
    index: Option<usize>,
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

/// How a completion ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The model finished (`stop`, `tool_calls`, or `[DONE]` after content).
    Finished,
    /// Cut off by the token limit (`finish_reason: "length"`): tool calls in it are incomplete.
    CutOff,
    /// The stream ended with neither a `finish_reason` nor `[DONE]`: the connection broke.
    Broken,
}

/// Accumulates one streamed completion.
#[derive(Debug, Default)]
pub struct Assembler {
    /// The answer text so far.
    pub content: String,
    /// Tool calls, in the order they started.
    pub calls: Vec<PendingCall>,
    /// Which call the server's `index` currently means.
    slot_of_index: HashMap<usize, usize>,
    /// The last `finish_reason` seen.
    pub finish_reason: Option<String>,
    /// `[DONE]` was seen.
    pub done: bool,
    /// Prompt and completion tokens, when the server reported them.
    pub usage: Option<(u64, u64)>,
    /// The same from llama.cpp's `timings`, for servers that report no usage.
    timings: Option<(u64, u64)>,
}

impl Assembler {
    /// Feeds one SSE `data` payload; returns new answer text to show, if any. A mid-stream
    /// error chunk or a payload that is not a chunk is an error.
    pub fn feed(&mut self, data: &str) -> Result<Option<String>, BrainError> {
        let data = data.trim();
        if data.is_empty() {
            return Ok(None);
        }
        if data == "[DONE]" {
            self.done = true;
            return Ok(None);
        }
        let chunk: Chunk = serde_json::from_str(data)
            .map_err(|e| BrainError::Model(format!("unexpected stream chunk: {e}")))?;
        if let Some(error) = chunk.error {
            return Err(BrainError::Model(format!(
                "the model server reported an error mid-answer: {}",
                error_message(&error)
            )));
        }
        if let Some(u) = chunk.usage {
            self.usage = Some((u.prompt_tokens, u.completion_tokens));
        }
        if let Some(t) = chunk.timings {
            self.timings = Some((t.cache_n.saturating_add(t.prompt_n), t.predicted_n));
        }
        let mut text = None;
        for choice in chunk.choices {
            if let Some(delta) = choice.delta {
                if let Some(c) = delta.content.filter(|c| !c.is_empty()) {
                    self.content.push_str(&c);
                    text = Some(text.map_or(c.clone(), |t: String| t + &c));
                }
                for call in delta.tool_calls.unwrap_or_default() {
                    self.add(call);
                }
            }
            if let Some(reason) = choice.finish_reason {
                self.finish_reason = Some(reason);
            }
        }
        Ok(text)
    }

    /// Prompt and completion tokens: the server's usage report, else llama.cpp's timings.
    pub fn tokens(&self) -> Option<(u64, u64)> {
        self.usage.or(self.timings)
    }

    /// How the completion ended, once the stream is over.
    pub fn ending(&self) -> Ending {
        match self.finish_reason.as_deref() {
            Some("length") => Ending::CutOff,
            Some(_) => Ending::Finished,
            None if self.done => Ending::Finished,
            None => Ending::Broken,
        }
    }

    fn add(&mut self, d: ToolCallDelta) {
        let index = d.index.unwrap_or(0);
        let existing = self.slot_of_index.get(&index).copied();
        // A delta with an id other than its slot's starts a new call (Ollama sends `index: 0`
        // for every parallel call).
        let slot = match (existing, d.id.as_deref()) {
            (Some(s), Some(id)) if !self.calls[s].id.is_empty() && self.calls[s].id != id => None,
            (s, _) => s,
        };
        let slot = slot.unwrap_or_else(|| {
            self.calls.push(PendingCall::default());
            self.calls.len() - 1
        });
        self.slot_of_index.insert(index, slot);
        let call = &mut self.calls[slot];
        if let Some(id) = d.id.filter(|i| !i.is_empty()) {
            call.id = id;
        }
        if let Some(f) = d.function {
            if let Some(name) = f.name.filter(|n| !n.is_empty()) {
                call.name = merge_name(&call.name, &name);
            }
            if let Some(args) = f.arguments {
                call.arguments.push_str(&args);
            }
        }
    }
}

/// The name so far and a new name fragment: servers either split the name across deltas or
/// repeat it whole in every one.
fn merge_name(so_far: &str, fragment: &str) -> String {
    if so_far.is_empty() || fragment.starts_with(so_far) {
        fragment.to_owned()
    } else {
        format!("{so_far}{fragment}")
    }
}

/// The `message` of an OpenAI error object, or the object itself.
pub fn error_message(error: &Value) -> String {
    let text = error
        .get("message")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .unwrap_or_else(|| error.to_string());
    text.chars().take(300).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed_all(chunks: &[&str]) -> (Assembler, String) {
        let mut a = Assembler::default();
        let mut shown = String::new();
        for c in chunks {
            if let Some(t) = a.feed(c).unwrap() {
                shown.push_str(&t);
            }
        }
        (a, shown)
    }

    #[test]
    fn tool_call_deltas_are_joined() {
        let (a, shown) = feed_all(&[
            r#"{"choices":[{"delta":{"content":"Hel"}}]}"#,
            r#"{"choices":[{"delta":{"content":"lo"}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"name":"list_","arguments":""}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":"files","arguments":"{\"di"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"r\":null}"}}]}}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"tool_calls"}]}"#,
        ]);
        assert_eq!(shown, "Hello");
        assert_eq!(
            a.calls,
            [PendingCall {
                id: "c1".into(),
                name: "list_files".into(),
                arguments: r#"{"dir":null}"#.into()
            }]
        );
        assert_eq!(a.ending(), Ending::Finished);
    }

    #[test]
    fn reasoning_usage_and_null_fields_are_tolerated() {
        // vLLM/DeepSeek-style `reasoning_content` is thinking, not answer; a usage-only chunk
        // has no choices; `content: null` and a role-only delta say nothing.
        let (a, shown) = feed_all(&[
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"reasoning_content":"let me think"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"Yes.","reasoning_content":null},"logprobs":null}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"timings":{"predicted_n":3}}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3,"total_tokens":12}}"#,
            "[DONE]",
        ]);
        assert_eq!(shown, "Yes.");
        assert!(a.calls.is_empty());
        assert_eq!(a.ending(), Ending::Finished);
        assert_eq!(a.usage, Some((9, 3)), "the usage-only chunk is counted");
        assert_eq!(a.tokens(), Some((9, 3)), "usage wins over timings");
    }

    #[test]
    fn token_counts_from_usage_or_timings() {
        // The last chunks of llama-server (tests/fixtures/openai/llama-server-samples.txt, B),
        // without and with the usage chunk `include_usage` asks for.
        let finish = r#"{"choices":[{"finish_reason":"length","index":0,"delta":{}}],"object":"chat.completion.chunk","timings":{"cache_n":1421,"prompt_n":69,"prompt_ms":731.546,"predicted_n":12,"predicted_ms":332.152}}"#;
        let usage = r#"{"choices":[],"object":"chat.completion.chunk","usage":{"completion_tokens":12,"prompt_tokens":1490,"total_tokens":1502}}"#;
        type Case<'a> = (&'a [&'a str], Option<(u64, u64)>);
        let cases: &[Case] = &[
            (&[finish, "[DONE]"], Some((1490, 12))),
            (&[finish, usage, "[DONE]"], Some((1490, 12))),
            (&[usage], Some((1490, 12))),
            (
                &[r#"{"choices":[{"delta":{"content":"x"},"finish_reason":"stop"}]}"#],
                None,
            ),
        ];
        for (chunks, want) in cases {
            assert_eq!(feed_all(chunks).0.tokens(), *want, "{chunks:?}");
        }
    }

    #[test]
    fn shapes_other_servers_send() {
        // Ollama: two parallel calls, both `index: 0`, distinct ids.
        let (a, _) = feed_all(&[
            r#"{"choices":[{"delta":{"tool_calls":[{"id":"a","index":0,"function":{"name":"list_files","arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"id":"b","index":0,"function":{"name":"list_files","arguments":"{}"}}]}}]}"#,
        ]);
        let names: Vec<(&str, &str, &str)> = a
            .calls
            .iter()
            .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(
            names,
            [("a", "list_files", "{}"), ("b", "list_files", "{}")]
        );
        assert_eq!(a.ending(), Ending::Broken, "no finish_reason, no [DONE]");
        // The name repeated in every delta.
        let (a, _) = feed_all(&[
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"list_files","arguments":""}}]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"name":"list_files","arguments":"{}"}}]}}]}"#,
            "[DONE]",
        ]);
        assert_eq!(
            (a.calls[0].name.as_str(), a.calls[0].arguments.as_str()),
            ("list_files", "{}")
        );
        // `tool_calls: null` and `content: null`.
        let (a, shown) = feed_all(&[
            r#"{"choices":[{"delta":{"content":"Hello","tool_calls":null}}]}"#,
            r#"{"choices":[{"delta":{"content":null,"tool_calls":null},"finish_reason":"stop"}]}"#,
        ]);
        assert_eq!(
            (shown.as_str(), a.calls.len(), a.ending()),
            ("Hello", 0, Ending::Finished)
        );
        // Cut off by the token limit, no [DONE].
        let (a, _) = feed_all(&[
            r#"{"choices":[{"delta":{"content":"cut"}}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"length"}]}"#,
        ]);
        assert_eq!(a.ending(), Ending::CutOff);
    }

    #[test]
    fn a_mid_stream_error_is_an_error() {
        let mut a = Assembler::default();
        a.feed(r#"{"choices":[{"delta":{"content":"The answer is"}}]}"#)
            .unwrap();
        let e = a
            .feed(r#"{"error":{"message":"The server had an error","type":"server_error"}}"#)
            .unwrap_err();
        assert!(e.to_string().contains("The server had an error"), "{e}");
        assert!(a.feed("not json").is_err());
    }

    #[test]
    fn names() {
        let cases = [
            ("", "list_files", "list_files"),
            ("list_", "files", "list_files"),
            ("list_files", "list_files", "list_files"),
            ("list", "list_files", "list_files"),
        ];
        for (so_far, fragment, expected) in cases {
            assert_eq!(
                merge_name(so_far, fragment),
                expected,
                "{so_far} + {fragment}"
            );
        }
    }
}
