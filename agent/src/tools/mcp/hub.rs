//! The MCP servers the operator configured, as a source of tools: connected on first use,
//! their tool lists cached per connection, every call bounded by `AGENT_MCP_TIMEOUT`. A server
//! that exits, breaks the connection or does not answer in time costs that call only (a clear
//! error for the brain); it is started again on the next call. The SDK (rmcp) stays behind
//! [`McpClient`] in `tools/mcp/client`, since its API changes often.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use protocol::ChatId;
use serde_json::{Map, Value};
use tokio::sync::Mutex;
use tracing::{info, warn};

use crate::config::{MCP_SEPARATOR, McpConfig, McpServerConfig};

/// After a server failed to start, calls fail at once for this long instead of trying again
/// (a model request per turn would otherwise wait for a dead server every time).
const RETRY_AFTER: Duration = Duration::from_secs(10);

/// Starting a server (spawning it, the handshake, listing its tools) may take at least this
/// long, however short `AGENT_MCP_TIMEOUT` is: an interpreter starting up is not a hung call.
const MIN_START_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest tool name OpenAI-compatible servers accept.
const MAX_TOOL_NAME: usize = 64;

/// Most characters of a call's result passed on to the brain.
const MAX_RESULT_CHARS: usize = 100_000;

/// A tool an MCP server offers, as it described it.
#[derive(Debug, Clone)]
pub struct McpTool {
    /// Its name on the server.
    pub name: String,
    /// What it does (empty when the server says nothing).
    pub description: String,
    /// The JSON schema of its arguments.
    pub schema: Value,
}

/// Why a client request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The connection is broken (the process exited, the HTTP server went away): it is
    /// dropped and made again on the next call.
    #[error("{0}")]
    Broken(String),
    /// The server answered with an error; the connection is fine.
    #[error("{0}")]
    Refused(String),
}

/// A connected MCP server. The only view the rest of the agent has of the MCP SDK.
pub trait McpClient: Send + Sync {
    /// Every tool the server offers.
    fn list_tools(&self) -> BoxFuture<'_, Result<Vec<McpTool>, ClientError>>;
    /// Calls `tool`; the text of its result, and whether the tool reported an error.
    fn call<'a>(
        &'a self,
        tool: &'a str,
        args: Map<String, Value>,
    ) -> BoxFuture<'a, Result<(String, bool), ClientError>>;
    /// Whether the connection has ended.
    fn is_closed(&self) -> bool;
}

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

struct Live {
    client: Arc<dyn McpClient>,
    tools: Tools,
}

#[derive(Default)]
struct Conn {
    live: Option<Live>,
    /// When starting last failed, and why.
    failed: Option<(Instant, String)>,
}

struct Server {
    config: McpServerConfig,
    conn: Mutex<Conn>,
}

/// The configured MCP servers and their connections. One per agent, shared by every chat.
pub struct Hub {
    servers: BTreeMap<String, Server>,
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
                    conn: Mutex::default(),
                };
                (name.clone(), server)
            })
            .collect();
        Self {
            servers,
            timeout: config.timeout,
        }
    }

    /// Whether `name` has the form of an MCP tool of a configured server (`server__tool`).
    pub fn owns(&self, name: &str) -> bool {
        self.server_of(name).is_some()
    }

    fn server_of(&self, name: &str) -> Option<&Server> {
        let (server, tool) = name.split_once(MCP_SEPARATOR)?;
        self.servers.get(server).filter(|_| !tool.is_empty())
    }

    /// The tools `chat` may use, by registry name, from every server that can be reached (the
    /// others are logged and left out).
    pub async fn tools(&self, chat: &ChatId) -> Vec<(String, McpTool)> {
        let mut all = Vec::new();
        for server in self.servers.values().filter(|s| s.config.serves(chat)) {
            match self.connected(server).await {
                Ok((_, tools)) => all.extend(tools.iter().map(|(n, t)| (n.clone(), t.clone()))),
                Err(e) => warn!(server = %server.config.name, error = %e, "MCP tools left out"),
            }
        }
        all
    }

    /// The tool `name` (`server__tool`) as `chat` may use it, connecting its server if needed.
    pub async fn tool(&self, chat: &ChatId, name: &str) -> Result<McpTool, McpError> {
        let server = self.server_for(chat, name)?;
        let (_, tools) = self.connected(server).await?;
        tools
            .get(name)
            .cloned()
            .ok_or_else(|| McpError::UnknownTool {
                server: server.config.name.clone(),
                tool: name.to_owned(),
            })
    }

    fn server_for(&self, chat: &ChatId, name: &str) -> Result<&Server, McpError> {
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
        let (client, tools) = self.connected(server).await?;
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
            // started afresh on the next call.
            let mut conn = server.conn.lock().await;
            if conn
                .live
                .as_ref()
                .is_some_and(|l| Arc::ptr_eq(&l.client, &client))
            {
                conn.live = None;
            }
        }
        result
    }

    /// The server's live connection and tools, connecting (and listing its tools) first when
    /// there is none.
    async fn connected(&self, server: &Server) -> Result<(Arc<dyn McpClient>, Tools), McpError> {
        let name = &server.config.name;
        let mut conn = server.conn.lock().await;
        if let Some(live) = &conn.live {
            if !live.client.is_closed() {
                return Ok((live.client.clone(), live.tools.clone()));
            }
            info!(server = %name, "MCP server connection ended; starting it again");
            conn.live = None;
        }
        if let Some((at, reason)) = &conn.failed
            && at.elapsed() < RETRY_AFTER
        {
            return Err(McpError::Unavailable {
                server: name.clone(),
                reason: reason.clone(),
            });
        }
        let start = async {
            let client = super::client::connect(&server.config).await?;
            let tools = client.list_tools().await.map_err(|e| e.to_string())?;
            Ok::<_, String>((client, tools))
        };
        let limit = self.timeout.max(MIN_START_TIMEOUT);
        let started = match tokio::time::timeout(limit, start).await {
            Ok(r) => r,
            Err(_) => Err(format!(
                "no answer within {}",
                humantime::format_duration(limit)
            )),
        };
        match started {
            Ok((client, tools)) => {
                let tools = Arc::new(registry_names(name, tools));
                info!(server = %name, tools = tools.len(), "MCP server connected");
                conn.failed = None;
                conn.live = Some(Live {
                    client: client.clone(),
                    tools: tools.clone(),
                });
                Ok((client, tools))
            }
            Err(reason) => {
                warn!(server = %name, error = %reason, "MCP server could not be started");
                conn.failed = Some((Instant::now(), reason.clone()));
                Err(McpError::Unavailable {
                    server: name.clone(),
                    reason,
                })
            }
        }
    }
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
            warn!(server, tool = %tool.name, "MCP tool left out: its name is empty, too long or taken");
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
