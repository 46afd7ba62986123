//! Events journaled before their room key arrived: listed, replaced by what decryption
//! revealed, or marked late when their wait timed out.

use protocol::ChatId;
use rusqlite::params;

use super::{Journal, JournaledEvent, NewEvent, Result, Stored};

/// An event journaled before its room key arrived.
#[derive(Debug, Clone)]
pub struct Undecrypted {
    /// The event (its content is [`Stored::Encrypted`]: the whole encrypted event).
    pub journaled: JournaledEvent,
    /// When it was journaled, ms since the epoch.
    pub recorded_ms: u64,
    /// Its wait timed out: the room was told and its lane went on.
    pub late: bool,
}

impl Journal {
    /// Events still waiting for their room key (and late ones), oldest first.
    pub fn undecrypted(&self) -> Result<Vec<Undecrypted>> {
        let sql = format!(
            "SELECT {}, recorded_ms, state FROM events WHERE state IN ('waiting', 'late') \
             ORDER BY ord",
            Self::EVENT_COLS
        );
        let conn = self.conn();
        let mut stmt = conn.prepare(&sql)?;
        let rows = stmt.query_map([], |r| {
            Ok(Undecrypted {
                journaled: Self::row_to_event(r)?,
                recorded_ms: r.get::<_, i64>(11)? as u64,
                late: r.get::<_, String>(12)? == "late",
            })
        })?;
        Ok(rows.collect::<rusqlite::Result<_>>()?)
    }

    /// Replaces a waiting (or late) event by what its decryption revealed and the decision on
    /// it. Returns false when it was not waiting any more (resolved meanwhile).
    pub fn resolve_undecrypted(&self, ev: &NewEvent) -> Result<bool> {
        let content = ev.content.as_ref().map(Stored::to_json).transpose()?;
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let n = tx.execute(
            "UPDATE events SET chat_id = ?2, thread_root = ?3, sender_name = ?4, content = ?5, \
             kind = ?8, disposition = ?6, state = ?7 \
             WHERE event_id = ?1 AND state IN ('waiting', 'late')",
            params![
                ev.event_id.as_str(),
                ev.chat_id.as_ref().map(ChatId::as_str),
                ev.thread_root.as_ref().map(|t| t.as_str()),
                ev.sender_name,
                content,
                ev.disposition.as_str(),
                ev.disposition.initial_state(),
                ev.content.as_ref().map(Stored::kind),
            ],
        )?;
        if let Some(chat) = &ev.chat_id {
            tx.execute(
                "INSERT OR IGNORE INTO chats(chat_id, room_id, thread_root) VALUES(?1, ?2, ?3)",
                params![
                    chat.as_str(),
                    ev.room_id.as_str(),
                    ev.thread_root.as_ref().map(|t| t.as_str())
                ],
            )?;
        }
        tx.commit()?;
        drop(conn);
        self.changed();
        Ok(n == 1)
    }

    /// A waiting event's wait timed out: its lane goes on without it. Returns false when it was
    /// not waiting any more.
    pub fn mark_late(&self, event_id: &str) -> Result<bool> {
        let late = self.conn().execute(
            "UPDATE events SET state = 'late' WHERE event_id = ?1 AND state = 'waiting'",
            [event_id],
        )? == 1;
        self.changed();
        Ok(late)
    }
}
