//! MCP tools in the registry: named `server__tool`, offered to models with the server's own
//! schema, run through the same policy and approval path as the built-in tools (default
//! `ask`; `AGENT_TOOL_POLICY` takes `server__tool` and `server__*`). They never count as
//! read-only, whatever the server hints: a model's identical second call is not run.

mod client;
mod hub;

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

pub(crate) use client::shown_within;
pub use client::{ClientError, McpClient, McpTool};
pub use hub::{Hub, McpError};

use super::{Registry, ToolCx, ToolError, ToolOutput, ToolSpec, TurnGrants, json_args};
use crate::config::{MCP_SEPARATOR, Policy};

/// Longest argument text shown as the resource of an approval prompt; longer arguments are
/// cut and marked with their hash, so "allow always" never covers arguments not shown.
const RESOURCE_CHARS: usize = 200;

/// The policy the operator gave the whole server of MCP tool `name` (`server__*`).
pub(super) fn server_policy(policies: &BTreeMap<String, Policy>, name: &str) -> Option<Policy> {
    let (server, _) = name.split_once(MCP_SEPARATOR)?;
    policies.get(&format!("{server}{MCP_SEPARATOR}*")).copied()
}

/// What an MCP call acts on, as approvals see it: its arguments, canonical.
fn resource(args: &serde_json::Value) -> String {
    let text = args.to_string();
    if text.chars().count() <= RESOURCE_CHARS {
        return text;
    }
    let digest = hex::encode(Sha256::digest(text.as_bytes()));
    let start: String = text.chars().take(RESOURCE_CHARS).collect();
    format!("{start}… (sha256 {})", &digest[..16])
}

impl Registry {
    /// The tools a model may call in `chat`: the built-in ones, then the MCP tools of the
    /// servers this chat may use (a server that cannot be reached is left out), denied ones
    /// left out.
    pub async fn specs_for(&self, chat: &protocol::ChatId) -> Vec<ToolSpec> {
        let mut specs = self.specs();
        let Some(hub) = &self.mcp else {
            return specs;
        };
        for (name, tool) in hub.tools(chat).await {
            if self.policy(&name) == Policy::Deny {
                continue;
            }
            let server = name.split_once(MCP_SEPARATOR).map_or("", |(s, _)| s);
            let description = if tool.description.is_empty() {
                format!("{} (from the MCP server {server})", tool.name)
            } else {
                format!("{} (from the MCP server {server})", tool.description)
            };
            specs.push(ToolSpec {
                name,
                description,
                parameters: tool.schema,
            });
        }
        specs
    }

    /// Runs MCP tool `name`: checks that the chat may use it and that it exists, applies the
    /// policy, then calls the server.
    pub(super) async fn run_mcp(
        &self,
        hub: &Hub,
        name: &str,
        arguments: &str,
        cx: &ToolCx<'_>,
        grants: &mut TurnGrants,
    ) -> Result<ToolOutput, ToolError> {
        let chat = cx.ws.scope.chat();
        let args = json_args(name, arguments)?;
        let serde_json::Value::Object(object) = args.clone() else {
            return Err(ToolError::InvalidArgs {
                tool: name.to_owned(),
                reason: "the arguments must be a JSON object".to_owned(),
            });
        };
        if self.policy(name) == Policy::Deny {
            return Err(ToolError::Denied(name.to_owned()));
        }
        // Before any prompt: nobody is asked to approve a tool that does not exist.
        let tool = hub.tool(chat, name).await?;
        let resource = resource(&args);
        let server = name.split_once(MCP_SEPARATOR).map_or("", |(s, _)| s);
        let summary = format!(
            "{name} wants to run the tool {:?} of the MCP server {server} with {resource}",
            tool.name
        );
        let policy = cx.within_room(name, self.policy(name));
        self.permit_as(policy, name, resource, &summary, cx, grants)
            .await?;
        let text = hub.call(chat, name, object).await?;
        Ok(text.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_arguments_are_cut_and_hashed() {
        let short = serde_json::json!({"text": "hi"});
        assert_eq!(resource(&short), r#"{"text":"hi"}"#);
        let a = serde_json::json!({"text": "a".repeat(300)});
        let b = serde_json::json!({"text": format!("{}b", "a".repeat(299))});
        assert_ne!(resource(&a), resource(&b));
        assert!(resource(&a).contains("… (sha256 "));
    }

    #[test]
    fn servers_give_their_tools_a_policy() {
        let mut policies = BTreeMap::new();
        policies.insert("demo__*".to_owned(), Policy::Allow);
        assert_eq!(server_policy(&policies, "demo__echo"), Some(Policy::Allow));
        assert_eq!(server_policy(&policies, "other__echo"), None);
    }
}
