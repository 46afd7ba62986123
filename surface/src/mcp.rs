//! The surface as an MCP server (`SURFACE_MCP_BIND`, off unless set): outside orchestrators
//! read the rooms' messages from the journal — subscribed, or caught up after a watermark they
//! keep — and, when `SURFACE_MCP_SEND` allows, post through the same journaled send path as the
//! agent's answers.
//!
//! Streamable HTTP (rmcp) at `/mcp`, behind a bearer token compared in constant time; browser
//! `Origin`s are refused and, on a loopback bind, so are foreign `Host`s (DNS rebinding). The
//! port is served by the same accept loop as `/healthz` ([`crate::health::serve_router`]): a
//! deadline for every request head, 10 s of life for a connection until it presents the token,
//! caps overall and per address that close the oldest unauthenticated connection first; an
//! authenticated request's body must arrive within [`BODY_DEADLINE`] and fit [`MAX_BODY`];
//! at most [`MAX_SESSIONS`] sessions live at once.
//! `feed` decides what a client sees (pure), `handler` answers a session, `actions` acts in
//! Matrix.

pub mod actions;
pub mod feed;
pub mod handler;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use protocol::Secret;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

use crate::context::Ctx;
use crate::health::{Limits, Trusted};

/// A session with neither a request from its client nor a notification to it for this long is
/// closed (and its subscriptions with it): the clean-up of clients that vanished. Clients that
/// follow quiet rooms ping more often than this, or subscribe again and catch up.
pub const SESSION_IDLE: Duration = Duration::from_secs(10 * 60);
/// Sessions alive at once; a new one beyond this is refused (503) until one ends.
pub const MAX_SESSIONS: usize = 256;
/// How long an authenticated request's body may take to arrive.
pub const BODY_DEADLINE: Duration = Duration::from_secs(30);
/// The largest request body (a JSON-RPC message).
pub const MAX_BODY: usize = 1024 * 1024;

/// The connection limits of the MCP port.
pub fn limits() -> Limits {
    Limits {
        header_read_timeout: Duration::from_secs(5),
        max_lifetime: Duration::from_secs(10),
        max_connections: 256,
        max_per_ip: 32,
    }
}

/// Binds the MCP listener (before login, so a taken port fails the start at once).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves MCP clients on `listener` until shutdown.
pub async fn serve(ctx: Ctx, listener: TcpListener, token: Secret) {
    let addr = listener
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let mut config = StreamableHttpServerConfig::default()
        .with_cancellation_token(ctx.shutdown.child_token())
        .enforce_origin_validation();
    if !addr.ip().is_loopback() {
        // Reached by other hosts under names we cannot know; the token still guards it.
        config = config.disable_allowed_hosts();
    }
    let sessions = Arc::new({
        let mut sessions = LocalSessionManager::default();
        sessions.session_config.keep_alive = Some(SESSION_IDLE);
        sessions
    });
    let service = StreamableHttpService::new(
        {
            let ctx = ctx.clone();
            move || Ok(handler::Session::new(ctx.clone()))
        },
        sessions.clone(),
        config,
    );
    let gate = Arc::new(Gate { token, sessions });
    let app = Router::new()
        .nest_service("/mcp", service)
        .layer(middleware::from_fn_with_state(gate, bearer));
    info!(addr = %addr, "MCP server listening at /mcp");
    if let Err(e) = crate::health::serve_router(listener, app, limits(), ctx.shutdown.clone()).await
    {
        warn!(error = %e, "MCP server stopped");
    }
}

/// What the gate in front of rmcp checks.
struct Gate {
    token: Secret,
    sessions: Arc<LocalSessionManager>,
}

/// Refuses requests without the right bearer token (401, and a log line without the token);
/// then marks the connection trusted, refuses a new session beyond [`MAX_SESSIONS`], and reads
/// the body within [`BODY_DEADLINE`] and [`MAX_BODY`].
async fn bearer(State(gate): State<Arc<Gate>>, req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if gate.token.matches_bearer(given) {
        if let Some(trusted) = req.extensions().get::<Trusted>() {
            trusted.grant();
        }
        let new_session = !req.headers().contains_key("mcp-session-id");
        if new_session && gate.sessions.sessions.read().await.len() >= MAX_SESSIONS {
            warn!(max = MAX_SESSIONS, "MCP session refused: too many sessions");
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::RETRY_AFTER, "60")],
                "too many MCP sessions; try again later\n",
            )
                .into_response();
        }
        let (parts, body) = req.into_parts();
        let bytes =
            match tokio::time::timeout(BODY_DEADLINE, axum::body::to_bytes(body, MAX_BODY)).await {
                Ok(Ok(bytes)) => bytes,
                Ok(Err(_)) => {
                    debug!(
                        max = MAX_BODY,
                        "MCP request refused: body too large or broken"
                    );
                    return (
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "the request body is too large\n",
                    )
                        .into_response();
                }
                Err(_) => {
                    debug!("MCP request refused: its body did not arrive in time");
                    return (
                        StatusCode::REQUEST_TIMEOUT,
                        "the request body came too slowly\n",
                    )
                        .into_response();
                }
            };
        return next
            .run(Request::from_parts(parts, axum::body::Body::from(bytes)))
            .await;
    }
    debug!(
        path = %req.uri().path(),
        with_token = given.is_some(),
        "MCP request refused: wrong or missing bearer token"
    );
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        "a valid bearer token is required\n",
    )
        .into_response()
}
