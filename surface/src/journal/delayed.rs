//! The "I was interrupted" notices scheduled with the homeserver (MSC4140 delayed events) for
//! running turns: a restarted surface finds the one its previous run left, cancels it, or
//! learns that the homeserver has posted it.

use rusqlite::{OptionalExtension, params};

use super::{Journal, Result, now_ms};

impl Journal {
    /// Turn `turn` in `room_id` has the delayed notice `delay_id` scheduled.
    pub fn set_delayed_notice(&self, turn: &str, room_id: &str, delay_id: &str) -> Result<()> {
        self.conn().execute(
            "INSERT INTO delayed_notices(turn, room_id, delay_id, created_ms) \
             VALUES(?1, ?2, ?3, ?4) ON CONFLICT(turn) DO UPDATE SET delay_id = ?3, \
             created_ms = ?4",
            params![turn, room_id, delay_id, now_ms()],
        )?;
        Ok(())
    }

    /// The delayed notice scheduled for `turn`, if any.
    pub fn delayed_notice(&self, turn: &str) -> Result<Option<String>> {
        Ok(self
            .conn()
            .query_row(
                "SELECT delay_id FROM delayed_notices WHERE turn = ?1",
                params![turn],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// `turn` has no delayed notice any more.
    pub fn clear_delayed_notice(&self, turn: &str) -> Result<()> {
        self.conn()
            .execute("DELETE FROM delayed_notices WHERE turn = ?1", params![turn])?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turns_delayed_notice_is_kept_until_cleared() {
        let j = Journal::in_memory().unwrap();
        assert_eq!(j.delayed_notice("$t").unwrap(), None);
        j.set_delayed_notice("$t", "!r:hs", "d1").unwrap();
        j.set_delayed_notice("$t", "!r:hs", "d2").unwrap();
        assert_eq!(j.delayed_notice("$t").unwrap().as_deref(), Some("d2"));
        j.clear_delayed_notice("$t").unwrap();
        assert_eq!(j.delayed_notice("$t").unwrap(), None);
    }
}
