//! [`McpClient`] over the rmcp SDK: a child process on stdio, or a streamable-HTTP server.
//! Nothing else in the agent names rmcp.

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use rmcp::model::{CallToolRequestParams, ContentBlock};
use rmcp::service::{ClientInitializeError, RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::{Map, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tracing::debug;

use super::hub::{ClientError, McpClient, McpTool};
use crate::config::{McpServerConfig, McpTransport};

/// Environment variables a stdio server gets from the agent; nothing else (the agent's own
/// environment holds its secrets).
const PASSED_ENV: &[&str] = &[
    "PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "USER",
];

/// Lines of a stdio server's stderr kept for the error when it fails to start.
const STDERR_TAIL: usize = 3;

struct Rmcp {
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
            // The server's own log goes to ours (RUST_LOG=agent=debug); its last lines explain
            // a server that fails to start (a missing module, a bad flag).
            let tail = Arc::new(Mutex::new(VecDeque::new()));
            let reader = stderr.map(|stderr| {
                let (server, tail) = (config.name.clone(), tail.clone());
                tokio::spawn(async move {
                    let mut lines = BufReader::new(stderr).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        debug!(server = %server, "{line}");
                        let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
                        if tail.len() == STDERR_TAIL {
                            tail.pop_front();
                        }
                        tail.push_back(line.chars().take(200).collect::<String>());
                    }
                })
            });
            match ().serve(transport).await {
                Ok(service) => service,
                Err(e) => {
                    // The child is gone with the transport: its stderr ends soon.
                    if let Some(reader) = reader {
                        let _ = tokio::time::timeout(Duration::from_secs(2), reader).await;
                    }
                    let tail = tail.lock().unwrap_or_else(|e| e.into_inner());
                    let mut why = init_error(&e);
                    if !tail.is_empty() {
                        let lines: Vec<&str> = tail.iter().map(String::as_str).collect();
                        why.push_str(&format!("; it said: {}", lines.join(" | ")));
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
    Ok(Arc::new(Rmcp { service }))
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
            let tools = self.service.list_all_tools().await.map_err(classify)?;
            Ok(tools
                .into_iter()
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
