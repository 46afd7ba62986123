//! The Agent Client Protocol brain (`AGENT_BRAIN=acp`): each chat's turns go to an ACP agent
//! process of its own (Claude Code, Codex, Gemini CLI, Hermes, …) started in the chat's folder.
//!
//! * One session per chat, started lazily; its id is stored ([`sessions`]) and resumed with
//!   `session/load` when the agent can, after a restart or on another agent. Otherwise a new
//!   session gets a summary of the chat and the room is told once.
//! * Answer text streams into the room; tool calls show as the tool notices; a plan as a
//!   checklist; `session/request_permission` goes through `AGENT_TOOL_POLICY` (`acp__<kind>`,
//!   `acp__*`; unset: ask) and our approval prompt.
//! * A process that dies during a turn is restarted and the turn run again, once, and the room
//!   is told. A turn given up by the worker (the surface went away, a stop) sends
//!   `session/cancel`.
//! * At most `AGENT_ACP_SESSIONS` processes; idle ones close after `AGENT_ACP_IDLE`.

mod conn;
mod decide;
mod event;
pub mod relay;
pub mod sessions;
mod wire;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use protocol::ChatId;
use tokio::sync::Mutex as AsyncMutex;
use tracing::{info, warn};

use self::conn::{Conn, ConnError};
use self::event::{Event, PromptFailed};
use self::sessions::SessionIds;
use self::wire::{Permission, ToolCall, Update};
use super::{Brain, BrainError, TurnInput};
use crate::config::AcpConfig;
use crate::turn::TurnIo;

/// How often idle sessions are looked for.
const REAP_EVERY: Duration = Duration::from_secs(30);

/// A chat's agent, if running.
#[derive(Debug, Default)]
struct Slot {
    conn: Option<Conn>,
    session: Option<String>,
    last_used: Option<Instant>,
}

type Slots = std::sync::Mutex<HashMap<ChatId, Arc<AsyncMutex<Slot>>>>;

/// The brain.
#[derive(Debug)]
pub struct Acp {
    config: AcpConfig,
    /// The workspace as the agent sees it (absolute paths in ACP are below it).
    root: PathBuf,
    sessions: SessionIds,
    slots: Arc<Slots>,
}

/// How one attempt at a turn ended badly.
enum Failed {
    /// The agent process or its connection went away: worth one more try.
    Died(String),
    /// Anything else: the turn fails with it.
    Brain(BrainError),
}

impl From<BrainError> for Failed {
    fn from(e: BrainError) -> Self {
        Self::Brain(e)
    }
}

impl From<crate::connection::Closed> for Failed {
    fn from(_: crate::connection::Closed) -> Self {
        Self::Brain(BrainError::Disconnected)
    }
}

impl Acp {
    /// The brain, with `root` the workspace root; closes idle sessions in the background.
    pub fn new(config: AcpConfig, root: PathBuf, sessions: SessionIds) -> Self {
        let slots: Arc<Slots> = Arc::default();
        tokio::spawn(reap(Arc::downgrade(&slots), config.idle));
        Self {
            config,
            root,
            sessions,
            slots,
        }
    }

    fn slot(&self, chat: &ChatId) -> Arc<AsyncMutex<Slot>> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.entry(chat.clone()).or_default().clone()
    }

    /// Closes the least recently used idle agent while `max_sessions` are running; an error
    /// when every one is busy.
    fn make_room(&self, chat: &ChatId) -> Result<(), BrainError> {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let mut running = 0;
        let mut idle: Vec<(Instant, tokio::sync::OwnedMutexGuard<Slot>)> = Vec::new();
        for (_, slot) in slots.iter().filter(|(id, _)| *id != chat) {
            match slot.clone().try_lock_owned() {
                Ok(guard) if guard.conn.is_some() => {
                    running += 1;
                    idle.push((guard.last_used.unwrap_or_else(Instant::now), guard));
                }
                Ok(_) => {}
                // Busy: running a turn, or starting its agent.
                Err(_) => running += 1,
            }
        }
        if running < self.config.max_sessions {
            return Ok(());
        }
        match idle.into_iter().min_by_key(|(t, _)| *t) {
            Some((_, mut oldest)) => {
                info!("closing the least recently used ACP session to make room");
                oldest.conn = None;
                Ok(())
            }
            None => Err(BrainError::Stopped(format!(
                "all {} agent sessions are busy; please send your message again in a moment",
                self.config.max_sessions
            ))),
        }
    }

    /// A running agent with the chat's session: started, resumed or new.
    async fn ensure(
        &self,
        slot: &mut Slot,
        input: &TurnInput,
        io: &mut TurnIo,
        cwd: &Path,
    ) -> Result<Option<String>, Failed> {
        if let Some(why) = slot.conn.as_ref().and_then(Conn::ended) {
            warn!(
                why,
                "the ACP agent's connection had ended; starting it again"
            );
            slot.conn = None;
        }
        if slot.conn.is_some() {
            return Ok(None);
        }
        self.make_room(&input.chat_id)?;
        let limit = self.config.start_timeout;
        let mut conn = Conn::start(&self.config, cwd, io.workspace().clone(), self.root.clone())
            .await
            .map_err(start_failed)?;
        info!(agent = %conn.info.name, pid = conn.pid(), load_session = conn.info.load_session, "ACP agent ready");
        let stored = self.sessions.get(&input.chat_id).await.unwrap_or_else(|e| {
            warn!(error = %e, "cannot read the chat's ACP session id");
            None
        });
        if let Some(id) = &stored
            && conn.info.load_session
        {
            match conn.load_session(id, cwd, limit).await {
                Ok(()) => {
                    info!(session = %id, "ACP session resumed");
                    slot.session = Some(id.clone());
                    slot.conn = Some(conn);
                    return Ok(None);
                }
                Err(e) => warn!(session = %id, error = %e, "the ACP session could not be resumed"),
            }
        }
        let id = conn.new_session(cwd, limit).await.map_err(start_failed)?;
        info!(session = %id, "ACP session started");
        if let Err(e) = self.sessions.put(&input.chat_id, &id).await {
            warn!(error = %e, "cannot store the chat's ACP session id");
        }
        slot.session = Some(id);
        slot.conn = Some(conn);
        let summary = decide::summary(&input.history);
        if summary.is_some() {
            io.notice("The agent's working memory of this chat was reset; it gets a short summary of the conversation so far.")
                .await?;
        }
        Ok(summary)
    }

    /// One attempt at the turn: prompt, then act on what the agent sends until it ends.
    async fn attempt(
        &self,
        slot: &mut Slot,
        input: &TurnInput,
        io: &mut TurnIo,
        summary: Option<&str>,
    ) -> Result<(), Failed> {
        let (Some(conn), Some(session)) = (slot.conn.as_mut(), slot.session.clone()) else {
            return Err(Failed::Died("the agent is not running".to_owned()));
        };
        conn.drain();
        let images = if conn.info.images {
            pictures(io, &input.turn).await
        } else {
            Vec::new()
        };
        let blocks = decide::prompt_blocks(&input.turn, &self.root, summary, &images);
        conn.prompt(&session, blocks)
            .map_err(|e| Failed::Died(e.to_string()))?;
        let cancel = conn.canceller(&session);
        let mut tools = Tools::default();
        loop {
            let event = tokio::time::timeout(self.config.turn_idle, conn.events.recv()).await;
            match event {
                Err(_) => {
                    cancel.cancel();
                    return Err(Failed::Brain(BrainError::Stopped(format!(
                        "the agent was silent for {}; its turn was cancelled",
                        humantime::format_duration(self.config.turn_idle)
                    ))));
                }
                Ok(None) => {
                    return Err(Failed::Died(
                        conn.ended()
                            .unwrap_or_else(|| "the connection to the agent ended".to_owned()),
                    ));
                }
                Ok(Some(Event::Update(u))) => apply(u, io, &mut tools).await?,
                Ok(Some(Event::Permission(p, reply))) => {
                    let choice = permit(io, &p).await?;
                    let _ = reply.send(choice);
                }
                Ok(Some(Event::Tool(name, arguments, reply))) => {
                    let own = io.scope().own_dir().clone();
                    let arguments = decide::relayed_arguments(&arguments, &self.root, &own);
                    let outcome = io.call_tool(&name, &arguments).await;
                    let _ = reply.send((outcome.ok, outcome.output));
                }
                Ok(Some(Event::PromptDone(done))) => {
                    cancel.disarm();
                    tools.close_all(io).await?;
                    return match done {
                        Ok(stop) => {
                            if let Some(text) = decide::stop_notice(&stop) {
                                io.notice(text).await?;
                            }
                            Ok(())
                        }
                        Err(PromptFailed::Gone(why)) => {
                            Err(Failed::Died(conn.ended().unwrap_or(why)))
                        }
                        Err(PromptFailed::Answered(e)) => Err(Failed::Brain(BrainError::Agent(
                            format!("the agent answered with an error: {e}"),
                        ))),
                    };
                }
            }
        }
    }

    async fn run(&self, input: &TurnInput, io: &mut TurnIo) -> Result<(), BrainError> {
        let slot = self.slot(&input.chat_id);
        let mut slot = slot.lock().await;
        let cwd = self.root.join(io.scope().own_dir().as_str());
        tokio::fs::create_dir_all(&cwd)
            .await
            .map_err(|e| BrainError::Agent(format!("the chat's folder cannot be made: {e}")))?;
        // A turn prompted before (this agent or another died during it) is prompted again: the
        // agent's side effects may repeat, so the room hears of it, after the answer (a notice
        // before it would post the text kept from the first try as an answer of its own).
        let rerun = io.replay_brain_step().is_some();
        io.record_brain_step(serde_json::json!({"acp": "prompted"}))
            .await;
        let mut retried = false;
        let result = loop {
            let outcome = match self.ensure(&mut slot, input, io, &cwd).await {
                Ok(summary) => self.attempt(&mut slot, input, io, summary.as_deref()).await,
                Err(e) => Err(e),
            };
            match outcome {
                Ok(()) => break Ok(()),
                Err(Failed::Brain(e)) => break Err(e),
                Err(Failed::Died(why)) => {
                    slot.conn = None;
                    warn!(why, retried, "the ACP agent stopped during the turn");
                    if retried {
                        break Err(BrainError::Agent(format!("the agent stopped twice: {why}")));
                    }
                    retried = true;
                    io.notice(format!(
                        "The agent stopped ({why}); it is starting again and your message runs once more."
                    ))
                    .await?;
                }
            }
        };
        slot.last_used = Some(Instant::now());
        if rerun {
            io.notice(decide::RERUN_NOTICE).await?;
        }
        result
    }
}

impl Brain for Acp {
    fn run_turn<'a>(
        &'a self,
        input: &'a TurnInput,
        io: &'a mut TurnIo,
    ) -> BoxFuture<'a, Result<(), BrainError>> {
        Box::pin(self.run(input, io))
    }
}

/// An agent that cannot be started or open its session fails the turn at once: running it
/// again would fail the same way.
fn start_failed(e: ConnError) -> Failed {
    warn!(cause = %e, "the ACP agent could not start");
    Failed::Brain(BrainError::Agent(match e {
        ConnError::Spawn(_) => e.to_string(),
        _ => format!("the agent could not start: {e}"),
    }))
}

/// The turn's pictures as image blocks' data: (path, base64, MIME type).
async fn pictures(io: &TurnIo, turn: &crate::store::TurnRecord) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for path in &turn.attachments {
        let Some(info) = turn.attachment_info.get(path) else {
            continue;
        };
        if !matches!(
            info.mime.as_str(),
            "image/png" | "image/jpeg" | "image/gif" | "image/webp"
        ) {
            continue;
        }
        match io.picture(path, info.inode).await {
            Some((data, mime)) => out.push((path.as_str().to_owned(), data, mime)),
            None => continue,
        }
    }
    out
}

/// Tool calls seen in this turn and not yet reported finished.
#[derive(Default)]
struct Tools {
    open: HashSet<String>,
    finished: HashSet<String>,
}

impl Tools {
    /// Reports the calls the agent never said were finished (some agents do not).
    async fn close_all(&mut self, io: &mut TurnIo) -> Result<(), Failed> {
        for id in std::mem::take(&mut self.open) {
            io.tool_finished(&id, true, "").await?;
        }
        Ok(())
    }
}

/// Acts on one update.
async fn apply(u: Update, io: &mut TurnIo, tools: &mut Tools) -> Result<(), Failed> {
    match u {
        Update::Text(text) => io.say(text).await?,
        Update::Plan(entries) => io.notice(decide::plan_text(&entries)).await?,
        Update::Tool(call) => tool_update(call, io, tools).await?,
    }
    Ok(())
}

async fn tool_update(call: ToolCall, io: &mut TurnIo, tools: &mut Tools) -> Result<(), Failed> {
    let id = call.tool_call_id.clone();
    if tools.finished.contains(&id) {
        return Ok(());
    }
    if !tools.open.contains(&id) {
        let title = call.title.clone().unwrap_or_else(|| "a tool".to_owned());
        let input = call
            .raw_input
            .as_ref()
            .map(|v| v.to_string())
            .unwrap_or_default();
        io.tool_started(&id, &title, &input).await?;
        tools.open.insert(id.clone());
    }
    if let Some(status @ ("completed" | "failed")) = call.status.as_deref() {
        tools.open.remove(&id);
        tools.finished.insert(id.clone());
        io.tool_finished(&id, status == "completed", "").await?;
    }
    Ok(())
}

/// Answers a permission request by policy, asking the user when it says so; the option id
/// chosen (`None`: cancelled).
async fn permit(io: &mut TurnIo, p: &Permission) -> Result<Option<String>, Failed> {
    let kind = p.tool_call.kind.as_deref();
    let tool = decide::policy_key(kind);
    let title = p
        .tool_call
        .title
        .clone()
        .unwrap_or_else(|| "a tool call".to_owned());
    let resource = p
        .tool_call
        .raw_input
        .as_ref()
        .and_then(|v| v.get("path").and_then(|p| p.as_str()).map(str::to_owned))
        .unwrap_or_else(|| title.clone());
    let allowed = match io.permit_acp(&tool, resource, &title).await {
        Ok(()) => true,
        Err(crate::tools::ToolError::Disconnected) => {
            return Err(Failed::Brain(BrainError::Disconnected));
        }
        Err(e) => {
            info!(tool, reason = %e, "ACP permission refused");
            false
        }
    };
    Ok(decide::option_for(allowed, &p.options))
}

/// Closes sessions idle longer than `idle`, until the brain is gone.
async fn reap(slots: Weak<Slots>, idle: Duration) {
    let mut tick = tokio::time::interval(REAP_EVERY.min(idle));
    loop {
        tick.tick().await;
        let Some(slots) = slots.upgrade() else {
            return;
        };
        let all: Vec<_> = slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        for slot in all {
            if let Ok(mut s) = slot.try_lock_owned()
                && s.conn.is_some()
                && s.last_used.is_some_and(|t| t.elapsed() >= idle)
            {
                info!(session = ?s.session, "closing an idle ACP session");
                s.conn = None;
            }
        }
    }
}
