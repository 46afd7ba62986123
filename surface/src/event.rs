//! A timeline event as the surface reads it (`RawEvent`), and the pure rules for where walking
//! back through a room's history stops: which past events are still work.

use matrix_sdk::deserialized_responses::TimelineEvent;
use serde::{Deserialize, Serialize};

/// The fields of a timeline event the surface looks at.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct RawEvent {
    /// Event id.
    pub event_id: String,
    /// Sender.
    pub sender: String,
    /// `origin_server_ts`.
    #[serde(default)]
    pub origin_server_ts: u64,
    /// Event type (`m.room.encrypted` while its room key is missing).
    #[serde(rename = "type")]
    pub kind: String,
    /// Content (kept raw for the journal).
    #[serde(default)]
    pub content: serde_json::Value,
    /// State key for state events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_key: Option<String>,
    /// Unsigned data (`prev_content` for membership transitions).
    #[serde(default)]
    pub unsigned: serde_json::Value,
    /// For a redaction in room versions before 11: the redacted event (later versions put it
    /// in the content).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redacts: Option<String>,
    /// How it reached the bot (not part of the event's JSON: set by [`RawEvent::parse`]).
    #[serde(skip)]
    pub arrival: Arrival,
}

/// How an event reached the bot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Arrival {
    /// In clear text (or still encrypted: [`RawEvent::is_undecryptable`]).
    #[default]
    Clear,
    /// Encrypted, and decrypted by the bot.
    Encrypted {
        /// The sending device is verified by its user (cross-signed) and the user is one the
        /// bot's crypto store trusts as verified.
        verified: bool,
    },
}

impl RawEvent {
    /// Parses a timeline event (the decrypted one when it could be decrypted); `None` for
    /// events without the basic fields (e.g. redacted beyond recognition).
    pub fn parse(ev: &TimelineEvent) -> Option<Self> {
        use matrix_sdk::deserialized_responses::VerificationState;
        let mut e: Self = serde_json::from_str(ev.raw().json().get()).ok()?;
        e.arrival = match ev.encryption_info() {
            Some(info) => Arrival::Encrypted {
                verified: info.verification_state == VerificationState::Verified,
            },
            None => Arrival::Clear,
        };
        Some(e)
    }

    /// Still encrypted: its room key was not there when it was read.
    pub fn is_undecryptable(&self) -> bool {
        self.kind == "m.room.encrypted"
    }

    /// The thread root, when the event is in a thread (`m.relates_to` stays in clear text in
    /// encrypted events, so this works before decryption too).
    pub fn thread_root(&self) -> Option<String> {
        let rel = self.content.get("m.relates_to")?;
        (rel.get("rel_type")?.as_str()? == "m.thread")
            .then(|| rel.get("event_id")?.as_str().map(str::to_owned))
            .flatten()
    }

    /// `m.relates_to.rel_type`.
    pub fn rel_type(&self) -> Option<&str> {
        self.content.get("m.relates_to")?.get("rel_type")?.as_str()
    }

    /// The event this one replies to.
    pub fn in_reply_to(&self) -> Option<&str> {
        self.content
            .get("m.relates_to")?
            .get("m.in_reply_to")?
            .get("event_id")?
            .as_str()
    }

    /// The event a person replied to: [`RawEvent::in_reply_to`] unless it is only a thread's
    /// fallback for clients without threads (`is_falling_back`, MSC3440), which names the
    /// thread's latest event, whoever sent it.
    pub fn replied_to(&self) -> Option<&str> {
        let rel = self.content.get("m.relates_to")?;
        let falling_back = rel.get("rel_type").and_then(serde_json::Value::as_str)
            == Some("m.thread")
            && rel
                .get("is_falling_back")
                .and_then(serde_json::Value::as_bool)
                == Some(true);
        if falling_back {
            return None;
        }
        self.in_reply_to()
    }

    /// For an `m.reaction` (`m.annotation`): the event it annotates and its key.
    pub fn annotation(&self) -> Option<(&str, &str)> {
        if self.kind != "m.reaction" {
            return None;
        }
        let rel = self.content.get("m.relates_to")?;
        if rel.get("rel_type")?.as_str()? != "m.annotation" {
            return None;
        }
        Some((rel.get("event_id")?.as_str()?, rel.get("key")?.as_str()?))
    }

    /// What kind of content the bot cannot read yet this is, if any: a sticker, a location, a
    /// poll.
    pub fn unsupported(&self) -> Option<&'static str> {
        match (self.kind.as_str(), self.msgtype()) {
            ("m.sticker", _) => Some("sticker"),
            ("m.room.message", "m.location") => Some("location"),
            ("m.poll.start" | "org.matrix.msc3381.poll.start", _) => Some("poll"),
            _ => None,
        }
    }

    /// For an `m.room.redaction`: the event it redacts.
    pub fn redacted_event(&self) -> Option<&str> {
        if self.kind != "m.room.redaction" {
            return None;
        }
        self.redacts
            .as_deref()
            .or_else(|| self.content.get("redacts")?.as_str())
    }

    /// Whether the message carries a file (`m.image`, `m.file`, `m.audio`, `m.video`).
    pub fn has_media(&self) -> bool {
        matches!(self.msgtype(), "m.image" | "m.file" | "m.audio" | "m.video")
    }

    /// The plain-text body.
    pub fn body(&self) -> &str {
        self.str_field("body")
    }

    /// The `msgtype`.
    pub fn msgtype(&self) -> &str {
        self.str_field("msgtype")
    }

    /// A string field of the content (empty when absent).
    pub fn str_field(&self, name: &str) -> &str {
        self.content
            .get(name)
            .and_then(|b| b.as_str())
            .unwrap_or_default()
    }

    /// `m.mentions.user_ids` names `user_id`.
    pub fn mentions(&self, user_id: &str) -> bool {
        self.content
            .get("m.mentions")
            .and_then(|m| m.get("user_ids"))
            .and_then(|u| u.as_array())
            .is_some_and(|ids| ids.iter().any(|i| i.as_str() == Some(user_id)))
    }

    fn membership_of(&self, user_id: &str) -> Option<&str> {
        if self.kind != "m.room.member" || self.state_key.as_deref() != Some(user_id) {
            return None;
        }
        self.content.get("membership")?.as_str()
    }

    /// Whether this is `user_id` joining (not a profile change while joined).
    pub fn is_join_of(&self, user_id: &str) -> bool {
        let before = self
            .unsigned
            .get("prev_content")
            .and_then(|p| p.get("membership"))
            .and_then(|m| m.as_str());
        self.membership_of(user_id) == Some("join") && before != Some("join")
    }

    /// Whether this is `user_id` being invited.
    pub fn is_invite_of(&self, user_id: &str) -> bool {
        self.membership_of(user_id) == Some("invite")
    }
}

/// Where walking back through a room's history stops (the landmark itself is not work).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Landmark {
    /// Already journaled: everything newer is what was missed.
    Journaled,
    /// The bot joining a room it knew before (it left and came back).
    Rejoin,
    /// First sight: the bot's invite. Element sends a new DM's first message before the
    /// invited bot joins, and people write while the bot is down: all of it is work.
    Invite,
    /// First sight: something the bot posted. An earlier state directory served the room up
    /// to here (the state volume was lost or replaced).
    OwnPost,
}

/// Whether `e` is where the walk back stops (pure). `room_known`: the journal has seen the
/// room before; `journaled`: `e` is in the journal.
pub fn landmark(e: &RawEvent, own: &str, room_known: bool, journaled: bool) -> Option<Landmark> {
    if journaled {
        Some(Landmark::Journaled)
    } else if room_known {
        e.is_join_of(own).then_some(Landmark::Rejoin)
    } else if e.is_invite_of(own) {
        Some(Landmark::Invite)
    } else if e.sender == own && e.kind != "m.room.member" {
        Some(Landmark::OwnPost)
    } else {
        None
    }
}

/// A room's first sight when the walk back found no landmark (the history ran out or was too
/// long): the events after the bot's own join count, or, when the join is out of reach too,
/// those newer than this process. Returns how many of `events` (oldest first) to drop (pure).
pub fn unanchored_first_sight(events: &[RawEvent], own: &str, started_ms: u64) -> usize {
    match events.iter().rposition(|e| e.is_join_of(own)) {
        Some(join) => join + 1,
        None => events
            .iter()
            .position(|e| e.origin_server_ts >= started_ms)
            .unwrap_or(events.len()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn raw(v: serde_json::Value) -> RawEvent {
        serde_json::from_value(v).unwrap()
    }

    fn member(id: &str, sender: &str, who: &str, membership: &str, before: &str) -> RawEvent {
        raw(json!({
            "event_id": id, "sender": sender, "origin_server_ts": 1, "type": "m.room.member",
            "state_key": who, "content": {"membership": membership},
            "unsigned": {"prev_content": {"membership": before}}
        }))
    }

    fn message(id: &str, sender: &str, ts: u64) -> RawEvent {
        raw(json!({
            "event_id": id, "sender": sender, "origin_server_ts": ts, "type": "m.room.message",
            "content": {"msgtype": "m.text", "body": "hi"}
        }))
    }

    #[test]
    fn joins_and_threads() {
        let join = member("$j", "@bot:hs", "@bot:hs", "join", "invite");
        assert!(join.is_join_of("@bot:hs"));
        assert!(!join.is_join_of("@alice:hs"));
        assert!(!join.is_invite_of("@bot:hs"));
        let rename = raw(json!({
            "event_id": "$r", "sender": "@bot:hs", "origin_server_ts": 1, "type": "m.room.member",
            "state_key": "@bot:hs", "content": {"membership": "join", "displayname": "B"},
            "unsigned": {"prev_content": {"membership": "join"}}
        }));
        assert!(!rename.is_join_of("@bot:hs"));
        let invite = member("$i", "@alice:hs", "@bot:hs", "invite", "leave");
        assert!(invite.is_invite_of("@bot:hs"));
        assert!(!invite.is_invite_of("@alice:hs"));
        let threaded = raw(json!({
            "event_id": "$t", "sender": "@alice:hs", "origin_server_ts": 1, "type": "m.room.message",
            "content": {"msgtype": "m.text", "body": "hi",
                "m.mentions": {"user_ids": ["@bot:hs"]},
                "m.relates_to": {"rel_type": "m.thread", "event_id": "$root",
                    "m.in_reply_to": {"event_id": "$prev"}}}
        }));
        assert_eq!(threaded.thread_root().as_deref(), Some("$root"));
        assert_eq!(threaded.in_reply_to(), Some("$prev"));
        assert_eq!(
            threaded.replied_to(),
            Some("$prev"),
            "a real reply in a thread"
        );
        let fallback = raw(json!({
            "event_id": "$f", "sender": "@alice:hs", "origin_server_ts": 1, "type": "m.room.message",
            "content": {"msgtype": "m.text", "body": "hi",
                "m.relates_to": {"rel_type": "m.thread", "event_id": "$root",
                    "is_falling_back": true, "m.in_reply_to": {"event_id": "$latest"}}}
        }));
        assert_eq!(fallback.in_reply_to(), Some("$latest"));
        assert_eq!(fallback.replied_to(), None, "only the thread's fallback");
        assert!(threaded.mentions("@bot:hs"));
        assert_eq!(threaded.body(), "hi");
        let edit = raw(json!({
            "event_id": "$e", "sender": "@alice:hs", "origin_server_ts": 1, "type": "m.room.message",
            "content": {"msgtype": "m.text", "body": "* hi", "m.relates_to": {"rel_type": "m.replace", "event_id": "$t"}}
        }));
        assert_eq!(edit.rel_type(), Some("m.replace"));
        assert_eq!(edit.thread_root(), None);
        let encrypted = raw(json!({
            "event_id": "$x", "sender": "@alice:hs", "origin_server_ts": 1, "type": "m.room.encrypted",
            "content": {"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "AwgA", "session_id": "s",
                "m.relates_to": {"rel_type": "m.thread", "event_id": "$root"}}
        }));
        assert!(encrypted.is_undecryptable());
        assert_eq!(encrypted.thread_root().as_deref(), Some("$root"));
        // What is kept of an undecryptable event is enough to decrypt it later.
        let back: serde_json::Value = serde_json::to_value(&encrypted).unwrap();
        assert_eq!(back["type"], "m.room.encrypted");
        assert_eq!(back["content"]["session_id"], "s");
        assert_eq!(back["origin_server_ts"], 1);
    }

    #[test]
    fn landmarks() {
        let own = "@bot:hs";
        let invite = member("$i", "@alice:hs", own, "invite", "leave");
        let join = member("$j", own, own, "join", "invite");
        let other_join = member("$o", "@alice:hs", "@alice:hs", "join", "invite");
        let post = message("$p", own, 5);
        let user_msg = message("$m", "@alice:hs", 5);
        let table: &[(&str, &RawEvent, bool, bool, Option<Landmark>)] = &[
            (
                "journaled",
                &user_msg,
                true,
                true,
                Some(Landmark::Journaled),
            ),
            (
                "journaled first sight",
                &user_msg,
                false,
                true,
                Some(Landmark::Journaled),
            ),
            ("message", &user_msg, true, false, None),
            (
                "rejoin of a known room",
                &join,
                true,
                false,
                Some(Landmark::Rejoin),
            ),
            ("first sight walks past the join", &join, false, false, None),
            (
                "first sight stops at the invite",
                &invite,
                false,
                false,
                Some(Landmark::Invite),
            ),
            ("invite in a known room", &invite, true, false, None),
            (
                "first sight stops at own post",
                &post,
                false,
                false,
                Some(Landmark::OwnPost),
            ),
            ("someone else joining", &other_join, false, false, None),
        ];
        for (name, e, known, journaled, expected) in table {
            assert_eq!(landmark(e, own, *known, *journaled), *expected, "{name}");
        }
    }

    #[test]
    fn first_sight_without_a_landmark() {
        let own = "@bot:hs";
        let join = member("$j", own, own, "join", "invite");
        let early = message("$a", "@alice:hs", 10);
        let late = message("$b", "@alice:hs", 30);
        let table: Vec<(&str, Vec<RawEvent>, u64, usize)> = vec![
            ("nothing", vec![], 20, 0),
            (
                "after the join",
                vec![early.clone(), join.clone(), late.clone()],
                99,
                2,
            ),
            ("join last", vec![early.clone(), join.clone()], 0, 2),
            (
                "no join: newer than the process",
                vec![early.clone(), late.clone()],
                20,
                1,
            ),
            ("no join, all old", vec![early.clone(), late.clone()], 99, 2),
        ];
        for (name, events, started, drop) in table {
            assert_eq!(
                unanchored_first_sight(&events, own, started),
                drop,
                "{name}"
            );
        }
    }
}
