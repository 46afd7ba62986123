//! What went wrong with a model request, by class, and the short sentence the room gets for
//! each: the person waiting should learn whether to wait, shorten the message or call the
//! operator. Pure: [`classify`] maps an HTTP status and the server's error body to a class.

use std::time::Duration;

/// A model request that did not produce a usable completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// No connection, or the connection broke before an answer.
    Unreachable,
    /// No response head within the configured time.
    NoAnswer(Duration),
    /// 429 after every retry.
    RateLimited,
    /// 503 (loading, overloaded) after every retry.
    Busy,
    /// The conversation does not fit the model's context window.
    ContextTooLong,
    /// The server does not serve the configured model (or the URL is not an API).
    ModelNotFound,
    /// 401 / 403: the API key is missing, wrong or lacks access.
    KeyRefused(u16),
    /// Another refusal or server error, with what the server said (shortened, key redacted).
    Server {
        /// The HTTP status.
        status: u16,
        /// The server's message.
        said: String,
    },
    /// The server refused the request's pictures (a model without vision).
    ImagesRefused {
        /// The HTTP status.
        status: u16,
        /// The server's message.
        said: String,
    },
    /// The stream went silent for longer than the idle timeout.
    Stalled(Duration),
    /// The stream broke or carried an error after it started.
    Broken(String),
}

impl Failure {
    /// A short label for metrics (one per class).
    pub fn label(&self) -> &'static str {
        match self {
            Self::Unreachable => "unreachable",
            Self::NoAnswer(_) => "no_answer",
            Self::RateLimited => "rate_limited",
            Self::Busy => "busy",
            Self::ContextTooLong => "context_too_long",
            Self::ModelNotFound => "model_not_found",
            Self::KeyRefused(_) => "key_refused",
            Self::Server { .. } => "server_error",
            Self::ImagesRefused { .. } => "images_refused",
            Self::Stalled(_) => "stalled",
            Self::Broken(_) => "broken",
        }
    }

    /// The sentence for the room (and the log). `model` is the configured model name.
    pub fn message(&self, model: &str) -> String {
        match self {
            Self::Unreachable => "the model server cannot be reached".to_owned(),
            Self::NoAnswer(d) => format!("the model server did not answer within {}s", d.as_secs()),
            Self::RateLimited => {
                "the model server is rate limiting requests; try again in a minute".to_owned()
            }
            Self::Busy => {
                "the model server is busy or still loading the model; try again shortly".to_owned()
            }
            Self::ContextTooLong => "the conversation is too long for the model's context \
                                     window; send a shorter message or start a new thread"
                .to_owned(),
            Self::ModelNotFound => format!("the model server has no model named {model:?}"),
            Self::KeyRefused(status) => {
                format!("the model server refused the API key (HTTP {status})")
            }
            Self::Server { status, said } => {
                format!("the model server answered HTTP {status}: {said}")
            }
            Self::ImagesRefused { status, said } => {
                format!("the model server refused the pictures (HTTP {status}): {said}")
            }
            Self::Stalled(d) => format!(
                "the model stopped sending for {}s in the middle of its answer",
                d.as_secs()
            ),
            Self::Broken(why) => format!("the answer stream broke: {why}"),
        }
    }

    /// Whether trying the same request again may help (nothing has been shown yet).
    pub fn is_passing(&self) -> bool {
        matches!(
            self,
            Self::Unreachable | Self::NoAnswer(_) | Self::RateLimited | Self::Busy
        ) || matches!(self, Self::Server { status, .. } if *status >= 500)
    }
}

/// The class of an HTTP answer that is not a success. `body` is the server's error body (JSON
/// or text); `said` is the message extracted from it, shortened and redacted.
pub fn classify(status: u16, body: &str, said: &str) -> Failure {
    let lower = body.to_ascii_lowercase();
    let context_words = [
        "context_length_exceeded",
        "exceed_context_size",
        "maximum context length",
        "context window",
        "context length",
        "too many tokens",
        "prompt is too long",
    ];
    match status {
        429 => Failure::RateLimited,
        503 => Failure::Busy,
        401 | 403 => Failure::KeyRefused(status),
        400 | 413 | 422 if context_words.iter().any(|w| lower.contains(w)) => {
            Failure::ContextTooLong
        }
        400 | 415 | 422 | 500 if refusal_of_images(&lower) => Failure::ImagesRefused {
            status,
            said: said.to_owned(),
        },
        404 => Failure::ModelNotFound,
        400 if lower.contains("model") && lower.contains("not found") => Failure::ModelNotFound,
        _ => Failure::Server {
            status,
            said: said.to_owned(),
        },
    }
}

/// Whether `failure` is a server refusing the request's `stream_options` field (servers
/// older than it validate strictly: vLLM's `extra_forbidden`, proxies' "unknown field").
pub fn refuses_stream_options(failure: &Failure) -> bool {
    matches!(failure, Failure::Server { status: 400 | 422, said }
        if said.to_ascii_lowercase().contains("stream_options"))
}

/// Whether an error body (lowercased) speaks of pictures, vision or multimodal input: how
/// llama.cpp (500, no mmproj), Ollama and vLLM (400, "multimodal") and OpenAI (400,
/// `image_url`) refuse pictures for a model without vision. Recorded bodies:
/// `tests/fixtures/openai/replay/*-vision-*.json`.
fn refusal_of_images(lower: &str) -> bool {
    ["image", "vision", "multimodal", "multi-modal", "mmproj"]
        .iter()
        .any(|w| lower.contains(w))
}

/// Whether `failure` is a server refusing the pictures in a request.
pub fn refuses_images(failure: &Failure) -> bool {
    matches!(failure, Failure::ImagesRefused { .. })
}

/// How long a `Retry-After` header asks to wait (seconds, or an HTTP date), if it is sane.
pub fn retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(when.duration_since(now).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use super::*;

    /// The body of a recorded one-response replay fixture.
    fn fixture(name: &str) -> String {
        let path = format!(
            "{}/tests/fixtures/openai/replay/{name}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).unwrap();
        let list: serde_json::Value = serde_json::from_str(&text).unwrap();
        list[0]["body"].as_str().unwrap().to_owned()
    }

    #[test]
    fn classes() {
        let llama_400 = r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":4133,"n_ctx":4096}}"#;
        let openai_400 = r#"{"error":{"message":"This model's maximum context length is 8192 tokens.","type":"invalid_request_error","code":"context_length_exceeded"}}"#;
        let ollama_404 = r#"{"error":{"message":"model \"llama9\" not found, try pulling it first","type":"api_error"}}"#;
        let images = |status: u16| Failure::ImagesRefused {
            status,
            said: "said".into(),
        };
        let recorded = [
            fixture("f-vision-llamacpp"),
            fixture("g-vision-ollama"),
            fixture("h-vision-vllm"),
            fixture("i-vision-openai"),
        ];
        let cases: &[(u16, &str, Failure)] = &[
            (500, &recorded[0], images(500)),
            (400, &recorded[1], images(400)),
            (400, &recorded[2], images(400)),
            (400, &recorded[3], images(400)),
            (429, "{}", Failure::RateLimited),
            (503, "Loading model", Failure::Busy),
            (401, "{}", Failure::KeyRefused(401)),
            (403, "{}", Failure::KeyRefused(403)),
            (400, llama_400, Failure::ContextTooLong),
            (400, openai_400, Failure::ContextTooLong),
            (404, ollama_404, Failure::ModelNotFound),
            (404, "Not Found", Failure::ModelNotFound),
            (
                400,
                r#"{"error":{"message":"model 'x' not found"}}"#,
                Failure::ModelNotFound,
            ),
            (
                500,
                "boom",
                Failure::Server {
                    status: 500,
                    said: "said".into(),
                },
            ),
            (
                400,
                "bad tool schema",
                Failure::Server {
                    status: 400,
                    said: "said".into(),
                },
            ),
        ];
        for (status, body, want) in cases {
            assert_eq!(&classify(*status, body, "said"), want, "{status} {body}");
        }
    }

    #[test]
    fn passing_failures_are_retried_others_not() {
        let cases = [
            (Failure::Unreachable, true),
            (Failure::NoAnswer(Duration::from_secs(1)), true),
            (Failure::RateLimited, true),
            (Failure::Busy, true),
            (
                Failure::Server {
                    status: 502,
                    said: String::new(),
                },
                true,
            ),
            (
                Failure::Server {
                    status: 400,
                    said: String::new(),
                },
                false,
            ),
            (Failure::ContextTooLong, false),
            (Failure::ModelNotFound, false),
            (Failure::KeyRefused(401), false),
            (Failure::Broken("x".into()), false),
            (Failure::Stalled(Duration::from_secs(1)), false),
        ];
        for (f, want) in cases {
            assert_eq!(f.is_passing(), want, "{f:?}");
        }
    }

    #[test]
    fn every_class_has_its_own_sentence() {
        let all = [
            Failure::Unreachable,
            Failure::NoAnswer(Duration::from_secs(60)),
            Failure::RateLimited,
            Failure::Busy,
            Failure::ContextTooLong,
            Failure::ModelNotFound,
            Failure::KeyRefused(401),
            Failure::Stalled(Duration::from_secs(120)),
        ];
        let texts: std::collections::HashSet<String> =
            all.iter().map(|f| f.message("qwen")).collect();
        assert_eq!(texts.len(), all.len());
        assert!(Failure::ModelNotFound.message("qwen").contains("\"qwen\""));
    }

    #[test]
    fn a_refused_stream_options_field_is_recognized() {
        let server = |status: u16, said: &str| Failure::Server {
            status,
            said: said.into(),
        };
        let cases = [
            (
                server(
                    400,
                    "Unrecognized request argument supplied: stream_options",
                ),
                true,
            ),
            (
                server(
                    422,
                    "[{'type': 'extra_forbidden', 'loc': ('body', 'stream_options')}]",
                ),
                true,
            ),
            (server(400, "bad tool schema"), false),
            (server(500, "stream_options broke me"), false),
            (Failure::ContextTooLong, false),
        ];
        for (failure, want) in cases {
            assert_eq!(refuses_stream_options(&failure), want, "{failure:?}");
        }
    }

    #[test]
    fn retry_after_in_seconds_or_as_a_date() {
        let now = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(retry_after("7", now), Some(Duration::from_secs(7)));
        assert_eq!(
            retry_after(&httpdate::fmt_http_date(now + Duration::from_secs(30)), now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            retry_after(&httpdate::fmt_http_date(now), now + Duration::from_secs(5)),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after("soon", SystemTime::now()), None);
    }
}
