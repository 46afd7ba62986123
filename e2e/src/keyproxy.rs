//! A loopback reverse proxy in front of the homeserver that can hold back Olm-encrypted
//! to-device messages (which carry megolm room keys), so a test can deliver a message whose key
//! reaches the recipient only later.
//!
//! It can also break `/messages` requests for a while, as a homeserver restarting in the
//! middle of a backfill does, and make room sends slow, as a homeserver busy with a burst does.
//! It counts the requests it saw by method and path. Everything else passes unchanged. Bodies are buffered, which is fine for JSON and the small
//! media of tests.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};

/// The only requests the proxy can hold: encrypted to-device messages (room keys, also the
/// Olm session set-up that comes with the first of them).
const HELD_PATH: &str = "/sendToDevice/m.room.encrypted/";

/// Largest request or response body the proxy buffers.
const BODY_LIMIT: usize = 256 << 20;

/// A request kept back in hold mode.
#[derive(Debug)]
struct Held {
    method: Method,
    path_and_query: String,
    headers: HeaderMap,
    body: axum::body::Bytes,
}

#[derive(Debug, Default)]
struct Mode {
    hold: bool,
    held: Vec<Held>,
    /// Until when `/messages` requests break (a homeserver going down mid-backfill).
    fail_messages_until: Option<std::time::Instant>,
    /// `/messages` requests broken so far.
    failed_messages: usize,
    /// How long a room send (`PUT /rooms/{id}/send/...`) is held before it is forwarded.
    send_delay: Duration,
    /// How long a media download (`GET .../media/download/...`) is held before it is forwarded.
    download_delay: Duration,
    /// Every request seen: method and path (without the query).
    seen: Vec<(Method, String)>,
}

#[derive(Debug)]
struct Inner {
    upstream: String,
    http: reqwest::Client,
    mode: Mutex<Mode>,
}

/// The running proxy; stops when dropped.
#[derive(Debug)]
pub struct KeyProxy {
    url: String,
    inner: Arc<Inner>,
    task: tokio::task::JoinHandle<()>,
}

impl KeyProxy {
    /// Starts a proxy on `127.0.0.1:0` forwarding to `upstream` (e.g. `http://127.0.0.1:8008`),
    /// in pass mode.
    pub async fn start(upstream: &str) -> Result<Self> {
        let inner = Arc::new(Inner {
            upstream: upstream.trim_end_matches('/').to_owned(),
            // Long enough for a long-polling sync.
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(300))
                .build()?,
            mode: Mutex::new(Mode::default()),
        });
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { url, inner, task })
    }

    /// The proxy's base URL, to use as a client's homeserver URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// From now on, encrypted to-device messages are answered `200 {}` at once and kept.
    pub fn hold(&self) {
        self.inner.mode.lock().expect("proxy lock").hold = true;
    }

    /// Stops holding new requests; those already held stay held until [`KeyProxy::release`].
    pub fn pass(&self) {
        self.inner.mode.lock().expect("proxy lock").hold = false;
    }

    /// For the next `span`, `/messages` requests (backfill) fail as if the homeserver went
    /// away in the middle of the answer.
    pub fn fail_messages_for(&self, span: Duration) {
        self.inner
            .mode
            .lock()
            .expect("proxy lock")
            .fail_messages_until = Some(std::time::Instant::now() + span);
    }

    /// How many `/messages` requests were broken.
    pub fn failed_messages(&self) -> usize {
        self.inner.mode.lock().expect("proxy lock").failed_messages
    }

    /// From now on, every room send waits `delay` before it reaches the homeserver (zero:
    /// none), as behind a homeserver that is slow to take messages.
    pub fn delay_sends(&self, delay: Duration) {
        self.inner.mode.lock().expect("proxy lock").send_delay = delay;
    }

    /// From now on, every media download waits `delay` before it reaches the homeserver (zero:
    /// none), as a file from a slow server would.
    pub fn delay_downloads(&self, delay: Duration) {
        self.inner.mode.lock().expect("proxy lock").download_delay = delay;
    }

    /// How many `method` requests whose path contains `fragment` the proxy has seen.
    pub fn requests(&self, method: &str, fragment: &str) -> usize {
        let mode = self.inner.mode.lock().expect("proxy lock");
        mode.seen
            .iter()
            .filter(|(m, p)| m.as_str() == method && p.contains(fragment))
            .count()
    }

    /// How many requests are held.
    pub fn held(&self) -> usize {
        self.inner.mode.lock().expect("proxy lock").held.len()
    }

    /// Back to pass mode, then forwards every held request to the homeserver in the order they
    /// came; returns how many. Fails on the first the homeserver does not accept.
    pub async fn release(&self) -> Result<usize> {
        let held = {
            let mut mode = self.inner.mode.lock().expect("proxy lock");
            mode.hold = false;
            std::mem::take(&mut mode.held)
        };
        let n = held.len();
        for h in held {
            let resp = self
                .inner
                .forward(h.method, &h.path_and_query, h.headers, h.body)
                .await
                .with_context(|| format!("release {}", h.path_and_query))?;
            if !resp.status().is_success() {
                let status = resp.status();
                let body = resp.text().await.unwrap_or_default();
                bail!("release {}: {status} {body}", h.path_and_query);
            }
        }
        Ok(n)
    }
}

impl Drop for KeyProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Inner {
    async fn forward(
        &self,
        method: Method,
        path_and_query: &str,
        mut headers: HeaderMap,
        body: axum::body::Bytes,
    ) -> reqwest::Result<reqwest::Response> {
        for h in [
            "host",
            "content-length",
            "connection",
            "keep-alive",
            "transfer-encoding",
            "te",
            "upgrade",
            // Plain bodies from upstream, so the headers passed back stay true.
            "accept-encoding",
        ] {
            headers.remove(h);
        }
        self.http
            .request(method, format!("{}{path_and_query}", self.upstream))
            .headers(headers)
            .body(body)
            .send()
            .await
    }
}

async fn handle(State(inner): State<Arc<Inner>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path_and_query = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_owned(), |p| p.as_str().to_owned());
    let body = match axum::body::to_bytes(body, BODY_LIMIT).await {
        Ok(b) => b,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    if parts.method == Method::GET && parts.uri.path().ends_with("/messages") {
        let mut mode = inner.mode.lock().expect("proxy lock");
        if mode
            .fail_messages_until
            .is_some_and(|t| std::time::Instant::now() < t)
        {
            mode.failed_messages += 1;
            // As a homeserver going down mid-request: the head arrives, then the connection
            // breaks (an HTTP error status would be retried inside matrix-sdk; a broken
            // connection is not, as when the server is gone).
            let broken = futures_util::stream::once(async {
                Err::<axum::body::Bytes, _>(std::io::Error::other("upstream went away"))
            });
            return Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "application/json")
                .body(Body::from_stream(broken))
                .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response());
        }
    }
    let send_delay = {
        let mut mode = inner.mode.lock().expect("proxy lock");
        let path = parts.uri.path().to_owned();
        let room_send = parts.method == Method::PUT && path.contains("/send/");
        let download = parts.method == Method::GET && path.contains("/media/download/");
        mode.seen.push((parts.method.clone(), path));
        if room_send {
            mode.send_delay
        } else if download {
            mode.download_delay
        } else {
            Duration::ZERO
        }
    };
    if !send_delay.is_zero() {
        tokio::time::sleep(send_delay).await;
    }
    if parts.method == Method::PUT && parts.uri.path().contains(HELD_PATH) {
        let mut mode = inner.mode.lock().expect("proxy lock");
        if mode.hold {
            mode.held.push(Held {
                method: parts.method,
                path_and_query,
                headers: parts.headers,
                body,
            });
            return (
                [("content-type", "application/json")],
                axum::body::Bytes::from_static(b"{}"),
            )
                .into_response();
        }
    }
    let resp = match inner
        .forward(parts.method, &path_and_query, parts.headers, body)
        .await
    {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    };
    let status = resp.status();
    let mut headers = resp.headers().clone();
    for h in [
        "content-length",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-encoding",
    ] {
        headers.remove(h);
    }
    match resp.bytes().await {
        Ok(bytes) => {
            let mut out = Response::new(Body::from(bytes));
            *out.status_mut() = status;
            *out.headers_mut() = headers;
            out
        }
        Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    }
}
