//! The brain's checks: the builtin brain, an ACP agent's program, an OpenAI-compatible model
//! server (its model list, whether the model sees pictures) and transcription. Pure: what was
//! seen is [`super::observe`]'s.

use super::observe::{ModelsSeen, VisionSeen};
use super::{Finding, Level};
use crate::config::{OpenAiConfig, TranscribeConfig, VisionMode};
use crate::server::without_userinfo;

/// Whether the model sees the pictures it will be sent, as its server says.
pub fn vision(config: &OpenAiConfig, seen: &VisionSeen) -> Finding {
    const CHECK: &str = "vision";
    let model = &config.model;
    let (says, sees) = match seen {
        VisionSeen::LlamaCpp(sees) => ("llama.cpp's /props", *sees),
        VisionSeen::Ollama(sees) => ("Ollama's /api/show", *sees),
        VisionSeen::Unknown => ("", false),
    };
    match (config.vision.mode, seen) {
        (VisionMode::Off, _) => Finding::new(
            Level::Ok,
            CHECK,
            "pictures are not sent to the model (OPENAI_VISION=off); it gets their details",
        ),
        (_, VisionSeen::Unknown) => Finding::new(
            Level::Ok,
            CHECK,
            format!(
                "the server does not say whether {model:?} sees pictures; with \
                 OPENAI_VISION=auto the first refusal turns them off"
            ),
        ),
        (_, _) if sees => Finding::new(
            Level::Ok,
            CHECK,
            format!("{says} says {model:?} sees pictures"),
        ),
        (mode, _) => Finding::new(
            Level::Warn,
            CHECK,
            format!(
                "{says} says {model:?} cannot see pictures: {}; load a multimodal projector \
                 (llama.cpp --mmproj) or a vision model, or set OPENAI_VISION=off",
                if mode == VisionMode::On {
                    "with OPENAI_VISION=on every turn with a picture will fail"
                } else {
                    "the first picture will be refused and the room told"
                }
            ),
        ),
    }
}

/// Whether voice messages are transcribed, and by what.
pub fn transcription(config: Option<&TranscribeConfig>) -> Finding {
    match config {
        None => Finding::new(
            Level::Ok,
            "transcription",
            "off (set TRANSCRIBE_MODEL to transcribe voice messages)",
        ),
        Some(t) => Finding::new(
            Level::Ok,
            "transcription",
            format!(
                "voice messages go to {} with model {:?}",
                without_userinfo(&t.base_url),
                t.model
            ),
        ),
    }
}

/// The builtin brain needs nothing.
pub fn brain_builtin() -> Finding {
    Finding::new(
        Level::Ok,
        "brain",
        "builtin (offline, no model server needed)",
    )
}

/// Whether the ACP agent's program can be run (`found`: where it is).
pub fn brain_acp(program: &str, found: Option<std::path::PathBuf>) -> Finding {
    match found {
        Some(path) => Finding::new(
            Level::Ok,
            "brain",
            format!("acp: {program} is {}", path.display()),
        ),
        None => Finding::new(
            Level::Fail,
            "brain",
            format!(
                "acp: {program} is not an executable file, nor one in PATH; install the agent \
                 or fix AGENT_ACP_COMMAND"
            ),
        ),
    }
}

/// The model server's answer to `GET /models`.
pub fn model_server(config: &OpenAiConfig, seen: &ModelsSeen) -> Finding {
    const CHECK: &str = "model";
    let base = without_userinfo(&config.base_url);
    let model = &config.model;
    match seen {
        ModelsSeen::Listed(ids) if ids.iter().any(|id| id == model) => Finding::new(
            Level::Ok,
            CHECK,
            format!("{base} answers and lists the model {model:?}"),
        ),
        ModelsSeen::Listed(ids) if ids.is_empty() => Finding::new(
            Level::Warn,
            CHECK,
            format!("{base} answers but lists no models; is {model:?} loaded?"),
        ),
        ModelsSeen::Listed(ids) => {
            let shown: Vec<String> = ids.iter().take(5).map(|id| format!("{id:?}")).collect();
            let more = if ids.len() > 5 { ", …" } else { "" };
            Finding::new(
                Level::Warn,
                CHECK,
                format!(
                    "{base} answers, but {model:?} is not among its models ({}{more}); check \
                     OPENAI_MODEL",
                    shown.join(", ")
                ),
            )
        }
        ModelsSeen::Unlisted(why) => Finding::new(
            Level::Warn,
            CHECK,
            format!("{base} answers, but GET /models gave no model list ({why})"),
        ),
        ModelsSeen::Refused { status, said } => {
            let hint = if matches!(status, 401 | 403) {
                " (check OPENAI_API_KEY)"
            } else if *status == 404 {
                " (check that OPENAI_BASE_URL ends in /v1)"
            } else {
                ""
            };
            let said = if said.is_empty() {
                String::new()
            } else {
                format!(": {said}")
            };
            Finding::new(
                Level::Fail,
                CHECK,
                format!("{base}/models answered HTTP {status}{said}{hint}"),
            )
        }
        ModelsSeen::Unreachable(e) => {
            Finding::new(Level::Fail, CHECK, format!("cannot reach {base}: {e}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;

    #[test]
    fn model_servers() {
        let config = OpenAiConfig::new(
            "http://user:pw@llm:8080/v1",
            "qwen",
            Some(Secret::new("sk-secret")),
        );
        let ids = |v: &[&str]| ModelsSeen::Listed(v.iter().map(|s| (*s).to_owned()).collect());
        let cases: Vec<(ModelsSeen, Level, &str)> = vec![
            (
                ids(&["llama", "qwen"]),
                Level::Ok,
                "http://llm:8080/v1 answers and lists the model \"qwen\"",
            ),
            (
                ids(&["llama"]),
                Level::Warn,
                "\"qwen\" is not among its models (\"llama\")",
            ),
            (ids(&[]), Level::Warn, "lists no models"),
            (
                ids(&["a", "b", "c", "d", "e", "f"]),
                Level::Warn,
                "\"e\", …)",
            ),
            (
                ModelsSeen::Unlisted("not JSON".into()),
                Level::Warn,
                "no model list (not JSON)",
            ),
            (
                ModelsSeen::Refused {
                    status: 401,
                    said: "Incorrect API key provided: [redacted]".into(),
                },
                Level::Fail,
                "/models answered HTTP 401: Incorrect API key provided: [redacted] (check \
                 OPENAI_API_KEY)",
            ),
            (
                ModelsSeen::Refused {
                    status: 404,
                    said: String::new(),
                },
                Level::Fail,
                "answered HTTP 404 (check that OPENAI_BASE_URL ends in /v1)",
            ),
            (
                ModelsSeen::Unreachable("connection refused".into()),
                Level::Fail,
                "cannot reach http://llm:8080/v1: connection refused",
            ),
        ];
        for (seen, level, text) in &cases {
            let f = model_server(&config, seen);
            assert_eq!((f.level, f.check), (*level, "model"), "{seen:?}");
            assert!(f.text.contains(text), "{seen:?}: {f}");
            assert!(
                !f.text.contains("pw@") && !f.text.contains("sk-secret"),
                "{f}"
            );
        }
        assert_eq!(brain_builtin().level, Level::Ok);
    }

    #[test]
    fn vision_verdicts() {
        use crate::config::{VisionConfig, VisionMode};
        let config = |mode| {
            let mut c = OpenAiConfig::new("http://127.0.0.1:1/v1", "m", None);
            c.vision = VisionConfig {
                mode,
                ..VisionConfig::default()
            };
            c
        };
        let cases = [
            (
                VisionMode::Auto,
                VisionSeen::LlamaCpp(true),
                Level::Ok,
                "/props says \"m\" sees",
            ),
            (
                VisionMode::Auto,
                VisionSeen::Ollama(true),
                Level::Ok,
                "/api/show says",
            ),
            (
                VisionMode::Auto,
                VisionSeen::LlamaCpp(false),
                Level::Warn,
                "first picture will be refused",
            ),
            (
                VisionMode::On,
                VisionSeen::Ollama(false),
                Level::Warn,
                "every turn with a picture will fail",
            ),
            (
                VisionMode::Auto,
                VisionSeen::Unknown,
                Level::Ok,
                "does not say",
            ),
            (
                VisionMode::Off,
                VisionSeen::LlamaCpp(false),
                Level::Ok,
                "OPENAI_VISION=off",
            ),
        ];
        for (mode, seen, level, words) in cases {
            let f = vision(&config(mode), &seen);
            assert_eq!(f.level, level, "{mode:?} {seen:?}: {f}");
            assert!(f.to_string().contains(words), "{mode:?} {seen:?}: {f}");
        }
    }
}
