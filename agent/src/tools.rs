//! The typed tool registry: each tool is an argument struct (its JSON schema is derived, never
//! written by hand) and a function over the chat's confined workspace. The registry applies the
//! per-tool policy (allow / ask / deny), runs approvals and reports every call to the surface
//! (`tool_call_chunk`, then `tool_result`).

mod files;
mod interact;
mod mcp;
pub(crate) use mcp::shown_within;
mod memory;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use protocol::{Decision, ToolCallChunk, ToolResult, WorkspacePath};
use schemars::JsonSchema;
use serde::Deserialize as _;
use serde::de::DeserializeOwned;
use tracing::{info, instrument, warn};

pub use files::{DescribeFile, ListFiles, ReadFile, SendFileTool, ViewImage, WriteFile};
pub use interact::{AskUserTool, DangerousAction};
pub use mcp::{ClientError, Hub, McpClient, McpError, McpTool};
pub use memory::{Forget, Recall, Remember};

use crate::config::Policy;
use crate::confine::{ChatScope, ConfineError, ScopedWorkspace};
use crate::link::{Link, new_id};
use crate::memory::Memory;
use crate::perceive::Perception;

/// Why a tool call did not produce a result. The message goes back to the brain.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// No tool has this name.
    #[error("unknown tool {0:?}")]
    UnknownTool(String),
    /// The arguments did not match the tool's schema.
    #[error("invalid arguments for {tool}: {reason}")]
    InvalidArgs {
        /// The tool.
        tool: String,
        /// What was wrong.
        reason: String,
    },
    /// The tool's policy is `deny`.
    #[error("{0} is not allowed by the agent's policy")]
    Denied(String),
    /// The user did not approve the call (or did not answer in time).
    #[error("the user did not approve {tool} on {resource}")]
    NotApproved {
        /// The tool.
        tool: String,
        /// The resource.
        resource: String,
    },
    /// A workspace path was refused or missing.
    #[error(transparent)]
    Confine(#[from] ConfineError),
    /// An MCP server could not run the call.
    #[error(transparent)]
    Mcp(#[from] McpError),
    /// The connection to the surface is gone.
    #[error("the surface is disconnected")]
    Disconnected,
    /// Anything else.
    #[error("{0}")]
    Failed(String),
}

/// What a successful tool call returns.
#[derive(Debug, Clone, Default)]
pub struct ToolOutput {
    /// Full text for the brain.
    pub text: String,
    /// A file delivered to the room by this call.
    pub sent_file: Option<WorkspacePath>,
    /// A picture the call asks to show the model (`view_image`).
    pub picture: Option<WorkspacePath>,
}

impl From<String> for ToolOutput {
    fn from(text: String) -> Self {
        Self {
            text,
            sent_file: None,
            picture: None,
        }
    }
}

/// What a tool gets besides its arguments.
#[derive(Debug)]
pub struct ToolCx<'a> {
    /// The workspace as this chat may see it.
    pub ws: &'a ScopedWorkspace,
    /// The running turn.
    pub turn: &'a str,
    /// The user whose message started the turn (the one asked for approvals).
    pub user: &'a str,
    /// The way to the surface (emit messages, ask, approve).
    pub link: &'a Link,
    /// The agent's durable memory (the memory tools reach the user's and the room's scopes).
    pub memory: &'a Memory,
    /// Pictures for the model (`view_image`).
    pub perception: &'a Perception,
    /// The number of this call's step in the turn: the same when an interrupted turn runs the
    /// call again, so its effects are keyed by it (a file's delivery is posted once).
    pub step: u32,
    /// The policies the turn's room set (`!set tool`): applied only where stricter.
    pub room: &'a BTreeMap<String, protocol::ToolPolicy>,
}

impl ToolCx<'_> {
    /// `operator`'s policy for tool `name`, made stricter where the room asked for it (a room
    /// can never loosen it).
    pub fn within_room(&self, name: &str, operator: Policy) -> Policy {
        match self.room.get(name) {
            Some(room) => operator.stricter(Policy::from(*room)),
            None => operator,
        }
    }
}

/// A tool: typed arguments and a function over the confined workspace.
pub trait Tool: Send + Sync + 'static {
    /// Name the brain uses.
    const NAME: &'static str;
    /// What it does, for the model.
    const DESCRIPTION: &'static str;
    /// Whether the tool only looks (a repeated call may run again: its result can change).
    const READ_ONLY: bool = false;
    /// A demonstration (`dangerous_action`): offered to models only when the operator names it
    /// in `AGENT_TOOL_POLICY`; the builtin brain's commands reach it by name regardless.
    const DEMO: bool = false;
    /// Arguments; the JSON schema given to models is derived from this type.
    type Args: DeserializeOwned + JsonSchema + Send + Sync + 'static;

    /// What the call acts on (shown in approval prompts; approvals are remembered per resource).
    fn resource(args: &Self::Args, scope: &ChatScope) -> String;

    /// One sentence for the person approving the call.
    fn summary(args: &Self::Args, scope: &ChatScope) -> String {
        format!(
            "{} wants to act on {}",
            Self::NAME,
            Self::resource(args, scope)
        )
    }

    /// Runs the tool.
    fn call(
        args: Self::Args,
        cx: &ToolCx<'_>,
    ) -> impl Future<Output = Result<ToolOutput, ToolError>> + Send;
}

/// Object-safe view of a [`Tool`].
trait DynTool: Send + Sync {
    fn name(&self) -> &'static str;
    fn read_only(&self) -> bool;
    fn demo(&self) -> bool;
    fn description(&self) -> &'static str;
    fn schema(&self) -> serde_json::Value;
    fn parse(
        &self,
        args: &serde_json::Value,
        scope: &ChatScope,
    ) -> Result<(String, String), ToolError>;
    fn call<'a>(
        &'a self,
        args: serde_json::Value,
        cx: &'a ToolCx<'a>,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>>;
}

struct Erased<T>(PhantomData<fn() -> T>);

impl<T: Tool> Erased<T> {
    fn args(args: &serde_json::Value) -> Result<T::Args, ToolError> {
        T::Args::deserialize(args).map_err(|e| ToolError::InvalidArgs {
            tool: T::NAME.to_owned(),
            reason: e.to_string(),
        })
    }
}

impl<T: Tool> DynTool for Erased<T> {
    fn name(&self) -> &'static str {
        T::NAME
    }

    fn read_only(&self) -> bool {
        T::READ_ONLY
    }

    fn demo(&self) -> bool {
        T::DEMO
    }

    fn description(&self) -> &'static str {
        T::DESCRIPTION
    }

    fn schema(&self) -> serde_json::Value {
        // Everything inline: several providers reject `$defs`/`$ref` in tool parameters.
        let generator = schemars::generate::SchemaSettings::draft07()
            .with(|s| s.inline_subschemas = true)
            .into_generator();
        let mut schema = serde_json::to_value(generator.into_root_schema_for::<T::Args>())
            .unwrap_or_else(|_| serde_json::json!({"type": "object"}));
        if let Some(obj) = schema.as_object_mut() {
            obj.remove("$schema");
            obj.remove("title");
        }
        schema
    }

    fn parse(
        &self,
        args: &serde_json::Value,
        scope: &ChatScope,
    ) -> Result<(String, String), ToolError> {
        let args = Self::args(args)?;
        Ok((T::resource(&args, scope), T::summary(&args, scope)))
    }

    fn call<'a>(
        &'a self,
        args: serde_json::Value,
        cx: &'a ToolCx<'a>,
    ) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            let args = Self::args(&args)?;
            T::call(args, cx).await
        })
    }
}

/// A tool as offered to a model: name, description and JSON schema (generated for built-in
/// tools, the server's own for MCP tools).
#[derive(Debug, Clone)]
pub struct ToolSpec {
    /// Tool name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON schema of its arguments.
    pub parameters: serde_json::Value,
}

/// The outcome of one call, as the brain sees it.
#[derive(Debug, Clone)]
pub struct ToolOutcome {
    /// Whether the tool ran and succeeded.
    pub ok: bool,
    /// Its output, or the error.
    pub output: String,
    /// A file the call delivered.
    pub sent_file: Option<WorkspacePath>,
    /// A picture the call asks to show the model.
    pub picture: Option<WorkspacePath>,
}

/// Decisions already taken during the current turn, so repeated requests for the same
/// `(tool, resource)` are coalesced into one prompt.
pub type TurnGrants = HashMap<(String, String), Decision>;

/// All tools with their policies.
pub struct Registry {
    tools: BTreeMap<&'static str, Box<dyn DynTool>>,
    policies: BTreeMap<String, Policy>,
    /// The MCP servers' tools (`server__tool`), if any are configured.
    mcp: Option<Arc<Hub>>,
    /// Demo tools are offered to models (the operator named them in `AGENT_TOOL_POLICY`).
    offer_demos: bool,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("tools", &self.tools.keys().collect::<Vec<_>>())
            .field("policies", &self.policies)
            .field("mcp", &self.mcp)
            .finish()
    }
}

/// Longest tool output shown to the surface in a `tool_result`.
const SHORT_OUTPUT_CHARS: usize = 300;

impl Registry {
    /// Every built-in tool, with `policies` (missing entries default to deny).
    pub fn new(policies: BTreeMap<String, Policy>) -> Self {
        let mut tools: BTreeMap<&'static str, Box<dyn DynTool>> = BTreeMap::new();
        fn add<T: Tool>(tools: &mut BTreeMap<&'static str, Box<dyn DynTool>>) {
            tools.insert(T::NAME, Box::new(Erased::<T>(PhantomData)));
        }
        add::<ListFiles>(&mut tools);
        add::<ReadFile>(&mut tools);
        add::<WriteFile>(&mut tools);
        add::<SendFileTool>(&mut tools);
        add::<AskUserTool>(&mut tools);
        add::<DangerousAction>(&mut tools);
        add::<DescribeFile>(&mut tools);
        add::<ViewImage>(&mut tools);
        add::<Remember>(&mut tools);
        add::<Recall>(&mut tools);
        add::<Forget>(&mut tools);
        Self {
            tools,
            policies,
            mcp: None,
            offer_demos: false,
        }
    }

    /// Offers the demo tools (`dangerous_action`) to models too.
    pub fn offering_demos(mut self, offer: bool) -> Self {
        self.offer_demos = offer;
        self
    }

    /// Adds the tools of the MCP servers in `hub`.
    pub fn with_mcp(mut self, hub: Arc<Hub>) -> Self {
        self.mcp = Some(hub);
        self
    }

    /// The policy of a tool: its own entry; for an MCP tool, else its server's (`server__*`),
    /// else `ask`; `deny` for a name no tool has.
    pub fn policy(&self, name: &str) -> Policy {
        if let Some(p) = self.policies.get(name) {
            return *p;
        }
        match self.mcp.as_deref().filter(|hub| hub.owns(name)) {
            Some(_) => mcp::server_policy(&self.policies, name).unwrap_or(Policy::Ask),
            None => Policy::Deny,
        }
    }

    /// The tool's own name (for metric labels: a fixed set), `mcp` for any MCP tool, or
    /// `unknown` for a name no tool has (a model may make one up).
    pub fn label(&self, name: &str) -> &'static str {
        if let Some((k, _)) = self.tools.get_key_value(name) {
            return k;
        }
        if self.mcp.as_deref().is_some_and(|hub| hub.owns(name)) {
            return "mcp";
        }
        "unknown"
    }

    /// Whether `name` is a tool that only looks.
    pub fn is_read_only(&self, name: &str) -> bool {
        self.tools.get(name).is_some_and(|t| t.read_only())
    }

    /// Built-in tools a model may call (those not denied, demos only when offered), with
    /// generated schemas.
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools
            .values()
            .filter(|t| self.policy(t.name()) != Policy::Deny)
            .filter(|t| self.offer_demos || !t.demo())
            .map(|t| ToolSpec {
                name: t.name().to_owned(),
                description: t.description().to_owned(),
                parameters: t.schema(),
            })
            .collect()
    }

    /// Runs a tool call end to end: announces it, applies the policy (asking the user when
    /// needed), runs it and reports the result. Errors become a failed outcome for the brain.
    #[instrument(skip_all, fields(chat_id = %cx.ws.scope.chat(), turn = cx.turn, tool = name))]
    pub async fn invoke(
        &self,
        name: &str,
        arguments: &str,
        cx: &ToolCx<'_>,
        grants: &mut TurnGrants,
    ) -> ToolOutcome {
        let call_id = new_id("call");
        let _ = cx
            .link
            .emit(ToolCallChunk {
                turn: cx.turn.to_owned(),
                call_id: call_id.clone(),
                name: name.to_owned(),
                arguments: arguments.to_owned(),
            })
            .await;
        let result = self.run(name, arguments, cx, grants).await;
        let outcome = match result {
            Ok(out) => {
                info!("tool call succeeded");
                ToolOutcome {
                    ok: true,
                    output: out.text,
                    sent_file: out.sent_file,
                    picture: out.picture,
                }
            }
            Err(e) => {
                // An MCP server's error text is its own: escaped, so it cannot forge log lines.
                warn!(error = %mcp::shown_within(&e.to_string(), 300), "tool call failed");
                ToolOutcome {
                    ok: false,
                    output: e.to_string(),
                    sent_file: None,
                    picture: None,
                }
            }
        };
        let _ = cx
            .link
            .emit(ToolResult {
                turn: cx.turn.to_owned(),
                call_id,
                ok: outcome.ok,
                output: shorten(&outcome.output, SHORT_OUTPUT_CHARS),
            })
            .await;
        outcome
    }

    async fn run(
        &self,
        name: &str,
        arguments: &str,
        cx: &ToolCx<'_>,
        grants: &mut TurnGrants,
    ) -> Result<ToolOutput, ToolError> {
        let Some(tool) = self.tools.get(name) else {
            return match &self.mcp {
                Some(hub) if hub.owns(name) => self.run_mcp(hub, name, arguments, cx, grants).await,
                _ => Err(ToolError::UnknownTool(name.to_owned())),
            };
        };
        let args = json_args(tool.name(), arguments)?;
        let (resource, summary) = tool.parse(&args, &cx.ws.scope)?;
        self.permit_as(
            cx.within_room(tool.name(), self.policy(tool.name())),
            tool.name(),
            resource,
            &summary,
            cx,
            grants,
        )
        .await?;
        tool.call(args, cx).await
    }

    /// The policy of an ACP agent's tool of `kind` (`acp__<kind>`, else `acp__*`, else ask).
    pub fn acp_policy(&self, key: &str) -> Policy {
        self.policies
            .get(key)
            .or_else(|| self.policies.get("acp__*"))
            .copied()
            .unwrap_or(Policy::Ask)
    }

    /// Applies `policy` to a call of `tool` on `resource`: runs it, refuses it, or asks the
    /// user (once per turn and resource; `allow_always` is remembered for the chat).
    pub(crate) async fn permit_as(
        &self,
        policy: Policy,
        tool: &str,
        resource: String,
        summary: &str,
        cx: &ToolCx<'_>,
        grants: &mut TurnGrants,
    ) -> Result<(), ToolError> {
        match policy {
            Policy::Allow => Ok(()),
            Policy::Deny => Err(ToolError::Denied(tool.to_owned())),
            Policy::Ask => {
                let key = (tool.to_owned(), resource.clone());
                let remembered = cx
                    .link
                    .chat
                    .is_always_allowed(cx.user, &key)
                    .await
                    .unwrap_or_else(|e| {
                        // Asked again rather than allowed on a guess.
                        warn!(error = %e, "could not read the remembered approvals");
                        false
                    });
                let decision = if remembered {
                    Decision::AllowAlways
                } else if let Some(d) = grants.get(&key) {
                    *d
                } else {
                    let d = cx
                        .link
                        .approve(cx.turn, tool, &resource, summary)
                        .await
                        .map_err(|_| ToolError::Disconnected)?;
                    grants.insert(key.clone(), d);
                    if d == Decision::AllowAlways
                        && let Err(e) = cx.link.chat.allow_always(cx.user, key).await
                    {
                        warn!(error = %e, "could not remember the approval");
                    }
                    d
                };
                if decision == Decision::Deny {
                    return Err(ToolError::NotApproved {
                        tool: tool.to_owned(),
                        resource,
                    });
                }
                Ok(())
            }
        }
    }
}

/// A call's JSON arguments (blank means none).
fn json_args(tool: &str, arguments: &str) -> Result<serde_json::Value, ToolError> {
    if arguments.trim().is_empty() {
        return Ok(serde_json::json!({}));
    }
    serde_json::from_str(arguments).map_err(|e| ToolError::InvalidArgs {
        tool: tool.to_owned(),
        reason: e.to_string(),
    })
}

/// Cuts `s` to at most `max` characters, marking the cut.
pub fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(max).collect();
    out.push('…');
    out
}

/// Runs blocking workspace I/O off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ToolError> + Send + 'static,
) -> Result<T, ToolError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ToolError::Failed(format!("internal error: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{TOOL_NAMES, default_policies};

    #[test]
    fn schemas_are_generated_for_every_tool() {
        let registry = Registry::new(default_policies()).offering_demos(true);
        let specs = registry.specs();
        assert_eq!(specs.len(), TOOL_NAMES.len());
        let without = Registry::new(default_policies()).specs();
        assert_eq!(without.len(), TOOL_NAMES.len() - 1);
        assert!(
            without.iter().all(|s| s.name != "dangerous_action"),
            "a demo"
        );
        for spec in specs {
            assert_eq!(spec.parameters["type"], "object", "{}", spec.name);
            assert!(spec.parameters.get("$schema").is_none());
            // No references anywhere: some providers reject them.
            let text = spec.parameters.to_string();
            assert!(
                !text.contains("$ref") && !text.contains("$defs") && !text.contains("definitions"),
                "{}: {text}",
                spec.name
            );
        }
        let write = registry
            .specs()
            .into_iter()
            .find(|s| s.name == "write_file")
            .unwrap();
        let required = write.parameters["required"].as_array().unwrap();
        assert!(required.contains(&serde_json::json!("path")));
        assert!(required.contains(&serde_json::json!("content")));

        // The memory scope is a plain string enum with a default, so `fact` alone is required.
        let remember = registry
            .specs()
            .into_iter()
            .find(|s| s.name == "remember")
            .unwrap();
        assert_eq!(remember.parameters["required"], serde_json::json!(["fact"]));
        let scope = &remember.parameters["properties"]["scope"];
        assert_eq!(
            scope["enum"],
            serde_json::json!(["user", "room"]),
            "{scope}"
        );
    }

    #[test]
    fn the_registry_has_exactly_the_configured_tools() {
        let registry = Registry::new(default_policies());
        let mut names: Vec<_> = registry.tools.keys().copied().collect();
        let mut configured = TOOL_NAMES.to_vec();
        names.sort_unstable();
        configured.sort_unstable();
        assert_eq!(names, configured);
    }

    #[test]
    fn denied_tools_are_not_offered() {
        let mut policies = default_policies();
        policies.insert("write_file".into(), Policy::Deny);
        let registry = Registry::new(policies);
        assert!(registry.specs().iter().all(|s| s.name != "write_file"));
        assert_eq!(registry.policy("nonexistent"), Policy::Deny);
    }

    #[test]
    fn shorten_marks_cuts() {
        assert_eq!(shorten("abc", 5), "abc");
        assert_eq!(shorten("abcdef", 3), "abc…");
    }
}
