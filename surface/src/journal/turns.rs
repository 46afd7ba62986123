//! The journal's turns: a stored message gets its chat's next `seq` (with the events it carries
//! moved along), is sent until the agent acks it, and ends when its answer is posted.

use protocol::{ChatId, UserMessage};
use rusqlite::{OptionalExtension, params};

use super::{Journal, Result};

impl Journal {
    /// Stores a turn: assigns the chat's next `seq`, writes the message, and moves the trigger
    /// and the `context_ids` events to `sent`. Returns the message with its `seq`. Atomic.
    pub fn create_turn(
        &self,
        chat: &ChatId,
        mut msg: UserMessage,
        context_ids: &[String],
    ) -> Result<UserMessage> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        tx.execute(
            "INSERT OR IGNORE INTO chats(chat_id, room_id, thread_root) VALUES(?1, ?2, ?3)",
            params![chat.as_str(), msg.room_id, msg.thread_root],
        )?;
        let last: i64 = tx.query_row(
            "SELECT last_seq FROM chats WHERE chat_id = ?1",
            [chat.as_str()],
            |r| r.get(0),
        )?;
        let seq = last + 1;
        msg.seq = seq as u64;
        tx.execute(
            "UPDATE chats SET last_seq = ?2 WHERE chat_id = ?1",
            params![chat.as_str(), seq],
        )?;
        tx.execute(
            "INSERT INTO turns(chat_id, seq, event_id, message) VALUES(?1, ?2, ?3, ?4)",
            params![chat.as_str(), seq, msg.id, serde_json::to_string(&msg)?],
        )?;
        let mut stmt = tx.prepare_cached(
            "UPDATE events SET state = 'sent', turn_seq = ?2 WHERE event_id = ?1",
        )?;
        stmt.execute(params![msg.id, seq])?;
        for id in context_ids {
            stmt.execute(params![id, seq])?;
        }
        drop(stmt);
        tx.commit()?;
        Ok(msg)
    }

    /// Stored turns of `chat` with `seq > after` that have not ended, in order: what a fresh
    /// connection must (re)send.
    pub fn turns_to_send(&self, chat: &ChatId, after: u64) -> Result<Vec<UserMessage>> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT message FROM turns WHERE chat_id = ?1 AND seq > ?2 AND ended = 0 ORDER BY seq",
        )?;
        let rows = stmt.query_map(params![chat.as_str(), after as i64], |r| {
            r.get::<_, String>(0)
        })?;
        let mut out = Vec::new();
        for row in rows {
            out.push(serde_json::from_str(&row?)?);
        }
        Ok(out)
    }

    /// How many ended turns the agent claims not to have (it lost state): logged, never resent.
    pub fn ended_turns_after(&self, chat: &ChatId, after: u64) -> Result<u64> {
        Ok(self.conn().query_row(
            "SELECT COUNT(*) FROM turns WHERE chat_id = ?1 AND seq > ?2 AND ended = 1",
            params![chat.as_str(), after as i64],
            |r| r.get::<_, i64>(0),
        )? as u64)
    }

    /// Unfinished turns of `chat`, oldest first (a lane resumes them after a restart).
    pub fn unended_turns(&self, chat: &ChatId) -> Result<Vec<UserMessage>> {
        self.turns_to_send(chat, 0)
    }

    /// The agent stored the turn `seq`.
    pub fn mark_acked(&self, chat: &ChatId, seq: u64) -> Result<()> {
        self.conn().execute(
            "UPDATE turns SET acked = 1 WHERE chat_id = ?1 AND seq = ?2",
            params![chat.as_str(), seq as i64],
        )?;
        Ok(())
    }

    /// Whether turn `seq` was acked.
    pub fn is_acked(&self, chat: &ChatId, seq: u64) -> Result<bool> {
        Ok(self
            .conn()
            .query_row(
                "SELECT acked FROM turns WHERE chat_id = ?1 AND seq = ?2",
                params![chat.as_str(), seq as i64],
                |r| r.get::<_, i64>(0),
            )
            .optional()?
            == Some(1))
    }

    /// The turn `seq` is over, as `outcome` says: it and its events are done for the surface.
    /// Atomic.
    pub fn finish_turn(&self, chat: &ChatId, seq: u64, outcome: &str) -> Result<()> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        tx.execute(
            "UPDATE turns SET ended = 1, outcome = ?3 WHERE chat_id = ?1 AND seq = ?2",
            params![chat.as_str(), seq as i64, outcome],
        )?;
        tx.execute(
            "UPDATE events SET state = 'handled' WHERE chat_id = ?1 AND turn_seq = ?2",
            params![chat.as_str(), seq as i64],
        )?;
        tx.commit()?;
        Ok(())
    }

    /// How the turn answering event `event_id` ended (`None`: not over, or unknown).
    pub fn turn_outcome(&self, event_id: &str) -> Result<Option<String>> {
        Ok(self
            .conn()
            .query_row(
                "SELECT outcome FROM turns WHERE event_id = ?1 ORDER BY seq DESC LIMIT 1",
                params![event_id],
                |r| r.get::<_, Option<String>>(0),
            )
            .optional()?
            .flatten())
    }
}
