//! The `!` commands a room gives the bot, read from a message's text once the mention of the
//! bot is taken off (pure, table-tested): `!mode all|mentions`, `!stop` and `!help`. Anything
//! else, an unknown `!word` included, is an ordinary message for the agent.
//!
//! The same commands are described for clients as MSC4391 proposes ([`descriptions`]: one
//! `org.matrix.msc4391.command_description` state event per command, keyed by [`state_key`]);
//! such a client sends `/stop` with the bot mentioned, which reads the same as `!stop`.

use base64::Engine;
use protocol::ToolPolicy;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// A change of a room's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// `!set model <name>`.
    Model(String),
    /// `!set instructions <text>` (empty: none).
    Instructions(String),
    /// `!set tool <name> allow|ask|deny`.
    Tool(String, ToolPolicy),
    /// `!set mode all|mentions` (and `!mode …`).
    Mode(bool),
    /// `!set streaming on|off`.
    Streaming(bool),
    /// `!set queue each|collect`: messages sent while an answer is written are answered each
    /// in turn, or collected into one next turn.
    Collect(bool),
    /// `!set approvers requester|moderators`: who may decide an approval prompt.
    ModeratorsApprove(bool),
    /// `!reset`: back to the operator's defaults.
    Reset,
}

/// A command addressed to the bot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `!mode all` / `!mode mentions`: answer every message, or only mentions (moderators).
    Mode {
        /// `all`.
        every_message: bool,
    },
    /// `!stop`: stop the answer being written (its requester or a moderator).
    Stop,
    /// `!help`: what the bot understands here.
    Help,
    /// `!set …` and `!reset`: change the room's settings (who may send its settings state
    /// event, moderators by default).
    Set(Change),
    /// `!set` with something it does not understand: the usage is shown.
    SetUsage,
    /// `!settings`: show them.
    Settings,
}

/// Every command with one line on what it does, in the order `!help` lists them.
pub const COMMANDS: [(&str, &str); 12] = [
    (
        "!stop",
        "stop the answer being written (also: react ⏹️ to it, or delete your message)",
    ),
    ("!settings", "show this room's settings"),
    (
        "!set model <name>",
        "answer with this model here (moderators)",
    ),
    (
        "!set instructions <text>",
        "add instructions to the agent's prompt here (moderators)",
    ),
    (
        "!set tool <name> allow|ask|deny",
        "make a tool ask or refuse here; never looser than the operator allows (moderators)",
    ),
    (
        "!set streaming on|off",
        "show answers while they are written, or only when done (moderators)",
    ),
    (
        "!set approvers requester|moderators",
        "who may decide an approval prompt: whoever asked, or also a moderator (moderators)",
    ),
    (
        "!set queue each|collect",
        "messages sent while an answer is written: answered each in turn, or collected into one \
         next answer (moderators)",
    ),
    (
        "!mode all",
        "answer every message in this room (moderators; also `!set mode all`)",
    ),
    ("!mode mentions", "answer only when mentioned (moderators)"),
    ("!reset", "back to the operator's defaults (moderators)"),
    ("!help", "this list"),
];

/// The command `text` is, if any (`text` is what was said to the bot, its mention removed):
/// `!word`, or `/word` as an MSC4391 client sends it.
pub fn parse(text: &str) -> Option<Command> {
    let text = text.trim();
    let (word, arg) = match text.split_once(char::is_whitespace) {
        Some((w, a)) => (w, a.trim()),
        None => (text, ""),
    };
    let word = word.strip_prefix('!').or_else(|| word.strip_prefix('/'))?;
    match (word.to_lowercase().as_str(), arg) {
        ("mode", arg) => mode(arg).map(|all| Command::Mode { every_message: all }),
        ("stop", "") => Some(Command::Stop),
        ("help", "") => Some(Command::Help),
        ("settings", "") => Some(Command::Settings),
        ("reset", "") => Some(Command::Set(Change::Reset)),
        ("set", arg) => Some(set(arg).map_or(Command::SetUsage, Command::Set)),
        _ => None,
    }
}

/// `all` or `mentions`, as whether every message is answered.
fn mode(arg: &str) -> Option<bool> {
    match arg.to_lowercase().as_str() {
        "all" | "every" | "everything" => Some(true),
        "mention" | "mentions" => Some(false),
        _ => None,
    }
}

/// What `!set <arg>` changes.
fn set(arg: &str) -> Option<Change> {
    let (key, value) = match arg.split_once(char::is_whitespace) {
        Some((k, v)) => (k, v.trim()),
        None => (arg, ""),
    };
    match key.to_lowercase().as_str() {
        "model" if !value.is_empty() && !value.contains(char::is_whitespace) => {
            Some(Change::Model(value.to_owned()))
        }
        "instructions" => Some(Change::Instructions(value.to_owned())),
        "tool" => {
            let (name, policy) = value.split_once(char::is_whitespace)?;
            let policy = match policy.trim().to_lowercase().as_str() {
                "allow" => ToolPolicy::Allow,
                "ask" => ToolPolicy::Ask,
                "deny" => ToolPolicy::Deny,
                _ => return None,
            };
            Some(Change::Tool(name.to_owned(), policy))
        }
        "mode" => mode(value).map(Change::Mode),
        "approvers" => match value.to_lowercase().as_str() {
            "requester" => Some(Change::ModeratorsApprove(false)),
            "moderators" => Some(Change::ModeratorsApprove(true)),
            _ => None,
        },
        "queue" => match value.to_lowercase().as_str() {
            "each" => Some(Change::Collect(false)),
            "collect" => Some(Change::Collect(true)),
            _ => None,
        },
        "streaming" => match value.to_lowercase().as_str() {
            "on" | "true" | "yes" => Some(Change::Streaming(true)),
            "off" | "false" | "no" => Some(Change::Streaming(false)),
            _ => None,
        },
        _ => None,
    }
}

/// MSC4391's state event type: the description of one command of a bot.
pub const DESCRIPTION_TYPE: &str = "org.matrix.msc4391.command_description";

/// The state key of `command`'s description by `bot`: SHA-256 of the command and the bot's user
/// id, in padded standard base64, as MSC4391 asks (clients check it, so no member's event can
/// pass as the bot's).
pub fn state_key(command: &str, bot: &str) -> String {
    let digest = Sha256::digest(format!("{command}{bot}").as_bytes());
    base64::engine::general_purpose::STANDARD.encode(digest)
}

/// Every command's MSC4391 description: its word and the state event's content.
pub fn descriptions() -> Vec<(&'static str, Value)> {
    let text = |body: &str| json!({"m.text": [{"body": body}]});
    let literal = |v: &str| json!({"schema_type": "literal", "value": v});
    vec![
        (
            "stop",
            json!({"command": "stop", "parameters": [],
                "description": text("Stop the answer being written (its requester or a moderator)")}),
        ),
        (
            "mode",
            json!({"command": "mode",
                "parameters": [{"key": "mode", "schema": {"schema_type": "union",
                    "variants": [literal("all"), literal("mentions")]}}],
                "description": text("Answer every message here, or only mentions (moderators)")}),
        ),
        (
            "help",
            json!({"command": "help", "parameters": [],
                "description": text("List the bot's commands")}),
        ),
        (
            "settings",
            json!({"command": "settings", "parameters": [],
                "description": text("Show this room's settings")}),
        ),
        (
            "set",
            json!({"command": "set",
                "parameters": [
                    {"key": "setting", "schema": {"schema_type": "union", "variants": [
                        literal("model"), literal("instructions"), literal("tool"),
                        literal("mode"), literal("streaming"), literal("queue"),
                        literal("approvers")]}},
                    {"key": "value", "schema": {"schema_type": "primitive", "type": "string"}}],
                "fi.mau.tail_parameter": "value",
                "description": text("Change a setting of this room (moderators)")}),
        ),
        (
            "reset",
            json!({"command": "reset", "parameters": [],
                "description": text("Back to the operator's defaults (moderators)")}),
        ),
    ]
}

/// The answer to `!help` (markdown).
pub fn help_text() -> String {
    let mut text = String::from(
        "Commands (in a group room, mention me first; in a direct chat, just send them):\n",
    );
    for (command, what) in COMMANDS {
        text.push_str(&format!("\n- `{command}`: {what}"));
    }
    text.push_str("\n\nAnything else goes to the agent: ask it `help` for what it can do.");
    text
}

/// Whether a reaction's key means stop: ⏹️ (and 🛑), and 🔁 (restart: stop, so that the
/// edited message waiting behind is answered), variation selectors ignored.
pub fn is_stop_reaction(key: &str) -> bool {
    let bare: String = key
        .chars()
        .filter(|c| *c != '\u{FE0F}' && *c != '\u{FE0E}')
        .collect();
    matches!(bare.as_str(), "⏹" | "🛑" | "🔁")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let cases: &[(&str, Option<Command>)] = &[
            ("!stop", Some(Command::Stop)),
            ("  !STOP ", Some(Command::Stop)),
            ("!stop now please", None),
            ("!help", Some(Command::Help)),
            (
                "!mode all",
                Some(Command::Mode {
                    every_message: true,
                }),
            ),
            (
                "!mode   Mentions",
                Some(Command::Mode {
                    every_message: false,
                }),
            ),
            ("!mode loud", None),
            ("!mode", None),
            ("stop", None),
            ("please !stop", None),
            ("!unknown", None),
            ("", None),
            ("/stop", Some(Command::Stop)),
            (
                "/mode mentions",
                Some(Command::Mode {
                    every_message: false,
                }),
            ),
            ("stop!", None),
            ("!settings", Some(Command::Settings)),
            ("!reset", Some(Command::Set(Change::Reset))),
            (
                "!set model Qwen/Qwen3-8B",
                Some(Command::Set(Change::Model("Qwen/Qwen3-8B".into()))),
            ),
            ("!set model two words", Some(Command::SetUsage)),
            (
                "!set instructions Answer in French.\nBe brief.",
                Some(Command::Set(Change::Instructions(
                    "Answer in French.\nBe brief.".into(),
                ))),
            ),
            (
                "!set tool write_file ASK",
                Some(Command::Set(Change::Tool(
                    "write_file".into(),
                    ToolPolicy::Ask,
                ))),
            ),
            ("!set tool write_file maybe", Some(Command::SetUsage)),
            (
                "!set streaming off",
                Some(Command::Set(Change::Streaming(false))),
            ),
            ("!set mode all", Some(Command::Set(Change::Mode(true)))),
            (
                "!set queue collect",
                Some(Command::Set(Change::Collect(true))),
            ),
            (
                "!set approvers Moderators",
                Some(Command::Set(Change::ModeratorsApprove(true))),
            ),
            ("!set queue sometimes", Some(Command::SetUsage)),
            ("!set colour blue", Some(Command::SetUsage)),
            ("!set", Some(Command::SetUsage)),
        ];
        for (text, expected) in cases {
            assert_eq!(parse(text), *expected, "{text:?}");
        }
    }

    #[test]
    fn stop_reactions() {
        for (key, stop) in [
            ("⏹️", true),
            ("⏹", true),
            ("🛑", true),
            ("🔁", true),
            ("✅", false),
            ("❌", false),
            ("", false),
        ] {
            assert_eq!(is_stop_reaction(key), stop, "{key:?}");
        }
    }

    #[test]
    fn msc4391_descriptions() {
        // The key clients compute: padded standard base64 of SHA-256("stop@bot:hs").
        let expected =
            base64::engine::general_purpose::STANDARD.encode(Sha256::digest(b"stop@bot:hs"));
        assert_eq!(state_key("stop", "@bot:hs"), expected);
        assert_eq!(expected.len(), 44, "padded");
        assert_ne!(state_key("stop", "@bot:hs"), state_key("stop", "@other:hs"));
        let all = descriptions();
        for (word, content) in &all {
            assert_eq!(content["command"], *word);
            assert!(content["description"]["m.text"][0]["body"].is_string());
            // Every described command is one `parse` knows.
            let args = content["parameters"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| {
                    p["schema"]["variants"][0]["value"]
                        .as_str()
                        .unwrap_or("x")
                        .to_owned()
                })
                .collect::<Vec<_>>()
                .join(" ");
            assert!(parse(&format!("/{word} {args}")).is_some(), "{word} {args}");
        }
        let help = help_text();
        for (word, _) in &all {
            assert!(help.contains(&format!("`!{word}")), "{word}");
        }
    }

    #[test]
    fn help_lists_every_command() {
        let help = help_text();
        for (command, _) in COMMANDS {
            assert!(help.contains(&format!("`{command}`")), "{command}");
        }
    }
}
