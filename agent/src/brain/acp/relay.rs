//! Our tools for an ACP agent: `send_file` (a file the agent made reaches the room as native
//! media) and `ask_user`, offered as an MCP server in `session/new`.
//!
//! The MCP server is the agent binary itself (`agent __acp-tools <socket>`, [`relay_main`]),
//! which the ACP agent starts on stdio. It relays each call over a Unix socket in a private
//! folder (0700) of the agent worker ([`ToolSocket`]), with a per-process token; the worker runs
//! it in the running turn, through the registry: the chat's confinement, `AGENT_TOOL_POLICY`,
//! approvals and the surface's delivery report, as for any other brain.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use rmcp::ServerHandler;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, warn};

use super::event::Event;

/// The hidden first argument that makes the agent binary the relay.
pub const RELAY_ARG: &str = "__acp-tools";

/// The variable carrying the relay's token.
const TOKEN_VAR: &str = "MXBRIDGE_ACP_TOOLS_TOKEN";

/// The tools relayed, by their registry names.
pub const RELAYED: &[&str] = &["send_file", "ask_user"];

/// Longest request or answer line on the socket.
const MAX_LINE: usize = 1024 * 1024;

/// One call, relay to worker.
#[derive(Debug, Serialize, Deserialize)]
struct Call {
    token: String,
    tool: String,
    arguments: String,
}

/// Its outcome, worker to relay.
#[derive(Debug, Serialize, Deserialize)]
struct Outcome {
    ok: bool,
    output: String,
}

/// The worker's end: a socket that turns calls into [`Event::Tool`]s.
pub struct ToolSocket {
    dir: PathBuf,
    path: PathBuf,
    token: String,
    task: tokio::task::JoinHandle<()>,
}

impl ToolSocket {
    /// Listens in a new private folder; calls go to `events` while the connection lives.
    pub fn open(events: mpsc::WeakSender<Event>) -> std::io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt as _;
        let token = hex::encode(rand::random::<[u8; 16]>());
        let dir = std::env::temp_dir().join(format!("mxbridge-acp-{}", &token[..12]));
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        let path = dir.join("tools.sock");
        let listener = UnixListener::bind(&path)?;
        let task = tokio::spawn(accept(listener, events, token.clone()));
        Ok(Self {
            dir,
            path,
            token,
            task,
        })
    }

    /// The MCP server entry for `session/new` (stdio: this binary as the relay).
    pub fn mcp_server(&self) -> serde_json::Value {
        let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("agent"));
        serde_json::json!({
            "name": "mxbridge",
            "command": exe,
            "args": [RELAY_ARG, self.path],
            "env": [{"name": TOKEN_VAR, "value": self.token}],
        })
    }
}

impl std::fmt::Debug for ToolSocket {
    /// Without the token.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolSocket")
            .field("path", &self.path)
            .finish()
    }
}

impl Drop for ToolSocket {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn accept(listener: UnixListener, events: mpsc::WeakSender<Event>, token: String) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        tokio::spawn(serve_call(stream, events.clone(), token.clone()));
    }
}

async fn serve_call(stream: UnixStream, events: mpsc::WeakSender<Event>, token: String) {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    let mut reader = BufReader::new(read.take(MAX_LINE as u64));
    if reader.read_line(&mut line).await.is_err() {
        return;
    }
    let outcome = match serde_json::from_str::<Call>(&line) {
        Ok(call) if call.token == token && RELAYED.contains(&call.tool.as_str()) => {
            run(call, &events).await
        }
        Ok(call) => {
            warn!(tool = %super::wire::shown_within(&call.tool, 64), "a relayed tool call was refused (token or tool)");
            Outcome {
                ok: false,
                output: "refused".to_owned(),
            }
        }
        Err(e) => Outcome {
            ok: false,
            output: format!("not a call: {e}"),
        },
    };
    let mut answer = serde_json::to_string(&outcome).unwrap_or_default();
    answer.push('\n');
    let _ = write.write_all(answer.as_bytes()).await;
}

async fn run(call: Call, events: &mpsc::WeakSender<Event>) -> Outcome {
    let (tx, rx) = oneshot::channel();
    let Some(events) = events.upgrade() else {
        return Outcome {
            ok: false,
            output: "the agent's connection has ended".to_owned(),
        };
    };
    if events
        .send(Event::Tool(call.tool, call.arguments, tx))
        .await
        .is_err()
    {
        return Outcome {
            ok: false,
            output: "no turn is running".to_owned(),
        };
    }
    drop(events);
    match rx.await {
        Ok((ok, output)) => Outcome { ok, output },
        Err(_) => Outcome {
            ok: false,
            output: "the turn ended before the call ran".to_owned(),
        },
    }
}

/// `agent __acp-tools <socket>`: an MCP server on stdio relaying [`RELAYED`] to the worker.
pub fn relay_main() -> ExitCode {
    let Some(socket) = std::env::args_os().nth(2).map(PathBuf::from) else {
        eprintln!("usage: agent {RELAY_ARG} <socket>");
        return ExitCode::FAILURE;
    };
    let token = std::env::var(TOKEN_VAR).unwrap_or_default();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("agent {RELAY_ARG}: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let relay = Relay {
            socket: Arc::new(socket),
            token: Arc::new(token),
            tools: Arc::new(tools()),
        };
        let service = match rmcp::serve_server(relay, rmcp::transport::stdio()).await {
            Ok(s) => s,
            Err(e) => {
                eprintln!("agent {RELAY_ARG}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let _ = service.waiting().await;
        ExitCode::SUCCESS
    })
}

/// The relayed tools as MCP tools, their schemas the registry's.
fn tools() -> Vec<Tool> {
    let registry = crate::tools::Registry::new(crate::config::default_policies());
    registry
        .specs()
        .into_iter()
        .filter(|s| RELAYED.contains(&s.name.as_str()))
        .map(|s| {
            let description = match s.name.as_str() {
                "send_file" => "Send a file to the chat as a native attachment (the people in \
                                the chat see it). path: absolute, or relative to your working \
                                directory."
                    .to_owned(),
                _ => s.description,
            };
            let schema = match s.parameters {
                serde_json::Value::Object(o) => o,
                _ => serde_json::Map::new(),
            };
            Tool::new(s.name, description, schema)
        })
        .collect()
}

#[derive(Clone)]
struct Relay {
    socket: Arc<PathBuf>,
    token: Arc<String>,
    tools: Arc<Vec<Tool>>,
}

impl ServerHandler for Relay {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, rmcp::ErrorData> {
        Ok(ListToolsResult {
            tools: (*self.tools).clone(),
            ..Default::default()
        })
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, rmcp::ErrorData> {
        let arguments = request
            .arguments
            .map(|a| serde_json::Value::Object(a).to_string())
            .unwrap_or_else(|| "{}".to_owned());
        let call = Call {
            token: (*self.token).clone(),
            tool: request.name.to_string(),
            arguments,
        };
        let outcome = relay(&self.socket, &call)
            .await
            .unwrap_or_else(|e| Outcome {
                ok: false,
                output: format!("the agent worker cannot be reached: {e}"),
            });
        let content = vec![ContentBlock::text(outcome.output)];
        Ok(CallToolResponse::Complete(if outcome.ok {
            CallToolResult::success(content)
        } else {
            CallToolResult::error(content)
        }))
    }
}

async fn relay(socket: &Path, call: &Call) -> std::io::Result<Outcome> {
    let stream = UnixStream::connect(socket).await?;
    let (read, mut write) = stream.into_split();
    let mut line = serde_json::to_string(call)?;
    line.push('\n');
    write.write_all(line.as_bytes()).await?;
    let mut answer = String::new();
    BufReader::new(read.take(MAX_LINE as u64))
        .read_line(&mut answer)
        .await?;
    debug!(bytes = answer.len(), "relayed tool call answered");
    serde_json::from_str(&answer).map_err(std::io::Error::other)
}
