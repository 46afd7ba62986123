//! The Matrix surface: the only process that talks to Matrix. It journals incoming messages,
//! downloads their media into the shared workspace, runs one lane per chat that forwards turns
//! to the agent over a WebSocket, and renders the agent's answers back into the room.
//!
//! Module map, top to bottom; a module imports only modules listed below it (the layers are
//! checked by `e2e/tests/it/layers.rs`):
//! * [`sync`]: the sync loop: every timeline event journaled before anything acts on it, gaps
//!   backfilled, invites from allowed users joined.
//! * [`undecrypted`]: events that arrived before their room key: tried again when keys arrive,
//!   the room told after `SURFACE_KEY_WAIT`.
//! * [`ingest`]: a sync's events classified ([`decide`]), journaled in one transaction, then
//!   acted on (answers to waits, redactions, `!mode`, waking lanes).
//! * [`mcp`]: the optional MCP server for outside orchestrators (`SURFACE_MCP_BIND`).
//! * [`outbound`]: posting files dropped into `outbox/` folders; the inbox retention sweep.
//! * [`lanes`]: one task per chat taking its journaled events in order: download, store the
//!   turn, send it, run it through the pure turn state machine.
//! * [`prompts`]: the reactions under an approval prompt and the outcome shown on it.
//! * [`doctor`]: `surface doctor`, "why no reply?" (probe, then pure findings).
//! * [`send`]: posting so that nothing is lost or posted twice; refusals parked and reported.
//! * [`context`]: [`context::Ctx`], the state every part shares, built once in [`run`].
//! * [`waits`]: questions and approval prompts waiting for a user's answer.
//! * [`agent_link`]: a chat's durable link to its agent: handshake, resends, reconnects.
//! * [`media`]: streaming downloads and uploads (encrypted in encrypted rooms), media that
//!   looks native.
//! * [`members`]: senders' display names, remembered per room.
//! * [`outbox`]: watching the `outbox/` folders for complete files.
//! * [`retention`]: removing old inbox files and stale temporary downloads.
//! * [`session`]: logging in once and staying the same device.
//! * [`connection`]: the one typed WebSocket connection to the agent.
//! * [`event`]: where walking back through a room's history stops (pure).
//! * [`logging`]: tracing set-up; noise and credentials left out where lines are written.
//! * [`trust`]: the bot's cross-signing identity and key backup, set up or restored.
//! * [`workspace`]: the surface's view of `/workspace`, beneath one directory handle.
//! * [`capabilities`]: what the homeserver offers, from `/capabilities` (pure).
//! * [`config`]: the typed configuration, validated before anything logs in or binds.
//! * [`decide`]: what an incoming event means for the bot (pure, table-tested).
//! * [`filename`]: a name a Matrix user chose, made a safe file name.
//! * [`health`]: `/healthz` and `/livez`, from an accept loop that strangers cannot exhaust.
//! * [`inbound`]: every timeline event parsed once, with ruma's types, into [`inbound::Inbound`].
//! * [`journal`]: the durable delivery journal (sqlite): events, turns, sends, room settings.
//! * [`lane_registry`]: which chats have a running lane, and how to wake each.
//! * [`latency`]: where the surface's own time goes, for the benchmark.
//! * [`metrics`]: every Prometheus metric's name and help text, and the exporter.
//! * [`mime`]: a file's MIME type from its bytes, its declaration and its name.
//! * [`purpose`]: [`purpose::Purpose`], why the bot posts something.
//! * [`render`]: agent output as room events, with transaction ids derived from their cause.
//! * [`retry`]: the one retry decision for requests to the homeserver.
//! * [`route`]: which agent a chat talks to (rendezvous hashing over `AGENT_URL`).

pub mod agent_link;
pub mod announce;
pub mod capabilities;
pub mod command;
pub mod config;
pub mod connection;
pub mod context;
pub mod decide;
pub mod delayed;
pub mod doctor;
pub mod event;
pub mod filename;
pub mod health;
pub mod inbound;
pub mod ingest;
pub mod journal;
pub mod lane_registry;
pub mod lanes;
pub mod latency;
pub mod logging;
pub mod mcp;
pub mod media;
pub mod members;
pub mod metrics;
pub mod mime;
pub mod outbound;
pub mod outbox;
pub mod prompts;
pub mod purpose;
pub mod render;
pub mod retention;
pub mod retry;
pub mod room_settings;
pub mod route;
pub mod send;
pub mod session;
pub mod sync;
pub mod trust;
pub mod undecrypted;
pub mod waits;
pub mod workspace;

use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context as _;
use matrix_sdk::Client;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{error, info, warn};
use url::Url;

use crate::agent_link::AgentEndpoint;
use crate::config::Config;
use crate::context::{Ctx, Shared, WorkspaceSentinels};
use crate::health::Health;
use crate::journal::Journal;
use crate::media::UploadCache;
use crate::workspace::Workspace;

/// How often a locked account's session is tried again.
const LOCKED_RETRY: Duration = Duration::from_secs(30);

/// How long shutdown waits for running tasks to finish their current step.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Runs the surface until `shutdown` is cancelled (or the sync loop fails for good): binds the
/// health endpoint, logs in (or restores the session), then [`run_with`].
pub async fn run(config: Config, shutdown: CancellationToken) -> anyhow::Result<()> {
    info!(
        version = env!("CARGO_PKG_VERSION"),
        homeserver = %config.homeserver_url,
        user_id = %config.user_id,
        agents = %config.agent_urls.iter().map(Url::as_str).collect::<Vec<_>>().join(","),
        health = %config.health_bind,
        workspace = %config.workspace_root.display(),
        state_dir = %config.state_dir.display(),
        video_posters = config.ffmpeg.is_some(),
        "surface starting"
    );
    for var in config.public_defaults() {
        warn!(
            var,
            "{var} is a public default from compose.yaml (dev-only-…): anyone who reads the \
             repository knows it; set your own in .env (e.g. `openssl rand -hex 32`)"
        );
    }
    let listener = health::bind(config.health_bind)
        .await
        .with_context(|| format!("SURFACE_HEALTH_BIND {} cannot be bound", config.health_bind))?;
    let mcp_listener = match &config.mcp {
        None => None,
        Some(m) => Some(
            mcp::bind(m.bind)
                .await
                .with_context(|| format!("SURFACE_MCP_BIND {} cannot be bound", m.bind))?,
        ),
    };
    let health = Arc::new(Health::default());
    tokio::spawn({
        let (health, shutdown) = (health.clone(), shutdown.clone());
        async move {
            if let Err(e) = health::serve(listener, health, shutdown).await {
                error!(error = %e, "health endpoint failed");
            }
        }
    });
    // Kept for the whole process: each session below serves MCP on a copy of it.
    let mcp_listener = mcp_listener.map(|l| l.into_std()).transpose()?;
    let has_password = config.auth.password.is_some();
    let mut first = true;
    let mut delay = Duration::from_secs(1);
    loop {
        let client = match session::login(&config).await {
            Ok(client) => client,
            // A locked account keeps its session: try it again until an admin unlocks it.
            Err(session::SessionError::LoggedOut(out @ session::LoggedOut::Locked)) => {
                session::report_logged_out(&health, out);
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(LOCKED_RETRY) => {}
                }
                continue;
            }
            Err(session::SessionError::LoggedOut(out)) => {
                return stay_logged_out(&config, &health, out, &shutdown).await;
            }
            // Logging in again after a soft logout: the homeserver may be restarting.
            Err(e) if !first && e.is_transient() => {
                warn!(error = %e, retry_in_ms = delay.as_millis() as u64, "logging in again failed; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(delay) => {}
                }
                delay = (delay * 2).min(Duration::from_secs(60));
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        first = false;
        delay = Duration::from_secs(1);
        session::report_logged_in(&health);
        info!(
            user_id = %client.user_id().map(|u| u.to_string()).unwrap_or_default(),
            device_id = %client.device_id().map(|d| d.to_string()).unwrap_or_default(),
            "logged in"
        );
        // One session runs until shutdown, or until the homeserver logs the bot out.
        let generation = shutdown.child_token();
        let watcher = tokio::spawn({
            let (client, generation) = (client.clone(), generation.clone());
            async move {
                let out = session::watch(client).await;
                error!(
                    reason = out.code(),
                    "the homeserver logged the bot out; stopping this session"
                );
                generation.cancel();
                out
            }
        });
        let mcp = match &mcp_listener {
            Some(l) => Some(tokio::net::TcpListener::from_std(l.try_clone()?)?),
            None => None,
        };
        run_session(config.clone(), client, health.clone(), mcp, generation).await?;
        if shutdown.is_cancelled() {
            watcher.abort();
            return Ok(());
        }
        let out = watcher.await.context("the session watch ended")?;
        match session::access::next(out, has_password) {
            session::access::Next::LogInAgain => {
                info!(reason = out.code(), "logging in again with the password");
            }
            session::access::Next::Wait => {}
            session::access::Next::Stop(out) => {
                return stay_logged_out(&config, &health, out, &shutdown).await;
            }
        }
    }
}

/// Logged out, with no way back by itself: no syncing and no posting (the journal keeps
/// everything for the next start), `/healthz` 503 with the reason, and a log line every minute
/// until the operator stops the surface. Never a loop of refused requests.
async fn stay_logged_out(
    config: &Config,
    health: &Arc<Health>,
    out: session::LoggedOut,
    shutdown: &CancellationToken,
) -> anyhow::Result<()> {
    // Logged out at the start: `/metrics` still serves (with the journal's backlog), so the
    // alert on `mxbridge_surface_logged_out` fires.
    if let Ok(journal) = Journal::open(&config.state_dir.join("journal.sqlite")) {
        install_metrics(health, &Arc::new(journal));
    }
    session::report_logged_out(health, out);
    loop {
        error!(
            reason = out.code(),
            "the bot is logged out and does not sync: {}; messages wait on the homeserver and in the journal",
            out.explain()
        );
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = tokio::time::sleep(Duration::from_secs(60)) => {}
        }
    }
}

/// Runs the surface with a logged-in `client` and a bound health listener until `shutdown`:
/// the seam focused tests drive against matrix-sdk's mock homeserver and a fake agent.
pub async fn run_with(
    config: Config,
    client: Client,
    health_listener: tokio::net::TcpListener,
    mcp_listener: Option<tokio::net::TcpListener>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let health = Arc::new(Health::default());
    let serving = tokio::spawn({
        let (health, shutdown) = (health.clone(), shutdown.clone());
        async move {
            if let Err(e) = health::serve(health_listener, health, shutdown).await {
                error!(error = %e, "health endpoint failed");
            }
        }
    });
    let result = run_session(config, client, health, mcp_listener, shutdown).await;
    let _ = serving.await;
    result
}

/// One logged-in session, until `shutdown` (the process's, or this session's when the
/// homeserver logs the bot out): opens the state, starts the background work, catches up and
/// syncs; then lets running tasks finish their step.
async fn run_session(
    config: Config,
    client: Client,
    health: Arc<Health>,
    mcp_listener: Option<tokio::net::TcpListener>,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let (workspace, journal, upload_cache) = open_state(&config)?;
    health.set_parked_sends(journal.parked_count().context("reading the journal")?);
    install_metrics(&health, &journal);
    let tracker = TaskTracker::new();

    let display_name = client.account().get_display_name().await.ok().flatten();

    let endpoint = AgentEndpoint {
        urls: config.agent_urls.clone(),
        token: config.agent_token.clone(),
        proof: Arc::new(WorkspaceSentinels(workspace.clone())),
        health: health.clone(),
    };
    let started_ms = daemon::now_ms();
    let ctx: Ctx = Arc::new(Shared {
        config,
        client,
        journal,
        health,
        workspace,
        endpoint,
        upload_cache,
        lanes: Default::default(),
        waits: Default::default(),
        joining: Default::default(),
        bot_loops: Default::default(),
        member_names: Default::default(),
        delayed_events: Default::default(),
        shutdown: shutdown.clone(),
        tracker: tracker.clone(),
        bot_display_name: RwLock::new(display_name),
        started_ms,
    });
    spawn_tasks(&ctx, mcp_listener);
    for chat in ctx.journal.chats_with_work()? {
        lanes::poke(&ctx, chat);
    }
    sync::register_handlers(&ctx);
    sync::catch_up_all(&ctx).await;
    let result = sync::run(ctx.clone()).await;
    if let Err(e) = &result {
        error!(error = %e, "sync stopped");
    }

    info!("shutting down");
    shutdown.cancel();
    tracker.close();
    if tokio::time::timeout(SHUTDOWN_GRACE, tracker.wait())
        .await
        .is_err()
    {
        warn!("some tasks did not finish in time; they resume after restart");
    }
    result.context("matrix sync failed")
}

/// Opens what the surface keeps on disk: the workspace (partial downloads of an earlier run
/// removed), the state directory's journal and upload cache.
fn open_state(config: &Config) -> anyhow::Result<(Workspace, Arc<Journal>, UploadCache)> {
    let workspace = Workspace::open(&config.workspace_root)
        .with_context(|| "WORKSPACE_ROOT is not usable".to_owned())?;
    let partials = workspace.remove_partials();
    if partials > 0 {
        info!(
            count = partials,
            "removed partial downloads left by an earlier run"
        );
    }
    std::fs::create_dir_all(&config.state_dir).with_context(|| {
        format!(
            "SURFACE_STATE_DIR {} cannot be created",
            config.state_dir.display()
        )
    })?;
    let journal = Arc::new(
        Journal::open(&config.state_dir.join("journal.sqlite")).context("opening the journal")?,
    );
    let upload_cache = UploadCache::open(&config.state_dir).context("opening the upload cache")?;
    Ok((workspace, journal, upload_cache))
}

/// Installs the `/metrics` exporter (when this process has none yet), rendered from `health`
/// and the journal's backlog at each scrape.
fn install_metrics(health: &Arc<Health>, journal: &Arc<Journal>) {
    let Some(handle) = metrics::install() else {
        return;
    };
    let (weak, journal) = (Arc::downgrade(health), journal.clone());
    let render = move || {
        let snap = weak.upgrade().map(|h| h.snapshot());
        let backlog = journal.backlog().unwrap_or_default();
        let now_ms = daemon::now_ms();
        let state = metrics::State {
            since_sync: snap.as_ref().and_then(|s| s.last_sync).map(|t| t.elapsed()),
            backlog: (
                backlog.unhandled,
                Duration::from_millis(backlog.oldest_ms.map_or(0, |o| now_ms.saturating_sub(o))),
            ),
            undecryptable: backlog.waiting_for_keys,
            parked: snap.as_ref().map_or(0, |s| s.parked_sends),
            agent_up: snap.as_ref().is_some_and(|s| s.agent_up),
            workspace_ok: snap.as_ref().is_none_or(|s| s.workspace_ok),
        };
        metrics::render(&handle, &state)
    };
    health.set_metrics(Arc::new(render));
}

/// Starts the surface's background work on its tracker: the MCP server (when configured),
/// a watch of each agent, the outbox and retention, undecrypted events, and the bot's
/// cross-signing identity.
fn spawn_tasks(ctx: &Ctx, mcp_listener: Option<tokio::net::TcpListener>) {
    let tracker = &ctx.tracker;
    if let (Some(listener), Some(m)) = (mcp_listener, &ctx.config.mcp) {
        tracker.spawn(mcp::serve(ctx.clone(), listener, m.token.clone()));
    }
    let watch_chat = agent_link::watch_chat(ctx.config.user_id.as_str());
    for url in ctx.config.agent_urls.clone() {
        tracker.spawn(agent_link::watch(
            ctx.endpoint.clone(),
            url,
            watch_chat.clone(),
            ctx.shutdown.clone(),
        ));
    }
    tracker.spawn(outbound::run_outbox(ctx.clone()));
    tracker.spawn(outbound::run_retention(ctx.clone()));
    tracker.spawn(undecrypted::run(ctx.clone()));
    tracker.spawn({
        let ctx = ctx.clone();
        async move {
            tokio::select! {
                _ = ctx.shutdown.cancelled() => {}
                _ = trust::ensure(&ctx.client, &ctx.config) => {}
            }
        }
    });
}
