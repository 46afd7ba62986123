//! Readiness and liveness as seen from outside. `GET /healthz` (readiness) answers 200
//! `{"status":"ok","parked_sends":0}` while the bot is syncing and an agent link is usable now
//! (handshake good: version, token and the shared workspace proven), 503 with the reason
//! otherwise; an agent that was fine and went away makes it 503 again. `GET /livez` (liveness)
//! answers 200 while the process serves at all: an unreachable agent or homeserver must not get
//! the surface restarted, which would not bring them back.
//!
//! The endpoint is served by its own accept loop rather than `axum::serve`, because a probe
//! must keep answering while someone holds sockets open against it: every connection has a
//! deadline for its request head (hyper's `header_read_timeout`, which also closes a
//! keep-alive connection that sits idle between requests) and a total lifetime, and the
//! number of connections is capped overall and per peer IP. At a cap the *oldest* connection
//! is closed to make room, never the new one: a probe finishes in milliseconds, so the oldest
//! connections are the silent ones, and refusing newcomers instead would let 300 idle sockets
//! from the same host (where the compose healthcheck also comes from) lock the probe out
//! until their deadlines ran out.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use serde::Serialize;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

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

impl AgentStatus {
    /// The two processes do not fit together (workspace or protocol).
    pub fn is_mismatch(&self) -> bool {
        matches!(self, Self::WorkspaceMismatch(_) | Self::ProtocolMismatch(_))
    }
}

#[derive(Debug)]
struct State_ {
    synced: bool,
    last_sync: Option<std::time::Instant>,
    /// What the last observation of each agent (by URL) showed.
    agents: BTreeMap<String, AgentStatus>,
    parked_sends: u64,
    /// The models a room may choose, as the last agent handshake said.
    agent_models: Option<Vec<String>>,
    /// Logged out for good: the status word and what the operator can do.
    logged_out: Option<(&'static str, &'static str)>,
}

impl State_ {
    /// All agents together, for the report: a mismatch anywhere first (a misconfiguration,
    /// not weather), then one usable is enough, then unreachable.
    fn agent(&self) -> AgentStatus {
        let all = || self.agents.values();
        let mismatch = all().find(|s| s.is_mismatch());
        let ok = || all().find(|s| **s == AgentStatus::Ok);
        let unreachable = || all().find(|s| matches!(s, AgentStatus::Unreachable(_)));
        mismatch
            .or_else(ok)
            .or_else(unreachable)
            .cloned()
            .unwrap_or(AgentStatus::Unchecked)
    }

    /// Whether some agent link is usable now.
    fn usable(&self) -> bool {
        self.agents.values().any(|s| *s == AgentStatus::Ok)
    }

    fn mismatched(&self) -> bool {
        self.agents.values().any(AgentStatus::is_mismatch)
    }
}

/// Renders `/metrics` (the text exposition format).
pub type MetricsRenderer = Arc<dyn Fn() -> String + Send + Sync>;

/// Shared health state, updated by the sync loop and the agent links.
pub struct Health {
    state: Mutex<State_>,
    metrics: std::sync::OnceLock<MetricsRenderer>,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("state", &self.state)
            .field("metrics", &self.metrics.get().is_some())
            .finish()
    }
}

/// What the metrics take from the health state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// When the last sync succeeded.
    pub last_sync: Option<std::time::Instant>,
    /// An agent link is usable now.
    pub agent_up: bool,
    /// No workspace (or protocol) mismatch.
    pub workspace_ok: bool,
    /// Parked posts.
    pub parked_sends: u64,
}

/// The JSON body of `/healthz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// `ok`, `starting`, `agent_unchecked`, `agent_unreachable`, `workspace_mismatch`,
    /// `protocol_mismatch`, or why the bot is logged out (`soft_logout`, `refresh_refused`,
    /// `logged_out`, `account_locked`, `account_deactivated`, `password_refused`).
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
                last_sync: None,
                agents: BTreeMap::new(),
                parked_sends: 0,
                agent_models: None,
                logged_out: None,
            }),
            metrics: std::sync::OnceLock::new(),
        }
    }
}

impl Health {
    fn lock(&self) -> std::sync::MutexGuard<'_, State_> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A sync with the homeserver succeeded.
    pub fn set_synced(&self) {
        let mut s = self.lock();
        s.synced = true;
        s.last_sync = Some(std::time::Instant::now());
    }

    /// Serves `/metrics` with `render` (the first one set stays).
    pub fn set_metrics(&self, render: MetricsRenderer) {
        let _ = self.metrics.set(render);
    }

    /// The state the metrics show.
    pub fn snapshot(&self) -> Snapshot {
        let s = self.lock();
        Snapshot {
            last_sync: s.last_sync,
            agent_up: s.usable(),
            workspace_ok: !s.mismatched(),
            parked_sends: s.parked_sends,
        }
    }

    /// Records what the agent at `url` showed: a handshake's outcome, or a connection lost
    /// (`Unreachable`). A workspace or protocol mismatch sticks until a handshake with that
    /// agent succeeds: an agent that then goes away does not hide it.
    pub fn set_agent(&self, url: &str, status: AgentStatus) {
        let mut s = self.lock();
        let entry = s
            .agents
            .entry(url.to_owned())
            .or_insert(AgentStatus::Unchecked);
        if entry.is_mismatch() && matches!(status, AgentStatus::Unreachable(_)) {
            return;
        }
        *entry = status;
    }

    /// The models the agents offer rooms (their welcome's `models`).
    pub fn set_agent_models(&self, models: Vec<String>) {
        self.lock().agent_models = Some(models);
    }

    /// The models a room may choose (`None`: no agent handshake yet).
    pub fn agent_models(&self) -> Option<Vec<String>> {
        self.lock().agent_models.clone()
    }

    /// The homeserver logged the bot out for good: `/healthz` says `status` (e.g.
    /// `soft_logout`) with `detail`, whatever else holds.
    /// Whether this is news (it was not said before).
    pub fn set_logged_out(&self, status: &'static str, detail: &'static str) -> bool {
        self.lock().logged_out.replace((status, detail)) != Some((status, detail))
    }

    /// The bot may use the homeserver again (an account unlocked); whether it was logged out.
    pub fn clear_logged_out(&self) -> bool {
        self.lock().logged_out.take().is_some()
    }

    /// How many posts are parked (see [`crate::send`]).
    pub fn set_parked_sends(&self, n: u64) {
        self.lock().parked_sends = n;
    }

    /// The current status.
    pub fn report(&self) -> Report {
        let s = self.lock();
        if let Some((status, detail)) = s.logged_out {
            return Report {
                status,
                detail: Some(detail.to_owned()),
                parked_sends: s.parked_sends,
            };
        }
        let (status, detail) = match (&s.agent(), s.synced) {
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

async fn metrics(State(health): State<Arc<Health>>) -> axum::response::Response {
    use axum::response::IntoResponse;
    match health.metrics.get() {
        Some(render) => (
            [(
                axum::http::header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            render(),
        )
            .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// Liveness: the process serves.
async fn livez() -> &'static str {
    "alive\n"
}

/// The health router: `/healthz` (readiness), `/livez` (liveness) and `/metrics`.
pub fn app(health: Arc<Health>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/livez", get(livez))
        .route("/metrics", get(metrics))
        .with_state(health)
}

/// Binds `addr` (logging the bound address).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let listener = TcpListener::bind(addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "health endpoint listening");
    Ok(listener)
}

/// Limits on the connections of an endpoint served by [`serve_router`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Time a client has to send a complete request head, from the moment the connection is
    /// accepted (or the previous response was written, on a keep-alive connection).
    pub header_read_timeout: Duration,
    /// Longest life of one connection that has not been [`Trusted`] (the health endpoint's
    /// never are).
    pub max_lifetime: Duration,
    /// Connections open at once; at the cap the oldest one is closed.
    pub max_connections: usize,
    /// Connections open at once from one peer IP; at the cap that peer's oldest one is closed.
    pub max_per_ip: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(5),
            max_lifetime: Duration::from_secs(30),
            max_connections: 64,
            max_per_ip: 16,
        }
    }
}

/// How long shutdown lets an in-flight response finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);
/// Pause after a failed `accept` (e.g. out of file descriptors), so the loop does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// A connection's mark, in every request's extensions: a handler that authenticated the
/// client calls [`Trusted::grant`], and the connection is then neither held to
/// [`Limits::max_lifetime`] nor closed to make room while an untrusted one can be.
#[derive(Debug, Clone, Default)]
pub struct Trusted(Arc<std::sync::atomic::AtomicBool>);

impl Trusted {
    /// The client proved who it is.
    pub fn grant(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether it did.
    pub fn is_granted(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// An open connection: its peer, its trust, and what closes it.
#[derive(Debug)]
struct Slot {
    ip: IpAddr,
    trusted: Trusted,
    close: CancellationToken,
}

/// The open connections, oldest first (ids only grow).
#[derive(Debug, Default)]
struct Slots {
    next_id: u64,
    open: BTreeMap<u64, Slot>,
}

impl Slots {
    /// Registers a connection from `ip`, first closing the connections that would put it over
    /// either cap: the oldest untrusted one, or the oldest of all when every one is trusted.
    fn admit(&mut self, ip: IpAddr, limits: &Limits) -> (u64, CancellationToken, Trusted) {
        let from_ip = self.open.values().filter(|s| s.ip == ip).count();
        if from_ip >= limits.max_per_ip.max(1) {
            let victim = self.victim(|s| s.ip == ip);
            self.evict(victim);
        }
        if self.open.len() >= limits.max_connections.max(1) {
            let victim = self.victim(|_| true);
            self.evict(victim);
        }
        let id = self.next_id;
        self.next_id += 1;
        let (close, trusted) = (CancellationToken::new(), Trusted::default());
        self.open.insert(
            id,
            Slot {
                ip,
                trusted: trusted.clone(),
                close: close.clone(),
            },
        );
        (id, close, trusted)
    }

    /// The oldest untrusted connection that `of` selects, else the oldest it selects.
    fn victim(&self, of: impl Fn(&Slot) -> bool) -> Option<u64> {
        let mut chosen = self.open.iter().filter(|(_, s)| of(s));
        let all: Vec<(&u64, &Slot)> = chosen.by_ref().collect();
        all.iter()
            .find(|(_, s)| !s.trusted.is_granted())
            .or_else(|| all.first())
            .map(|(id, _)| **id)
    }

    fn evict(&mut self, id: Option<u64>) {
        if let Some(slot) = id.and_then(|id| self.open.remove(&id)) {
            tracing::debug!(peer_ip = %slot.ip, "endpoint full: closing the oldest connection");
            slot.close.cancel();
        }
    }
}

/// Serves `/healthz` on `listener` until `shutdown`, with the default [`Limits`].
pub async fn serve(
    listener: TcpListener,
    health: Arc<Health>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_with(listener, health, Limits::default(), shutdown).await
}

/// Serves `/healthz` on `listener` until `shutdown`, within `limits`.
pub async fn serve_with(
    listener: TcpListener,
    health: Arc<Health>,
    limits: Limits,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    serve_router(listener, app(health), limits, shutdown).await
}

/// Serves `router` on `listener` until `shutdown` from an accept loop that strangers cannot
/// fill (see the module documentation): a deadline for each request head, a lifetime for
/// connections that are not [`Trusted`], caps overall and per peer IP that close the oldest
/// (untrusted) connection first. Every request carries its connection's [`Trusted`].
pub async fn serve_router(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let slots = Arc::new(Mutex::new(Slots::default()));
    let tracker = TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        let (id, evicted, trusted) = lock(&slots).admit(peer.ip(), &limits);
        let router = router.clone().layer(axum::Extension(trusted.clone()));
        let slots = slots.clone();
        let shutdown = shutdown.clone();
        tracker.spawn(async move {
            serve_connection(stream, router, &limits, evicted, trusted, shutdown).await;
            lock(&slots).open.remove(&id);
        });
    }
    tracker.close();
    tracker.wait().await;
    Ok(())
}

fn lock(slots: &Mutex<Slots>) -> std::sync::MutexGuard<'_, Slots> {
    slots.lock().unwrap_or_else(|p| p.into_inner())
}

/// Drives one HTTP/1 connection until it ends, its deadline passes (while it is not trusted),
/// it is evicted, or shutdown (which lets an in-flight response finish briefly).
async fn serve_connection(
    stream: TcpStream,
    router: Router,
    limits: &Limits,
    evicted: CancellationToken,
    trusted: Trusted,
    shutdown: CancellationToken,
) {
    let lifetime = async {
        tokio::time::sleep(limits.max_lifetime).await;
        if trusted.is_granted() {
            std::future::pending::<()>().await;
        }
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(router));
    tokio::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => {
            if let Err(e) = result {
                tracing::debug!(error = %e, "connection ended");
            }
        }
        () = evicted.cancelled() => {}
        () = lifetime => {
            tracing::debug!("connection reached its lifetime");
        }
        () = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, conn).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_endpoint_closes_the_oldest_connection() {
        let limits = Limits {
            max_connections: 3,
            max_per_ip: 2,
            ..Limits::default()
        };
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let mut slots = Slots::default();
        let (_, a0, _) = slots.admit(a, &limits);
        let (_, b0, _) = slots.admit(b, &limits);
        let (_, a1, _) = slots.admit(a, &limits);
        assert!(![&a0, &b0, &a1].iter().any(|t| t.is_cancelled()));
        // A third from `a` closes `a`'s oldest, not `b`'s.
        let (_, a2, _) = slots.admit(a, &limits);
        assert!(a0.is_cancelled() && !b0.is_cancelled());
        // A newcomer at the overall cap closes the oldest of all.
        let (_, c0, _) = slots.admit("10.0.0.3".parse().unwrap(), &limits);
        assert!(b0.is_cancelled());
        assert!(![&a1, &a2, &c0].iter().any(|t| t.is_cancelled()));
        assert_eq!(slots.open.len(), 3);
    }

    #[test]
    fn trusted_connections_are_closed_last() {
        let limits = Limits {
            max_connections: 3,
            max_per_ip: 2,
            ..Limits::default()
        };
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let mut slots = Slots::default();
        let (_, client, trust) = slots.admit(a, &limits);
        trust.grant();
        let (_, stranger, _) = slots.admit(a, &limits);
        // From the same address: the stranger goes, not the older, trusted client.
        let (_, s2, _) = slots.admit(a, &limits);
        assert!(stranger.is_cancelled() && !client.is_cancelled());
        // Everyone else's too: at the overall cap, untrusted ones go first.
        let (_, b0, _) = slots.admit("10.0.0.2".parse().unwrap(), &limits);
        let (_, c0, _) = slots.admit("10.0.0.3".parse().unwrap(), &limits);
        assert!(s2.is_cancelled() && !client.is_cancelled());
        assert!(!b0.is_cancelled() && !c0.is_cancelled());
        // Only trusted ones left: the oldest of them goes.
        let mut all_trusted = Slots::default();
        let (_, t0, g0) = all_trusted.admit(a, &limits);
        g0.grant();
        let (_, t1, g1) = all_trusted.admit(a, &limits);
        g1.grant();
        let (_, t2, _) = all_trusted.admit(a, &limits);
        assert!(t0.is_cancelled() && !t1.is_cancelled() && !t2.is_cancelled());
    }

    #[test]
    fn logged_out_wins_over_everything() {
        let h = Health::default();
        h.set_synced();
        h.set_agent("ws://a:8700/", AgentStatus::Ok);
        assert_eq!(h.report().status, "ok");
        h.set_logged_out("soft_logout", "set MATRIX_PASSWORD");
        let r = h.report();
        assert_eq!(
            (r.status, r.detail.as_deref()),
            ("soft_logout", Some("set MATRIX_PASSWORD"))
        );
    }

    #[test]
    fn status_progression() {
        let h = Health::default();
        assert_eq!(h.report().status, "starting");
        h.set_synced();
        assert_eq!(h.report().status, "agent_unchecked");
        assert!(!h.snapshot().agent_up);
        let a = "ws://a:8700/";
        h.set_agent(a, AgentStatus::Unreachable("refused".into()));
        assert_eq!(h.report().status, "agent_unreachable");
        h.set_agent(a, AgentStatus::Ok);
        assert_eq!(h.report().status, "ok");
        assert!(h.snapshot().agent_up);
        h.set_agent(
            a,
            AgentStatus::WorkspaceMismatch("sentinel not found".into()),
        );
        assert_eq!(h.report().status, "workspace_mismatch");
        assert!(!h.snapshot().workspace_ok);
        h.set_agent(a, AgentStatus::Unreachable("refused".into()));
        assert_eq!(
            h.report().status,
            "workspace_mismatch",
            "mismatch is sticky"
        );
        h.set_agent(a, AgentStatus::Ok);
        assert_eq!(h.report().status, "ok");
        h.set_agent(a, AgentStatus::Unreachable("agent restarting".into()));
        assert_eq!(
            h.report().status,
            "agent_unreachable",
            "an agent that was fine and went away is not ready, whatever happened before"
        );
        assert!(!h.snapshot().agent_up);
        h.set_agent(a, AgentStatus::Ok);
        // A second agent: one usable is enough; one mismatched is reported.
        let b = "ws://b:8700/";
        h.set_agent(b, AgentStatus::Unreachable("down".into()));
        assert_eq!(
            h.report().status,
            "ok",
            "chats fail over to the usable agent"
        );
        assert!(h.snapshot().agent_up && h.snapshot().workspace_ok);
        h.set_agent(b, AgentStatus::ProtocolMismatch("v2".into()));
        assert_eq!(h.report().status, "protocol_mismatch");
        assert!(h.snapshot().agent_up && !h.snapshot().workspace_ok);
        h.set_agent(b, AgentStatus::Ok);
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
