//! Per-room settings the room's moderators change from the chat: whether the bot answers every
//! message or only mentions (the default).

use rusqlite::{OptionalExtension, params};

use super::{Journal, Result};

impl Journal {
    /// Whether the bot answers every message in `room_id` (not only mentions).
    pub fn every_message(&self, room_id: &str) -> Result<bool> {
        let v: Option<i64> = self
            .conn()
            .query_row(
                "SELECT every_message FROM room_settings WHERE room_id = ?1",
                params![room_id],
                |r| r.get(0),
            )
            .optional()?;
        Ok(v == Some(1))
    }

    /// Sets whether the bot answers every message in `room_id`.
    pub fn set_every_message(&self, room_id: &str, on: bool) -> Result<()> {
        self.conn().execute(
            "INSERT INTO room_settings(room_id, every_message) VALUES(?1, ?2) \
             ON CONFLICT(room_id) DO UPDATE SET every_message = ?2",
            params![room_id, i64::from(on)],
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rooms_mode_is_kept() {
        let j = Journal::in_memory().unwrap();
        assert!(
            !j.every_message("!r:hs").unwrap(),
            "mentions only by default"
        );
        j.set_every_message("!r:hs", true).unwrap();
        assert!(j.every_message("!r:hs").unwrap());
        assert!(!j.every_message("!other:hs").unwrap());
        j.set_every_message("!r:hs", false).unwrap();
        assert!(!j.every_message("!r:hs").unwrap());
    }
}
