//! The MCP servers the operator configured, as a source of tools: started in the background
//! (at the agent's start, and again when needed), their tool lists cached per connection,
//! every call bounded by `AGENT_MCP_TIMEOUT`. A server that exits, breaks the connection or
//! does not answer in time costs that call only (a clear error for the brain); it is started
//! again when next needed. Listing the tools of a turn never waits: a server that is starting,
//! or failed to, is left out of that turn (only a call of one of its tools waits for its
//! start), so a hostile or broken server cannot stall other chats. Whatever a server names is
//! logged through [`shown`]. The SDK (rmcp) stays behind [`McpClient`] in
//! `tools/mcp/client`, since its API changes often.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex, MutexGuard};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use protocol::ChatId;
use serde_json::{Map, Value};
use tracing::{info, warn};

use super::client::{self, ClientError, McpClient, McpTool, shown, shown_within};
use crate::config::{MCP_SEPARATOR, McpConfig, McpServerConfig};

/// After a server failed to start, calls fail at once for this long instead of trying again
/// (a model request per turn would otherwise wait for a dead server every time).
const RETRY_AFTER: Duration = Duration::from_secs(10);

/// Starting a server (spawning it, the handshake, listing its tools) may take at least this
/// long, however short `AGENT_MCP_TIMEOUT` is: an interpreter starting up is not a hung call.
const MIN_START_TIMEOUT: Duration = Duration::from_secs(30);

/// Most MCP tools offered to the model in one turn, all servers together: every tool's schema
/// rides along with every model request, so a server offering thousands would make each
/// request megabytes long.
pub const MAX_TOOLS_PER_TURN: usize = 128;

/// Longest tool name OpenAI-compatible servers accept.
const MAX_TOOL_NAME: usize = 64;

/// Most characters of a call's result passed on to the brain.
const MAX_RESULT_CHARS: usize = 100_000;

/// Why an MCP tool could not be used. The message goes to the brain (and the room): it names
/// the server, never a token.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// No configured server has this name, or this chat may not use it.
    #[error("no MCP server {0:?} for this chat")]
    UnknownServer(String),
    /// The server has no tool by this name.
    #[error("the MCP server {server:?} has no tool {tool:?}")]
    UnknownTool {
        /// The server.
        server: String,
        /// The tool name asked for.
        tool: String,
    },
    /// The server could not be started or reached, or failed the handshake.
    #[error("the MCP server {server:?} could not be started: {reason}")]
    Unavailable {
        /// The server.
        server: String,
        /// Why.
        reason: String,
    },
    /// The server did not answer in time; it is restarted on the next call.
    #[error(
        "the MCP server {server:?} did not answer within {}, so the call was abandoned; \
         the server is restarted on the next call",
        humantime::format_duration(*after)
    )]
    Timeout {
        /// The server.
        server: String,
        /// The limit (`AGENT_MCP_TIMEOUT`).
        after: Duration,
    },
    /// The connection broke during the call; it is made again on the next call.
    #[error(
        "the MCP server {server:?} went away during the call ({reason}); it is restarted on the next call"
    )]
    Gone {
        /// The server.
        server: String,
        /// What the transport said.
        reason: String,
    },
    /// The server refused the call, or the tool reported an error.
    #[error("the MCP tool {tool} failed: {reason}")]
    Failed {
        /// The tool (registry name).
        tool: String,
        /// The server's message.
        reason: String,
    },
}

/// A server's tools under their registry names (`server__tool`).
type Tools = Arc<BTreeMap<String, McpTool>>;

/// A started server: its connection and the tools it listed.
#[derive(Clone)]
struct Live {
    client: Arc<dyn McpClient>,
    tools: Tools,
}

/// The end of a start: the connection, or why there is none.
type Started = Result<Live, String>;

/// Where a server stands. Changed under a plain mutex that is never held across I/O: a
/// start runs in its own task, and whoever needs its outcome awaits `Starting`'s future.
enum State {
    /// Not started yet, or dropped after a call hung or broke the connection.
    Idle,
    /// A task is starting it; the future resolves when the start ends (shared by every
    /// caller that waits for it).
    Starting(Shared<BoxFuture<'static, Started>>),
    /// Started.
    Live(Live),
    /// Starting last failed, at `at`.
    Failed { at: Instant, reason: String },
}

/// What a caller gets to see of a server's state, the lock released.
enum Now {
    Live(Live),
    Starting(Shared<BoxFuture<'static, Started>>),
    Failed(String),
}

struct Server {
    config: McpServerConfig,
    state: StdMutex<State>,
    /// How many of its tools were last left out of a turn's list (logged when it changes).
    dropped: AtomicUsize,
}

impl Server {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The configured MCP servers and their connections. One per agent, shared by every chat.
pub struct Hub {
    servers: BTreeMap<String, Arc<Server>>,
    timeout: Duration,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub")
            .field("servers", &self.servers.keys().collect::<Vec<_>>())
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Hub {
    /// The servers of `config`, none connected yet.
    pub fn new(config: &McpConfig) -> Self {
        let servers = config
            .servers
            .iter()
            .map(|(name, c)| {
                let server = Server {
                    config: c.clone(),
                    state: StdMutex::new(State::Idle),
                    dropped: AtomicUsize::new(0),
                };
                (name.clone(), Arc::new(server))
            })
            .collect();
        Self {
            servers,
            timeout: config.timeout,
        }
    }

    /// Starts every server in the background (the agent does this at its own start, so
    /// that the first turns find them ready). Must run within a Tokio runtime.
    pub fn start_all(&self) {
        for server in self.servers.values() {
            let _ = self.now(server);
        }
    }

    /// Whether `name` has the form of an MCP tool of a configured server (`server__tool`).
    pub fn owns(&self, name: &str) -> bool {
        self.server_of(name).is_some()
    }

    fn server_of(&self, name: &str) -> Option<&Arc<Server>> {
        let (server, tool) = name.split_once(MCP_SEPARATOR)?;
        self.servers.get(server).filter(|_| !tool.is_empty())
    }

    /// The tools `chat` may use, by registry name, from every server that is running now, at
    /// most [`MAX_TOOLS_PER_TURN`] in all. Never waits: a server still starting, or one that
    /// failed to start, is left out (and started in the background when it is time to try
    /// again), so a slow server never holds up a turn.
    pub async fn tools(&self, chat: &ChatId) -> Vec<(String, McpTool)> {
        let mut all = Vec::new();
        for server in self.servers.values().filter(|s| s.config.serves(chat)) {
            let Now::Live(live) = self.now(server) else {
                continue;
            };
            let room = MAX_TOOLS_PER_TURN.saturating_sub(all.len());
            let dropped = live.tools.len().saturating_sub(room);
            if server.dropped.swap(dropped, Ordering::Relaxed) != dropped && dropped > 0 {
                warn!(
                    server = %server.config.name,
                    offered = live.tools.len(),
                    dropped,
                    limit = MAX_TOOLS_PER_TURN,
                    "MCP server offers more tools than a turn may carry; the rest are left out"
                );
            }
            all.extend(
                live.tools
                    .iter()
                    .take(room)
                    .map(|(n, t)| (n.clone(), t.clone())),
            );
        }
        all
    }

    /// The tool `name` (`server__tool`) as `chat` may use it, waiting for its server to start
    /// if needed (only this caller waits).
    pub async fn tool(&self, chat: &ChatId, name: &str) -> Result<McpTool, McpError> {
        let server = self.server_for(chat, name)?;
        let live = self.connected(server).await?;
        live.tools
            .get(name)
            .cloned()
            .ok_or_else(|| McpError::UnknownTool {
                server: server.config.name.clone(),
                tool: name.to_owned(),
            })
    }

    fn server_for(&self, chat: &ChatId, name: &str) -> Result<&Arc<Server>, McpError> {
        self.server_of(name)
            .filter(|s| s.config.serves(chat))
            .ok_or_else(|| {
                let server = name.split_once(MCP_SEPARATOR).map_or(name, |(s, _)| s);
                McpError::UnknownServer(server.to_owned())
            })
    }

    /// Calls the tool `name` (`server__tool`) with `args`; the text of its result.
    pub async fn call(
        &self,
        chat: &ChatId,
        name: &str,
        args: Map<String, Value>,
    ) -> Result<String, McpError> {
        let server = self.server_for(chat, name)?;
        let server_name = &server.config.name;
        let Live { client, tools } = self.connected(server).await?;
        let tool = tools.get(name).ok_or_else(|| McpError::UnknownTool {
            server: server_name.clone(),
            tool: name.to_owned(),
        })?;
        let outcome = tokio::time::timeout(self.timeout, client.call(&tool.name, args)).await;
        let broken = |reason: String| McpError::Gone {
            server: server_name.clone(),
            reason,
        };
        let result = match outcome {
            Err(_) => Err(McpError::Timeout {
                server: server_name.clone(),
                after: self.timeout,
            }),
            Ok(Err(ClientError::Broken(reason))) => Err(broken(reason)),
            Ok(Err(ClientError::Refused(reason))) => Err(McpError::Failed {
                tool: name.to_owned(),
                reason,
            }),
            Ok(Ok((text, true))) => Err(McpError::Failed {
                tool: name.to_owned(),
                reason: cap(text),
            }),
            Ok(Ok((text, false))) => Ok(cap(text)),
        };
        if matches!(
            result,
            Err(McpError::Timeout { .. } | McpError::Gone { .. })
        ) {
            // A hung or broken server is dropped (a child process is killed with it) and
            // started afresh when next needed.
            let mut state = server.state();
            if matches!(&*state, State::Live(l) if Arc::ptr_eq(&l.client, &client)) {
                info!(server = %server_name, "MCP server dropped after a hung or broken call");
                *state = State::Idle;
            }
        }
        result
    }

    /// The server's live connection, waiting for its start (begun now if needed) to end.
    async fn connected(&self, server: &Arc<Server>) -> Result<Live, McpError> {
        let unavailable = |reason| McpError::Unavailable {
            server: server.config.name.clone(),
            reason,
        };
        match self.now(server) {
            Now::Live(live) => Ok(live),
            Now::Failed(reason) => Err(unavailable(reason)),
            Now::Starting(start) => start.await.map_err(unavailable),
        }
    }

    /// Where `server` stands, starting it in the background when it is not running and not
    /// waiting out [`RETRY_AFTER`]. Never waits.
    fn now(&self, server: &Arc<Server>) -> Now {
        let name = &server.config.name;
        let mut state = server.state();
        match &*state {
            State::Live(live) if !live.client.is_closed() => return Now::Live(live.clone()),
            State::Live(_) => {
                info!(server = %name, "MCP server connection ended; starting it again")
            }
            State::Starting(start) => return Now::Starting(start.clone()),
            State::Failed { at, reason } if at.elapsed() < RETRY_AFTER => {
                return Now::Failed(reason.clone());
            }
            State::Failed { .. } | State::Idle => {}
        }
        info!(server = %name, "MCP server starting");
        let task = tokio::spawn(start_server(
            server.clone(),
            self.timeout.max(MIN_START_TIMEOUT),
        ));
        let start: BoxFuture<'static, Started> = Box::pin(async move {
            task.await
                .unwrap_or_else(|e| Err(format!("the start was abandoned ({e})")))
        });
        let start = start.shared();
        *state = State::Starting(start.clone());
        Now::Starting(start)
    }
}

/// Starts `server` within `limit` (spawning it, the handshake, listing its tools) and records
/// the outcome in its state, logging the change once.
async fn start_server(server: Arc<Server>, limit: Duration) -> Started {
    let name = &server.config.name;
    let attempt = async {
        let client = client::connect(&server.config).await?;
        let tools = client.list_tools().await.map_err(|e| e.to_string())?;
        Ok::<_, String>((client, tools))
    };
    let started = match tokio::time::timeout(limit, attempt).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "no answer within {}",
            humantime::format_duration(limit)
        )),
    };
    let started = started.map(|(client, tools)| Live {
        client,
        tools: Arc::new(registry_names(name, tools)),
    });
    let mut state = server.state();
    match &started {
        Ok(live) => {
            info!(server = %name, tools = live.tools.len(), "MCP server connected");
            server.dropped.store(0, Ordering::Relaxed);
            *state = State::Live(live.clone());
        }
        Err(reason) => {
            warn!(
                server = %name,
                error = %shown_within(reason, 600),
                "MCP server could not be started; its tools are left out"
            );
            *state = State::Failed {
                at: Instant::now(),
                reason: reason.clone(),
            };
        }
    }
    started
}

/// The registry names of a server's tools: `server__tool`, with every character an
/// OpenAI-compatible server refuses in a tool name replaced by `_`. Tools whose name is too
/// long, or the same as an earlier one's after the replacement, are left out (and logged).
fn registry_names(server: &str, tools: Vec<McpTool>) -> BTreeMap<String, McpTool> {
    let mut names = BTreeMap::new();
    let mut taken = BTreeSet::new();
    for tool in tools {
        let safe: String = tool
            .name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let name = format!("{server}{MCP_SEPARATOR}{safe}");
        if safe.is_empty() || name.len() > MAX_TOOL_NAME || !taken.insert(name.clone()) {
            warn!(server, tool = %shown(&tool.name), "MCP tool left out: its name is empty, too long or taken");
            continue;
        }
        names.insert(name, tool);
    }
    names
}

/// Cuts a result to [`MAX_RESULT_CHARS`], marking the cut.
fn cap(text: String) -> String {
    if text.chars().count() <= MAX_RESULT_CHARS {
        return text;
    }
    let mut out: String = text.chars().take(MAX_RESULT_CHARS).collect();
    out.push_str("\n… (cut: the result was longer)");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> McpTool {
        McpTool {
            name: name.to_owned(),
            description: String::new(),
            schema: serde_json::json!({"type": "object"}),
        }
    }

    #[test]
    fn registry_names_are_safe_for_openai_and_unique() {
        let long = "x".repeat(70);
        let names = registry_names(
            "demo",
            vec![
                tool("echo"),
                tool("fs.read"),
                tool("fs/read"),
                tool(&long),
                tool(""),
            ],
        );
        let keys: Vec<&str> = names.keys().map(String::as_str).collect();
        assert_eq!(keys, ["demo__echo", "demo__fs_read"]);
        assert_eq!(names["demo__fs_read"].name, "fs.read");
    }

    #[test]
    fn names_belong_to_configured_servers() {
        let mut config = McpConfig::default();
        let servers = crate::config::Config::from_lookup(|k| match k {
            "AGENT_TOKEN" => Some("0123456789abcdef".into()),
            "AGENT_MCP_SERVERS" => Some("demo=stdio:true".into()),
            _ => None,
        })
        .unwrap()
        .mcp
        .servers;
        config.servers = servers;
        let hub = Hub::new(&config);
        assert!(hub.owns("demo__echo"));
        assert!(!hub.owns("demo__"));
        assert!(!hub.owns("other__echo"));
        assert!(!hub.owns("read_file"));
    }
}
