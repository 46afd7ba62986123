//! Streaming media transfers between the homeserver and the workspace.
//!
//! matrix-sdk 0.18's media calls hold whole files in memory (`Media::get_media_content` returns a
//! `Vec<u8>`; `upload` and `send_attachment` keep three to five copies; upstream issue
//! matrix-org/matrix-rust-sdk#1735), so this module talks to the media endpoints directly with the SDK's
//! own HTTP client and access token, in chunks: memory does not grow with file size. Raw
//! requests skip the SDK's retry loop, so rate limits (429) and server errors (5xx) are retried
//! here, with a bound.
//!
//! * [`download_to_inbox`]: authenticated download into a room's inbox, size-limited while
//!   streaming, decrypted (and hash-checked) on the way when end-to-end encrypted,
//!   MIME-sniffed, committed atomically.
//! * [`upload_file`] / [`upload_file_encrypted`]: streaming upload (encrypted on the way in
//!   encrypted rooms), deduplicated by content hash and file version ([`UploadCache`]).
//! * [`prepare_file_message`]: confinement check, upload and the `m.image`/`m.video`/`m.audio`/
//!   `m.file` content for a file the agent asked to send, looking as native as Element's own
//!   (`look`: dimensions, durations, thumbnail and blurhash, voice messages; thumbnails are
//!   uploaded by `small`).
//!
//! The heavy work runs on blocking threads beside the network I/O: an upload's reading,
//! hashing and encryption in `pipe`, a download's hashing, decryption and writing in `spool`
//! (with `writeback` handing the written file to the disk as it goes).

mod cipher;
mod download;
mod kind;
mod look;
mod message;
mod pipe;
mod poster;
mod small;
mod spool;
mod upload;
mod writeback;

use std::time::Duration;

use backon::Retryable;
use matrix_sdk::Client;
use matrix_sdk::reqwest;
use serde::Deserialize;
use url::Url;

use crate::retry;
use crate::workspace::human_size;

pub use download::{
    DownloadError, DownloadFailure, DownloadRequest, Downloaded, download_to_inbox,
};
pub use kind::MediaFields;
pub use message::{Outbound, Posting, SendFileError, SendFileFailure, prepare_file_message};
pub use upload::{UploadCache, UploadError, upload_file, upload_file_encrypted};

/// How long a transfer may go without receiving a single byte before it counts as stalled.
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long to wait for the response headers.
const HEADERS_TIMEOUT: Duration = Duration::from_secs(120);

/// Longest wait a server may impose with `retry_after_ms` / `Retry-After` before we give up.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// Retries after the first attempt of a transfer.
const MAX_RETRIES: usize = 4;

/// Largest error body read from the homeserver.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// Total timeout for a transfer of `bytes`: generous (the SDK client's 30 s default includes the
/// body and would cut large files off); stalls are caught sooner by [`IDLE_TIMEOUT`].
fn transfer_timeout(bytes: u64) -> Duration {
    // At least 64 KiB/s, plus slack for the server to process the request.
    Duration::from_secs(300 + bytes / (64 * 1024))
}

/// Why a request to the homeserver's media API failed.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The client has no access token (not logged in yet, or logged out).
    #[error("the client is not logged in")]
    NotLoggedIn,
    /// 429: too many requests.
    #[error("rate limited by the homeserver")]
    RateLimited {
        /// How long the server asked us to wait.
        retry_after: Option<Duration>,
    },
    /// 5xx.
    #[error("homeserver error (HTTP {status})")]
    Server {
        /// The status code.
        status: u16,
    },
    /// Any other non-success status.
    #[error("HTTP {status}{}: {message}", errcode.as_deref().map(|c| format!(" {c}")).unwrap_or_default())]
    Status {
        /// The status code.
        status: u16,
        /// The Matrix `errcode`, e.g. `M_NOT_FOUND`.
        errcode: Option<String>,
        /// The Matrix `error` text (or the start of the body).
        message: String,
    },
    /// The connection failed or broke.
    #[error("network error: {0}")]
    Network(#[source] reqwest::Error),
    /// No bytes for [`IDLE_TIMEOUT`], or no response headers in time.
    #[error("the transfer stalled")]
    Stalled,
    /// The body ended before the announced length.
    #[error("the transfer was cut short ({got} of {expected} bytes)")]
    Truncated {
        /// Bytes received.
        got: u64,
        /// `Content-Length`.
        expected: u64,
    },
    /// A success response we could not understand.
    #[error("unexpected response: {0}")]
    InvalidResponse(String),
}

impl HttpError {
    /// Whether trying again later can succeed (429, 5xx, network trouble): the decision of
    /// [`crate::retry::verdict`], shared with room events.
    pub fn is_retryable(&self) -> bool {
        retry::verdict(&self.observed()) != retry::Verdict::Permanent
    }

    fn observed(&self) -> retry::Observed {
        use retry::Observed;
        match self {
            Self::RateLimited { retry_after } => Observed::Status {
                status: 429,
                errcode: Some("M_LIMIT_EXCEEDED".into()),
                retry_after: *retry_after,
            },
            Self::Server { status } => Observed::Status {
                status: *status,
                errcode: None,
                retry_after: None,
            },
            Self::Status {
                status, errcode, ..
            } => Observed::Status {
                status: *status,
                errcode: errcode.clone(),
                retry_after: None,
            },
            Self::Stalled | Self::Truncated { .. } => Observed::Network,
            Self::Network(e) if e.is_builder() || e.is_redirect() => Observed::Invalid,
            Self::Network(_) => Observed::Network,
            Self::NotLoggedIn | Self::InvalidResponse(_) => Observed::Invalid,
        }
    }

    /// The wait the server asked for, if any.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::RateLimited { retry_after } => *retry_after,
            _ => None,
        }
    }

    /// The HTTP status, when the server answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::RateLimited { .. } => Some(429),
            Self::Server { status } | Self::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// The Matrix `errcode`, when the server sent one.
    pub fn errcode(&self) -> Option<&str> {
        match self {
            Self::Status { errcode, .. } => errcode.as_deref(),
            _ => None,
        }
    }
}

/// What the raw requests need from the SDK client: its HTTP client, base URL and token.
///
/// The token is kept out of `Debug` output.
#[derive(Clone)]
pub(crate) struct MediaApi {
    http: reqwest::Client,
    homeserver: Url,
    token: String,
}

impl std::fmt::Debug for MediaApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MediaApi")
            .field("homeserver", &self.homeserver.as_str())
            .finish_non_exhaustive()
    }
}

impl MediaApi {
    pub(crate) fn from_client(client: &Client) -> Result<Self, HttpError> {
        Ok(Self {
            http: client.http_client().clone(),
            homeserver: client.homeserver(),
            token: client.access_token().ok_or(HttpError::NotLoggedIn)?,
        })
    }

    #[cfg(test)]
    pub(crate) fn new(http: reqwest::Client, homeserver: Url, token: &str) -> Self {
        Self {
            http,
            homeserver,
            token: token.to_owned(),
        }
    }

    /// `{homeserver}/{segments...}`, each segment percent-encoded as needed.
    fn url(&self, segments: &[&str]) -> Result<Url, HttpError> {
        let mut url = self.homeserver.clone();
        url.path_segments_mut()
            .map_err(|()| HttpError::InvalidResponse("homeserver URL cannot be a base".into()))?
            .pop_if_empty()
            .extend(segments);
        Ok(url)
    }

    fn get(&self, url: Url, timeout: Duration) -> reqwest::RequestBuilder {
        self.http.get(url).bearer_auth(&self.token).timeout(timeout)
    }

    fn post(&self, url: Url, timeout: Duration) -> reqwest::RequestBuilder {
        self.http
            .post(url)
            .bearer_auth(&self.token)
            .timeout(timeout)
    }
}

/// Sends `req`, waiting at most `wait` for the response headers (which, for an upload, come
/// after the whole body), and turns a non-success status into an [`HttpError`].
async fn send(
    req: reqwest::RequestBuilder,
    wait: Duration,
) -> Result<reqwest::Response, HttpError> {
    let resp = tokio::time::timeout(wait, req.send())
        .await
        .map_err(|_| HttpError::Stalled)?
        .map_err(network)?;
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    Err(error_from_response(resp).await)
}

fn network(e: reqwest::Error) -> HttpError {
    if e.is_timeout() {
        HttpError::Stalled
    } else {
        HttpError::Network(e)
    }
}

/// The next chunk of a body, or [`HttpError::Stalled`] after [`IDLE_TIMEOUT`] without one.
async fn next_chunk(resp: &mut reqwest::Response) -> Result<Option<bytes::Bytes>, HttpError> {
    tokio::time::timeout(IDLE_TIMEOUT, resp.chunk())
        .await
        .map_err(|_| HttpError::Stalled)?
        .map_err(network)
}

#[derive(Deserialize)]
struct MatrixError {
    errcode: Option<String>,
    error: Option<String>,
    retry_after_ms: Option<u64>,
}

async fn error_from_response(mut resp: reqwest::Response) -> HttpError {
    let status = resp.status().as_u16();
    let header_retry = resp
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    let mut body = Vec::new();
    while body.len() < MAX_ERROR_BODY {
        match next_chunk(&mut resp).await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk),
            _ => break,
        }
    }
    body.truncate(MAX_ERROR_BODY);
    classify_error(status, header_retry, &body)
}

/// Turns a non-success response into an [`HttpError`] (pure, for tests).
fn classify_error(status: u16, header_retry: Option<Duration>, body: &[u8]) -> HttpError {
    let parsed: Option<MatrixError> = serde_json::from_slice(body).ok();
    let body_retry = parsed
        .as_ref()
        .and_then(|e| e.retry_after_ms)
        .map(Duration::from_millis);
    let errcode = parsed.as_ref().and_then(|e| e.errcode.clone());
    if status == 429 || errcode.as_deref() == Some("M_LIMIT_EXCEEDED") {
        return HttpError::RateLimited {
            retry_after: body_retry.or(header_retry),
        };
    }
    if (500..600).contains(&status) {
        return HttpError::Server { status };
    }
    let message = parsed
        .and_then(|e| e.error)
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned());
    HttpError::Status {
        status,
        errcode,
        message,
    }
}

/// Runs `attempt` until it succeeds, fails permanently, or [`MAX_RETRIES`] retries are spent,
/// waiting with exponential backoff or as long as the server asked (capped).
async fn with_retries<T, E, F, Fut>(what: &str, mut attempt: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: RetryClass + std::fmt::Display,
{
    let backoff = daemon::backoff(Duration::from_millis(500), Duration::from_secs(30))
        .with_max_times(MAX_RETRIES);
    (|| attempt())
        .retry(backoff)
        .when(|e: &E| e.is_retryable())
        .adjust(|e: &E, next| {
            next.map(|d| e.retry_after().map(|r| r.min(MAX_RETRY_AFTER)).unwrap_or(d))
        })
        .notify(|e: &E, wait| {
            tracing::warn!(error = %e, wait = ?wait, "{what} failed, retrying");
        })
        .await
}

/// How the retry loop sees an error.
trait RetryClass {
    fn is_retryable(&self) -> bool;
    fn retry_after(&self) -> Option<Duration>;
}

/// A file name safe to put between backticks in a room message.
fn quoted_name(name: &str) -> String {
    let clean: String = name
        .chars()
        .filter(|c| *c != '`' && !c.is_control())
        .take(120)
        .collect();
    if clean.is_empty() {
        "file".to_owned()
    } else {
        clean
    }
}

#[cfg(test)]
pub(crate) mod test_server;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_errors() {
        let e = classify_error(
            429,
            Some(Duration::from_secs(3)),
            br#"{"errcode":"M_LIMIT_EXCEEDED","retry_after_ms":1500}"#,
        );
        assert_eq!(e.retry_after(), Some(Duration::from_millis(1500)));
        assert!(e.is_retryable());
        let e = classify_error(429, Some(Duration::from_secs(3)), b"busy");
        assert_eq!(e.retry_after(), Some(Duration::from_secs(3)));
        let e = classify_error(502, None, b"<html>");
        assert!(e.is_retryable());
        assert_eq!(e.status(), Some(502));
        let e = classify_error(
            404,
            None,
            br#"{"errcode":"M_NOT_FOUND","error":"Not found"}"#,
        );
        assert!(!e.is_retryable());
        assert_eq!(e.errcode(), Some("M_NOT_FOUND"));
        assert_eq!(e.to_string(), "HTTP 404 M_NOT_FOUND: Not found");
        let e = classify_error(413, None, br#"{"errcode":"M_TOO_LARGE"}"#);
        assert_eq!(e.errcode(), Some("M_TOO_LARGE"));
        assert!(!e.is_retryable());
    }

    #[test]
    fn urls_are_encoded_and_keep_base_path() {
        let api = MediaApi::new(
            reqwest::Client::new(),
            Url::parse("https://hs.example/prefix/").unwrap(),
            "secret",
        );
        let url = api.url(&["_matrix", "media", "a/b?c"]).unwrap();
        assert_eq!(
            url.as_str(),
            "https://hs.example/prefix/_matrix/media/a%2Fb%3Fc"
        );
        assert!(!format!("{api:?}").contains("secret"));
    }

    #[test]
    fn sizes_and_names_for_people() {
        assert_eq!(human_size(100 * 1024 * 1024), "100 MiB");
        assert_eq!(human_size(1536), "1.5 KiB");
        assert_eq!(quoted_name("a`b`.txt"), "ab.txt");
        assert_eq!(quoted_name("``"), "file");
    }
}
