//! The delivery checker of the fault test: from what users sent and what the bot posted, per
//! room, it counts lost replies, duplicated replies and replies out of order. Pure, so its own
//! tests can prove it fails when it should.

use std::collections::BTreeMap;

use crate::matrix::{Event, replied_to};

/// A message the bot posted, as the room's timeline shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BotMessage {
    /// Its event id.
    pub event_id: String,
    /// The event it answers: the `m.in_reply_to` target, else the `m.relates_to` event (thread
    /// root). `None` for a message unrelated to anything.
    pub answers: Option<String>,
    /// Whether it is a text reply (`m.text`), as opposed to a notice, a prompt or a file.
    pub is_text: bool,
}

impl BotMessage {
    /// Reads a bot message from a timeline event.
    pub fn from_event(e: &Event) -> Self {
        Self {
            event_id: e["event_id"].as_str().unwrap_or_default().to_owned(),
            answers: replied_to(e),
            is_text: e["content"]["msgtype"] == "m.text",
        }
    }
}

/// One room: the triggers users sent, in the order they were sent, and every message of the bot,
/// in timeline order.
#[derive(Debug, Clone, Default)]
pub struct RoomTimeline {
    /// Event ids of the user messages, in sending order; each must get exactly one reply.
    pub triggers: Vec<String>,
    /// The bot's messages in timeline order.
    pub bot: Vec<BotMessage>,
}

/// What the checker found. Every list names the events concerned, for the failure message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Number of triggers over all rooms.
    pub messages: usize,
    /// Triggers without any text reply.
    pub lost: Vec<String>,
    /// Triggers with more than one text reply, with how many they got.
    pub duplicate_replies: Vec<(String, usize)>,
    /// Triggers whose (first) reply came after the reply to a later trigger of the same room.
    pub out_of_order: Vec<String>,
    /// Text replies of the bot to events that are not triggers (should not happen).
    pub stray: Vec<String>,
}

impl Report {
    /// Whether every trigger got exactly one reply, in order.
    pub fn is_clean(&self) -> bool {
        self.lost.is_empty() && self.duplicate_replies.is_empty() && self.out_of_order.is_empty()
    }

    /// The summary line the fault test prints (without its kill counts).
    pub fn summary(&self) -> String {
        format!(
            "lost={} duplicate_replies={} out_of_order={}",
            self.lost.len(),
            self.duplicate_replies.len(),
            self.out_of_order.len()
        )
    }
}

/// Checks every room: each trigger must have exactly one text reply, and the first replies must
/// appear in the order the triggers were sent.
pub fn check(rooms: &[RoomTimeline]) -> Report {
    let mut report = Report::default();
    for room in rooms {
        report.messages += room.triggers.len();
        let position: BTreeMap<&str, usize> = room
            .triggers
            .iter()
            .enumerate()
            .map(|(i, id)| (id.as_str(), i))
            .collect();
        let mut replies = vec![0usize; room.triggers.len()];
        // Trigger positions in the order their first replies appear.
        let mut answered_order = Vec::new();
        for m in room.bot.iter().filter(|m| m.is_text) {
            match m.answers.as_deref().and_then(|a| position.get(a)) {
                Some(&i) => {
                    replies[i] += 1;
                    if replies[i] == 1 {
                        answered_order.push(i);
                    }
                }
                None => report.stray.push(m.event_id.clone()),
            }
        }
        for (i, n) in replies.iter().enumerate() {
            match n {
                0 => report.lost.push(room.triggers[i].clone()),
                1 => {}
                n => report
                    .duplicate_replies
                    .push((room.triggers[i].clone(), *n)),
            }
        }
        // A reply is out of order when a later trigger was answered before it.
        let mut latest = None;
        for i in answered_order {
            if latest.is_some_and(|l| i < l) {
                report.out_of_order.push(room.triggers[i].clone());
            } else {
                latest = Some(i);
            }
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn reply(id: &str, to: &str) -> BotMessage {
        BotMessage {
            event_id: id.into(),
            answers: Some(to.into()),
            is_text: true,
        }
    }

    fn room(triggers: &[&str], bot: Vec<BotMessage>) -> RoomTimeline {
        RoomTimeline {
            triggers: triggers.iter().map(|t| (*t).to_owned()).collect(),
            bot,
        }
    }

    #[test]
    fn a_clean_timeline_passes() {
        let notice = BotMessage {
            event_id: "$n".into(),
            answers: None,
            is_text: false,
        };
        let report = check(&[
            room(
                &["$a", "$b", "$c"],
                vec![
                    notice,
                    reply("$1", "$a"),
                    reply("$2", "$b"),
                    reply("$3", "$c"),
                ],
            ),
            room(&["$x"], vec![reply("$4", "$x")]),
        ]);
        assert!(report.is_clean(), "{report:?}");
        assert_eq!(report.messages, 4);
        assert_eq!(
            report.summary(),
            "lost=0 duplicate_replies=0 out_of_order=0"
        );
    }

    #[test]
    fn a_lost_reply_is_caught() {
        let report = check(&[room(
            &["$a", "$b", "$c"],
            vec![reply("$1", "$a"), reply("$3", "$c")],
        )]);
        assert_eq!(report.lost, vec!["$b".to_owned()]);
        assert!(report.duplicate_replies.is_empty() && report.out_of_order.is_empty());
        assert!(!report.is_clean());
    }

    #[test]
    fn a_duplicated_reply_is_caught() {
        let report = check(&[room(
            &["$a", "$b"],
            vec![reply("$1", "$a"), reply("$2", "$a"), reply("$3", "$b")],
        )]);
        assert_eq!(report.duplicate_replies, vec![("$a".to_owned(), 2)]);
        assert!(report.lost.is_empty() && report.out_of_order.is_empty());
        assert!(!report.is_clean());
    }

    #[test]
    fn an_out_of_order_pair_is_caught() {
        let report = check(&[room(
            &["$a", "$b", "$c"],
            vec![reply("$1", "$a"), reply("$3", "$c"), reply("$2", "$b")],
        )]);
        assert_eq!(report.out_of_order, vec!["$b".to_owned()]);
        assert!(report.lost.is_empty() && report.duplicate_replies.is_empty());
        assert!(!report.is_clean());
    }

    #[test]
    fn notices_do_not_count_as_replies_and_strays_are_listed() {
        let notice = BotMessage {
            event_id: "$n".into(),
            answers: Some("$a".into()),
            is_text: false,
        };
        let report = check(&[room(&["$a"], vec![notice, reply("$9", "$elsewhere")])]);
        assert_eq!(report.lost, vec!["$a".to_owned()]);
        assert_eq!(report.stray, vec!["$9".to_owned()]);
    }

    #[test]
    fn bot_messages_read_from_threaded_replies() {
        let e = json!({
            "event_id": "$r", "type": "m.room.message",
            "content": {"msgtype": "m.text", "body": "hi", "m.relates_to": {
                "rel_type": "m.thread", "event_id": "$root",
                "is_falling_back": true, "m.in_reply_to": {"event_id": "$trigger"}}}
        });
        assert_eq!(
            BotMessage::from_event(&e),
            BotMessage {
                event_id: "$r".into(),
                answers: Some("$trigger".into()),
                is_text: true
            }
        );
        let n = json!({"event_id": "$n", "content": {"msgtype": "m.notice", "body": "queued"}});
        assert_eq!(BotMessage::from_event(&n).answers, None);
        assert!(!BotMessage::from_event(&n).is_text);
    }
}
