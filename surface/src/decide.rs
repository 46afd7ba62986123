//! What an incoming message means for the bot: a pure function with table tests. The side
//! effects live in the sync ingest and the lanes.
//!
//! Besides triggers and context it decides: the room and sender allowlists and the bot-loop
//! breaker; what answers a waiting prompt (text from the asked user, or a ✅ ♾️ ❌ reaction on
//! the prompt; a file never does; with `SURFACE_APPROVALS=verified` only from a device its user
//! verified); that an encrypted room acts only on events that arrived encrypted
//! ([`Decision::Plaintext`]); what an edit does (a message not processed yet takes the new text,
//! one that ran gets a follow-up turn); the `!` commands ([`crate::command`]) and a ⏹️
//! reaction on the answer being written; and redactions.
//! [`without_mention`] takes the bot's name out of the text it forwards, so the brain never
//! guesses which leading word is a name.

use protocol::Decision as ApprovalChoice;

use crate::command::{self, Command};

/// A question or approval the bot is waiting on from this message's sender in this room.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waiting {
    /// An `ask_user` question.
    Question {
        /// The question id.
        question_id: String,
    },
    /// An `approval_request`.
    Approval {
        /// The request id.
        request_id: String,
    },
}

/// The facts [`decide`] looks at, gathered by the caller.
#[derive(Debug, Clone, Default)]
pub struct Facts<'a> {
    /// The bot's user id.
    pub bot_user_id: &'a str,
    /// The bot's display name, if set.
    pub bot_display_name: Option<&'a str>,
    /// The sender's user id.
    pub sender: &'a str,
    /// The sender matches `SURFACE_ALLOWED_USERS`.
    pub sender_allowed: bool,
    /// The room matches `SURFACE_ALLOWED_ROOMS`.
    pub room_allowed: bool,
    /// The sender is a bot (configured, or seen posting notices).
    pub sender_is_bot: bool,
    /// Turns in a row other bots have triggered in this chat.
    pub bot_streak: u32,
    /// How many such turns are allowed in a row (`SURFACE_MAX_BOT_TURNS`).
    pub max_bot_turns: u32,
    /// The event is an `m.room.message` (other types are never turns).
    pub is_message: bool,
    /// The event is still `m.room.encrypted`: its room key has not arrived (yet).
    pub undecryptable: bool,
    /// The room has encryption on.
    pub room_encrypted: bool,
    /// The event arrived encrypted (and was decrypted).
    pub arrived_encrypted: bool,
    /// It came from a device its user verified (cross-signed), as the bot's crypto store sees it.
    pub verified_device: bool,
    /// `SURFACE_APPROVALS=verified`: an approval counts only from a verified device.
    pub approvals_need_verified: bool,
    /// `msgtype` is `m.notice` (what bots post; answering them loops bots).
    pub is_notice: bool,
    /// The event edits another one (`m.replace`).
    pub is_edit: bool,
    /// The event is an `m.room.redaction` (the server checked who may redact what).
    pub is_redaction: bool,
    /// For an edit by the message's author: where the edited message stands.
    pub edited: Option<Edited>,
    /// The message carries a file (`m.image`, `m.file`, `m.audio`, `m.video`): it is a new
    /// turn of its own, never the answer to a waiting question or approval.
    pub has_media: bool,
    /// What the bot cannot read yet (`sticker`, `location`, `poll`), for such events.
    pub unsupported: Option<&'static str>,
    /// For an `m.reaction`: its key (the emoji). Its target's wait is in `waiting`, set only
    /// when the reaction is on a prompt and comes from the user the prompt asks.
    pub reaction: Option<&'a str>,
    /// The plain-text body.
    pub body: &'a str,
    /// `m.mentions.user_ids` contains the bot.
    pub mentions_bot: bool,
    /// The message replies to something the bot posted.
    pub reply_to_bot: bool,
    /// The message is in a thread the bot posts in.
    pub in_bot_thread: bool,
    /// `SURFACE_THREADS=mentions`: in a group room, a message in the bot's thread is answered
    /// only when it mentions or replies to the bot (by default every message there is).
    pub threads_need_mention: bool,
    /// The room has at most two joined members.
    pub direct_chat: bool,
    /// The room's moderators set the bot to answer every message, not only mentions.
    pub every_message: bool,
    /// What the bot waits for from this sender here, if anything.
    pub waiting: Option<Waiting>,
    /// For an `m.reaction`: it is on the message being answered right now, or on the answer
    /// being written for it.
    pub on_running_turn: bool,
}

/// Where the message an edit changes stands (looked up in the journal by the caller).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edited {
    /// Not processed yet: the edit replaces its text.
    Queued,
    /// Its turn ran or runs: the edit is a follow-up turn.
    Ran,
}

/// Why an event is ignored (for logs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IgnoreReason {
    /// Sent by the bot itself.
    OwnEvent,
    /// Not an `m.room.message`.
    NotAMessage,
    /// Sender not allowed.
    NotAllowed,
    /// Room not allowed.
    RoomNotAllowed,
    /// Another bot triggered too many turns in a row in this chat.
    BotLoop,
    /// An `m.notice`.
    Notice,
    /// An edit.
    Edit,
    /// A reaction that is not an answer (another emoji, another message, another user).
    Reaction,
}

/// The outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Do nothing.
    Ignore(IgnoreReason),
    /// Carry along as context with the next turn of its chat.
    Context,
    /// Start a turn.
    Trigger,
    /// Not decryptable yet: hold its place in the room order until its key arrives.
    WaitForKey,
    /// The answer to question `question_id`.
    Answer(String),
    /// A redaction: the redacted message's files leave the inbox, and its chat is told.
    Redaction,
    /// An edit of a message not processed yet: it takes the new text.
    ReplaceQueued,
    /// A `!` command addressed to the bot (or a ⏹️ reaction on the answer being written, which
    /// is [`Command::Stop`]); the caller checks who may give it.
    Command(Command),
    /// Something the bot cannot read yet, sent to it: say so (once).
    Unsupported(&'static str),
    /// A message, edit or reaction sent unencrypted in an encrypted room: anyone who can reach
    /// the homeserver's API as a member can send one, no client shows it as trusted, so it is
    /// not acted on; the room is told once.
    Plaintext,
    /// An approval from a device its user has not verified, while `SURFACE_APPROVALS=verified`:
    /// it does not count (the prompt keeps waiting), and the sender is told why.
    UnverifiedApproval {
        /// The request it would have answered.
        request_id: String,
    },
    /// The decision on approval `request_id`.
    Approval {
        /// The request answered.
        request_id: String,
        /// What the user chose.
        choice: ApprovalChoice,
    },
}

/// Classifies a message.
pub fn decide(f: &Facts<'_>) -> Decision {
    if let Some(d) = gate(f) {
        return d;
    }
    if let Some(key) = f.reaction {
        return reaction(f, key);
    }
    if let Some(kind) = f.unsupported {
        let addressed = f.direct_chat || f.mentions_bot || f.reply_to_bot || in_thread(f);
        return if addressed {
            Decision::Unsupported(kind)
        } else {
            Decision::Ignore(IgnoreReason::NotAMessage)
        };
    }
    if !f.is_message {
        return Decision::Ignore(IgnoreReason::NotAMessage);
    }
    if f.is_notice {
        return Decision::Ignore(IgnoreReason::Notice);
    }
    // An edit changes a message that waits, follows up on one that ran, and does nothing else.
    if f.is_edit {
        return match f.edited {
            Some(Edited::Queued) => Decision::ReplaceQueued,
            Some(Edited::Ran) => Decision::Trigger,
            None => Decision::Ignore(IgnoreReason::Edit),
        };
    }
    let addressed =
        f.direct_chat || f.mentions_bot || f.reply_to_bot || in_thread(f) || body_mentions_bot(f);
    let command = match f.has_media {
        true => None,
        false => command::parse(without_mention(f.body, f.bot_user_id, f.bot_display_name)),
    };
    // `!stop` while the bot waits for the sender's answer stops the turn that asked.
    if command == Some(Command::Stop) && (addressed || f.waiting.is_some()) {
        return Decision::Command(Command::Stop);
    }
    if let Some(d) = answer(f) {
        return d;
    }
    if addressed && let Some(c) = command {
        return Decision::Command(c);
    }
    if addressed || f.every_message {
        if f.sender_is_bot && f.bot_streak >= f.max_bot_turns {
            return Decision::Ignore(IgnoreReason::BotLoop);
        }
        Decision::Trigger
    } else {
        Decision::Context
    }
}

/// What is settled before the content is looked at: who sent it, where, whether it can be
/// read yet, and whether it arrived as an encrypted room requires.
fn gate(f: &Facts<'_>) -> Option<Decision> {
    if f.sender == f.bot_user_id {
        return Some(Decision::Ignore(IgnoreReason::OwnEvent));
    }
    if !f.room_allowed {
        return Some(Decision::Ignore(IgnoreReason::RoomNotAllowed));
    }
    if f.is_redaction {
        return Some(Decision::Redaction);
    }
    // Whether an undecryptable event is a message at all is known only once its key arrives;
    // until then it keeps its place, so later messages are not answered first.
    if f.undecryptable {
        return Some(if f.sender_allowed {
            Decision::WaitForKey
        } else {
            Decision::Ignore(IgnoreReason::NotAllowed)
        });
    }
    if !f.sender_allowed {
        return Some(Decision::Ignore(IgnoreReason::NotAllowed));
    }
    let content = f.is_message || f.reaction.is_some() || f.unsupported.is_some();
    if f.room_encrypted && !f.arrived_encrypted && content {
        return Some(Decision::Plaintext);
    }
    None
}

/// An approval that counts only from a verified session came from another one.
fn unverified(f: &Facts<'_>) -> bool {
    f.approvals_need_verified && !f.verified_device
}

/// A reaction: an answer to the approval prompt it is on, a stop of the answer it is on, or
/// nothing.
fn reaction(f: &Facts<'_>, key: &str) -> Decision {
    if f.on_running_turn && command::is_stop_reaction(key) {
        return Decision::Command(Command::Stop);
    }
    match (&f.waiting, reaction_choice(key)) {
        (Some(Waiting::Approval { request_id }), Some(_)) if unverified(f) => {
            Decision::UnverifiedApproval {
                request_id: request_id.clone(),
            }
        }
        (Some(Waiting::Approval { request_id }), Some(choice)) => Decision::Approval {
            request_id: request_id.clone(),
            choice,
        },
        _ => Decision::Ignore(IgnoreReason::Reaction),
    }
}

/// A message while the bot waits for this sender's answer: the answer (a file never is: it
/// is a turn of its own, queued behind the waiting one).
fn answer(f: &Facts<'_>) -> Option<Decision> {
    if f.has_media {
        return None;
    }
    match f.waiting.as_ref()? {
        Waiting::Question { question_id } => Some(Decision::Answer(question_id.clone())),
        Waiting::Approval { request_id } if unverified(f) => Some(Decision::UnverifiedApproval {
            request_id: request_id.clone(),
        }),
        Waiting::Approval { request_id } => Some(Decision::Approval {
            request_id: request_id.clone(),
            choice: parse_approval(f.body),
        }),
    }
}

/// A thread the bot posts in is a conversation with it: every message there is addressed to
/// it, unless `SURFACE_THREADS=mentions` asks for a mention there too.
fn in_thread(f: &Facts<'_>) -> bool {
    f.in_bot_thread && !f.threads_need_mention
}

/// `yes` / `no` / `always` (and a few synonyms). Anything else is a refusal: consent must be
/// explicit.
pub fn parse_approval(body: &str) -> ApprovalChoice {
    explicit_approval(body).unwrap_or(ApprovalChoice::Deny)
}

/// The decision `body` spells out (`yes`, `always`, `no` and synonyms), if it is one.
pub fn explicit_approval(body: &str) -> Option<ApprovalChoice> {
    let word = strip_reply_fallback(body)
        .trim()
        .trim_end_matches(['.', '!'])
        .to_lowercase();
    match word.as_str() {
        "yes" | "y" | "ok" | "allow" | "approve" | "approved" => Some(ApprovalChoice::AllowOnce),
        "always" | "yes always" | "always allow" => Some(ApprovalChoice::AllowAlways),
        "no" | "n" | "deny" | "denied" | "reject" => Some(ApprovalChoice::Deny),
        _ => None,
    }
}

/// The reactions the bot seeds on an approval prompt, in order, with what each means.
pub const APPROVAL_REACTIONS: [(&str, ApprovalChoice); 3] = [
    ("✅", ApprovalChoice::AllowOnce),
    ("♾️", ApprovalChoice::AllowAlways),
    ("❌", ApprovalChoice::Deny),
];

/// What a reaction on an approval prompt decides: the seeded ✅ ♾️ ❌ and the common
/// thumbs; any other emoji decides nothing. Variation selectors and skin tones are ignored.
pub fn reaction_choice(key: &str) -> Option<ApprovalChoice> {
    let bare: String = key
        .chars()
        .filter(|c| !matches!(*c, '\u{FE0E}' | '\u{FE0F}' | '\u{1F3FB}'..='\u{1F3FF}'))
        .collect();
    match bare.as_str() {
        "✅" | "✔" | "👍" => Some(ApprovalChoice::AllowOnce),
        "♾" | "🔁" => Some(ApprovalChoice::AllowAlways),
        "❌" | "✖" | "👎" | "🚫" => Some(ApprovalChoice::Deny),
        _ => None,
    }
}

/// Removes the `> quoted` lines clients put in front of a reply's body.
pub fn strip_reply_fallback(body: &str) -> &str {
    if !body.starts_with("> ") {
        return body;
    }
    match body.find("\n\n") {
        Some(i) => &body[i + 2..],
        None => body,
    }
}

/// The text a triggering message says to the bot: the reply quote dropped, and a mention of
/// the bot at its start (`Helper Bot: …`, `@bot:hs …`, `bot, …`) removed, so the agent gets
/// what was asked and never has to guess which leading word is a name (pure).
pub fn without_mention<'a>(
    body: &'a str,
    bot_user_id: &str,
    display_name: Option<&str>,
) -> &'a str {
    let text = strip_reply_fallback(body).trim_start();
    let localpart = bot_user_id
        .trim_start_matches('@')
        .split(':')
        .next()
        .unwrap_or_default();
    let mut names = vec![bot_user_id, localpart];
    names.extend(display_name);
    // The longest first: a display name may start with the localpart.
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    for name in names.iter().filter(|n| !n.is_empty()) {
        let Some(head) = text.get(..name.len()) else {
            continue;
        };
        if !head.eq_ignore_ascii_case(name) && head.to_lowercase() != name.to_lowercase() {
            continue;
        }
        let rest = &text[name.len()..];
        match rest.chars().next() {
            None => return "",
            Some(c) if c == ':' || c == ',' || c.is_whitespace() => {
                return rest.trim_start_matches([':', ',']).trim_start();
            }
            Some(_) => {}
        }
    }
    text
}

fn body_mentions_bot(f: &Facts<'_>) -> bool {
    let body = strip_reply_fallback(f.body).to_lowercase();
    let localpart = f
        .bot_user_id
        .trim_start_matches('@')
        .split(':')
        .next()
        .unwrap_or_default()
        .to_lowercase();
    let mut names = vec![f.bot_user_id.to_lowercase(), localpart];
    if let Some(d) = f.bot_display_name {
        names.push(d.to_lowercase());
    }
    names
        .iter()
        .filter(|n| !n.is_empty())
        .any(|n| contains_word(&body, n))
}

/// `needle` occurs in `hay` not glued to letters or digits (so `bot` does not match `robot`).
fn contains_word(hay: &str, needle: &str) -> bool {
    let is_word = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
    hay.match_indices(needle).any(|(i, m)| {
        let before = hay[..i].chars().next_back();
        let after = hay[i + m.len()..].chars().next();
        !is_word(before) && !is_word(after)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> Facts<'static> {
        Facts {
            bot_user_id: "@bot:hs",
            bot_display_name: Some("Helper Bot"),
            sender: "@alice:hs",
            sender_allowed: true,
            room_allowed: true,
            max_bot_turns: 3,
            is_message: true,
            body: "hello",
            ..Facts::default()
        }
    }

    #[test]
    fn table() {
        let q = Waiting::Question {
            question_id: "q1".into(),
        };
        let a = Waiting::Approval {
            request_id: "r1".into(),
        };
        type Tweak = fn(&mut Facts<'static>);
        let cases: Vec<(&str, Tweak, Decision)> = vec![
            ("group, plain", |_| {}, Decision::Context),
            ("direct chat", |f| f.direct_chat = true, Decision::Trigger),
            (
                "own event",
                |f| f.sender = "@bot:hs",
                Decision::Ignore(IgnoreReason::OwnEvent),
            ),
            (
                "not a message",
                |f| f.is_message = false,
                Decision::Ignore(IgnoreReason::NotAMessage),
            ),
            (
                "not allowed, even in DM",
                |f| {
                    f.sender_allowed = false;
                    f.direct_chat = true;
                },
                Decision::Ignore(IgnoreReason::NotAllowed),
            ),
            (
                "notice",
                |f| {
                    f.is_notice = true;
                    f.direct_chat = true;
                },
                Decision::Ignore(IgnoreReason::Notice),
            ),
            (
                "edit",
                |f| {
                    f.is_edit = true;
                    f.direct_chat = true;
                },
                Decision::Ignore(IgnoreReason::Edit),
            ),
            (
                "undecryptable from an allowed user",
                |f| {
                    f.undecryptable = true;
                    f.is_message = false;
                },
                Decision::WaitForKey,
            ),
            (
                "undecryptable from a stranger",
                |f| {
                    f.undecryptable = true;
                    f.is_message = false;
                    f.sender_allowed = false;
                },
                Decision::Ignore(IgnoreReason::NotAllowed),
            ),
            (
                "own undecryptable",
                |f| {
                    f.undecryptable = true;
                    f.sender = "@bot:hs";
                },
                Decision::Ignore(IgnoreReason::OwnEvent),
            ),
            ("m.mentions", |f| f.mentions_bot = true, Decision::Trigger),
            ("reply to bot", |f| f.reply_to_bot = true, Decision::Trigger),
            (
                "in the bot's thread: a conversation with it",
                |f| f.in_bot_thread = true,
                Decision::Trigger,
            ),
            (
                "in the bot's thread with SURFACE_THREADS=mentions: context",
                |f| {
                    f.in_bot_thread = true;
                    f.threads_need_mention = true;
                },
                Decision::Context,
            ),
            (
                "in the bot's thread with SURFACE_THREADS=mentions, mentioned",
                |f| {
                    f.in_bot_thread = true;
                    f.threads_need_mention = true;
                    f.mentions_bot = true;
                },
                Decision::Trigger,
            ),
            (
                "in the bot's thread with SURFACE_THREADS=mentions, a reply to the bot",
                |f| {
                    f.in_bot_thread = true;
                    f.threads_need_mention = true;
                    f.reply_to_bot = true;
                },
                Decision::Trigger,
            ),
            (
                "localpart in body",
                |f| f.body = "bot: help",
                Decision::Trigger,
            ),
            (
                "localpart case-insensitive",
                |f| f.body = "hey BOT, files?",
                Decision::Trigger,
            ),
            (
                "display name in body",
                |f| f.body = "Helper Bot what is this",
                Decision::Trigger,
            ),
            (
                "full id in body",
                |f| f.body = "@bot:hs help",
                Decision::Trigger,
            ),
            (
                "substring is not a mention",
                |f| f.body = "the robot said",
                Decision::Context,
            ),
            (
                "mention only in quoted reply",
                |f| f.body = "> <@x:hs> bot do it\n\nthanks",
                Decision::Context,
            ),
            (
                "waiting question wins over mention rules",
                |f| f.body = "blue",
                Decision::Context,
            ),
            ("empty body in group", |f| f.body = "", Decision::Context),
            (
                "every message in a room set so",
                |f| f.every_message = true,
                Decision::Trigger,
            ),
            (
                "!mode all with a mention",
                |f| {
                    f.mentions_bot = true;
                    f.body = "bot: !mode all";
                },
                Decision::Command(Command::Mode {
                    every_message: true,
                }),
            ),
            (
                "!mode mentions in a DM",
                |f| {
                    f.direct_chat = true;
                    f.body = "!mode mentions";
                },
                Decision::Command(Command::Mode {
                    every_message: false,
                }),
            ),
            (
                "!stop in a DM",
                |f| {
                    f.direct_chat = true;
                    f.body = "!stop";
                },
                Decision::Command(Command::Stop),
            ),
            (
                "!stop while a question waits for the sender stops, it is no answer",
                |f| {
                    f.direct_chat = true;
                    f.body = "!stop";
                    f.waiting = Some(Waiting::Question {
                        question_id: "q".into(),
                    });
                },
                Decision::Command(Command::Stop),
            ),
            (
                "!help with the bot's name in a group",
                |f| f.body = "bot: !help",
                Decision::Command(Command::Help),
            ),
            (
                "a ⏹️ reaction on the answer being written",
                |f| {
                    f.is_message = false;
                    f.reaction = Some("⏹️");
                    f.on_running_turn = true;
                },
                Decision::Command(Command::Stop),
            ),
            (
                "a ⏹️ reaction on anything else",
                |f| {
                    f.is_message = false;
                    f.reaction = Some("⏹️");
                },
                Decision::Ignore(IgnoreReason::Reaction),
            ),
            (
                "a ⏹️ reaction sent in clear in an encrypted room",
                |f| {
                    f.is_message = false;
                    f.reaction = Some("⏹️");
                    f.on_running_turn = true;
                    f.room_encrypted = true;
                },
                Decision::Plaintext,
            ),
            (
                "!mode without a mention in a group is just context",
                |f| f.body = "!mode all",
                Decision::Context,
            ),
            (
                "!mode with something unknown is a message",
                |f| {
                    f.direct_chat = true;
                    f.body = "!mode loud";
                },
                Decision::Trigger,
            ),
            (
                "a redaction, whoever made it",
                |f| {
                    f.is_redaction = true;
                    f.is_message = false;
                    f.sender_allowed = false;
                },
                Decision::Redaction,
            ),
            (
                "an edit of a queued message",
                |f| {
                    f.is_edit = true;
                    f.edited = Some(Edited::Queued);
                },
                Decision::ReplaceQueued,
            ),
            (
                "an edit of a message whose turn ran",
                |f| {
                    f.is_edit = true;
                    f.edited = Some(Edited::Ran);
                },
                Decision::Trigger,
            ),
            (
                "a sticker in a DM",
                |f| {
                    f.is_message = false;
                    f.unsupported = Some("sticker");
                    f.direct_chat = true;
                },
                Decision::Unsupported("sticker"),
            ),
            (
                "a location nobody addressed to the bot",
                |f| f.unsupported = Some("location"),
                Decision::Ignore(IgnoreReason::NotAMessage),
            ),
            (
                "a poll replying to the bot",
                |f| {
                    f.is_message = false;
                    f.unsupported = Some("poll");
                    f.reply_to_bot = true;
                },
                Decision::Unsupported("poll"),
            ),
            (
                "a room not allowed, even in DM",
                |f| {
                    f.room_allowed = false;
                    f.direct_chat = true;
                },
                Decision::Ignore(IgnoreReason::RoomNotAllowed),
            ),
            (
                "a bot's turn within the allowance",
                |f| {
                    f.sender_is_bot = true;
                    f.reply_to_bot = true;
                    f.bot_streak = 2;
                },
                Decision::Trigger,
            ),
            (
                "a bot past the allowance",
                |f| {
                    f.sender_is_bot = true;
                    f.reply_to_bot = true;
                    f.bot_streak = 3;
                },
                Decision::Ignore(IgnoreReason::BotLoop),
            ),
            (
                "a person past a bot's allowance",
                |f| {
                    f.reply_to_bot = true;
                    f.bot_streak = 3;
                },
                Decision::Trigger,
            ),
            (
                "no allowance at all",
                |f| {
                    f.sender_is_bot = true;
                    f.direct_chat = true;
                    f.max_bot_turns = 0;
                },
                Decision::Ignore(IgnoreReason::BotLoop),
            ),
            (
                "a file in a DM while an approval waits is a turn, not an answer",
                |f| {
                    f.direct_chat = true;
                    f.has_media = true;
                    f.body = "no";
                    f.waiting = Some(Waiting::Approval {
                        request_id: "r1".into(),
                    });
                },
                Decision::Trigger,
            ),
            (
                "a file in a group while a question waits is context",
                |f| {
                    f.has_media = true;
                    f.waiting = Some(Waiting::Question {
                        question_id: "q1".into(),
                    });
                },
                Decision::Context,
            ),
            (
                "encrypted room: a plaintext message is not acted on",
                |f| {
                    f.room_encrypted = true;
                    f.direct_chat = true;
                },
                Decision::Plaintext,
            ),
            (
                "encrypted room: a plaintext ✅ on a prompt approves nothing",
                |f| {
                    f.room_encrypted = true;
                    f.is_message = false;
                    f.reaction = Some("✅");
                    f.waiting = Some(Waiting::Approval {
                        request_id: "r1".into(),
                    });
                },
                Decision::Plaintext,
            ),
            (
                "encrypted room: a plaintext answer to a waiting approval",
                |f| {
                    f.room_encrypted = true;
                    f.body = "yes";
                    f.waiting = Some(Waiting::Approval {
                        request_id: "r1".into(),
                    });
                },
                Decision::Plaintext,
            ),
            (
                "encrypted room: a plaintext redaction is still a redaction (they are sent clear)",
                |f| {
                    f.room_encrypted = true;
                    f.is_message = false;
                    f.is_redaction = true;
                },
                Decision::Redaction,
            ),
            (
                "encrypted room: an encrypted message from an unverified device is answered",
                |f| {
                    f.room_encrypted = true;
                    f.arrived_encrypted = true;
                    f.direct_chat = true;
                },
                Decision::Trigger,
            ),
            (
                "SURFACE_APPROVALS=verified: ✅ from an unverified device does not count",
                |f| {
                    f.room_encrypted = true;
                    f.arrived_encrypted = true;
                    f.approvals_need_verified = true;
                    f.is_message = false;
                    f.reaction = Some("✅");
                    f.waiting = Some(Waiting::Approval {
                        request_id: "r1".into(),
                    });
                },
                Decision::UnverifiedApproval {
                    request_id: "r1".into(),
                },
            ),
            (
                "SURFACE_APPROVALS=verified: a typed yes from an unverified device does not count",
                |f| {
                    f.arrived_encrypted = true;
                    f.approvals_need_verified = true;
                    f.body = "yes";
                    f.waiting = Some(Waiting::Approval {
                        request_id: "r1".into(),
                    });
                },
                Decision::UnverifiedApproval {
                    request_id: "r1".into(),
                },
            ),
            (
                "SURFACE_APPROVALS=verified: ✅ from a verified device counts",
                |f| {
                    f.room_encrypted = true;
                    f.arrived_encrypted = true;
                    f.verified_device = true;
                    f.approvals_need_verified = true;
                    f.is_message = false;
                    f.reaction = Some("✅");
                    f.waiting = Some(Waiting::Approval {
                        request_id: "r1".into(),
                    });
                },
                Decision::Approval {
                    request_id: "r1".into(),
                    choice: ApprovalChoice::AllowOnce,
                },
            ),
            (
                "SURFACE_APPROVALS=verified: an unverified device's other messages are answered",
                |f| {
                    f.arrived_encrypted = true;
                    f.approvals_need_verified = true;
                    f.direct_chat = true;
                },
                Decision::Trigger,
            ),
            (
                "✅ on the prompt from the asked user",
                |f| {
                    f.is_message = false;
                    f.reaction = Some("✅");
                    f.waiting = Some(Waiting::Approval {
                        request_id: "r1".into(),
                    });
                },
                Decision::Approval {
                    request_id: "r1".into(),
                    choice: ApprovalChoice::AllowOnce,
                },
            ),
            (
                "♾️ on the prompt",
                |f| {
                    f.is_message = false;
                    f.reaction = Some("♾️");
                    f.waiting = Some(Waiting::Approval {
                        request_id: "r1".into(),
                    });
                },
                Decision::Approval {
                    request_id: "r1".into(),
                    choice: ApprovalChoice::AllowAlways,
                },
            ),
            (
                "❌ on the prompt",
                |f| {
                    f.is_message = false;
                    f.reaction = Some("❌");
                    f.waiting = Some(Waiting::Approval {
                        request_id: "r1".into(),
                    });
                },
                Decision::Approval {
                    request_id: "r1".into(),
                    choice: ApprovalChoice::Deny,
                },
            ),
            (
                "another emoji on the prompt",
                |f| {
                    f.is_message = false;
                    f.reaction = Some("🎉");
                    f.waiting = Some(Waiting::Approval {
                        request_id: "r1".into(),
                    });
                },
                Decision::Ignore(IgnoreReason::Reaction),
            ),
            (
                "a reaction on anything else (or from another user)",
                |f| {
                    f.is_message = false;
                    f.reaction = Some("✅");
                },
                Decision::Ignore(IgnoreReason::Reaction),
            ),
            (
                "a reaction from a stranger",
                |f| {
                    f.is_message = false;
                    f.sender_allowed = false;
                    f.reaction = Some("✅");
                    f.waiting = Some(Waiting::Approval {
                        request_id: "r1".into(),
                    });
                },
                Decision::Ignore(IgnoreReason::NotAllowed),
            ),
        ];
        for (name, tweak, expected) in cases {
            let mut f = base();
            tweak(&mut f);
            assert_eq!(decide(&f), expected, "{name}");
        }

        let mut f = base();
        f.waiting = Some(q);
        f.body = "blue";
        assert_eq!(
            decide(&f),
            Decision::Answer("q1".into()),
            "answer without mention"
        );
        f.sender = "@bot:hs";
        assert_eq!(decide(&f), Decision::Ignore(IgnoreReason::OwnEvent));

        let mut f = base();
        f.waiting = Some(a);
        for (body, choice) in [
            ("yes", ApprovalChoice::AllowOnce),
            ("Yes!", ApprovalChoice::AllowOnce),
            ("always", ApprovalChoice::AllowAlways),
            ("no", ApprovalChoice::Deny),
            ("what?", ApprovalChoice::Deny),
        ] {
            f.body = body;
            assert_eq!(
                decide(&f),
                Decision::Approval {
                    request_id: "r1".into(),
                    choice
                },
                "{body}"
            );
        }
    }

    #[test]
    fn mentions_are_removed_only_at_the_start() {
        let cases = [
            ("Helper Bot: files", "files"),
            ("helper bot, files", "files"),
            ("@bot:hs files", "files"),
            ("@bot:hs: files", "files"),
            ("bot: send a.txt", "send a.txt"),
            ("Bot", ""),
            ("Location: Berlin", "Location: Berlin"),
            ("robot: x", "robot: x"),
            ("botany: x", "botany: x"),
            ("hey bot, what", "hey bot, what"),
            ("> <@a:hs> quoted\n\nbot: yes", "yes"),
            ("  files", "files"),
        ];
        for (body, expected) in cases {
            assert_eq!(
                without_mention(body, "@bot:hs", Some("Helper Bot")),
                expected,
                "{body:?}"
            );
        }
    }

    #[test]
    fn reaction_keys() {
        let cases = [
            ("✅", Some(ApprovalChoice::AllowOnce)),
            ("👍🏽", Some(ApprovalChoice::AllowOnce)),
            ("✔️", Some(ApprovalChoice::AllowOnce)),
            ("♾️", Some(ApprovalChoice::AllowAlways)),
            ("♾", Some(ApprovalChoice::AllowAlways)),
            ("❌", Some(ApprovalChoice::Deny)),
            ("👎", Some(ApprovalChoice::Deny)),
            ("🎉", None),
            ("yes", None),
            ("", None),
        ];
        for (key, expected) in cases {
            assert_eq!(reaction_choice(key), expected, "{key}");
        }
        for (key, choice) in APPROVAL_REACTIONS {
            assert_eq!(reaction_choice(key), Some(choice), "seeded {key}");
        }
    }

    #[test]
    fn reply_fallback_is_stripped() {
        assert_eq!(strip_reply_fallback("> <@a:hs> q\n\nyes"), "yes");
        assert_eq!(strip_reply_fallback("plain"), "plain");
        assert_eq!(
            parse_approval("> <@bot:hs> approve?\n\nalways"),
            ApprovalChoice::AllowAlways
        );
    }
}
