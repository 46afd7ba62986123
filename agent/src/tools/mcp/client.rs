//! [`McpClient`] over the rmcp SDK: a child process on stdio, or a streamable-HTTP server.
//! Nothing else in the agent names rmcp.

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use rmcp::model::{CallToolRequestParams, ContentBlock, PaginatedRequestParams};
use rmcp::service::{ClientInitializeError, RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Map, Value};
use tokio::io::AsyncReadExt;
use tokio::process::ChildStderr;
use tracing::{debug, info, warn};

use super::hub::{ClientError, McpClient, McpTool, shown, shown_within};
use crate::config::{McpServerConfig, McpTransport};

/// Environment variables a stdio server gets from the agent; nothing else (the agent's own
/// environment holds its secrets).
const PASSED_ENV: &[&str] = &[
    "PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "USER",
];

/// Bytes of a stdio server's stderr kept (the last ones) for the error when it fails to start.
const STDERR_TAIL: usize = 8 * 1024;

/// Lines of that tail quoted in the error.
const STDERR_WORDS: usize = 3;

/// Bytes read from a stdio server's stderr at a time.
const STDERR_CHUNK: usize = 4 * 1024;

/// Bytes of a stderr line logged; the rest of a longer line is left out.
const STDERR_LINE: usize = 1024;

/// Pages of `tools/list` read at most: a server that hands out cursors forever is cut off.
const MAX_TOOL_PAGES: usize = 32;

/// Tools listed at most (across pages); more are left out. Far above what a turn offers
/// ([`super::hub::MAX_TOOLS_PER_TURN`]) but bounds what one server makes the agent hold.
const MAX_LISTED_TOOLS: usize = 4096;

struct Rmcp {
    /// The server's name in the agent's configuration.
    name: String,
    service: RunningService<RoleClient, ()>,
}

/// Starts or reaches the server and completes the MCP handshake.
pub(super) async fn connect(config: &McpServerConfig) -> Result<Arc<dyn McpClient>, String> {
    let service = match &config.transport {
        McpTransport::Stdio { program, args } => {
            let mut command = tokio::process::Command::new(program);
            command.args(args).env_clear().kill_on_drop(true);
            for var in PASSED_ENV {
                if let Some(value) = std::env::var_os(var) {
                    command.env(var, value);
                }
            }
            let (transport, stderr) = TokioChildProcess::builder(command)
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("cannot run {program}: {e}"))?;
            // The server's own log goes to ours (RUST_LOG=agent=debug), line by line, cut
            // short; its last bytes explain a server that fails to start (a missing module, a
            // bad flag). Read in bounded chunks: a line without end costs no memory.
            let tail = Arc::new(Mutex::new(VecDeque::with_capacity(STDERR_TAIL)));
            let reader = stderr.map(|stderr| {
                tokio::spawn(drain_stderr(config.name.clone(), stderr, tail.clone()))
            });
            match ().serve(transport).await {
                Ok(service) => service,
                Err(e) => {
                    // The child is gone with the transport: its stderr ends soon.
                    if let Some(reader) = reader {
                        let _ = tokio::time::timeout(Duration::from_secs(2), reader).await;
                    }
                    let mut why = init_error(&e);
                    if let Some(words) = last_words(&tail) {
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
    }))
}

/// Reads a stdio server's stderr to its end in chunks of [`STDERR_CHUNK`] bytes: each line
/// logged at debug (escaped, the first [`STDERR_LINE`] bytes of it), the last
/// [`STDERR_TAIL`] bytes kept in `tail`.
async fn drain_stderr(server: String, mut stderr: ChildStderr, tail: Arc<Mutex<VecDeque<u8>>>) {
    let mut chunk = vec![0; STDERR_CHUNK];
    let mut line = Vec::with_capacity(STDERR_LINE);
    let mut cut = false;
    let log = |line: &[u8], cut: bool| {
        let text = String::from_utf8_lossy(line);
        let more = if cut { " … (cut)" } else { "" };
        debug!(server = %server, "{}{more}", shown_within(&text, STDERR_LINE));
    };
    loop {
        let n = match stderr.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let bytes = &chunk[..n];
        {
            let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
            let keep = &bytes[bytes.len().saturating_sub(STDERR_TAIL)..];
            let over = (tail.len() + keep.len()).saturating_sub(STDERR_TAIL);
            tail.drain(..over);
            tail.extend(keep);
        }
        for &byte in bytes {
            if byte == b'\n' {
                log(&line, cut);
                line.clear();
                cut = false;
            } else if line.len() < STDERR_LINE {
                line.push(byte);
            } else {
                cut = true;
            }
        }
    }
    if !line.is_empty() {
        log(&line, cut);
    }
}

/// The last few lines of a server's stderr `tail`, escaped and cut short, for an error
/// message; `None` when it said nothing.
fn last_words(tail: &Mutex<VecDeque<u8>>) -> Option<String> {
    let tail = tail.lock().unwrap_or_else(|e| e.into_inner());
    let bytes: Vec<u8> = tail.iter().copied().collect();
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .rev()
        .take(STDERR_WORDS)
        .map(|l| shown_within(l, 200))
        .collect();
    if lines.is_empty() {
        return None;
    }
    let lines: Vec<String> = lines.into_iter().rev().collect();
    Some(lines.join(" | "))
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
                    .map_err(classify)?;
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
            let result = self.service.call_tool(params).await.map_err(classify)?;
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
