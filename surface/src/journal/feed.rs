//! The room feed an outside reader (the MCP server) follows: every message of a room the
//! journal kept with its content — messages the bot would consider, in room order — read after
//! a position, never past a message still waiting for its room key.
//!
//! Self-authored events, senders outside the allowlist, edits and non-messages are journaled
//! as `skip` without content, so they are not in the feed.

use rusqlite::{OptionalExtension, params};

use super::{Journal, Result, Stored};

/// One message of a room's feed.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedRow {
    /// Its position: the journal's arrival order (room order within a room).
    pub ord: i64,
    /// Matrix event id.
    pub event_id: String,
    /// Sender user id.
    pub sender: String,
    /// Sender display name when it was journaled.
    pub sender_name: Option<String>,
    /// `origin_server_ts`, ms.
    pub origin_ts: u64,
    /// Thread root, when the message is in a thread.
    pub thread_root: Option<String>,
    /// What the message holds (`None` when it never decrypted: see `undecryptable`).
    pub content: Option<Stored>,
    /// Its room key never came within `SURFACE_KEY_WAIT`: the feed went on without it.
    pub undecryptable: bool,
    /// Workspace paths of its files, once its lane saved them.
    pub attachments: Vec<String>,
}

/// The dispositions whose events are messages someone sent to the room (with content).
const FEED_DISPOSITIONS: &str = "('context', 'trigger', 'answered', 'waiting')";

impl Journal {
    /// Where `event_id` stands: its room and position, if journaled.
    pub fn feed_position(&self, event_id: &str) -> Result<Option<(String, i64)>> {
        Ok(self
            .conn()
            .query_row(
                "SELECT room_id, ord FROM events WHERE event_id = ?1",
                [event_id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?)
    }

    /// The position a new reader of `room_id` starts after: the end of the room's feed, or
    /// just before its first message still waiting for a key.
    pub fn feed_end(&self, room_id: &str) -> Result<i64> {
        let conn = self.conn();
        let waiting: Option<i64> = conn.query_row(
            "SELECT MIN(ord) FROM events WHERE room_id = ?1 AND state = 'waiting'",
            [room_id],
            |r| r.get(0),
        )?;
        if let Some(ord) = waiting {
            return Ok(ord - 1);
        }
        let last: Option<i64> = conn.query_row(
            "SELECT MAX(ord) FROM events WHERE room_id = ?1",
            [room_id],
            |r| r.get(0),
        )?;
        Ok(last.unwrap_or(0))
    }

    /// At most `limit` feed messages of `room_id` after position `after`, in order, stopping
    /// before the first one still waiting for its room key (it comes once decrypted).
    pub fn feed_after(&self, room_id: &str, after: i64, limit: usize) -> Result<Vec<FeedRow>> {
        self.feed_rows("e.ord > ?2 ORDER BY e.ord", room_id, after, limit)
    }

    /// The last `count` feed messages of `room_id` up to position `upto` (a [`Journal::feed_end`],
    /// so none of them waits for a key), in order.
    pub fn feed_last(&self, room_id: &str, upto: i64, count: usize) -> Result<Vec<FeedRow>> {
        let mut rows = self.feed_rows("e.ord <= ?2 ORDER BY e.ord DESC", room_id, upto, count)?;
        rows.reverse();
        Ok(rows)
    }

    /// Feed rows of `room_id` where `order` (a condition on `?2` and the order) holds, at most
    /// `limit`, cut before the first one still waiting for its room key.
    fn feed_rows(&self, order: &str, room_id: &str, at: i64, limit: usize) -> Result<Vec<FeedRow>> {
        let sql = format!(
            "SELECT e.ord, e.event_id, e.sender, e.sender_name, e.origin_ts, e.thread_root, \
             e.content, e.state, e.context_json, e.kind, \
             (SELECT t.message FROM turns t WHERE t.event_id = e.event_id LIMIT 1) \
             FROM events e WHERE e.room_id = ?1 AND e.disposition IN {FEED_DISPOSITIONS} \
             AND {order} LIMIT ?3"
        );
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(&sql)?;
        let rows = stmt.query_map(params![room_id, at, limit as i64], |r| {
            let state: String = r.get(7)?;
            let context: Option<String> = r.get(8)?;
            let turn: Option<String> = r.get(10)?;
            Ok((
                FeedRow {
                    ord: r.get(0)?,
                    event_id: r.get(1)?,
                    sender: r.get(2)?,
                    sender_name: r.get(3)?,
                    origin_ts: r.get::<_, i64>(4)? as u64,
                    thread_root: r.get(5)?,
                    content: None,
                    undecryptable: state == "late",
                    attachments: attachments_of(context.as_deref(), turn.as_deref()),
                },
                state,
                Stored::load(r.get::<_, Option<String>>(9)?.as_deref(), r.get(6)?),
            ))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (mut row, state, content) = row?;
            match state.as_str() {
                "waiting" => break,
                "late" => {}
                _ => row.content = content,
            }
            out.push(row);
        }
        Ok(out)
    }
}

/// The files a message brought, from what its lane stored: the context message it became, or
/// the turn it started.
fn attachments_of(context_json: Option<&str>, turn_json: Option<&str>) -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct Files {
        #[serde(default)]
        attachments: Vec<String>,
    }
    [context_json, turn_json]
        .into_iter()
        .flatten()
        .filter_map(|json| serde_json::from_str::<Files>(json).ok())
        .map(|f| f.attachments)
        .find(|a| !a.is_empty())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use matrix_sdk::ruma::events::room::message::MessageType;

    use super::super::{Disposition, NewEvent};
    use super::*;

    fn ev(id: &str, sender: &str, disposition: Disposition) -> NewEvent {
        NewEvent {
            event_id: id.try_into().unwrap(),
            room_id: "!r:hs".try_into().unwrap(),
            chat_id: protocol::ChatId::new("c1").ok(),
            thread_root: None,
            sender: sender.try_into().unwrap(),
            sender_name: None,
            origin_ts: 1,
            content: (disposition != Disposition::Skip)
                .then(|| Stored::Message(MessageType::text_plain(id))),
            disposition,
        }
    }

    fn ids(rows: &[FeedRow]) -> Vec<&str> {
        rows.iter().map(|r| r.event_id.as_str()).collect()
    }

    #[test]
    fn the_feed_is_the_messages_with_content_in_order_and_stops_at_a_waiting_one() {
        let j = Journal::in_memory().unwrap();
        j.record(
            "!r:hs",
            &[
                ev("$a", "@u:hs", Disposition::Trigger),
                ev("$self", "@bot:hs", Disposition::Skip),
                ev("$b", "@u:hs", Disposition::Context),
                ev("$c", "@u:hs", Disposition::Answered),
                ev("$w", "@u:hs", Disposition::Waiting),
                ev("$d", "@u:hs", Disposition::Trigger),
            ],
        )
        .unwrap();
        let all = j.feed_after("!r:hs", 0, 100).unwrap();
        assert_eq!(ids(&all), ["$a", "$b", "$c"]);
        assert_eq!(
            all[0].content,
            Some(Stored::Message(MessageType::text_plain("$a")))
        );
        let (_, b) = j.feed_position("$b").unwrap().unwrap();
        assert_eq!(ids(&j.feed_after("!r:hs", b, 100).unwrap()), ["$c"]);
        assert_eq!(ids(&j.feed_after("!r:hs", 0, 1).unwrap()), ["$a"]);
        // A new reader starts before the waiting message, so it is not missed.
        let (_, w) = j.feed_position("$w").unwrap().unwrap();
        assert_eq!(j.feed_end("!r:hs").unwrap(), w - 1);

        // Late (its key never came): listed as undecryptable, and the feed goes on.
        assert!(j.mark_late("$w").unwrap());
        let rest = j.feed_after("!r:hs", b, 100).unwrap();
        assert_eq!(ids(&rest), ["$c", "$w", "$d"]);
        assert!(rest[1].undecryptable && rest[1].content.is_none());
        let (_, d) = j.feed_position("$d").unwrap().unwrap();
        assert_eq!(j.feed_end("!r:hs").unwrap(), d);
        assert!(j.feed_after("!other:hs", 0, 10).unwrap().is_empty());
        // The last ones up to the end, in order, however many skipped events lie between.
        assert_eq!(ids(&j.feed_last("!r:hs", d, 2).unwrap()), ["$w", "$d"]);
        assert_eq!(ids(&j.feed_last("!r:hs", b, 10).unwrap()), ["$a", "$b"]);
        assert!(j.feed_last("!r:hs", 0, 10).unwrap().is_empty());
        assert_eq!(j.feed_end("!other:hs").unwrap(), 0);
    }

    #[test]
    fn attachments_come_from_the_context_message_or_the_turn() {
        let turn = r#"{"attachments":["surfaces/matrix/u/r/inbox/a.png"]}"#;
        assert_eq!(
            attachments_of(None, Some(turn)),
            ["surfaces/matrix/u/r/inbox/a.png"]
        );
        assert_eq!(
            attachments_of(Some(r#"{"attachments":["x"]}"#), Some(turn)),
            ["x"]
        );
        assert!(attachments_of(Some("not json"), None).is_empty());
        assert!(attachments_of(None, None).is_empty());
    }
}
