//! Readiness as seen from outside: `GET /healthz` answers 200 `{"status":"ok","parked_sends":0}` once the bot
//! is syncing and the agent proved it sees the same workspace, 503 with the reason otherwise.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// What the last agent handshake showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentStatus {
    /// No handshake finished yet.
    Unchecked,
    /// Versions match and both sentinels were found.
    Ok,
    /// The agent is unreachable or refused us.
    Unreachable(String),
    /// The two processes do not see the same workspace.
    WorkspaceMismatch(String),
    /// The agent speaks another protocol version.
    ProtocolMismatch(String),
}

#[derive(Debug)]
struct State_ {
    synced: bool,
    agent: AgentStatus,
    parked_sends: u64,
}

/// Shared health state, updated by the sync loop and the agent links.
#[derive(Debug)]
pub struct Health {
    state: Mutex<State_>,
}

/// The JSON body of `/healthz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// `ok`, `starting`, `agent_unchecked`, `agent_unreachable`, `workspace_mismatch` or
    /// `protocol_mismatch`.
    pub status: &'static str,
    /// Details for a person, when not ok.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Posts the homeserver refused for good (kept in the journal, reported in the room and
    /// the log). Not a failure of the surface itself, so it does not change `status`.
    pub parked_sends: u64,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            state: Mutex::new(State_ {
                synced: false,
                agent: AgentStatus::Unchecked,
                parked_sends: 0,
            }),
        }
    }
}

impl Health {
    fn lock(&self) -> std::sync::MutexGuard<'_, State_> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A sync with the homeserver succeeded.
    pub fn set_synced(&self) {
        self.lock().synced = true;
    }

    /// Records the outcome of an agent handshake. A workspace or protocol mismatch sticks until
    /// a later handshake succeeds: an unreachable agent does not hide it.
    pub fn set_agent(&self, status: AgentStatus) {
        let mut s = self.lock();
        let sticky = matches!(
            s.agent,
            AgentStatus::WorkspaceMismatch(_) | AgentStatus::ProtocolMismatch(_)
        );
        // Once the workspace proof passed, a dropped connection (an agent restart) does not
        // make the surface unhealthy: restarting the surface would not help, and the links
        // reconnect on their own.
        let proven = s.agent == AgentStatus::Ok;
        if (sticky || proven) && matches!(status, AgentStatus::Unreachable(_)) {
            return;
        }
        s.agent = status;
    }

    /// The current status.
    /// How many posts are parked (see [`crate::send`]).
    pub fn set_parked_sends(&self, n: u64) {
        self.lock().parked_sends = n;
    }

    pub fn report(&self) -> Report {
        let s = self.lock();
        let (status, detail) = match (&s.agent, s.synced) {
            (AgentStatus::WorkspaceMismatch(d), _) => ("workspace_mismatch", Some(d.clone())),
            (AgentStatus::ProtocolMismatch(d), _) => ("protocol_mismatch", Some(d.clone())),
            (_, false) => (
                "starting",
                Some("not synced with the homeserver yet".into()),
            ),
            (AgentStatus::Unchecked, true) => ("agent_unchecked", None),
            (AgentStatus::Unreachable(d), true) => ("agent_unreachable", Some(d.clone())),
            (AgentStatus::Ok, true) => ("ok", None),
        };
        Report {
            status,
            detail,
            parked_sends: s.parked_sends,
        }
    }
}

async fn healthz(State(health): State<Arc<Health>>) -> (StatusCode, Json<Report>) {
    let report = health.report();
    let code = if report.status == "ok" {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(report))
}

/// The health router.
pub fn app(health: Arc<Health>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .with_state(health)
}

/// Binds `addr` (logging the bound address).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let listener = TcpListener::bind(addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "health endpoint listening");
    Ok(listener)
}

/// Serves `/healthz` on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    health: Arc<Health>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, app(health))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_progression() {
        let h = Health::default();
        assert_eq!(h.report().status, "starting");
        h.set_synced();
        assert_eq!(h.report().status, "agent_unchecked");
        h.set_agent(AgentStatus::Unreachable("refused".into()));
        assert_eq!(h.report().status, "agent_unreachable");
        h.set_agent(AgentStatus::Ok);
        assert_eq!(h.report().status, "ok");
        h.set_agent(AgentStatus::WorkspaceMismatch("sentinel not found".into()));
        assert_eq!(h.report().status, "workspace_mismatch");
        h.set_agent(AgentStatus::Unreachable("refused".into()));
        assert_eq!(
            h.report().status,
            "workspace_mismatch",
            "mismatch is sticky"
        );
        h.set_agent(AgentStatus::Ok);
        assert_eq!(h.report().status, "ok");
        h.set_agent(AgentStatus::Unreachable("agent restarting".into()));
        assert_eq!(h.report().status, "ok", "a proven agent may restart");
        assert_eq!(
            serde_json::to_string(&h.report()).unwrap(),
            r#"{"status":"ok","parked_sends":0}"#
        );
        h.set_parked_sends(2);
        assert_eq!(
            h.report().status,
            "ok",
            "a refused post is not the surface's fault"
        );
        assert_eq!(h.report().parked_sends, 2);
    }
}
