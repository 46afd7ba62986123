//! Every timeline event the surface acts on, parsed once, with ruma's types, into an
//! [`Inbound`]: who sent it, how it arrived, where it sits (thread, reply), and what it is
//! ([`Kind`]). Everything downstream (the decision, the journal row, the lanes, the MCP feed)
//! reads this value; nothing looks at an event's JSON again.
//!
//! An event that does not parse as its type claims keeps its place as [`Kind::Unreadable`] (a
//! message) or [`Kind::Other`], so it is still journaled and, where someone waits, answered
//! with a notice instead of dropped.

use matrix_sdk::deserialized_responses::{TimelineEvent, VerificationState};
use matrix_sdk::ruma::events::relation::Thread;
use matrix_sdk::ruma::events::room::encrypted::{
    EncryptedEventScheme, Relation as EncryptedRelation, RoomEncryptedEventContent,
};
use matrix_sdk::ruma::events::room::member::MembershipState;
use matrix_sdk::ruma::events::room::message::{MessageType, Relation, RoomMessageEventContent};
use matrix_sdk::ruma::events::room::redaction::SyncRoomRedactionEvent;
use matrix_sdk::ruma::events::{
    AnySyncMessageLikeEvent, AnySyncStateEvent, AnySyncTimelineEvent, SyncMessageLikeEvent,
    SyncStateEvent,
};
use matrix_sdk::ruma::serde::Raw;
use matrix_sdk::ruma::{OwnedEventId, OwnedUserId, UserId};

/// How an event reached the bot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Arrival {
    /// In clear text (or still encrypted: [`Kind::Encrypted`]).
    #[default]
    Clear,
    /// Encrypted, and decrypted by the bot.
    Encrypted {
        /// The sending device is verified by its user (cross-signed) and the user is one the
        /// bot's crypto store trusts as verified.
        verified: bool,
    },
}

/// Where an event sits among others (`m.relates_to`, which stays in clear text in encrypted
/// events, so this is known before decryption too).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Place {
    /// The thread root, when the event is in a thread.
    pub thread_root: Option<OwnedEventId>,
    /// The event it replies to (`m.in_reply_to`).
    pub in_reply_to: Option<OwnedEventId>,
    /// `in_reply_to` is only a thread's fallback for clients without threads
    /// (`is_falling_back`, MSC3440): it names the thread's latest event, whoever sent it.
    pub falling_back: bool,
    /// It relates to another event in some other way (an edit, a reaction, a reference): no
    /// thread can start from it (the homeserver refuses).
    pub other_relation: bool,
}

impl Place {
    /// In the thread of `t` (`m.thread`, the same relation in clear and encrypted events).
    fn in_thread(t: Thread) -> Self {
        Self {
            thread_root: Some(t.event_id),
            in_reply_to: t.in_reply_to.map(|r| r.event_id),
            falling_back: t.is_falling_back,
            other_relation: false,
        }
    }

    /// The event a person replied to: `in_reply_to` unless it is only the thread fallback.
    pub fn replied_to(&self) -> Option<&OwnedEventId> {
        (!self.falling_back)
            .then_some(self.in_reply_to.as_ref())
            .flatten()
    }
}

/// What an event is.
#[derive(Debug, Clone)]
pub enum Kind {
    /// An `m.room.message` that is not an edit: text, notice, emote, a file...
    Message(MessageType),
    /// An edit (`m.replace`) of `target`: `fallback` is what clients without edits show
    /// (`* …`), `new` the message's new content.
    Edit {
        /// The edited event.
        target: OwnedEventId,
        /// The edit's own (fallback) content.
        fallback: MessageType,
        /// The new content.
        new: MessageType,
    },
    /// An `m.room.redaction` of `target` (the server checked who may redact what).
    Redaction {
        /// The redacted event (`None`: a redaction naming none).
        target: Option<OwnedEventId>,
    },
    /// An `m.reaction` (`m.annotation`) with `key` on `target`.
    Reaction {
        /// The event reacted to.
        target: OwnedEventId,
        /// The emoji (or text) of the reaction.
        key: String,
    },
    /// An `m.sticker`.
    Sticker,
    /// An `m.location` message.
    Location,
    /// A poll (`m.poll.start` or its unstable MSC3381 form).
    Poll,
    /// Still `m.room.encrypted`: its room key was not there when it was read.
    Encrypted {
        /// Its megolm session (what the missing key is).
        session_id: String,
        /// The whole event, as decrypting it again needs it.
        json: String,
    },
    /// A membership change of `user`.
    Membership {
        /// Whose membership (the state key).
        user: OwnedUserId,
        /// What it is now.
        now: MembershipState,
        /// What it was before, when the server says.
        before: Option<MembershipState>,
    },
    /// An `m.room.message` whose content does not parse (a broken client or a forgery).
    Unreadable,
    /// Any other event: state, calls, a redacted event... never work for the bot.
    Other(String),
}

/// A timeline event as the surface reads it.
#[derive(Debug, Clone)]
pub struct Inbound {
    /// Event id.
    pub event_id: OwnedEventId,
    /// Sender.
    pub sender: OwnedUserId,
    /// `origin_server_ts`, ms.
    pub origin_ts: u64,
    /// How it arrived.
    pub arrival: Arrival,
    /// Thread and reply.
    pub place: Place,
    /// `m.mentions.user_ids`.
    pub mentions: Vec<OwnedUserId>,
    /// What it is.
    pub kind: Kind,
}

/// The fields every event has, for events whose type does not parse.
#[derive(serde::Deserialize)]
struct Envelope {
    event_id: OwnedEventId,
    sender: OwnedUserId,
    #[serde(default)]
    origin_server_ts: u64,
    #[serde(rename = "type")]
    kind: String,
}

impl Inbound {
    /// Parses a timeline event (the decrypted one when it could be decrypted); `None` for
    /// events without valid ids (nothing could refer to them).
    pub fn parse(ev: &TimelineEvent) -> Option<Self> {
        let arrival = match ev.encryption_info() {
            Some(info) => Arrival::Encrypted {
                verified: info.verification_state == VerificationState::Verified,
            },
            None => Arrival::Clear,
        };
        let mut parsed = Self::from_raw(ev.raw())?;
        parsed.arrival = arrival;
        Some(parsed)
    }

    /// Parses an event's JSON (arrival [`Arrival::Clear`]).
    pub fn from_json(json: &str) -> Option<Self> {
        Self::from_raw(&Raw::from_json_string(json.to_owned()).ok()?)
    }

    fn from_raw(raw: &Raw<AnySyncTimelineEvent>) -> Option<Self> {
        let Ok(any) = raw.deserialize() else {
            let envelope: Envelope = raw.deserialize_as_unchecked().ok()?;
            let kind = match envelope.kind.as_str() {
                "m.room.message" => Kind::Unreadable,
                _ => Kind::Other(envelope.kind),
            };
            return Some(Self {
                event_id: envelope.event_id,
                sender: envelope.sender,
                origin_ts: envelope.origin_server_ts,
                arrival: Arrival::Clear,
                place: Place::default(),
                mentions: Vec::new(),
                kind,
            });
        };
        let mut out = Self {
            event_id: any.event_id().to_owned(),
            sender: any.sender().to_owned(),
            origin_ts: u64::from(any.origin_server_ts().0),
            arrival: Arrival::Clear,
            place: Place::default(),
            mentions: Vec::new(),
            kind: Kind::Other(any.event_type().to_string()),
        };
        match any {
            AnySyncTimelineEvent::MessageLike(m) => out.message_like(m, raw),
            AnySyncTimelineEvent::State(AnySyncStateEvent::RoomMember(
                SyncStateEvent::Original(m),
            )) => {
                out.kind = Kind::Membership {
                    user: UserId::parse(&m.state_key).ok()?,
                    now: m.content.membership,
                    before: m.unsigned.prev_content.map(|p| p.membership),
                };
            }
            AnySyncTimelineEvent::State(_) => {}
        }
        Some(out)
    }

    fn message_like(&mut self, m: AnySyncMessageLikeEvent, raw: &Raw<AnySyncTimelineEvent>) {
        use AnySyncMessageLikeEvent as M;
        match m {
            M::RoomMessage(SyncMessageLikeEvent::Original(m)) => self.room_message(m.content),
            M::RoomEncrypted(SyncMessageLikeEvent::Original(e)) => self.encrypted(e.content, raw),
            M::Reaction(SyncMessageLikeEvent::Original(r)) => {
                self.place.other_relation = true;
                self.kind = Kind::Reaction {
                    target: r.content.relates_to.event_id,
                    key: r.content.relates_to.key,
                };
            }
            M::RoomRedaction(SyncRoomRedactionEvent::Original(r)) => {
                self.kind = Kind::Redaction {
                    target: r.content.redacts.or(r.redacts),
                };
            }
            M::Sticker(SyncMessageLikeEvent::Original(_)) => self.kind = Kind::Sticker,
            M::PollStart(SyncMessageLikeEvent::Original(_))
            | M::UnstablePollStart(SyncMessageLikeEvent::Original(_)) => self.kind = Kind::Poll,
            _ => {}
        }
    }

    fn room_message(&mut self, content: RoomMessageEventContent) {
        self.mentions = content
            .mentions
            .map(|m| m.user_ids.into_iter().collect())
            .unwrap_or_default();
        let msgtype = content.msgtype;
        self.kind = match (content.relates_to, msgtype) {
            (Some(Relation::Replacement(r)), fallback) => {
                self.place.other_relation = true;
                Kind::Edit {
                    target: r.event_id,
                    fallback,
                    new: r.new_content.msgtype,
                }
            }
            (relation, msgtype) => {
                match relation {
                    Some(Relation::Thread(t)) => self.place = Place::in_thread(t),
                    Some(Relation::Reply(r)) => {
                        self.place.in_reply_to = Some(r.in_reply_to.event_id);
                    }
                    Some(_) => self.place.other_relation = true,
                    None => {}
                }
                match msgtype {
                    MessageType::Location(_) => Kind::Location,
                    other => Kind::Message(other),
                }
            }
        };
    }

    fn encrypted(&mut self, content: RoomEncryptedEventContent, raw: &Raw<AnySyncTimelineEvent>) {
        match content.relates_to {
            Some(EncryptedRelation::Thread(t)) => self.place = Place::in_thread(t),
            Some(EncryptedRelation::Reply(r)) => {
                self.place.in_reply_to = Some(r.in_reply_to.event_id);
            }
            Some(_) => self.place.other_relation = true,
            None => {}
        }
        let session_id = match content.scheme {
            EncryptedEventScheme::MegolmV1AesSha2(m) => m.session_id,
            _ => String::new(),
        };
        self.kind = Kind::Encrypted {
            session_id,
            json: raw.json().get().to_owned(),
        };
    }

    /// Still encrypted: its room key was not there when it was read.
    pub fn is_undecryptable(&self) -> bool {
        matches!(self.kind, Kind::Encrypted { .. })
    }

    /// The message's content, for a message or (its fallback) for an edit.
    pub fn msgtype(&self) -> Option<&MessageType> {
        match &self.kind {
            Kind::Message(m) | Kind::Edit { fallback: m, .. } => Some(m),
            _ => None,
        }
    }

    /// The plain-text body (empty for events without one).
    pub fn body(&self) -> &str {
        self.msgtype().map(MessageType::body).unwrap_or_default()
    }

    /// `m.mentions.user_ids` names `user_id`.
    pub fn mentions(&self, user_id: &UserId) -> bool {
        self.mentions.iter().any(|m| m == user_id)
    }

    /// Whether this is `user_id` joining (not a profile change while joined).
    pub fn is_join_of(&self, user_id: &UserId) -> bool {
        matches!(&self.kind, Kind::Membership { user, now: MembershipState::Join, before }
            if user == user_id && before.as_ref() != Some(&MembershipState::Join))
    }

    /// A membership event (also one whose content does not parse).
    pub fn is_membership(&self) -> bool {
        match &self.kind {
            Kind::Membership { .. } => true,
            Kind::Other(t) => t == "m.room.member",
            _ => false,
        }
    }

    /// Whether this is `user_id` being invited.
    pub fn is_invite_of(&self, user_id: &UserId) -> bool {
        matches!(&self.kind, Kind::Membership { user, now: MembershipState::Invite, .. }
            if user == user_id)
    }
}

/// The megolm session of an encrypted event's JSON (what a missing key is), if it has one.
pub fn session_id_of(json: &str) -> Option<String> {
    Inbound::from_json(json).and_then(|e| match e.kind {
        Kind::Encrypted { session_id, .. } => Some(session_id),
        _ => None,
    })
}

/// Events for tests (also of the modules that read [`Inbound`]s).
#[cfg(test)]
pub(crate) mod samples {
    use serde_json::json;

    use super::Inbound;

    /// An event from its JSON.
    pub(crate) fn raw(v: serde_json::Value) -> Inbound {
        Inbound::from_json(&v.to_string()).unwrap()
    }

    /// `sender` changes the membership of `who` from `before` to `membership`.
    pub(crate) fn member(
        id: &str,
        sender: &str,
        who: &str,
        membership: &str,
        before: &str,
    ) -> Inbound {
        raw(json!({
            "event_id": id, "sender": sender, "origin_server_ts": 1, "type": "m.room.member",
            "state_key": who, "content": {"membership": membership},
            "unsigned": {"prev_content": {"membership": before}}
        }))
    }
}

#[cfg(test)]
mod tests {
    use matrix_sdk::ruma::{event_id, user_id};
    use serde_json::json;

    use super::samples::{member, raw};
    use super::*;

    fn event(kind: &str, content: serde_json::Value) -> Inbound {
        raw(json!({
            "event_id": "$e", "sender": "@alice:hs", "origin_server_ts": 1, "type": kind,
            "content": content
        }))
    }

    #[test]
    fn joins_and_threads() {
        let join = member("$j", "@bot:hs", "@bot:hs", "join", "invite");
        assert!(join.is_join_of(user_id!("@bot:hs")));
        assert!(!join.is_join_of(user_id!("@alice:hs")));
        assert!(!join.is_invite_of(user_id!("@bot:hs")));
        let rename = raw(json!({
            "event_id": "$r", "sender": "@bot:hs", "origin_server_ts": 1, "type": "m.room.member",
            "state_key": "@bot:hs", "content": {"membership": "join", "displayname": "B"},
            "unsigned": {"prev_content": {"membership": "join"}}
        }));
        assert!(!rename.is_join_of(user_id!("@bot:hs")));
        let invite = member("$i", "@alice:hs", "@bot:hs", "invite", "leave");
        assert!(invite.is_invite_of(user_id!("@bot:hs")));
        assert!(!invite.is_invite_of(user_id!("@alice:hs")));
        let threaded = raw(json!({
            "event_id": "$t", "sender": "@alice:hs", "origin_server_ts": 1, "type": "m.room.message",
            "content": {"msgtype": "m.text", "body": "hi",
                "m.mentions": {"user_ids": ["@bot:hs"]},
                "m.relates_to": {"rel_type": "m.thread", "event_id": "$root",
                    "m.in_reply_to": {"event_id": "$prev"}}}
        }));
        assert_eq!(
            threaded.place.thread_root.as_deref().map(|e| e.as_str()),
            Some("$root")
        );
        assert_eq!(
            threaded.place.in_reply_to.as_deref().map(|e| e.as_str()),
            Some("$prev")
        );
        assert_eq!(
            threaded.place.replied_to().map(|e| e.as_str()),
            Some("$prev"),
            "a real reply in a thread"
        );
        let fallback = raw(json!({
            "event_id": "$f", "sender": "@alice:hs", "origin_server_ts": 1, "type": "m.room.message",
            "content": {"msgtype": "m.text", "body": "hi",
                "m.relates_to": {"rel_type": "m.thread", "event_id": "$root",
                    "is_falling_back": true, "m.in_reply_to": {"event_id": "$latest"}}}
        }));
        assert_eq!(
            fallback.place.in_reply_to.as_deref().map(|e| e.as_str()),
            Some("$latest")
        );
        assert_eq!(
            fallback.place.replied_to(),
            None,
            "only the thread's fallback"
        );
        assert!(threaded.mentions(user_id!("@bot:hs")));
        assert_eq!(threaded.body(), "hi");
        let edit = raw(json!({
            "event_id": "$e", "sender": "@alice:hs", "origin_server_ts": 1, "type": "m.room.message",
            "content": {"msgtype": "m.text", "body": "* hi", "m.relates_to": {"rel_type": "m.replace", "event_id": "$t"},
                "m.new_content": {"msgtype": "m.text", "body": "hi"}}
        }));
        assert!(matches!(edit.kind, Kind::Edit { .. }));
        assert_eq!(edit.place.thread_root, None);
        let encrypted = raw(json!({
            "event_id": "$x", "sender": "@alice:hs", "origin_server_ts": 1, "type": "m.room.encrypted",
            "content": {"algorithm": "m.megolm.v1.aes-sha2", "ciphertext": "AwgA", "session_id": "s",
                "m.relates_to": {"rel_type": "m.thread", "event_id": "$root"}}
        }));
        assert!(encrypted.is_undecryptable());
        assert_eq!(
            encrypted.place.thread_root.as_deref().map(|e| e.as_str()),
            Some("$root")
        );
        // What is kept of an undecryptable event is enough to decrypt it later: all of it.
        let Kind::Encrypted { json, .. } = &encrypted.kind else {
            unreachable!()
        };
        let back: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(back["type"], "m.room.encrypted");
        assert_eq!(back["content"]["session_id"], "s");
        assert_eq!(back["origin_server_ts"], 1);
    }

    #[test]
    fn every_kind_is_told_apart() {
        let target = || event_id!("$t").to_owned();
        let text = |b: &str| MessageType::text_plain(b);
        let cases: Vec<(&str, Inbound, Kind)> = vec![
            (
                "text",
                event("m.room.message", json!({"msgtype": "m.text", "body": "hi"})),
                Kind::Message(text("hi")),
            ),
            (
                "edit",
                event(
                    "m.room.message",
                    json!({"msgtype": "m.text", "body": "* hi!",
                "m.new_content": {"msgtype": "m.text", "body": "hi!"},
                "m.relates_to": {"rel_type": "m.replace", "event_id": "$t"}}),
                ),
                Kind::Edit {
                    target: target(),
                    fallback: text("* hi!"),
                    new: text("hi!"),
                },
            ),
            (
                "redaction, room v11",
                event("m.room.redaction", json!({"redacts": "$t"})),
                Kind::Redaction {
                    target: Some(target()),
                },
            ),
            (
                "redaction, earlier rooms",
                raw(json!({"event_id": "$e", "sender": "@alice:hs",
                "origin_server_ts": 1, "type": "m.room.redaction", "redacts": "$t", "content": {}})),
                Kind::Redaction {
                    target: Some(target()),
                },
            ),
            (
                "reaction",
                event(
                    "m.reaction",
                    json!({"m.relates_to": {"rel_type": "m.annotation",
                "event_id": "$t", "key": "✅"}}),
                ),
                Kind::Reaction {
                    target: target(),
                    key: "✅".into(),
                },
            ),
            (
                "sticker",
                event(
                    "m.sticker",
                    json!({"body": "cat", "url": "mxc://hs/c", "info": {}}),
                ),
                Kind::Sticker,
            ),
            (
                "location",
                event(
                    "m.room.message",
                    json!({"msgtype": "m.location", "body": "here",
                "geo_uri": "geo:1,2"}),
                ),
                Kind::Location,
            ),
            (
                "poll",
                event(
                    "m.poll.start",
                    json!({"m.poll": {"question": {"m.text": [{"body": "?"}]},
                "answers": [{"m.id": "a", "m.text": [{"body": "a"}]}, {"m.id": "b", "m.text": [{"body": "b"}]}]},
                "m.text": [{"body": "?"}]}),
                ),
                Kind::Poll,
            ),
            (
                "unstable poll",
                event(
                    "org.matrix.msc3381.poll.start",
                    json!({
                "org.matrix.msc3381.poll.start": {"question": {"org.matrix.msc1767.text": "?"},
                "kind": "org.matrix.msc3381.poll.disclosed", "max_selections": 1,
                "answers": [{"id": "a", "org.matrix.msc1767.text": "a"}, {"id": "b", "org.matrix.msc1767.text": "b"}]},
                "org.matrix.msc1767.text": "?"}),
                ),
                Kind::Poll,
            ),
            (
                "a message without a body",
                event("m.room.message", json!({"msgtype": "m.text"})),
                Kind::Unreadable,
            ),
            (
                "an edit without new content",
                event(
                    "m.room.message",
                    json!({"msgtype": "m.text",
                "body": "* x", "m.relates_to": {"rel_type": "m.replace", "event_id": "$t"}}),
                ),
                Kind::Unreadable,
            ),
            (
                "a topic",
                raw(
                    json!({"event_id": "$e", "sender": "@alice:hs", "origin_server_ts": 1,
                "type": "m.room.topic", "state_key": "", "content": {"topic": "t"}}),
                ),
                Kind::Other("m.room.topic".into()),
            ),
        ];
        for (name, got, want) in cases {
            // (ruma's message types have no `PartialEq`: compared as they print)
            assert_eq!(format!("{:?}", got.kind), format!("{want:?}"), "{name}");
        }
        let encrypted = event(
            "m.room.encrypted",
            json!({"algorithm": "m.megolm.v1.aes-sha2",
            "ciphertext": "AwgA", "session_id": "s1", "sender_key": "k", "device_id": "D"}),
        );
        assert!(
            matches!(&encrypted.kind, Kind::Encrypted { session_id, .. } if session_id == "s1")
        );
        let Kind::Encrypted { json, .. } = &encrypted.kind else {
            unreachable!()
        };
        assert_eq!(session_id_of(json).as_deref(), Some("s1"));
        assert!(
            Inbound::from_json(
                r#"{"event_id": "no sigil", "sender": "@a:hs", "type": "x", "content": {}}"#
            )
            .is_none()
        );
    }

    #[test]
    fn what_cannot_start_a_thread() {
        let reply = event(
            "m.room.message",
            json!({"msgtype": "m.text", "body": "hi",
            "m.relates_to": {"m.in_reply_to": {"event_id": "$t"}}}),
        );
        assert_eq!(reply.place.replied_to().map(|e| e.as_str()), Some("$t"));
        assert!(!reply.place.other_relation);
        let reference = event(
            "m.room.message",
            json!({"msgtype": "m.text", "body": "hi",
            "m.relates_to": {"rel_type": "m.reference", "event_id": "$t"}}),
        );
        assert!(reference.place.other_relation);
        let reaction = event(
            "m.reaction",
            json!({"m.relates_to": {"rel_type": "m.annotation",
            "event_id": "$t", "key": "👍"}}),
        );
        assert!(reaction.place.other_relation);
    }
}
