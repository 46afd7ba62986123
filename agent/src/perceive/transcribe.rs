//! Speech to text through an OpenAI-compatible `POST /audio/transcriptions` (hosted Whisper
//! APIs, local Whisper servers): the recording is checked against the duration and size
//! bounds before anything is uploaded, streamed from its file (never held in memory whole),
//! and tried again while the server is unreachable, rate limiting or failing.

use std::io::BufReader;
use std::time::Duration;

use backon::Retryable;
use protocol::{AttachmentInfo, WorkspacePath};
use reqwest::multipart::{Form, Part};
use serde_json::Value;
use tokio_util::io::ReaderStream;
use tracing::{info, warn};

use crate::config::TranscribeConfig;
use crate::confine::{ConfineError, ScopedWorkspace};

/// Why a recording was not transcribed. The `Display` text is one sentence for the model and
/// the room (no URL, no key).
#[derive(Debug, thiserror::Error)]
pub enum TranscribeError {
    /// Longer than `TRANSCRIBE_MAX_DURATION`: not uploaded.
    #[error("it is {} long, more than the {} I transcribe", secs(*.length), secs(*.limit))]
    TooLong {
        /// Its length.
        length: Duration,
        /// The bound.
        limit: Duration,
    },
    /// Larger than `TRANSCRIBE_MAX_SIZE`: not uploaded.
    #[error("it is {} bytes, more than the {} I transcribe", .size, .limit)]
    TooLarge {
        /// Its size.
        size: u64,
        /// The bound.
        limit: u64,
    },
    /// The file is out of reach or unreadable.
    #[error("the file could not be read")]
    Unreadable(#[source] ConfineError),
    /// No connection to the transcription server.
    #[error("the transcription server cannot be reached")]
    Unreachable,
    /// No answer in time.
    #[error("the transcription server did not answer within {}", secs(*.0))]
    NoAnswer(Duration),
    /// The server refused or failed, with what it said (shortened).
    #[error("the transcription server answered HTTP {status}: {said}")]
    Server {
        /// The HTTP status.
        status: u16,
        /// Its message.
        said: String,
    },
    /// A success without a transcript.
    #[error("the transcription server's answer had no text")]
    Malformed,
}

impl TranscribeError {
    /// A label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Self::TooLong { .. } => "too_long",
            Self::TooLarge { .. } => "too_large",
            Self::Unreadable(_) => "unreadable",
            Self::Unreachable => "unreachable",
            Self::NoAnswer(_) => "no_answer",
            Self::Server { .. } => "server_error",
            Self::Malformed => "malformed",
        }
    }

    /// Whether trying again may help.
    fn is_passing(&self) -> bool {
        match self {
            Self::Unreachable | Self::NoAnswer(_) => true,
            Self::Server { status, .. } => *status == 429 || *status >= 500,
            _ => false,
        }
    }
}

fn secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 120.0 {
        format!("{:.0} min", s / 60.0)
    } else {
        format!("{s:.1} s")
    }
}

/// Whether an attachment is speech to transcribe: a voice message, or any audio file.
pub fn is_audio(info: &AttachmentInfo) -> bool {
    info.voice || info.mime.starts_with("audio/")
}

/// A transcription client. Cheap to clone.
#[derive(Clone)]
pub struct Transcriber {
    config: TranscribeConfig,
    http: reqwest::Client,
}

impl std::fmt::Debug for Transcriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transcriber")
            .field("config", &self.config)
            .finish()
    }
}

/// A transcript and the recording's length as measured (or declared).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transcript {
    /// The words heard; empty when nothing could be made out.
    pub text: String,
    /// How long the recording plays.
    pub length: Option<Duration>,
    /// Time spent in exchanges with the server (from sending each request to the end of its
    /// answer), all attempts together: the server's share of the wait, not the agent's.
    pub exchange: Duration,
}

impl Transcriber {
    /// A client for the server in `config`.
    pub fn new(config: TranscribeConfig) -> Self {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .user_agent(concat!("mxbridge-agent/", env!("CARGO_PKG_VERSION")))
            .build()
            .unwrap_or_default();
        Self { config, http }
    }

    /// Whether the room is shown what was heard.
    pub fn shows_room(&self) -> bool {
        self.config.show
    }

    /// Transcribes the recording at `path`, whose sender described it as `info`.
    pub async fn transcribe(
        &self,
        ws: &ScopedWorkspace,
        path: &WorkspacePath,
        info: &AttachmentInfo,
    ) -> Result<Transcript, TranscribeError> {
        let (size, measured) = {
            let (ws, path, mime, inode) = (ws.clone(), path.clone(), info.mime.clone(), info.inode);
            tokio::task::spawn_blocking(move || measure(&ws, &path, &mime, inode))
        }
        .await
        .map_err(|e| TranscribeError::Unreadable(super::images::internal(path, e)))??;
        let declared = info.duration_ms.map(Duration::from_millis);
        // The file's own length when it can be read from it; the sender's word otherwise.
        let length = measured.or(declared);
        check_bounds(size, length, &self.config)?;
        let started = std::time::Instant::now();
        let exchange = std::sync::Mutex::new(Duration::ZERO);
        let attempt = || self.once(ws, path, info, size, &exchange);
        let text = attempt
            .retry(
                daemon::backoff(Duration::from_millis(500), Duration::from_secs(8))
                    .with_max_times(self.config.attempts.saturating_sub(1)),
            )
            .when(TranscribeError::is_passing)
            .notify(|e, wait| warn!(%path, error = %e, ?wait, "transcription failed; trying again"))
            .await?;
        info!(
            %path,
            bytes = size,
            length_ms = length.map(|l| l.as_millis() as u64),
            chars = text.chars().count(),
            ms = started.elapsed().as_millis() as u64,
            "recording transcribed"
        );
        let exchange = exchange.into_inner().unwrap_or_else(|e| e.into_inner());
        Ok(Transcript {
            text,
            length,
            exchange,
        })
    }

    /// One upload of the file, streamed from a fresh handle.
    async fn once(
        &self,
        ws: &ScopedWorkspace,
        path: &WorkspacePath,
        info: &AttachmentInfo,
        size: u64,
        spent: &std::sync::Mutex<Duration>,
    ) -> Result<String, TranscribeError> {
        let name = info.name.as_str();
        let opened = {
            let (ws, path, inode) = (ws.clone(), path.clone(), info.inode);
            tokio::task::spawn_blocking(move || ws.open_sent(&path, inode))
        }
        .await
        .map_err(|e| TranscribeError::Unreadable(super::images::internal(path, e)))?
        .map_err(TranscribeError::Unreadable)?;
        let file = tokio::fs::File::from_std(opened.file);
        let body = reqwest::Body::wrap_stream(ReaderStream::with_capacity(file, 64 * 1024));
        let file_name = if name.is_empty() { "audio" } else { name };
        let part = Part::stream_with_length(body, size).file_name(file_name.to_owned());
        let mut form = Form::new()
            .part("file", part)
            .text("model", self.config.model.clone())
            .text("response_format", "json");
        if let Some(language) = &self.config.language {
            form = form.text("language", language.clone());
        }
        if let Some(prompt) = &self.config.prompt {
            form = form.text("prompt", prompt.clone());
        }
        let mut request = self
            .http
            .post(format!("{}/audio/transcriptions", self.config.base_url))
            .multipart(form);
        if let Some(key) = &self.config.api_key {
            request = request.bearer_auth(key.expose());
        }
        let timeout = self.config.timeout;
        let exchange = async {
            let response = request.send().await.map_err(|e| {
                warn!(error = %e.without_url(), "transcription request failed");
                TranscribeError::Unreachable
            })?;
            let status = response.status();
            let text = bounded_text(response).await?;
            Ok::<_, TranscribeError>((status, text))
        };
        let sent = std::time::Instant::now();
        let answer = tokio::time::timeout(timeout, exchange).await;
        *spent.lock().unwrap_or_else(|e| e.into_inner()) += sent.elapsed();
        let (status, text) = answer.map_err(|_| TranscribeError::NoAnswer(timeout))??;
        if !status.is_success() {
            return Err(TranscribeError::Server {
                status: status.as_u16(),
                said: self.redact(&said(&text)),
            });
        }
        transcript_of(&text).ok_or(TranscribeError::Malformed)
    }

    fn redact(&self, said: &str) -> String {
        match &self.config.api_key {
            Some(key) if !key.expose().is_empty() => said.replace(key.expose(), "[redacted]"),
            _ => said.to_owned(),
        }
    }
}

/// Longest answer read from a transcription server (a transcript of the longest recording
/// allowed is far smaller); a longer one is refused, not buffered.
const MAX_ANSWER: usize = 4 * 1024 * 1024;

/// The answer's body as text, read in chunks up to [`MAX_ANSWER`].
async fn bounded_text(mut response: reqwest::Response) -> Result<String, TranscribeError> {
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) if body.len() + chunk.len() <= MAX_ANSWER => {
                body.extend_from_slice(&chunk);
            }
            Ok(Some(_)) => {
                warn!("the transcription server's answer is larger than 4 MiB; refused");
                return Err(TranscribeError::Malformed);
            }
            Ok(None) => return Ok(String::from_utf8_lossy(&body).into_owned()),
            Err(e) => {
                warn!(error = %e.without_url(), "transcription answer broke off");
                return Err(TranscribeError::Unreachable);
            }
        }
    }
}

/// The recording's size and, where its format tells, its length.
fn measure(
    ws: &ScopedWorkspace,
    path: &WorkspacePath,
    mime: &str,
    inode: Option<u64>,
) -> Result<(u64, Option<Duration>), TranscribeError> {
    let opened = ws
        .open_sent(path, inode)
        .map_err(TranscribeError::Unreadable)?;
    let size = opened.size;
    let length = mediainfo::audio_length(BufReader::new(opened.file), mime, size)
        .ok()
        .flatten();
    Ok((size, length))
}

/// Refuses a recording beyond the bounds, before any upload. Pure.
pub fn check_bounds(
    size: u64,
    length: Option<Duration>,
    config: &TranscribeConfig,
) -> Result<(), TranscribeError> {
    if size > config.max_size {
        return Err(TranscribeError::TooLarge {
            size,
            limit: config.max_size,
        });
    }
    match length {
        Some(length) if length > config.max_duration => Err(TranscribeError::TooLong {
            length,
            limit: config.max_duration,
        }),
        _ => Ok(()),
    }
}

/// The text of a transcription answer: OpenAI's JSON (`{"text": …}`), or a plain-text body
/// from a server that ignores `response_format`.
fn transcript_of(body: &str) -> Option<String> {
    match serde_json::from_str::<Value>(body) {
        Ok(v) => v.get("text")?.as_str().map(|t| t.trim().to_owned()),
        Err(_) if !body.trim_start().starts_with(['{', '[', '<']) => Some(body.trim().to_owned()),
        Err(_) => None,
    }
}

/// What an error body says: `error.message` of JSON, else the text, cut to 300 characters.
fn said(body: &str) -> String {
    let message = serde_json::from_str::<Value>(body).ok().and_then(|v| {
        let e = v.get("error")?;
        e.get("message")
            .and_then(Value::as_str)
            .or_else(|| e.as_str())
            .map(str::to_owned)
    });
    message
        .unwrap_or_else(|| body.to_owned())
        .chars()
        .filter(|c| !c.is_control())
        .take(300)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> TranscribeConfig {
        TranscribeConfig {
            base_url: "http://127.0.0.1:1/v1".into(),
            model: "whisper-1".into(),
            api_key: None,
            language: None,
            prompt: None,
            timeout: Duration::from_secs(1),
            attempts: 1,
            max_duration: Duration::from_secs(60),
            max_size: 1000,
            show: true,
        }
    }

    #[test]
    fn bounds() {
        let c = config();
        let s = Duration::from_secs;
        let cases: &[(u64, Option<Duration>, Option<&str>)] = &[
            (1000, Some(s(60)), None),
            (1000, None, None),
            (1001, Some(s(1)), Some("too_large")),
            (10, Some(s(61)), Some("too_long")),
        ];
        for (size, length, want) in cases {
            let got = check_bounds(*size, *length, &c).err().map(|e| e.label());
            assert_eq!(got, *want, "{size} {length:?}");
        }
        assert_eq!(
            check_bounds(10, Some(s(900)), &c).unwrap_err().to_string(),
            "it is 15 min long, more than the 60.0 s I transcribe"
        );
    }

    #[test]
    fn transcripts() {
        let cases: &[(&str, Option<&str>)] = &[
            (r#"{"text":" hello world "}"#, Some("hello world")),
            (r#"{"text":""}"#, Some("")),
            (r#"{"segments":[]}"#, None),
            ("hello world\n", Some("hello world")),
            ("<html>oops</html>", None),
        ];
        for (body, want) in cases {
            assert_eq!(transcript_of(body).as_deref(), *want, "{body}");
        }
    }

    #[test]
    fn error_bodies() {
        assert_eq!(
            said(r#"{"error":{"message":"Invalid file format.","type":"invalid_request_error"}}"#),
            "Invalid file format."
        );
        assert_eq!(said("plain\nfailure"), "plainfailure");
        assert_eq!(said(&"x".repeat(1000)).len(), 300);
    }

    #[test]
    fn passing_errors() {
        let server = |status| TranscribeError::Server {
            status,
            said: String::new(),
        };
        assert!(server(429).is_passing());
        assert!(server(503).is_passing());
        assert!(!server(400).is_passing());
        assert!(TranscribeError::Unreachable.is_passing());
        assert!(!TranscribeError::Malformed.is_passing());
    }
}
