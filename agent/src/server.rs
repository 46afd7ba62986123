//! The HTTP side: routes, authentication before the WebSocket upgrade, and the server's life
//! cycle (`run` until the shutdown token fires, then close every connection). Until a
//! connection has upgraded it is a stranger's: it gets a deadline for its request head and the
//! upgrade, and a place at the [`gate`], which caps how many such connections there are.

mod gate;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use protocol::{ChatId, MAX_MESSAGE_BYTES, Secret};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, instrument, warn};

use self::gate::{Gate, Pending};

use crate::config::{BrainConfig, Config};
use crate::session;
use crate::state::{AppState, StateError};

/// How long shutdown waits for connections and turns to wind down.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// After its deadline, how long a connection that has not upgraded may finish a response
/// already under way before it is dropped.
const LATE_RESPONSE_GRACE: Duration = Duration::from_secs(1);

/// How long accepting pauses after an error such as running out of file descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The agent could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The workspace or the state directory cannot be used.
    #[error(transparent)]
    State(#[from] StateError),
    /// Serving failed.
    #[error("server error: {0}")]
    Serve(#[from] std::io::Error),
}

/// The routes: `GET /healthz`, `GET /metrics` and `GET /v1/agent_ws/{chat_id}/`.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/metrics", get(metrics))
        .route("/v1/agent_ws/{chat_id}/", get(agent_ws))
        .with_state(state)
}

/// `url` without any `user:password@` part (a base URL may carry credentials).
pub(crate) fn without_userinfo(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let host_start = rest.find('@').filter(|at| !rest[..*at].contains('/'));
            format!(
                "{scheme}://{}",
                host_start.map_or(rest, |at| &rest[at + 1..])
            )
        }
        None => url.to_owned(),
    }
}

/// The Prometheus text exposition of this process's metrics.
async fn metrics(State(state): State<AppState>) -> Response {
    if let Some(db) = &state.db {
        db.record_pool_use();
    }
    match &state.metrics {
        Some(handle) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            handle.render(),
        )
            .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// Serves on `listener` until `shutdown` fires, then closes every connection and returns.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: CancellationToken,
) -> Result<(), RunError> {
    let tracker = TaskTracker::new();
    let limits = config.limits.clone();
    let state = AppState::new(config, shutdown.clone(), tracker.clone()).await?;
    let gate = Gate::new(limits.max_pending, limits.max_pending_per_ip);
    let (brain, model, model_server) = match &state.config.brain {
        BrainConfig::Builtin => ("builtin", String::new(), String::new()),
        BrainConfig::OpenAi(o) => ("openai", o.model.clone(), without_userinfo(&o.base_url)),
        BrainConfig::Acp(a) => ("acp", a.program.clone(), String::new()),
    };
    info!(
        version = env!("CARGO_PKG_VERSION"),
        addr = %listener.local_addr()?,
        brain,
        model,
        model_server,
        workspace = %state.config.workspace_root.display(),
        "agent started"
    );
    if state.config.token.is_public_default() {
        warn!(
            var = "AGENT_TOKEN",
            "AGENT_TOKEN is a public default from compose.yaml (dev-only-…): anyone who reads \
             the repository knows it; set your own in .env (e.g. `openssl rand -hex 32`)"
        );
    }
    let router = app(state);
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors, or a connection that died in the backlog: neither stops
                // the server; pausing lets closing connections give descriptors back.
                warn!(error = %e, "accept failed");
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                }
            }
        };
        let pending = match gate.admit(peer.ip()) {
            Ok(pending) => pending,
            Err(refused) => {
                // Dropping the stream closes it at once. Not a warning: an attacker would
                // decide how much the log grows.
                debug!(peer = %peer, reason = %refused, "closed a connection at once");
                continue;
            }
        };
        tracker.spawn(serve_connection(
            stream,
            peer,
            pending,
            router.clone(),
            limits.head_timeout,
            shutdown.clone(),
        ));
    }
    info!("shutting down: closing connections");
    tracker.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, tracker.wait())
        .await
        .is_err()
    {
        warn!("some connections did not close in time");
    }
    info!("stopped");
    Ok(())
}

/// Serves one connection until it upgrades, closes, or misses `head_timeout`. The upgraded
/// WebSocket lives on in its own task (see [`agent_ws`]); `pending` is freed here either way.
#[instrument(skip_all, fields(peer = %peer))]
async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    pending: Pending,
    router: Router,
    head_timeout: Duration,
    shutdown: CancellationToken,
) {
    if let Err(e) = stream.set_nodelay(true) {
        debug!(error = %e, "cannot set TCP_NODELAY");
    }
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(head_timeout)
        .serve_connection(TokioIo::new(stream), TowerToHyperService::new(router))
        .with_upgrades();
    let mut conn = std::pin::pin!(conn);
    // One deadline for everything before the upgrade: hyper's header timer alone does not
    // start until the first byte arrives, and does not cover a slow body or keep-alive.
    tokio::select! {
        done = conn.as_mut() => {
            if let Err(e) = done {
                debug!(error = %e, "connection ended with an error");
            }
            return;
        }
        () = tokio::time::sleep(head_timeout) => {
            debug!("closing a connection that did not upgrade in time");
        }
        () = pending.evicted() => {
            debug!("closed a connection that had not upgraded: a newer one took its place");
            return;
        }
        () = shutdown.cancelled() => {}
    }
    conn.as_mut().graceful_shutdown();
    if tokio::time::timeout(LATE_RESPONSE_GRACE, conn)
        .await
        .is_err()
    {
        debug!("dropped a connection that did not close");
    }
    drop(pending);
}

/// Refused upgrades: one WARN line a minute at most.
static REFUSALS: LogBudget = LogBudget::new(Duration::from_secs(60));

/// At most one log line per `every`; the ones held back are counted and reported with the next.
#[derive(Debug)]
pub struct LogBudget {
    every: Duration,
    state: std::sync::Mutex<(Option<std::time::Instant>, u64)>,
}

impl LogBudget {
    /// A budget of one line per `every`.
    pub const fn new(every: Duration) -> Self {
        Self {
            every,
            state: std::sync::Mutex::new((None, 0)),
        }
    }

    /// At `now`: `Some(held back since the last line)` when a line may be written, else `None`
    /// (and this one is counted).
    pub fn take(&self, now: std::time::Instant) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match s.0 {
            Some(last) if now.duration_since(last) < self.every => {
                s.1 += 1;
                None
            }
            _ => {
                let held = std::mem::take(&mut s.1);
                s.0 = Some(now);
                Some(held)
            }
        }
    }
}

async fn agent_ws(
    State(state): State<AppState>,
    Path(chat_id): Path<String>,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    if !authorized(&headers, &state.config.token) {
        // A stranger must not decide how much the log grows: one line a minute, with a count.
        match REFUSALS.take(std::time::Instant::now()) {
            Some(0) => warn!("refused a connection without a valid token"),
            Some(more) => warn!(
                also_refused = more,
                "refused a connection without a valid token (and others since the last line)"
            ),
            None => debug!("refused a connection without a valid token"),
        }
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "missing or wrong bearer token",
        )
            .into_response();
    }
    if headers.contains_key(header::ORIGIN) {
        match REFUSALS.take(std::time::Instant::now()) {
            Some(_) => warn!("refused a browser connection (Origin header)"),
            None => debug!("refused a browser connection (Origin header)"),
        }
        return (StatusCode::FORBIDDEN, "browser origins are not allowed").into_response();
    }
    let Ok(chat_id) = ChatId::new(chat_id) else {
        return (StatusCode::BAD_REQUEST, "invalid chat id").into_response();
    };
    let upgrade = match upgrade {
        Ok(u) => u,
        Err(rejection) => return rejection.into_response(),
    };
    let tracker = state.tracker.clone();
    upgrade
        .max_message_size(MAX_MESSAGE_BYTES)
        .max_frame_size(MAX_MESSAGE_BYTES)
        .write_buffer_size(64 * 1024)
        .max_write_buffer_size(4 * MAX_MESSAGE_BYTES)
        .on_upgrade(move |socket| async move {
            tracker
                .track_future(session::serve(state, chat_id, socket))
                .await;
        })
}

/// Checks `Authorization: Bearer <token>` in constant time (hashing first hides the length).
fn authorized(headers: &HeaderMap, token: &Secret) -> bool {
    token.matches_bearer(
        headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok()),
    )
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    #[test]
    fn refusals_write_one_line_a_minute_and_count_the_rest() {
        let budget = LogBudget::new(Duration::from_secs(60));
        let t0 = std::time::Instant::now();
        assert_eq!(budget.take(t0), Some(0));
        let held: Vec<Option<u64>> = (1..=1000)
            .map(|i| budget.take(t0 + Duration::from_millis(i)))
            .collect();
        assert!(
            held.iter().all(Option::is_none),
            "1000 refusals in a second: no line"
        );
        assert_eq!(budget.take(t0 + Duration::from_secs(61)), Some(1000));
        assert_eq!(budget.take(t0 + Duration::from_secs(62)), None);
    }

    #[test]
    fn model_server_urls_lose_their_credentials() {
        for (url, shown) in [
            ("http://127.0.0.1:11434/v1", "http://127.0.0.1:11434/v1"),
            (
                "https://user:secret@api.example/v1",
                "https://api.example/v1",
            ),
            ("http://host/v1/a@b", "http://host/v1/a@b"),
        ] {
            assert_eq!(without_userinfo(url), shown);
        }
    }

    #[test]
    fn bearer_checks() {
        let token = &Secret::new("0123456789abcdef");
        let mut h = HeaderMap::new();
        assert!(!authorized(&h, token));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer 0123456789abcdef"),
        );
        assert!(authorized(&h, token));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer 0123456789abcdeF"),
        );
        assert!(!authorized(&h, token));
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Basic 0123456789abcdef"),
        );
        assert!(!authorized(&h, token));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer "));
        assert!(!authorized(&h, token));
    }
}
