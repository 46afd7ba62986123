//! The surface as an MCP server (`SURFACE_MCP_BIND`, off unless set): outside orchestrators
//! read the rooms' messages from the journal — subscribed, or caught up after a watermark they
//! keep — and, when `SURFACE_MCP_SEND` allows, post through the same journaled send path as the
//! agent's answers.
//!
//! Streamable HTTP (rmcp) at `/mcp`, behind a bearer token compared in constant time; browser
//! `Origin`s are refused and, on a loopback bind, so are foreign `Host`s (DNS rebinding).
//! `feed` decides what a client sees (pure), `handler` answers a session, `actions` acts in
//! Matrix.

pub mod actions;
pub mod feed;
pub mod handler;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use protocol::Secret;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio::net::TcpListener;
use tracing::{info, warn};

use crate::context::Ctx;

/// A session with neither a request from its client nor a notification to it for this long is
/// closed (and its subscriptions with it): the clean-up of clients that vanished. Clients that
/// follow quiet rooms ping more often than this, or subscribe again and catch up.
pub const SESSION_IDLE: std::time::Duration = std::time::Duration::from_secs(60 * 60);

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
    let service = StreamableHttpService::new(
        {
            let ctx = ctx.clone();
            move || Ok(handler::Session::new(ctx.clone()))
        },
        Arc::new({
            let mut sessions = LocalSessionManager::default();
            sessions.session_config.keep_alive = Some(SESSION_IDLE);
            sessions
        }),
        config,
    );
    let app = Router::new()
        .nest_service("/mcp", service)
        .layer(middleware::from_fn_with_state(Arc::new(token), bearer));
    info!(addr = %addr, "MCP server listening at /mcp");
    let shutdown = ctx.shutdown.clone();
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
    {
        warn!(error = %e, "MCP server stopped");
    }
}

/// Refuses requests without the right bearer token (401, and a log line without the token).
async fn bearer(State(token): State<Arc<Secret>>, req: Request, next: Next) -> Response {
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if token.matches_bearer(given) {
        return next.run(req).await;
    }
    warn!(
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
