//! The HTTP side: routes, authentication before the WebSocket upgrade, and the server's life
//! cycle (`run` until the shutdown token fires, then close every connection).

use std::time::Duration;

use axum::Router;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use protocol::{ChatId, MAX_MESSAGE_BYTES};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

use crate::config::Config;
use crate::session;
use crate::state::{AppState, StateError};

/// How long shutdown waits for connections and turns to wind down.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

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

/// The routes: `GET /healthz` and `GET /v1/agent_ws/{chat_id}/`.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/v1/agent_ws/{chat_id}/", get(agent_ws))
        .with_state(state)
}

/// Serves on `listener` until `shutdown` fires, then closes every connection and returns.
pub async fn run(
    listener: TcpListener,
    config: Config,
    shutdown: CancellationToken,
) -> Result<(), RunError> {
    let tracker = TaskTracker::new();
    let state = AppState::new(config, shutdown.clone(), tracker.clone())?;
    info!(addr = %listener.local_addr()?, "listening");
    axum::serve(listener, app(state))
        .with_graceful_shutdown(shutdown.clone().cancelled_owned())
        .await?;
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

async fn agent_ws(
    State(state): State<AppState>,
    Path(chat_id): Path<String>,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    if !authorized(&headers, state.config.token.expose()) {
        warn!("refused a connection without a valid token");
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            "missing or wrong bearer token",
        )
            .into_response();
    }
    if headers.contains_key(header::ORIGIN) {
        warn!("refused a browser connection (Origin header)");
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
fn authorized(headers: &HeaderMap, token: &str) -> bool {
    let Some(given) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    let given = Sha256::digest(given.trim().as_bytes());
    let expected = Sha256::digest(token.as_bytes());
    given.as_slice().ct_eq(expected.as_slice()).into()
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    #[test]
    fn bearer_checks() {
        let token = "0123456789abcdef";
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
