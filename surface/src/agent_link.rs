//! The durable link between one chat's lane and the agent: connects, does the handshake
//! (version and shared-workspace proof), resends every stored turn the agent has not got yet,
//! and reconnects with exponential backoff and jitter. User messages are only ever sent from
//! the journal, so a message is never lost or sent twice by a reconnect race.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use backon::BackoffBuilder;
use protocol::{ChatId, Hello, PROTOCOL_VERSION, Sentinel, ToAgent, ToSurface, Welcome};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, info, info_span, warn};
use url::Url;

use crate::config::Secret;
use crate::connection::{Connection, ConnectionError};
use crate::health::{AgentStatus, Health};
use crate::journal::Journal;

/// How long the agent may take to answer `hello`.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Keepalive ping interval.
const PING_EVERY: Duration = Duration::from_secs(30);
/// With no frame at all for this long, the connection is presumed dead.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// The shared-workspace proof, implemented over the workspace (and faked in tests).
pub trait WorkspaceProof: Send + Sync + 'static {
    /// Writes a fresh sentinel the agent must find.
    fn write_sentinel(&self) -> Result<Sentinel, String>;
    /// Checks a sentinel the agent wrote.
    fn check_sentinel(&self, sentinel: &Sentinel) -> Result<(), String>;
}

/// Where and how to reach the agents.
#[derive(Clone)]
pub struct AgentEndpoint {
    /// Base `ws://` URLs of the agents (`AGENT_URL`), never empty: each chat goes to one, in
    /// its order of preference ([`crate::route`]).
    pub urls: Vec<Url>,
    /// Bearer token.
    pub token: Secret,
    /// Sentinel writer/checker.
    pub proof: Arc<dyn WorkspaceProof>,
    /// Where handshake outcomes are reported.
    pub health: Arc<Health>,
}

impl std::fmt::Debug for AgentEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentEndpoint")
            .field("urls", &self.urls)
            .finish_non_exhaustive()
    }
}

/// Why a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// Connecting failed.
    #[error(transparent)]
    Connection(#[from] ConnectionError),
    /// No welcome in time, or the connection closed first.
    #[error("no welcome from the agent")]
    NoWelcome,
    /// The first frame was not a welcome.
    #[error("agent sent {0} instead of welcome")]
    Unexpected(String),
    /// Different protocol versions.
    #[error("protocol version mismatch: surface {ours}, agent {theirs}")]
    Version {
        /// Ours.
        ours: u32,
        /// Theirs.
        theirs: u32,
    },
    /// The workspace proof failed on either side.
    #[error("shared workspace mismatch: {0}")]
    Workspace(String),
}

impl HandshakeError {
    /// The health status this failure implies.
    pub fn health(&self) -> AgentStatus {
        match self {
            Self::Version { .. } => AgentStatus::ProtocolMismatch(self.to_string()),
            Self::Workspace(_) => AgentStatus::WorkspaceMismatch(self.to_string()),
            _ => AgentStatus::Unreachable(self.to_string()),
        }
    }
}

/// Checks the agent's welcome: same version, it found our sentinel, we find its sentinel.
pub fn check_welcome(w: &Welcome, proof: &dyn WorkspaceProof) -> Result<(), HandshakeError> {
    if w.protocol_version != PROTOCOL_VERSION {
        return Err(HandshakeError::Version {
            ours: PROTOCOL_VERSION,
            theirs: w.protocol_version,
        });
    }
    match w.workspace.surface_sentinel_ok {
        Some(true) => {}
        Some(false) => {
            return Err(HandshakeError::Workspace(
                "the agent did not find the surface's sentinel file under its workspace root"
                    .into(),
            ));
        }
        None => {
            return Err(HandshakeError::Workspace(
                "the agent did not check the surface's sentinel".into(),
            ));
        }
    }
    let Some(theirs) = &w.workspace.agent_sentinel else {
        return Err(HandshakeError::Workspace(
            "the agent sent no sentinel".into(),
        ));
    };
    proof.check_sentinel(theirs).map_err(|e| {
        HandshakeError::Workspace(format!(
            "the surface did not find the agent's sentinel {}: {e}",
            theirs.path
        ))
    })
}

/// Connects to the agent at `url` and completes the handshake. Returns the connection and the
/// welcome.
pub async fn handshake(
    endpoint: &AgentEndpoint,
    url: &Url,
    chat: &ChatId,
) -> Result<(Connection, Welcome), HandshakeError> {
    let mut conn = Connection::connect(url, chat, &endpoint.token).await?;
    let sentinel = endpoint.proof.write_sentinel().map_err(|e| {
        HandshakeError::Workspace(format!("cannot write the surface sentinel: {e}"))
    })?;
    conn.send(&ToAgent::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        surface: "matrix".into(),
        workspace_sentinel: Some(sentinel),
    }))
    .await?;
    let welcome = match tokio::time::timeout(HANDSHAKE_TIMEOUT, conn.recv()).await {
        Ok(Ok(Some(ToSurface::Welcome(w)))) => w,
        Ok(Ok(Some(ToSurface::Error(e)))) => {
            conn.close().await;
            let err = HandshakeError::Unexpected(format!("error {:?}: {}", e.code, e.message));
            return Err(match e.code {
                protocol::ErrorCode::WorkspaceMismatch => HandshakeError::Workspace(e.message),
                _ => err,
            });
        }
        Ok(Ok(Some(other))) => {
            conn.close().await;
            return Err(HandshakeError::Unexpected(
                format!("{other:?}").chars().take(80).collect(),
            ));
        }
        Ok(Ok(None)) | Err(_) => return Err(HandshakeError::NoWelcome),
        Ok(Err(e)) => return Err(e.into()),
    };
    if let Err(e) = check_welcome(&welcome, endpoint.proof.as_ref()) {
        conn.close().await;
        return Err(e);
    }
    Ok((conn, welcome))
}

/// What the link tells its lane.
#[derive(Debug, Clone, PartialEq)]
pub enum LinkEvent {
    /// A (re)connection completed; the agent has every turn up to `last_seq`.
    Connected {
        /// From the welcome.
        last_seq: u64,
    },
    /// A message from the agent (acks are also recorded in the journal by the link).
    Message(ToSurface),
    /// The connection dropped; the link is reconnecting.
    Disconnected,
}

pub(crate) enum Outgoing {
    Msg(Box<ToAgent>),
    TurnsStored,
}

/// The lane's handle on its link. Cloneable (answers to questions are sent through it from
/// the sync ingest).
#[derive(Debug, Clone)]
pub struct LinkHandle {
    out: mpsc::UnboundedSender<Outgoing>,
}

impl std::fmt::Debug for Outgoing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Msg(m) => write!(f, "Msg({m:?})"),
            Self::TurnsStored => f.write_str("TurnsStored"),
        }
    }
}

impl LinkHandle {
    /// Tells the link that new turns are in the journal (it sends them in `seq` order).
    pub fn turns_stored(&self) {
        let _ = self.out.send(Outgoing::TurnsStored);
    }

    /// Sends a non-turn message (answer, decision, delivery result, cancel). Queued while
    /// disconnected and sent after the resend of stored turns.
    pub fn send(&self, msg: ToAgent) {
        if matches!(msg, ToAgent::UserMessage(_) | ToAgent::Hello(_)) {
            warn!("user messages go through the journal; ignoring a direct send");
            return;
        }
        let _ = self.out.send(Outgoing::Msg(Box::new(msg)));
    }
}

/// A handle whose messages land in the returned receiver (for tests of code that sends).
#[cfg(test)]
pub(crate) fn test_handle() -> (LinkHandle, mpsc::UnboundedReceiver<Outgoing>) {
    let (out, rx) = mpsc::unbounded_channel();
    (LinkHandle { out }, rx)
}

/// The non-turn messages sent through a [`test_handle`].
#[cfg(test)]
pub(crate) fn drain(rx: &mut mpsc::UnboundedReceiver<Outgoing>) -> Vec<ToAgent> {
    let mut out = Vec::new();
    while let Ok(o) = rx.try_recv() {
        if let Outgoing::Msg(m) = o {
            out.push(*m);
        }
    }
    out
}

/// Starts the link task for `chat`. Events for the lane arrive on the returned receiver; the
/// task ends on `shutdown` or when every [`LinkHandle`] is dropped.
pub fn spawn(
    endpoint: AgentEndpoint,
    chat: ChatId,
    journal: Arc<Journal>,
    shutdown: CancellationToken,
    tracker: &tokio_util::task::TaskTracker,
) -> (LinkHandle, mpsc::Receiver<LinkEvent>) {
    let (out_tx, out_rx) = mpsc::unbounded_channel();
    let (ev_tx, ev_rx) = mpsc::channel(256);
    let span = info_span!("agent_link", chat_id = %chat);
    tracker.spawn(run(endpoint, chat, journal, shutdown, out_rx, ev_tx).instrument(span));
    (LinkHandle { out: out_tx }, ev_rx)
}

fn backoff() -> impl Iterator<Item = Duration> {
    daemon::backoff(Duration::from_millis(200), Duration::from_secs(30)).build()
}

async fn run(
    endpoint: AgentEndpoint,
    chat: ChatId,
    journal: Arc<Journal>,
    shutdown: CancellationToken,
    mut out_rx: mpsc::UnboundedReceiver<Outgoing>,
    ev_tx: mpsc::Sender<LinkEvent>,
) {
    let mut delays = backoff();
    // Non-turn messages that could not be sent yet, in order.
    let mut queued: VecDeque<ToAgent> = VecDeque::new();
    let order: Vec<&Url> = crate::route::preference(chat.as_str(), &endpoint.urls)
        .into_iter()
        .map(|i| &endpoint.urls[i])
        .collect();
    // Which agent in the chat's order is tried next: its owner first, the next ones while it
    // cannot be reached; every (re)connection starts from the owner again.
    let mut next = 0;
    loop {
        let Some(&url) = order.get(next) else { return };
        let agent = url.as_str();
        let attempt = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = handshake(&endpoint, url, &chat) => r,
        };
        let (mut conn, welcome) = match attempt {
            Ok(ok) => ok,
            Err(e) => {
                match &e {
                    HandshakeError::Workspace(_) | HandshakeError::Version { .. } => error!(
                        error = %e,
                        "AGENT HANDSHAKE REFUSED: the surface and the agent are misconfigured; \
                         no messages are forwarded until this is fixed"
                    ),
                    HandshakeError::Connection(c) if c.is_auth() => {
                        error!(error = %e, "the agent refused AGENT_TOKEN")
                    }
                    _ => warn!(error = %e, agent, "agent not reachable, retrying"),
                }
                endpoint.health.set_agent(agent, e.health());
                // The next agent in the chat's order is tried at once; after a whole round
                // without one, the link waits.
                next = (next + 1) % order.len();
                if next != 0 {
                    continue;
                }
                let delay = delays.next().unwrap_or(Duration::from_secs(30));
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(delay) => continue,
                }
            }
        };
        endpoint.health.set_agent(agent, AgentStatus::Ok);
        delays = backoff();
        if next > 0 {
            crate::metrics::agent_failover();
            warn!(
                agent,
                owner = order[0].as_str(),
                "chat moved to another agent while its own cannot be reached; its unfinished \
                 turns are sent there"
            );
        }
        next = 0;
        endpoint.health.set_agent_models(welcome.models.clone());
        info!(
            last_seq = welcome.last_seq,
            agent,
            agent_name = %welcome.agent,
            agent_version = %welcome.agent_version,
            "connected to agent"
        );
        match journal.ended_turns_after(&chat, welcome.last_seq) {
            Ok(0) => {}
            Ok(n) => warn!(
                count = n,
                last_seq = welcome.last_seq,
                "the agent lacks finished turns (state lost?); they are not resent"
            ),
            Err(e) => warn!(error = %e, "journal read failed"),
        }
        if ev_tx
            .send(LinkEvent::Connected {
                last_seq: welcome.last_seq,
            })
            .await
            .is_err()
        {
            conn.close().await;
            return;
        }
        // Unended turns the agent already has are resent too: its duplicate ack tells the lane
        // to expect the stored answer again (the old connection may have lost it).
        let mut sent_upto = 0;
        let ended = pump(
            &mut conn,
            &chat,
            &journal,
            &shutdown,
            &mut out_rx,
            &ev_tx,
            &mut queued,
            &mut sent_upto,
        )
        .await;
        conn.close().await;
        match ended {
            PumpEnd::Stop => return,
            PumpEnd::Reconnect(reason) => {
                warn!(reason = %reason, "agent connection lost, reconnecting");
                endpoint
                    .health
                    .set_agent(agent, AgentStatus::Unreachable(reason.clone()));
                if ev_tx.send(LinkEvent::Disconnected).await.is_err() {
                    return;
                }
                let delay = delays.next().unwrap_or(Duration::from_secs(1));
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// The chat id the surface's watcher of the agents uses: one per bot account, so that the
/// watchers of several surfaces sharing an agent do not replace each other's connection.
pub fn watch_chat(bot_user_id: &str) -> ChatId {
    use sha2::{Digest, Sha256};
    let digest = hex::encode(Sha256::digest(bot_user_id.as_bytes()));
    ChatId::new(format!("surface-watch-{}", &digest[..16])).expect("a valid chat id")
}

/// Watches the agent at `url` until `shutdown`, so that `/healthz` and `agent_up` tell the
/// truth also while no chat is active: a handshake (version, token, shared workspace), then
/// the connection held open with pings; when it drops, or a handshake fails, the health state
/// says so and the watcher tries again (exponential backoff, at most 10 s apart).
pub async fn watch(endpoint: AgentEndpoint, url: Url, chat: ChatId, shutdown: CancellationToken) {
    let agent = url.as_str();
    let mut delays = watch_backoff();
    // Log a change of state once, not every attempt.
    let mut last: Option<AgentStatus> = None;
    loop {
        let outcome = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = handshake(&endpoint, &url, &chat) => r,
        };
        match outcome {
            Ok((mut conn, welcome)) => {
                endpoint.health.set_agent(agent, AgentStatus::Ok);
                info!(agent, agent_name = %welcome.agent, agent_version = %welcome.agent_version, "agent handshake ok: shared workspace confirmed");
                delays = watch_backoff();
                let ended = hold(&mut conn, &shutdown).await;
                conn.close().await;
                let Some(reason) = ended else { return };
                warn!(agent, reason = %reason, "lost the connection to the agent");
                let status = AgentStatus::Unreachable(reason);
                endpoint.health.set_agent(agent, status.clone());
                last = Some(status);
            }
            Err(e) => {
                let status = e.health();
                let changed = last
                    .as_ref()
                    .is_none_or(|l| std::mem::discriminant(l) != std::mem::discriminant(&status));
                if changed {
                    match &e {
                        HandshakeError::Workspace(_) | HandshakeError::Version { .. } => error!(
                            error = %e, agent,
                            "AGENT CHECK FAILED: the surface and the agent do not share the \
                             workspace or protocol; nothing will be forwarded"
                        ),
                        HandshakeError::Connection(c) if c.is_auth() => {
                            error!(error = %e, agent, "the agent refused AGENT_TOKEN")
                        }
                        _ => warn!(error = %e, agent, "agent not reachable"),
                    }
                }
                endpoint.health.set_agent(agent, status.clone());
                last = Some(status);
            }
        }
        let delay = delays.next().unwrap_or(Duration::from_secs(10));
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

fn watch_backoff() -> impl Iterator<Item = Duration> {
    daemon::backoff(Duration::from_millis(200), Duration::from_secs(10)).build()
}

/// Keeps an idle connection open with pings until it drops (`Some(reason)`) or `shutdown`
/// (`None`). Whatever the agent sends on it is ignored.
async fn hold(conn: &mut Connection, shutdown: &CancellationToken) -> Option<String> {
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.tick().await;
    let idle = tokio::time::sleep(IDLE_TIMEOUT);
    tokio::pin!(idle);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = ping.tick() => {
                if let Err(e) = conn.ping().await {
                    return Some(e.to_string());
                }
            }
            _ = &mut idle => {
                let quiet_until = conn.last_frame() + IDLE_TIMEOUT;
                if quiet_until <= std::time::Instant::now() {
                    return Some("no frame from the agent for 90 s".into());
                }
                idle.as_mut().reset(quiet_until.into());
            }
            incoming = conn.recv() => match incoming {
                Ok(Some(_)) => idle.as_mut().reset(tokio::time::Instant::now() + IDLE_TIMEOUT),
                Ok(None) => return Some("agent closed the connection".into()),
                Err(e) => return Some(e.to_string()),
            },
        }
    }
}

enum PumpEnd {
    Stop,
    Reconnect(String),
}

async fn send_stored_turns(
    conn: &mut Connection,
    chat: &ChatId,
    journal: &Journal,
    sent_upto: &mut u64,
) -> Result<(), String> {
    let turns = journal
        .turns_to_send(chat, *sent_upto)
        .map_err(|e| e.to_string())?;
    for msg in turns {
        let seq = msg.seq;
        info!(seq, event_id = %msg.id, "sending turn to agent");
        let event_id = msg.id.clone();
        conn.send(&ToAgent::UserMessage(msg))
            .await
            .map_err(|e| e.to_string())?;
        crate::latency::sent_to_agent(&event_id);
        *sent_upto = seq;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn pump(
    conn: &mut Connection,
    chat: &ChatId,
    journal: &Journal,
    shutdown: &CancellationToken,
    out_rx: &mut mpsc::UnboundedReceiver<Outgoing>,
    ev_tx: &mpsc::Sender<LinkEvent>,
    queued: &mut VecDeque<ToAgent>,
    sent_upto: &mut u64,
) -> PumpEnd {
    if let Err(e) = send_stored_turns(conn, chat, journal, sent_upto).await {
        return PumpEnd::Reconnect(e);
    }
    while let Some(msg) = queued.front() {
        if let Err(e) = conn.send(msg).await {
            return PumpEnd::Reconnect(e.to_string());
        }
        queued.pop_front();
    }
    let mut ping = tokio::time::interval(PING_EVERY);
    ping.tick().await;
    let idle = tokio::time::sleep(IDLE_TIMEOUT);
    tokio::pin!(idle);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return PumpEnd::Stop,
            out = out_rx.recv() => match out {
                None => return PumpEnd::Stop,
                Some(Outgoing::TurnsStored) => {
                    if let Err(e) = send_stored_turns(conn, chat, journal, sent_upto).await {
                        return PumpEnd::Reconnect(e);
                    }
                }
                Some(Outgoing::Msg(m)) => {
                    if let Err(e) = conn.send(&m).await {
                        queued.push_back(*m);
                        return PumpEnd::Reconnect(e.to_string());
                    }
                }
            },
            _ = ping.tick() => {
                if let Err(e) = conn.ping().await {
                    return PumpEnd::Reconnect(e.to_string());
                }
            }
            _ = &mut idle => {
                // Pings and pongs do not surface from `recv`, but they prove the agent alive.
                let quiet_until = conn.last_frame() + IDLE_TIMEOUT;
                if quiet_until <= std::time::Instant::now() {
                    return PumpEnd::Reconnect("no frame from the agent for 90 s".into());
                }
                idle.as_mut().reset(quiet_until.into());
            }
            incoming = conn.recv() => {
                idle.as_mut().reset(tokio::time::Instant::now() + IDLE_TIMEOUT);
                match incoming {
                    Ok(Some(msg)) => {
                        if let ToSurface::Ack(a) = &msg
                            && let Err(e) = journal.mark_acked(chat, a.seq)
                        {
                            warn!(error = %e, seq = a.seq, "could not record ack");
                        }
                        if let ToSurface::Error(e) = &msg {
                            warn!(code = ?e.code, message = %e.message, "agent reported an error");
                        }
                        if ev_tx.send(LinkEvent::Message(msg)).await.is_err() {
                            return PumpEnd::Stop;
                        }
                    }
                    Ok(None) => return PumpEnd::Reconnect("agent closed the connection".into()),
                    Err(e) => return PumpEnd::Reconnect(e.to_string()),
                }
            }
        }
    }
}
