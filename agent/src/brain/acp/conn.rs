//! One ACP agent process and its connection: the only module that uses the
//! `agent-client-protocol` crate (pinned exactly; its API changes with each major version).
//!
//! The process runs in the chat's own folder with a cleared environment (the basic variables
//! and the operator's `AGENT_ACP_ENV` only), in a process group of its own that is killed with
//! it. Its stdout is read line by line with a length limit; a line that is not JSON is logged
//! and skipped (some agents print a banner). What the agent sends us arrives as [`Event`]s, in
//! the order it sent them, with the prompt's end among them; `fs/*` requests are served here,
//! through the chat's confined workspace.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    CancelNotification, ClientCapabilities, ContentBlock, FileSystemCapabilities, Implementation,
    InitializeRequest, LoadSessionRequest, McpServer, NewSessionRequest, PromptRequest,
    ReadTextFileRequest, ReadTextFileResponse, RequestPermissionOutcome, RequestPermissionRequest,
    RequestPermissionResponse, SelectedPermissionOutcome, SessionNotification,
    WriteTextFileRequest, WriteTextFileResponse,
};
use agent_client_protocol::{Agent, Client, Lines};
use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncBufReadExt, AsyncRead};
use tokio::process::Child;
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::{FramedRead, FramedWrite, LinesCodec, LinesCodecError};
use tracing::{debug, info, warn};

use super::event::{Event, PromptFailed};
use super::relay::ToolSocket;
use super::wire::{self, Permission};
use crate::config::AcpConfig;
use crate::confine::ScopedWorkspace;

/// Environment variables every agent gets from ours (when set); `AGENT_ACP_ENV` adds more.
const BASIC_ENV: &[&str] = &[
    "PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "USER",
];

/// Longest line (one JSON-RPC message) read from an agent: a longer one ends the connection.
pub const MAX_LINE: usize = 8 * 1024 * 1024;

/// Events queued between the connection and the turn; a flood waits for the turn to read.
const EVENTS: usize = 256;

/// Characters of a skipped non-JSON line quoted in the log and in an error.
const QUOTED: usize = 120;

/// Most bytes `fs/read_text_file` returns.
const MAX_READ: u64 = 1024 * 1024;

/// What the agent said about itself in `initialize`.
#[derive(Debug, Clone, Default)]
pub struct AgentInfo {
    /// Its name (and version), for the log.
    pub name: String,
    /// It can resume a session (`loadSession`).
    pub load_session: bool,
    /// It takes image blocks in a prompt.
    pub images: bool,
}

/// Why the connection could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// The program could not be started.
    #[error("the agent could not be started: {0}")]
    Spawn(String),
    /// It did not answer in time (and what it printed instead, if anything).
    #[error("the agent did not answer {0} in time{1}")]
    Timeout(&'static str, String),
    /// It answered with an error, or the connection broke.
    #[error("{0}")]
    Protocol(String),
}

/// A running agent: its process, its connection and the events it sends.
pub struct Conn {
    cx: ConnectionTo<Agent>,
    /// Taken when the connection is dropped, to be reaped.
    child: Option<Child>,
    /// Ends the connection's driver (dropping it does too).
    _stop: oneshot::Sender<()>,
    /// The session whose updates reach [`Conn::events`].
    session: Arc<Mutex<Option<String>>>,
    /// What the agent sends.
    pub events: mpsc::Receiver<Event>,
    /// Why the connection ended, once it has.
    ended: Arc<OnceLock<String>>,
    /// The first line it printed that is not JSON, if any.
    noise: Arc<OnceLock<String>>,
    /// What it said about itself.
    pub info: AgentInfo,
    /// For the prompt's end; weak, so that [`Conn::events`] ends when the connection does.
    events_tx: mpsc::WeakSender<Event>,
    /// Our tools for the agent (`None` if the socket could not be opened).
    tools: Option<ToolSocket>,
}

/// Sends `session/cancel` when dropped while armed: a turn given up mid-prompt stops the agent.
pub struct Canceller {
    cx: ConnectionTo<Agent>,
    session: String,
    armed: bool,
}

impl Canceller {
    /// Cancels now.
    pub fn cancel(mut self) {
        self.send();
    }

    /// The prompt ended: nothing to cancel.
    pub fn disarm(mut self) {
        self.armed = false;
    }

    fn send(&mut self) {
        if std::mem::take(&mut self.armed) {
            info!(session = %self.session, "cancelling the agent's prompt");
            if let Err(e) = self
                .cx
                .send_notification(CancelNotification::new(self.session.clone()))
            {
                debug!(error = %e, "cannot send session/cancel");
            }
        }
    }
}

impl Drop for Canceller {
    fn drop(&mut self) {
        self.send();
    }
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn").field("info", &self.info).finish()
    }
}

impl Conn {
    /// Starts the agent in `cwd` and initializes the connection.
    pub async fn start(
        config: &AcpConfig,
        cwd: &Path,
        ws: ScopedWorkspace,
        root: PathBuf,
    ) -> Result<Self, ConnError> {
        let mut child = spawn(config, cwd)?;
        let (Some(stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(ConnError::Spawn("its pipes are missing".to_owned()));
        };
        tokio::spawn(drain_stderr(config.program.clone(), stderr));
        let ended = Arc::new(OnceLock::new());
        let noise = Arc::new(OnceLock::new());
        let incoming = lines(stdout, ended.clone(), noise.clone());
        let outgoing = SinkExt::<String>::sink_map_err(
            FramedWrite::new(stdin, LinesCodec::new()),
            |e: LinesCodecError| std::io::Error::other(e.to_string()),
        );
        let (events_tx, events) = mpsc::channel(EVENTS);
        let session = Arc::new(Mutex::new(None::<String>));
        let (cx_tx, cx_rx) = oneshot::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let handlers = Handlers {
            events: events_tx.clone(),
            session: session.clone(),
            ws,
            root,
        };
        let driver = handlers.client().connect_with(
            Lines::new(outgoing, incoming),
            async move |cx: ConnectionTo<Agent>| {
                let _ = cx_tx.send(cx);
                let _ = stopped.await;
                Ok(())
            },
        );
        let why = ended.clone();
        tokio::spawn(async move {
            if let Err(e) = driver.await {
                let _ = why.set(e.to_string());
            }
            let _ = why.set("the agent closed the connection".to_owned());
        });
        let cx = cx_rx
            .await
            .map_err(|_| ConnError::Protocol(reason(&ended)))?;
        let mut conn = Self {
            cx,
            child: Some(child),
            _stop: stop,
            session,
            events,
            ended,
            noise,
            info: AgentInfo::default(),
            events_tx: events_tx.downgrade(),
            tools: None,
        };
        conn.tools = ToolSocket::open(events_tx.downgrade())
            .inspect_err(|e| warn!(error = %e, "our tools cannot be offered to the ACP agent"))
            .ok();
        drop(events_tx);
        conn.info = conn.initialize(config.start_timeout).await?;
        Ok(conn)
    }

    async fn initialize(&mut self, limit: Duration) -> Result<AgentInfo, ConnError> {
        let caps = ClientCapabilities::new()
            .fs(FileSystemCapabilities::new()
                .read_text_file(true)
                .write_text_file(true))
            .terminal(false);
        let request = InitializeRequest::new(ProtocolVersion::V1)
            .client_capabilities(caps)
            .client_info(Implementation::new("mxbridge", env!("CARGO_PKG_VERSION")));
        let answer = self
            .call(
                "initialize",
                limit,
                self.cx.send_request(request).block_task(),
            )
            .await?;
        let caps = &answer.agent_capabilities;
        let name = answer
            .agent_info
            .as_ref()
            .map(|i| format!("{} {}", i.name, i.version))
            .unwrap_or_else(|| "an unnamed agent".to_owned());
        Ok(AgentInfo {
            name,
            load_session: caps.load_session,
            images: caps.prompt_capabilities.image,
        })
    }

    /// Waits for `fut`, at most `limit`, and names what failed.
    async fn call<T>(
        &self,
        what: &'static str,
        limit: Duration,
        fut: impl Future<Output = Result<T, agent_client_protocol::Error>>,
    ) -> Result<T, ConnError> {
        match tokio::time::timeout(limit, fut).await {
            Err(_) => Err(ConnError::Timeout(
                what,
                match self.noise.get() {
                    Some(line) => format!("; it printed text that is not JSON: {line:?}"),
                    None => String::new(),
                },
            )),
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(ConnError::Protocol(match self.ended.get() {
                Some(why) => why.clone(),
                None if agent_client_protocol::is_incoming_transport_closed(&e)
                    || agent_client_protocol::is_connection_terminated(&e) =>
                {
                    format!("it exited or closed its output before answering {what}")
                }
                None => format!(
                    "it answered {what} with an error: {}",
                    wire::shown(&e.message)
                ),
            })),
        }
    }

    /// The MCP servers offered with a session: ours (send_file, ask_user).
    fn mcp_servers(&self) -> Vec<McpServer> {
        self.tools
            .iter()
            .filter_map(|t| match serde_json::from_value(t.mcp_server()) {
                Ok(server) => Some(server),
                Err(e) => {
                    warn!(error = %e, "our MCP server entry is not valid ACP");
                    None
                }
            })
            .collect()
    }

    /// Opens a new session in `cwd`; its id.
    pub async fn new_session(&self, cwd: &Path, limit: Duration) -> Result<String, ConnError> {
        let request = NewSessionRequest::new(cwd).mcp_servers(self.mcp_servers());
        let answer = self
            .call(
                "session/new",
                limit,
                self.cx.send_request(request).block_task(),
            )
            .await?;
        let id = answer.session_id.to_string();
        self.follow(&id);
        Ok(id)
    }

    /// Resumes the session `id` (the agent replays it; that replay is not passed on).
    pub async fn load_session(
        &mut self,
        id: &str,
        cwd: &Path,
        limit: Duration,
    ) -> Result<(), ConnError> {
        let request = LoadSessionRequest::new(id.to_owned(), cwd).mcp_servers(self.mcp_servers());
        self.call(
            "session/load",
            limit,
            self.cx.send_request(request).block_task(),
        )
        .await?;
        self.follow(id);
        self.drain();
        Ok(())
    }

    /// Updates of `session` reach the events from now on.
    fn follow(&self, session: &str) {
        *self.session.lock().unwrap_or_else(|e| e.into_inner()) = Some(session.to_owned());
    }

    /// Drops events queued so far (a replayed session, a turn given up).
    pub fn drain(&mut self) {
        let mut dropped = 0_usize;
        while self.events.try_recv().is_ok() {
            dropped += 1;
        }
        if dropped > 0 {
            debug!(dropped, "earlier agent events dropped");
        }
    }

    /// Sends a prompt; its end arrives as [`Event::PromptDone`] after its updates.
    pub fn prompt(&self, session: &str, blocks: Vec<serde_json::Value>) -> Result<(), ConnError> {
        let blocks = blocks
            .into_iter()
            .map(serde_json::from_value::<ContentBlock>)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| ConnError::Protocol(format!("a prompt block is malformed: {e}")))?;
        let events = self
            .events_tx
            .upgrade()
            .ok_or_else(|| ConnError::Protocol(reason(&self.ended)))?;
        self.cx
            .send_request(PromptRequest::new(session.to_owned(), blocks))
            .on_receiving_result(async move |result| {
                let done = result.map(|r| wire::name_of(&r.stop_reason)).map_err(|e| {
                    if agent_client_protocol::is_incoming_transport_closed(&e)
                        || agent_client_protocol::is_connection_terminated(&e)
                    {
                        PromptFailed::Gone("the agent's connection closed".to_owned())
                    } else {
                        PromptFailed::Answered(wire::shown(&e.to_string()))
                    }
                });
                let _ = events.send(Event::PromptDone(done)).await;
                Ok(())
            })
            .map_err(|e| ConnError::Protocol(e.to_string()))
    }

    /// What cancels the prompt running in `session`.
    pub fn canceller(&self, session: &str) -> Canceller {
        Canceller {
            cx: self.cx.clone(),
            session: session.to_owned(),
            armed: true,
        }
    }

    /// Why the connection ended, if it has.
    pub fn ended(&self) -> Option<String> {
        self.ended.get().cloned()
    }

    /// The process id (for the log).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }
}

impl Drop for Conn {
    /// The agent and everything it started go with the connection.
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok())
            && let Some(pid) = rustix::process::Pid::from_raw(pid)
        {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
        // Reaped now, not whenever the runtime next notices a child exit: no zombie lingers.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = child.kill().await;
            });
        }
    }
}

/// Starts the program in its own process group (so that all it starts can be killed with it).
fn spawn(config: &AcpConfig, cwd: &Path) -> Result<Child, ConnError> {
    let mut command = tokio::process::Command::new(&config.program);
    command
        .args(&config.args)
        .current_dir(cwd)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    for var in BASIC_ENV
        .iter()
        .copied()
        .chain(config.pass_env.iter().map(String::as_str))
    {
        if let Some(value) = std::env::var_os(var) {
            command.env(var, value);
        }
    }
    let child = command
        .spawn()
        .map_err(|e| ConnError::Spawn(format!("{}: {e}", config.program)))?;
    info!(program = %config.program, pid = child.id(), cwd = %cwd.display(), "ACP agent started");
    Ok(child)
}

/// The agent's stdout as JSON lines. Other lines are skipped (some agents print a banner): the
/// first is kept in `noise` and logged, the rest counted at debug level. A line longer than
/// [`MAX_LINE`] ends the stream, with the reason in `ended`.
fn lines(
    stdout: impl AsyncRead + Send + 'static,
    ended: Arc<OnceLock<String>>,
    noise: Arc<OnceLock<String>>,
) -> impl futures_util::Stream<Item = std::io::Result<String>> + Send + 'static {
    let skipped = Arc::new(std::sync::atomic::AtomicU64::new(0));
    FramedRead::new(stdout, LinesCodec::new_with_max_length(MAX_LINE)).filter_map(move |line| {
        let (ended, noise, skipped) = (ended.clone(), noise.clone(), skipped.clone());
        async move {
            match line {
                Ok(line) if line.trim_start().starts_with('{') => Some(Ok(line)),
                Ok(line) if line.trim().is_empty() => None,
                Ok(line) => {
                    let n = skipped.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let shown = wire::shown_within(&line, QUOTED);
                    if n == 0 {
                        warn!(line = %shown, "the ACP agent printed a line that is not JSON; skipped (later ones are counted at debug level)");
                        let _ = noise.set(shown);
                    } else if n.is_power_of_two() {
                        debug!(skipped = n + 1, "lines of the ACP agent that are not JSON");
                    }
                    None
                }
                Err(LinesCodecError::MaxLineLengthExceeded) => {
                    let why = format!("the agent sent a message larger than {} MiB", MAX_LINE >> 20);
                    let _ = ended.set(why.clone());
                    Some(Err(std::io::Error::other(why)))
                }
                Err(LinesCodecError::Io(e)) => {
                    let _ = ended.set(format!("reading the agent's output failed: {e}"));
                    Some(Err(e))
                }
            }
        }
    })
}

/// The agent's stderr into our log (debug), line by line.
async fn drain_stderr(program: String, stderr: tokio::process::ChildStderr) {
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        debug!(program, line = %wire::shown_within(&line, 1024), "ACP agent stderr");
    }
}

fn reason(ended: &OnceLock<String>) -> String {
    ended
        .get()
        .cloned()
        .unwrap_or_else(|| "the connection to the agent ended".to_owned())
}

/// What the connection's handlers need.
#[derive(Clone)]
struct Handlers {
    events: mpsc::Sender<Event>,
    session: Arc<Mutex<Option<String>>>,
    ws: ScopedWorkspace,
    root: PathBuf,
}

impl Handlers {
    fn followed(&self, session: &str) -> bool {
        self.session
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_deref()
            == Some(session)
    }

    fn client(
        self,
    ) -> agent_client_protocol::v1::Builder<
        Client,
        impl agent_client_protocol::HandleDispatchFrom<Agent> + 'static,
    > {
        let (h1, h2, h3, h4) = (self.clone(), self.clone(), self.clone(), self);
        Client
            .v1()
            .on_receive_notification(
                async move |n: SessionNotification, _cx| {
                    if !h1.followed(&n.session_id.to_string()) {
                        return Ok(());
                    }
                    match serde_json::to_value(&n.update).map(wire::update) {
                        Ok(Some(update)) => {
                            let _ = h1.events.send(Event::Update(update)).await;
                        }
                        Ok(None) => {}
                        Err(e) => debug!(error = %e, "a session update could not be read"),
                    }
                    Ok(())
                },
                agent_client_protocol::on_receive_notification!(),
            )
            .on_receive_request(
                async move |r: RequestPermissionRequest, responder, _cx| {
                    let asked = serde_json::to_value(&r)
                        .ok()
                        .and_then(|v| serde_json::from_value::<Permission>(v).ok());
                    let (tx, rx) = oneshot::channel();
                    match asked {
                        Some(p) if h2.followed(&r.session_id.to_string()) => {
                            let _ = h2.events.send(Event::Permission(p, tx)).await;
                        }
                        _ => drop(tx),
                    }
                    // Answered later, off the dispatch loop (which must go on meanwhile).
                    tokio::spawn(async move {
                        let outcome = match rx.await {
                            Ok(Some(id)) => RequestPermissionOutcome::Selected(
                                SelectedPermissionOutcome::new(id),
                            ),
                            _ => RequestPermissionOutcome::Cancelled,
                        };
                        let _ = responder.respond(RequestPermissionResponse::new(outcome));
                    });
                    Ok(())
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                async move |r: ReadTextFileRequest, responder, _cx| {
                    let (ws, root) = (h3.ws.clone(), h3.root.clone());
                    let read = tokio::task::spawn_blocking(move || {
                        read_text(&ws, &root, &r.path, r.line, r.limit)
                    })
                    .await
                    .unwrap_or_else(|e| Err(e.to_string()));
                    match read {
                        Ok(text) => responder.respond(ReadTextFileResponse::new(text)),
                        Err(why) => responder.respond_with_error(
                            agent_client_protocol::Error::invalid_params().data(why),
                        ),
                    }
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                async move |r: WriteTextFileRequest, responder, _cx| {
                    let (ws, root) = (h4.ws.clone(), h4.root.clone());
                    let written = tokio::task::spawn_blocking(move || {
                        write_text(&ws, &root, &r.path, &r.content)
                    })
                    .await
                    .unwrap_or_else(|e| Err(e.to_string()));
                    match written {
                        Ok(()) => responder.respond(WriteTextFileResponse::new()),
                        Err(why) => responder.respond_with_error(
                            agent_client_protocol::Error::invalid_params().data(why),
                        ),
                    }
                },
                agent_client_protocol::on_receive_request!(),
            )
    }
}

/// `fs/read_text_file`: a file the chat may read, from 1-based `line`, at most `limit` lines.
fn read_text(
    ws: &ScopedWorkspace,
    root: &Path,
    path: &Path,
    line: Option<u32>,
    limit: Option<u32>,
) -> Result<String, String> {
    let rel = wire::in_workspace(root, path)?;
    let (bytes, _cut) = ws.read_prefix(&rel, MAX_READ).map_err(|e| e.to_string())?;
    let text = String::from_utf8(bytes).map_err(|_| format!("{rel} is not UTF-8 text"))?;
    Ok(wire::line_window(&text, line, limit))
}

/// `fs/write_text_file`: only below the chat's own folder.
fn write_text(ws: &ScopedWorkspace, root: &Path, path: &Path, content: &str) -> Result<(), String> {
    let rel = wire::in_workspace(root, path)?;
    ws.write_file(&rel, content.as_bytes())
        .map_err(|e| e.to_string())
}
