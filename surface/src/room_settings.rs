//! A room's settings for the bot, kept in Matrix itself: a state event of the bot's own type
//! ([`EVENT_TYPE`], state key empty), so they survive the bot's own state being lost, every
//! client can show them (Element's `/devtools` edits them), and the homeserver checks who may
//! change them (the room's power level for that event, moderators by default). Read once at the
//! edge into [`RoomSettings`]: a field that does not make sense is left out and named, never
//! guessed. Pure, table-tested; the commands that change them are in `ingest`.

use std::collections::BTreeMap;

use matrix_sdk::Room;
use matrix_sdk::deserialized_responses::RawAnySyncOrStrippedState;
use matrix_sdk::ruma::events::StateEventType;
use protocol::{ToolPolicy, TurnSettings};
use serde_json::{Map, Value, json};

use crate::command::Change;

/// The state event type of a room's settings.
pub const EVENT_TYPE: &str = "org.mxbridge.room_settings";
/// The longest instructions a room may add to the system prompt, in characters.
pub const MAX_INSTRUCTIONS: usize = 4_000;
/// The longest model name.
const MAX_MODEL: usize = 200;

/// What a room set. `None`: the operator's default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoomSettings {
    /// The model (one the agent offers).
    pub model: Option<String>,
    /// Instructions added to the system prompt.
    pub instructions: Option<String>,
    /// Per-tool policy, applied only where stricter than the operator's.
    pub tools: BTreeMap<String, ToolPolicy>,
    /// Answer every message (`true`) or only mentions.
    pub every_message: Option<bool>,
    /// Show answers while they are written.
    pub streaming: Option<bool>,
    /// Messages sent while an answer is written are collected into one next turn (`true`), or
    /// each answered in turn (the default).
    pub collect: Option<bool>,
    /// Moderators may decide approval prompts too (`true`), or only whoever asked (default).
    pub moderators_approve: Option<bool>,
}

impl RoomSettings {
    /// Reads the state event's `content`; fields that make no sense are left out and named in
    /// the second value.
    pub fn from_content(content: &Value) -> (Self, Vec<String>) {
        let mut s = Self::default();
        let mut problems = Vec::new();
        let Some(map) = content.as_object() else {
            return (s, vec!["the content is not an object".into()]);
        };
        let mut bad = |key: &str| problems.push(key.to_owned());
        match map.get("model") {
            None | Some(Value::Null) => {}
            Some(Value::String(m)) if valid_model(m) => s.model = Some(m.clone()),
            Some(_) => bad("model"),
        }
        match map.get("instructions") {
            None | Some(Value::Null) => {}
            Some(Value::String(i)) if i.chars().count() <= MAX_INSTRUCTIONS => {
                s.instructions = Some(i.clone()).filter(|i| !i.trim().is_empty())
            }
            Some(_) => bad("instructions"),
        }
        match map.get("tools") {
            None | Some(Value::Null) => {}
            Some(Value::Object(tools)) => {
                for (name, policy) in tools {
                    match serde_json::from_value::<ToolPolicy>(policy.clone()) {
                        Ok(p) if valid_tool(name) => {
                            s.tools.insert(name.clone(), p);
                        }
                        _ => bad(&format!("tools.{name}")),
                    }
                }
            }
            Some(_) => bad("tools"),
        }
        match map.get("mode").and_then(Value::as_str) {
            None if map.get("mode").is_none_or(Value::is_null) => {}
            Some("all") => s.every_message = Some(true),
            Some("mentions") => s.every_message = Some(false),
            _ => bad("mode"),
        }
        match map.get("streaming") {
            None | Some(Value::Null) => {}
            Some(Value::Bool(b)) => s.streaming = Some(*b),
            Some(_) => bad("streaming"),
        }
        match map.get("approvers") {
            None | Some(Value::Null) => {}
            Some(Value::String(a)) if a == "requester" => s.moderators_approve = Some(false),
            Some(Value::String(a)) if a == "moderators" => s.moderators_approve = Some(true),
            Some(_) => bad("approvers"),
        }
        match map.get("queue") {
            None | Some(Value::Null) => {}
            Some(Value::String(q)) if q == "each" => s.collect = Some(false),
            Some(Value::String(q)) if q == "collect" => s.collect = Some(true),
            Some(_) => bad("queue"),
        }
        (s, problems)
    }

    /// The state event's content.
    pub fn to_content(&self) -> Value {
        let mut map = Map::new();
        if let Some(m) = &self.model {
            map.insert("model".into(), json!(m));
        }
        if let Some(i) = &self.instructions {
            map.insert("instructions".into(), json!(i));
        }
        if !self.tools.is_empty() {
            map.insert("tools".into(), json!(self.tools));
        }
        if let Some(all) = self.every_message {
            map.insert("mode".into(), json!(if all { "all" } else { "mentions" }));
        }
        if let Some(on) = self.streaming {
            map.insert("streaming".into(), json!(on));
        }
        if let Some(m) = self.moderators_approve {
            map.insert(
                "approvers".into(),
                json!(if m { "moderators" } else { "requester" }),
            );
        }
        if let Some(collect) = self.collect {
            map.insert(
                "queue".into(),
                json!(if collect { "collect" } else { "each" }),
            );
        }
        Value::Object(map)
    }

    /// These settings with `change` made.
    pub fn with(&self, change: &Change) -> Self {
        let mut s = self.clone();
        match change {
            Change::Model(m) => s.model = Some(m.clone()),
            Change::Instructions(i) => {
                s.instructions = Some(i.clone()).filter(|i| !i.trim().is_empty())
            }
            Change::Tool(name, policy) => {
                s.tools.insert(name.clone(), *policy);
            }
            Change::Mode(all) => s.every_message = Some(*all),
            Change::Streaming(on) => s.streaming = Some(*on),
            Change::Collect(on) => s.collect = Some(*on),
            Change::ModeratorsApprove(on) => s.moderators_approve = Some(*on),
            Change::Reset => s = Self::default(),
        }
        s
    }

    /// What the agent gets with each turn (`None`: nothing set for it).
    pub fn for_turn(&self) -> Option<TurnSettings> {
        let t = TurnSettings {
            model: self.model.clone(),
            instructions: self.instructions.clone(),
            tools: self.tools.clone(),
        };
        (t != TurnSettings::default()).then_some(t)
    }

    /// The settings as `!settings` shows them (markdown).
    pub fn show(&self) -> String {
        let or_default = |v: Option<String>| v.unwrap_or_else(|| "the operator's default".into());
        let mut lines = vec![
            "This room's settings:".to_owned(),
            format!(
                "- model: {}",
                or_default(self.model.as_ref().map(|m| format!("`{m}`")))
            ),
            format!(
                "- mode: {}",
                match self.every_message {
                    Some(true) => "every message",
                    Some(false) => "mentions only",
                    None => "the default (mentions in groups)",
                }
            ),
            format!(
                "- streaming: {}",
                match self.streaming {
                    Some(false) => "off",
                    _ => "on",
                }
            ),
            format!(
                "- who may approve: {}",
                match self.moderators_approve {
                    Some(true) => "whoever asked, or a moderator",
                    _ => "whoever asked",
                }
            ),
            format!(
                "- messages sent while an answer is written: {}",
                match self.collect {
                    Some(true) => "collected into one next answer",
                    _ => "answered each in turn",
                }
            ),
        ];
        match &self.instructions {
            Some(i) => lines.push(format!("- instructions: {}", quote(i))),
            None => lines.push("- instructions: none".into()),
        }
        for (tool, policy) in &self.tools {
            lines.push(format!("- tool `{tool}`: {}", policy_word(*policy)));
        }
        lines.push(String::new());
        lines.push(format!(
            "Change them with `!set model|instructions|tool|mode|streaming|queue|approvers …` or `!reset` \
             (moderators), or edit the `{EVENT_TYPE}` state event."
        ));
        lines.join("\n")
    }
}

/// The content of `room`'s state event `event_type`/`key`, as the client's store has it.
pub async fn state_content(room: &Room, event_type: &str, key: &str) -> Option<Value> {
    let raw = room
        .get_state_event(StateEventType::from(event_type), key)
        .await
        .ok()??;
    let event: Value = match raw {
        RawAnySyncOrStrippedState::Sync(r) => r.deserialize_as_unchecked().ok()?,
        RawAnySyncOrStrippedState::Stripped(r) => r.deserialize_as_unchecked().ok()?,
    };
    event.get("content").cloned()
}

/// `room`'s settings (none set: the defaults), and what in them made no sense.
pub async fn read(room: &Room) -> (RoomSettings, Vec<String>) {
    match state_content(room, EVENT_TYPE, "").await {
        Some(content) => RoomSettings::from_content(&content),
        None => (RoomSettings::default(), Vec::new()),
    }
}

/// `allow`, `ask` or `deny`.
pub fn policy_word(p: ToolPolicy) -> &'static str {
    match p {
        ToolPolicy::Allow => "allow",
        ToolPolicy::Ask => "ask",
        ToolPolicy::Deny => "deny",
    }
}

fn quote(text: &str) -> String {
    let short: String = text.chars().take(300).collect();
    let more = if short.len() < text.len() { " …" } else { "" };
    format!("“{}{more}”", short.replace('\n', " "))
}

fn valid_model(m: &str) -> bool {
    !m.trim().is_empty() && m.len() <= MAX_MODEL && !m.chars().any(char::is_control)
}

fn valid_tool(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '*' | '.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_from_the_state_event() {
        let cases: Vec<(&str, Value, RoomSettings, Vec<&str>)> = vec![
            ("nothing set", json!({}), RoomSettings::default(), vec![]),
            (
                "everything",
                json!({"model": "m1", "instructions": "Be brief.", "tools": {"write_file": "ask"},
                       "mode": "all", "streaming": false, "queue": "collect",
                       "approvers": "moderators"}),
                RoomSettings {
                    model: Some("m1".into()),
                    instructions: Some("Be brief.".into()),
                    tools: BTreeMap::from([("write_file".into(), ToolPolicy::Ask)]),
                    every_message: Some(true),
                    streaming: Some(false),
                    collect: Some(true),
                    moderators_approve: Some(true),
                },
                vec![],
            ),
            (
                "nonsense is named, the rest is kept",
                json!({"model": 7, "tools": {"write_file": "maybe", "read_file": "deny"},
                       "mode": "loud", "streaming": "yes"}),
                RoomSettings {
                    tools: BTreeMap::from([("read_file".into(), ToolPolicy::Deny)]),
                    ..RoomSettings::default()
                },
                vec!["model", "tools.write_file", "mode", "streaming"],
            ),
            (
                "instructions too long",
                json!({"instructions": "x".repeat(MAX_INSTRUCTIONS + 1)}),
                RoomSettings::default(),
                vec!["instructions"],
            ),
            (
                "a model name with a control character",
                json!({"model": "m\u{0}"}),
                RoomSettings::default(),
                vec!["model"],
            ),
            (
                "not an object",
                json!([1]),
                RoomSettings::default(),
                vec!["the content is not an object"],
            ),
        ];
        for (name, content, expected, problems) in cases {
            let (got, why) = RoomSettings::from_content(&content);
            assert_eq!(got, expected, "{name}");
            assert_eq!(why, problems, "{name}");
            // What is kept survives a round trip through the state event.
            assert_eq!(
                RoomSettings::from_content(&got.to_content()).0,
                got,
                "{name}"
            );
        }
    }

    #[test]
    fn changes_and_what_the_agent_gets() {
        let s = RoomSettings::default();
        assert_eq!(s.for_turn(), None, "nothing to send");
        let s = s
            .with(&Change::Model("m2".into()))
            .with(&Change::Tool("write_file".into(), ToolPolicy::Ask))
            .with(&Change::Streaming(false))
            .with(&Change::Mode(true));
        let t = s.for_turn().unwrap();
        assert_eq!(t.model.as_deref(), Some("m2"));
        assert_eq!(t.tools["write_file"], ToolPolicy::Ask);
        assert_eq!(s.streaming, Some(false));
        assert_eq!(s.every_message, Some(true));
        let shown = s.show();
        assert!(
            shown.contains("`m2`") && shown.contains("`write_file`: ask"),
            "{shown}"
        );
        assert_eq!(
            s.with(&Change::Instructions("  ".into())).instructions,
            None
        );
        assert_eq!(s.with(&Change::Reset), RoomSettings::default());
    }
}
