//! What an operator asks the journal (`surface doctor`): opened read-only, next to a running
//! surface (WAL lets a reader in beside the writer), never creating or migrating anything.

use std::path::Path;

use rusqlite::{Connection, OpenFlags};

use super::{Journal, Result};

/// One room as the journal sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoomView {
    /// Events waiting for the lane (a turn or context).
    pub pending: u64,
    /// Events still waiting for their room key.
    pub waiting_for_keys: u64,
    /// Posts the homeserver refused for good.
    pub parked: u64,
    /// The room's moderators set `!mode all`.
    pub every_message: bool,
    /// When the last event here was recorded, ms since the epoch.
    pub last_recorded_ms: Option<u64>,
}

impl Journal {
    /// Opens an existing journal read-only (`None`: there is none yet).
    pub fn open_read_only(path: &Path) -> Result<Option<Self>> {
        if !path.exists() {
            return Ok(None);
        }
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        Ok(Some(Self {
            conn: std::sync::Mutex::new(conn),
            changes: tokio::sync::watch::Sender::new(0),
        }))
    }

    /// The journal's view of `room_id`.
    pub fn room_view(&self, room_id: &str) -> Result<RoomView> {
        let conn = self.conn();
        let (pending, waiting, last) = conn.query_row(
            "SELECT COALESCE(SUM(state = 'pending'), 0), COALESCE(SUM(state = 'waiting'), 0), \
             MAX(recorded_ms) FROM events WHERE room_id = ?1",
            [room_id],
            |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, i64>(1)?,
                    r.get::<_, Option<i64>>(2)?,
                ))
            },
        )?;
        let parked = conn.query_row(
            "SELECT COUNT(*) FROM sends WHERE room_id = ?1 AND failure IS NOT NULL \
             AND event_id IS NULL",
            [room_id],
            |r| r.get::<_, i64>(0),
        )?;
        drop(conn);
        Ok(RoomView {
            pending: pending as u64,
            waiting_for_keys: waiting as u64,
            parked: parked as u64,
            every_message: self.every_message(room_id)?,
            last_recorded_ms: last.map(|v| v as u64),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_read_only_journal_sees_what_the_writer_wrote_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.sqlite");
        assert!(Journal::open_read_only(&path).unwrap().is_none());
        assert!(!path.exists(), "looking did not create a journal");
        let writer = Journal::open(&path).unwrap();
        writer.set_every_message("!r:hs", true).unwrap();
        writer.begin_send("txn1", "!r:hs", None, "answer").unwrap();
        writer.park_send("txn1", "HTTP 400", "{}").unwrap();
        let reader = Journal::open_read_only(&path).unwrap().unwrap();
        let view = reader.room_view("!r:hs").unwrap();
        assert_eq!((view.parked, view.every_message), (1, true));
        assert_eq!(reader.room_view("!other:hs").unwrap(), RoomView::default());
        assert!(reader.set_meta("k", "v").is_err(), "read-only");
    }
}
