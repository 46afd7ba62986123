//! [`McpClient`], the rest of the agent's only view of a connected MCP server (and
//! [`shown`], how whatever a server names is logged), implemented over the rmcp SDK: a child
//! process on stdio (whose stdout the agent checks line by line before rmcp reads it: `stdio`),
//! or a streamable-HTTP server. Nothing else in the agent names rmcp.

mod stdio;

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use rmcp::model::{CallToolRequestParams, ContentBlock, PaginatedRequestParams};
use rmcp::service::{ClientInitializeError, RunningService, ServiceError};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Map, Value};
use tracing::{info, warn};

use crate::config::{McpServerConfig, McpTransport};

/// Most characters of a server-chosen name logged (see [`shown`]).
const MAX_SHOWN: usize = 80;

/// Pages of `tools/list` read at most: a server that hands out cursors forever is cut off.
const MAX_TOOL_PAGES: usize = 32;

/// Tools listed at most (across pages); more are left out. Far above what a turn offers
/// ([`super::hub::MAX_TOOLS_PER_TURN`]) but bounds what one server makes the agent hold.
const MAX_LISTED_TOOLS: usize = 4096;

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

struct Rmcp {
    /// The server's name in the agent's configuration.
    name: String,
    service: RunningService<RoleClient, ()>,
    /// Why a stdio server's stdout was cut off, once it was (see [`stdio`]).
    spoiled: Option<stdio::Spoiled>,
}

/// Starts or reaches the server and completes the MCP handshake.
pub(super) async fn connect(config: &McpServerConfig) -> Result<Arc<dyn McpClient>, String> {
    let mut spoiled = None;
    let service = match &config.transport {
        McpTransport::Stdio { program, args } => {
            let spawned = stdio::spawn(&config.name, program, args)?;
            spoiled = Some(spawned.spoiled.clone());
            match ().serve(spawned.transport).await {
                Ok(service) => service,
                Err(e) => {
                    // The child is gone with the transport: its stderr ends soon.
                    let _ = tokio::time::timeout(Duration::from_secs(2), spawned.stderr).await;
                    let mut why = spawned
                        .spoiled
                        .get()
                        .cloned()
                        .unwrap_or_else(|| init_error(&e));
                    if let Some(words) = stdio::last_words(&spawned.tail) {
                        why.push_str(&format!("; it said: {words}"));
                    }
                    return Err(why);
                }
            }
        }
        McpTransport::Http { url, token } => {
            let mut http = StreamableHttpClientTransportConfig::with_uri(url.as_str());
            if let Some(token) = token {
                http = http.auth_header(token.expose());
            }
            let transport = StreamableHttpClientTransport::<reqwest::Client>::from_config(http);
            ().serve(transport).await.map_err(|e| init_error(&e))?
        }
    };
    if let Some(peer) = service.peer_info()
        && let Some(info) = &peer.server_info
    {
        info!(
            server = %config.name,
            name = %shown(&info.name),
            version = %shown(&info.version),
            "MCP handshake done"
        );
    }
    Ok(Arc::new(Rmcp {
        name: config.name.clone(),
        service,
        spoiled,
    }))
}

/// Text a server chose (a tool name, its stderr, its own name), fit for a log line or an
/// error: control characters escaped, so a newline cannot start a forged log line, and at
/// most [`MAX_SHOWN`] characters, the cut marked.
pub(super) fn shown(text: &str) -> String {
    shown_within(text, MAX_SHOWN)
}

/// [`shown`] with its own length limit, in characters.
pub(crate) fn shown_within(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max + 8));
    for (i, c) in text.chars().enumerate() {
        if i == max {
            out.push('…');
            break;
        }
        if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}') {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Why the handshake failed, in words for the operator.
fn init_error(e: &ClientInitializeError) -> String {
    match e {
        ClientInitializeError::ConnectionClosed(_) => {
            "it closed the connection before the MCP handshake finished (did it exit?)".to_owned()
        }
        // Without the transport's type name, which says nothing to an operator.
        ClientInitializeError::TransportError { error, context } => {
            format!("{} ({context})", error.error)
        }
        other => other.to_string(),
    }
}

/// Whether a failed request leaves the connection unusable.
fn classify(e: ServiceError) -> ClientError {
    match e {
        ServiceError::McpError(e) => ClientError::Refused(e.message.to_string()),
        ServiceError::TransportSend(e) => ClientError::Broken(e.error.to_string()),
        other => ClientError::Broken(other.to_string()),
    }
}

impl Rmcp {
    /// [`classify`], naming the cause when the agent itself cut the connection off.
    fn failed(&self, e: ServiceError) -> ClientError {
        match (classify(e), self.spoiled.as_ref().and_then(|s| s.get())) {
            (ClientError::Broken(_), Some(why)) => ClientError::Broken(why.clone()),
            (other, _) => other,
        }
    }
}

impl McpClient for Rmcp {
    fn list_tools(&self) -> BoxFuture<'_, Result<Vec<McpTool>, ClientError>> {
        Box::pin(async move {
            let mut tools = Vec::new();
            let mut cursor = None;
            for _ in 0..MAX_TOOL_PAGES {
                let params = PaginatedRequestParams::default().with_cursor(cursor.take());
                let page = self
                    .service
                    .list_tools(Some(params))
                    .await
                    .map_err(|e| self.failed(e))?;
                tools.extend(page.tools);
                cursor = page.next_cursor;
                if cursor.is_none() || tools.len() >= MAX_LISTED_TOOLS {
                    break;
                }
            }
            if cursor.is_some() || tools.len() > MAX_LISTED_TOOLS {
                warn!(
                    server = %self.name,
                    limit = MAX_LISTED_TOOLS,
                    pages = MAX_TOOL_PAGES,
                    "MCP server lists more tools than the agent reads; the rest are left out"
                );
            }
            Ok(tools
                .into_iter()
                .take(MAX_LISTED_TOOLS)
                .map(|t| McpTool {
                    name: t.name.into_owned(),
                    description: t.description.map(|d| d.into_owned()).unwrap_or_default(),
                    schema: Value::Object((*t.input_schema).clone()),
                })
                .collect())
        })
    }

    fn call<'a>(
        &'a self,
        tool: &'a str,
        args: Map<String, Value>,
    ) -> BoxFuture<'a, Result<(String, bool), ClientError>> {
        Box::pin(async move {
            let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(args);
            let result = self
                .service
                .call_tool(params)
                .await
                .map_err(|e| self.failed(e))?;
            let mut parts: Vec<String> = result.content.iter().map(content_text).collect();
            if parts.is_empty()
                && let Some(structured) = &result.structured_content
            {
                parts.push(structured.to_string());
            }
            Ok((parts.join("\n"), result.is_error.unwrap_or(false)))
        })
    }

    fn is_closed(&self) -> bool {
        self.service.is_closed() || self.service.is_transport_closed()
    }
}

/// A content block as text for the brain: text as is, anything else named.
fn content_text(block: &ContentBlock) -> String {
    match block {
        ContentBlock::Text(t) => t.text.clone(),
        ContentBlock::Image(i) => format!("[image, {}]", i.mime_type),
        ContentBlock::Audio(a) => format!("[audio, {}]", a.mime_type),
        ContentBlock::Resource(_) => "[embedded resource]".to_owned(),
        ContentBlock::ResourceLink(r) => format!("[resource {}]", r.uri),
        _ => "[content of a kind this agent does not know]".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_text_is_escaped_and_cut_for_logs() {
        assert_eq!(shown("echo"), "echo");
        assert_eq!(
            shown("a\nINFO forged\r\u{1b}[31m"),
            "a\\nINFO forged\\r\\u{1b}[31m"
        );
        assert_eq!(shown("x\u{2028}y"), "x\\u{2028}y");
        let long = shown(&"é".repeat(200));
        assert_eq!(long.chars().count(), MAX_SHOWN + 1);
        assert!(long.ends_with('…'));
        assert_eq!(shown_within("abcdef", 3), "abc…");
    }
}
