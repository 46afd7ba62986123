//! The journal's record of posts: every transaction id is written before its first try, so a
//! post is made once (the homeserver dedupes a retried transaction id), one that went through
//! is known by its event id, and one refused for good is parked with its reason.

use rusqlite::{OptionalExtension, params};

use super::{Journal, Result, now_ms};

/// Where a send stands, from [`Journal::begin_send`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendState {
    /// Not done yet: try it (again) with the same transaction id.
    Open,
    /// Already posted as this event.
    Posted(String),
    /// Refused for good earlier, for this reason: not tried again.
    Parked(String),
}

impl Journal {
    /// Records the intent to send with `txn_id` (before the first try) and returns where that
    /// send stands: a transaction that already went through or was parked is not tried again.
    pub fn begin_send(
        &self,
        txn_id: &str,
        room_id: &str,
        thread_root: Option<&str>,
        purpose: &str,
    ) -> Result<SendState> {
        let conn = self.conn();
        conn.execute(
            "INSERT OR IGNORE INTO sends(txn_id, room_id, thread_root, purpose, created_ms) \
             VALUES(?1, ?2, ?3, ?4, ?5)",
            params![txn_id, room_id, thread_root, purpose, now_ms()],
        )?;
        let (event_id, failure) = conn.query_row(
            "SELECT event_id, failure FROM sends WHERE txn_id = ?1",
            [txn_id],
            |r| {
                Ok((
                    r.get::<_, Option<String>>(0)?,
                    r.get::<_, Option<String>>(1)?,
                ))
            },
        )?;
        Ok(match (event_id, failure) {
            (Some(id), _) => SendState::Posted(id),
            (None, Some(why)) => SendState::Parked(why),
            (None, None) => SendState::Open,
        })
    }

    /// The event a transaction was posted as, if it went through.
    pub fn posted_event(&self, txn_id: &str) -> Result<Option<String>> {
        use rusqlite::OptionalExtension;
        let id = self
            .conn()
            .query_row(
                "SELECT event_id FROM sends WHERE txn_id = ?1",
                [txn_id],
                |r| r.get::<_, Option<String>>(0),
            )
            .optional()?;
        Ok(id.flatten())
    }

    /// Parks the send `txn_id`: the homeserver refused it for good. Its content is kept for
    /// an operator to inspect; it is never tried again.
    pub fn park_send(&self, txn_id: &str, failure: &str, content_json: &str) -> Result<()> {
        self.conn().execute(
            "UPDATE sends SET failed_ms = ?2, failure = ?3, content = ?4 WHERE txn_id = ?1",
            params![txn_id, now_ms(), failure, content_json],
        )?;
        Ok(())
    }

    /// How many sends are parked.
    pub fn parked_count(&self) -> Result<u64> {
        Ok(self.conn().query_row(
            "SELECT COUNT(*) FROM sends WHERE failure IS NOT NULL AND event_id IS NULL",
            [],
            |r| r.get::<_, i64>(0),
        )? as u64)
    }

    /// The send with `txn_id` produced `event_id`.
    pub fn finish_send(&self, txn_id: &str, event_id: &str) -> Result<()> {
        self.conn().execute(
            "UPDATE sends SET event_id = ?2 WHERE txn_id = ?1",
            params![txn_id, event_id],
        )?;
        Ok(())
    }

    /// Whether `event_id` is something the bot posted.
    pub fn is_own_post(&self, event_id: &str) -> Result<bool> {
        Ok(self
            .conn()
            .query_row(
                "SELECT 1 FROM sends WHERE event_id = ?1",
                [event_id],
                |_| Ok(()),
            )
            .optional()?
            .is_some())
    }

    /// The room of `event_id`, when the journal knows the event (one it recorded, or one the
    /// bot posted).
    pub fn room_of_event(&self, event_id: &str) -> Result<Option<String>> {
        Ok(self
            .conn()
            .query_row(
                "SELECT room_id FROM events WHERE event_id = ?1 \
                 UNION ALL SELECT room_id FROM sends WHERE event_id = ?1 LIMIT 1",
                [event_id],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// Whether the bot has posted in the thread rooted at `root`.
    pub fn bot_in_thread(&self, root: &str) -> Result<bool> {
        Ok(self
            .conn()
            .query_row(
                "SELECT 1 FROM sends WHERE thread_root = ?1 AND event_id IS NOT NULL LIMIT 1",
                [root],
                |_| Ok(()),
            )
            .optional()?
            .is_some())
    }
}
