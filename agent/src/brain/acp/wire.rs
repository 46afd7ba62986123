//! What an ACP agent sends, read from its wire format (protocol v1) into our own small types:
//! the brain depends on these, not on the crate's, and an unknown kind of update is skipped
//! rather than an error. Pure functions, table-tested.

use std::path::Path;

use protocol::WorkspacePath;
use serde::Deserialize;

/// A `session/update` the turn acts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Update {
    /// Answer text (`agent_message_chunk` with a text block).
    Text(String),
    /// A tool call started or changed (`tool_call`, `tool_call_update`).
    Tool(ToolCall),
    /// The agent's plan, whole (`plan`).
    Plan(Vec<PlanEntry>),
}

/// A tool call's fields as far as known (an update carries only what changed).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCall {
    /// Its id in the session.
    pub tool_call_id: String,
    /// What it does, for people ("Write notes.txt").
    #[serde(default)]
    pub title: Option<String>,
    /// read, edit, delete, move, search, execute, think, fetch, switch_mode or other.
    #[serde(default)]
    pub kind: Option<String>,
    /// pending, in_progress, completed or failed.
    #[serde(default)]
    pub status: Option<String>,
    /// Its input, as the agent gave it.
    #[serde(default)]
    pub raw_input: Option<serde_json::Value>,
}

/// One line of a plan.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PlanEntry {
    /// What the step is.
    pub content: String,
    /// pending, in_progress or completed.
    #[serde(default)]
    pub status: String,
}

/// `session/request_permission`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Permission {
    /// The call it is about.
    pub tool_call: ToolCall,
    /// The choices offered.
    pub options: Vec<PermissionOption>,
}

/// One choice of a permission request.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PermissionOption {
    /// Its id, sent back when chosen.
    pub option_id: String,
    /// allow_once, allow_always, reject_once or reject_always.
    pub kind: String,
}

#[derive(Deserialize)]
#[serde(tag = "sessionUpdate", rename_all = "snake_case")]
enum RawUpdate {
    AgentMessageChunk {
        content: serde_json::Value,
    },
    ToolCall(ToolCall),
    ToolCallUpdate(ToolCall),
    Plan {
        entries: Vec<PlanEntry>,
    },
    #[serde(other)]
    Other,
}

/// The update in `value` if the turn acts on it (`None`: a kind it ignores, such as thoughts,
/// the user's own message replayed, commands or usage).
pub fn update(value: serde_json::Value) -> Option<Update> {
    match serde_json::from_value::<RawUpdate>(value).ok()? {
        RawUpdate::AgentMessageChunk { content } => {
            let text = content
                .get("type")
                .and_then(|t| (t == "text").then(|| content.get("text")))
                .flatten()
                .and_then(|t| t.as_str())?;
            Some(Update::Text(text.to_owned()))
        }
        RawUpdate::ToolCall(c) | RawUpdate::ToolCallUpdate(c) => Some(Update::Tool(c)),
        RawUpdate::Plan { entries } => Some(Update::Plan(entries)),
        RawUpdate::Other => None,
    }
}

/// A serializable enum's wire name (`"end_turn"`).
pub fn name_of(value: &impl serde::Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "unknown".to_owned(),
    }
}

/// An agent's absolute path as a workspace path: it must be below `root` (the workspace as the
/// agent sees it) and name nothing outside it.
pub fn in_workspace(root: &Path, path: &Path) -> Result<WorkspacePath, String> {
    let rel = path
        .strip_prefix(root)
        .map_err(|_| format!("{} is outside the workspace", path.display()))?;
    let rel = rel
        .to_str()
        .ok_or_else(|| format!("{} is not a UTF-8 path", path.display()))?;
    WorkspacePath::new(rel).map_err(|e| format!("{}: {e}", path.display()))
}

/// `limit` lines of `text` from the 1-based `line` (all when unset).
pub fn line_window(text: &str, line: Option<u32>, limit: Option<u32>) -> String {
    let skip = line.map_or(0, |l| l.saturating_sub(1) as usize);
    let take = limit.map_or(usize::MAX, |l| l as usize);
    if skip == 0 && take == usize::MAX {
        return text.to_owned();
    }
    text.split_inclusive('\n').skip(skip).take(take).collect()
}

/// Someone else's text for our log or a room: control characters escaped, at most 300
/// characters.
pub fn shown(s: &str) -> String {
    shown_within(s, 300)
}

/// As [`shown`], at most `max` characters.
pub fn shown_within(s: &str, max: usize) -> String {
    crate::tools::shown_within(s, max)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn updates_are_read_and_unknown_ones_skipped() {
        let tool = |id: &str, status: Option<&str>| {
            Update::Tool(ToolCall {
                tool_call_id: id.to_owned(),
                title: Some("Write notes.txt".to_owned()),
                kind: Some("edit".to_owned()),
                status: status.map(str::to_owned),
                raw_input: None,
            })
        };
        let cases = [
            (
                json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "Hi"}}),
                Some(Update::Text("Hi".to_owned())),
            ),
            (
                json!({"sessionUpdate": "agent_message_chunk", "content": {"type": "image", "data": "", "mimeType": "image/png"}}),
                None,
            ),
            (
                json!({"sessionUpdate": "agent_thought_chunk", "content": {"type": "text", "text": "hmm"}}),
                None,
            ),
            (
                json!({"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "replayed"}}),
                None,
            ),
            (
                json!({"sessionUpdate": "tool_call", "toolCallId": "c1", "title": "Write notes.txt", "kind": "edit", "status": "pending"}),
                Some(tool("c1", Some("pending"))),
            ),
            (
                json!({"sessionUpdate": "tool_call_update", "toolCallId": "c1", "title": "Write notes.txt", "kind": "edit"}),
                Some(tool("c1", None)),
            ),
            (
                json!({"sessionUpdate": "plan", "entries": [{"content": "read", "status": "completed", "priority": "high"}]}),
                Some(Update::Plan(vec![PlanEntry {
                    content: "read".to_owned(),
                    status: "completed".to_owned(),
                }])),
            ),
            (json!({"sessionUpdate": "a_future_kind", "x": 1}), None),
            (json!({"no": "tag"}), None),
        ];
        for (value, want) in cases {
            assert_eq!(update(value.clone()), want, "{value}");
        }
    }

    #[test]
    fn paths_must_be_inside_the_workspace() {
        let root = Path::new("/workspace");
        let cases = [
            (
                "/workspace/agents/c1/notes.txt",
                Some("agents/c1/notes.txt"),
            ),
            ("/workspace/../etc/passwd", None),
            ("/workspace/agents/../../etc/passwd", None),
            ("/etc/passwd", None),
            ("relative.txt", None),
            ("/workspace", None),
        ];
        for (path, want) in cases {
            let got = in_workspace(root, Path::new(path)).ok();
            assert_eq!(got.as_ref().map(|p| p.as_str()), want, "{path}");
        }
    }

    #[test]
    fn line_windows_are_one_based() {
        let text = "a\nb\nc\n";
        let cases = [
            (None, None, "a\nb\nc\n"),
            (Some(2), None, "b\nc\n"),
            (Some(1), Some(1), "a\n"),
            (Some(0), Some(2), "a\nb\n"),
            (Some(9), None, ""),
        ];
        for (line, limit, want) in cases {
            assert_eq!(line_window(text, line, limit), want, "{line:?} {limit:?}");
        }
    }

    #[test]
    fn permissions_are_read_from_the_wire() {
        let p: Permission = serde_json::from_value(json!({
            "sessionId": "s",
            "toolCall": {"toolCallId": "c1", "title": "Write x", "kind": "edit", "rawInput": {"path": "x"}},
            "options": [
                {"optionId": "allow", "name": "Allow once", "kind": "allow_once"},
                {"optionId": "deny", "name": "Deny", "kind": "reject_once"}
            ]
        }))
        .unwrap();
        assert_eq!(p.tool_call.kind.as_deref(), Some("edit"));
        assert_eq!(p.options[1].option_id, "deny");
    }
}
