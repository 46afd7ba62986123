//! What an incoming message means for the bot: a pure function with table tests. The side
//! effects live in the sync ingest and the lanes.

use protocol::Decision as ApprovalChoice;

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
    /// The event is an `m.room.message` (other types are never turns).
    pub is_message: bool,
    /// The event is still `m.room.encrypted`: its room key has not arrived (yet).
    pub undecryptable: bool,
    /// `msgtype` is `m.notice` (what bots post; answering them loops bots).
    pub is_notice: bool,
    /// The event edits another one (`m.replace`).
    pub is_edit: bool,
    /// The plain-text body.
    pub body: &'a str,
    /// `m.mentions.user_ids` contains the bot.
    pub mentions_bot: bool,
    /// The message replies to something the bot posted, or is in a thread the bot posts in.
    pub reply_to_bot: bool,
    /// The room has at most two joined members.
    pub direct_chat: bool,
    /// What the bot waits for from this sender here, if anything.
    pub waiting: Option<Waiting>,
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
    /// An `m.notice`.
    Notice,
    /// An edit.
    Edit,
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
    if f.sender == f.bot_user_id {
        return Decision::Ignore(IgnoreReason::OwnEvent);
    }
    // Whether an undecryptable event is a message at all is known only once its key arrives;
    // until then it keeps its place, so later messages are not answered first.
    if f.undecryptable {
        return if f.sender_allowed {
            Decision::WaitForKey
        } else {
            Decision::Ignore(IgnoreReason::NotAllowed)
        };
    }
    if !f.is_message {
        return Decision::Ignore(IgnoreReason::NotAMessage);
    }
    if !f.sender_allowed {
        return Decision::Ignore(IgnoreReason::NotAllowed);
    }
    if f.is_notice {
        return Decision::Ignore(IgnoreReason::Notice);
    }
    // Edits would re-run a turn for a typo fix; the original already ran.
    if f.is_edit {
        return Decision::Ignore(IgnoreReason::Edit);
    }
    match &f.waiting {
        Some(Waiting::Question { question_id }) => return Decision::Answer(question_id.clone()),
        Some(Waiting::Approval { request_id }) => {
            return Decision::Approval {
                request_id: request_id.clone(),
                choice: parse_approval(f.body),
            };
        }
        None => {}
    }
    if f.direct_chat || f.mentions_bot || f.reply_to_bot || body_mentions_bot(f) {
        Decision::Trigger
    } else {
        Decision::Context
    }
}

/// `yes` / `no` / `always` (and a few synonyms). Anything else is a refusal: consent must be
/// explicit.
pub fn parse_approval(body: &str) -> ApprovalChoice {
    let word = strip_reply_fallback(body)
        .trim()
        .trim_end_matches(['.', '!'])
        .to_lowercase();
    match word.as_str() {
        "yes" | "y" | "ok" | "allow" | "approve" | "approved" => ApprovalChoice::AllowOnce,
        "always" | "yes always" | "always allow" => ApprovalChoice::AllowAlways,
        _ => ApprovalChoice::Deny,
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
    fn reply_fallback_is_stripped() {
        assert_eq!(strip_reply_fallback("> <@a:hs> q\n\nyes"), "yes");
        assert_eq!(strip_reply_fallback("plain"), "plain");
        assert_eq!(
            parse_approval("> <@bot:hs> approve?\n\nalways"),
            ApprovalChoice::AllowAlways
        );
    }
}
