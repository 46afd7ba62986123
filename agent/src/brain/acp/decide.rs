//! The ACP brain's decisions, pure and table-tested: which permission option answers a
//! decision, what a plan looks like in the room, what a stop reason tells the user, the prompt
//! a turn becomes, and the summary a new session starts from.

use std::path::Path;

use serde_json::{Value, json};

use super::wire::{PermissionOption, PlanEntry};
use crate::store::{History, TurnRecord};

/// The policy entry of an ACP tool kind in `AGENT_TOOL_POLICY` (`acp__edit`; `acp__*` for all).
pub fn policy_key(kind: Option<&str>) -> String {
    format!("acp__{}", kind.unwrap_or("other"))
}

/// The option that says `allowed` (once: a lasting grant is ours to remember, so the agent
/// keeps asking and our policy keeps deciding); `None` when the agent offered none of that
/// kind (then the request is answered `cancelled`).
pub fn option_for(allowed: bool, options: &[PermissionOption]) -> Option<String> {
    let wanted: &[&str] = if allowed {
        &["allow_once", "allow_always"]
    } else {
        &["reject_once", "reject_always"]
    };
    wanted.iter().find_map(|kind| {
        options
            .iter()
            .find(|o| o.kind == *kind)
            .map(|o| o.option_id.clone())
    })
}

/// A plan as a checklist for the room.
pub fn plan_text(entries: &[PlanEntry]) -> String {
    let lines: Vec<String> = entries
        .iter()
        .map(|e| {
            let mark = match e.status.as_str() {
                "completed" => "☑",
                "in_progress" => "▶",
                _ => "☐",
            };
            format!("{mark} {}", e.content.trim())
        })
        .collect();
    format!("Plan:\n{}", lines.join("\n"))
}

/// What the room is told when a prompt ended other than normally (`None`: nothing).
pub fn stop_notice(stop: &str) -> Option<String> {
    match stop {
        "end_turn" => None,
        "cancelled" => Some("The agent stopped.".to_owned()),
        "max_tokens" => Some("The agent reached its output limit and stopped.".to_owned()),
        "max_turn_requests" => {
            Some("The agent reached its limit of steps for one message and stopped.".to_owned())
        }
        "refusal" => Some("The agent refused to go on.".to_owned()),
        other => Some(format!("The agent stopped ({other}).")),
    }
}

/// What the room hears when a turn whose agent was interrupted is sent to it again.
pub const RERUN_NOTICE: &str =
    "I was interrupted while answering this, so the agent got your message a second time.";

/// Most characters of a summary given to a new session.
const SUMMARY_CHARS: usize = 4000;

/// The chat so far, for a session that starts without it: the turns kept in full, oldest
/// first, newest kept when it is too long. `None` when there was nothing before.
pub fn summary(history: &History) -> Option<String> {
    if history.earlier == 0 {
        return None;
    }
    let mut lines = Vec::new();
    for t in &history.recent {
        lines.push(format!("User: {}", one_line(&t.text, 600)));
        if !t.output.trim().is_empty() {
            lines.push(format!("You: {}", one_line(&t.output, 600)));
        }
    }
    while lines.iter().map(|l| l.len() + 1).sum::<usize>() > SUMMARY_CHARS && lines.len() > 1 {
        lines.remove(0);
    }
    let skipped = history.earlier.saturating_sub(history.recent.len());
    let head = if skipped > 0 {
        format!("(The conversation had {skipped} earlier messages before these.)\n")
    } else {
        String::new()
    };
    Some(format!(
        "[Context from the chat bridge: your earlier session with this chat was lost. \
         The conversation so far:]\n{head}{}\n[End of context.]",
        lines.join("\n")
    ))
}

fn one_line(s: &str, max: usize) -> String {
    let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s,
    }
}

/// The prompt for `turn`: the summary (if any), the text, and each attachment as a resource
/// link to its file (absolute, as the agent sees the workspace at `root`), or as an image block
/// given in `images` (path to base64 data and MIME type).
pub fn prompt_blocks(
    turn: &TurnRecord,
    root: &Path,
    summary: Option<&str>,
    images: &[(String, String, String)],
) -> Vec<Value> {
    let mut blocks = Vec::new();
    if let Some(s) = summary {
        blocks.push(json!({"type": "text", "text": s}));
    }
    let text = if turn.text.trim().is_empty() && !turn.attachments.is_empty() {
        "(The user sent the attached files without a message.)".to_owned()
    } else {
        turn.text.clone()
    };
    blocks.push(json!({"type": "text", "text": text}));
    for path in &turn.attachments {
        if let Some((_, data, mime)) = images.iter().find(|(p, _, _)| p == path.as_str()) {
            blocks.push(json!({"type": "image", "data": data, "mimeType": mime}));
            continue;
        }
        let abs = root.join(path.as_str());
        let mut link = json!({
            "type": "resource_link",
            "name": path.as_str().rsplit('/').next().unwrap_or(path.as_str()),
            "uri": format!("file://{}", abs.display()),
        });
        if let Some(info) = turn.attachment_info.get(path) {
            link["name"] = json!(info.name);
            link["mimeType"] = json!(info.mime);
            link["size"] = json!(info.size);
        }
        blocks.push(link);
    }
    blocks
}

/// A relayed call's JSON arguments with its `path` made workspace-relative: an ACP agent names
/// files by absolute path (under `root`, the workspace as it sees it) or relative to its working
/// directory (the chat's folder, `own`). Anything else is left for the tool to refuse.
pub fn relayed_arguments(arguments: &str, root: &Path, own: &protocol::WorkspacePath) -> String {
    let Ok(Value::Object(mut args)) = serde_json::from_str::<Value>(arguments) else {
        return arguments.to_owned();
    };
    if let Some(Value::String(path)) = args.get("path") {
        let path = Path::new(path);
        let rel = if path.is_absolute() {
            path.strip_prefix(root)
                .ok()
                .map(|p| p.display().to_string())
        } else {
            Some(format!("{}/{}", own.as_str(), path.display()))
        };
        if let Some(rel) = rel {
            args.insert("path".to_owned(), Value::String(rel));
        }
    }
    Value::Object(args).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opt(id: &str, kind: &str) -> PermissionOption {
        PermissionOption {
            option_id: id.to_owned(),
            kind: kind.to_owned(),
        }
    }

    #[test]
    fn decisions_pick_the_narrowest_option_of_their_kind() {
        let full = [
            opt("always", "allow_always"),
            opt("once", "allow_once"),
            opt("no", "reject_once"),
            opt("never", "reject_always"),
        ];
        let only_always = [opt("always", "allow_always"), opt("never", "reject_always")];
        let cases: [(bool, &[PermissionOption], Option<&str>); 6] = [
            (true, &full, Some("once")),
            (false, &full, Some("no")),
            (true, &only_always, Some("always")),
            (false, &only_always, Some("never")),
            (true, &[], None),
            (false, &[opt("once", "allow_once")], None),
        ];
        for (allowed, options, want) in cases {
            assert_eq!(
                option_for(allowed, options).as_deref(),
                want,
                "{allowed} {options:?}"
            );
        }
    }

    #[test]
    fn relayed_paths_become_workspace_paths() {
        let own = protocol::WorkspacePath::new("chats/c1").unwrap();
        let root = Path::new("/workspace");
        let cases = [
            (
                r#"{"path":"/workspace/chats/c1/a.txt"}"#,
                Some("chats/c1/a.txt"),
            ),
            (r#"{"path":"a.txt","caption":"x"}"#, Some("chats/c1/a.txt")),
            (r#"{"path":"sub/b.png"}"#, Some("chats/c1/sub/b.png")),
            // Left as it is: the tool refuses what is outside the workspace or not a path.
            (r#"{"path":"/etc/passwd"}"#, Some("/etc/passwd")),
            (r#"{"question":"why?"}"#, None),
        ];
        for (args, want) in cases {
            let out: Value = serde_json::from_str(&relayed_arguments(args, root, &own)).unwrap();
            assert_eq!(out["path"].as_str(), want, "{args}");
        }
        assert_eq!(relayed_arguments("not json", root, &own), "not json");
    }

    #[test]
    fn plans_and_stops_read_well() {
        let plan = [
            PlanEntry {
                content: "read the file".to_owned(),
                status: "completed".to_owned(),
            },
            PlanEntry {
                content: "write notes".to_owned(),
                status: "in_progress".to_owned(),
            },
            PlanEntry {
                content: "send them".to_owned(),
                status: "pending".to_owned(),
            },
        ];
        assert_eq!(
            plan_text(&plan),
            "Plan:\n☑ read the file\n▶ write notes\n☐ send them"
        );
        for (stop, quiet) in [
            ("end_turn", true),
            ("cancelled", false),
            ("refusal", false),
            ("new_reason", false),
        ] {
            assert_eq!(stop_notice(stop).is_none(), quiet, "{stop}");
        }
        assert_eq!(policy_key(Some("edit")), "acp__edit");
        assert_eq!(policy_key(None), "acp__other");
    }
}
