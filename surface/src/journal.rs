//! The durable delivery journal (sqlite, WAL): every timeline event seen, what was decided for
//! it, the turns sent to the agent with their per-chat `seq`, and every send's transaction id.
//!
//! matrix-sdk saves its sync token before our code runs, so this journal — written before any
//! action — is what makes delivery at-least-once on our side and exactly-once with the agent's
//! dedup by id.
//!
//! Event states: `pending` (a lane must process it), `waiting` (not decryptable yet: its lane
//! stops there until the key arrives or the wait times out), `late` (the wait timed out and the
//! room was told; decrypted and handled if the key still comes), `ready` (a context message
//! prepared and waiting for the next trigger), `sent` (part of a stored turn not finished yet),
//! `handled`.

mod delayed;
mod edits;
mod feed;
mod inspect;
mod redactions;
mod sends;
mod settings;
mod stored;
mod turns;
mod undecrypted;

pub use inspect::RoomView;

use std::path::Path;
use std::sync::Mutex;

use matrix_sdk::ruma::{OwnedEventId, OwnedRoomId, OwnedUserId};
use protocol::{ChatId, ContextMessage};
use rusqlite::{Connection, OptionalExtension, params};

pub use edits::EditTarget;
pub use feed::FeedRow;
pub use redactions::Redacted;
pub use sends::SendState;
pub use stored::Stored;
pub use undecrypted::Undecrypted;

impl NewEvent {
    /// The conversation it belongs to (its room, or its thread), whether it was kept or not.
    pub fn conversation(&self) -> ChatId {
        ChatId::for_conversation(
            self.room_id.as_str(),
            self.thread_root.as_ref().map(|t| t.as_str()),
        )
    }
}

/// What [`crate::decide`] concluded for an event when it was recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Nothing to do (self-sent, not allowed, not a message, an edit...).
    Skip,
    /// Travels as context with the next trigger of its chat.
    Context,
    /// Starts a turn.
    Trigger,
    /// Consumed as the answer to a question or approval.
    Answered,
    /// Not decryptable yet; its content is the whole encrypted event, kept to try again.
    Waiting,
}

impl Disposition {
    fn as_str(self) -> &'static str {
        match self {
            Self::Skip => "skip",
            Self::Context => "context",
            Self::Trigger => "trigger",
            Self::Answered => "answered",
            Self::Waiting => "waiting",
        }
    }

    fn parse(s: &str) -> Self {
        match s {
            "context" => Self::Context,
            "trigger" => Self::Trigger,
            "answered" => Self::Answered,
            "waiting" => Self::Waiting,
            _ => Self::Skip,
        }
    }

    fn initial_state(self) -> &'static str {
        match self {
            Self::Context | Self::Trigger => "pending",
            Self::Skip | Self::Answered => "handled",
            Self::Waiting => "waiting",
        }
    }
}

/// An event to record.
#[derive(Debug, Clone)]
pub struct NewEvent {
    /// Matrix event id.
    pub event_id: OwnedEventId,
    /// Room it belongs to.
    pub room_id: OwnedRoomId,
    /// Conversation it belongs to (`None` for skipped events).
    pub chat_id: Option<ChatId>,
    /// Thread root when the chat is a thread.
    pub thread_root: Option<OwnedEventId>,
    /// Sender user id.
    pub sender: OwnedUserId,
    /// Sender display name at recording time.
    pub sender_name: Option<String>,
    /// `origin_server_ts`, ms.
    pub origin_ts: u64,
    /// What it holds (`None` for skipped events: we keep only the id for gap detection).
    pub content: Option<Stored>,
    /// The decision.
    pub disposition: Disposition,
}

/// What the journal holds that nothing acted on yet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Messages not answered yet and not in the agent's hands: events pending or waiting, and
    /// turns stored that the agent has not accepted (acked).
    pub unhandled: u64,
    /// Of those, events waiting for their room key.
    pub waiting_for_keys: u64,
    /// When the oldest was recorded, ms since the epoch.
    pub oldest_ms: Option<u64>,
}

/// An event read back from the journal: what was recorded, and where it stands in arrival
/// order (room order within a room).
#[derive(Debug, Clone)]
pub struct JournaledEvent {
    /// Arrival order.
    pub ord: i64,
    /// The event as it was recorded.
    pub event: NewEvent,
}

/// A chat that has work left (for starting lanes after a restart).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatRef {
    /// The chat.
    pub chat_id: ChatId,
    /// Its room.
    pub room_id: OwnedRoomId,
    /// Its thread root.
    pub thread_root: Option<OwnedEventId>,
}

/// A journal error (sqlite or a corrupt stored value).
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// sqlite failed.
    #[error("journal database: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A stored JSON value did not decode.
    #[error("journal value: {0}")]
    Json(#[from] serde_json::Error),
}

type Result<T> = std::result::Result<T, JournalError>;

/// The journal. Cheap to share behind an `Arc`; every call is a short sqlite transaction.
#[derive(Debug)]
pub struct Journal {
    conn: Mutex<Connection>,
    /// Bumped whenever the room feeds may have grown (events recorded, decrypted, or given up
    /// on), for readers that follow them ([`Journal::changes`]).
    changes: tokio::sync::watch::Sender<u64>,
}

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rooms(room_id TEXT PRIMARY KEY, first_seen_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS events(
    ord INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id TEXT NOT NULL UNIQUE,
    room_id TEXT NOT NULL,
    chat_id TEXT,
    thread_root TEXT,
    sender TEXT NOT NULL,
    sender_name TEXT,
    origin_ts INTEGER NOT NULL,
    content TEXT,
    kind TEXT,
    disposition TEXT NOT NULL,
    state TEXT NOT NULL,
    context_json TEXT,
    turn_seq INTEGER,
    recorded_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS events_chat_state ON events(chat_id, state, ord);
-- The undecrypted sweep runs every few seconds: it must not scan the whole journal.
CREATE INDEX IF NOT EXISTS events_undecrypted ON events(ord) WHERE state IN ('waiting', 'late');
CREATE TABLE IF NOT EXISTS chats(
    chat_id TEXT PRIMARY KEY,
    room_id TEXT NOT NULL,
    thread_root TEXT,
    last_seq INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS turns(
    chat_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    event_id TEXT NOT NULL,
    message TEXT NOT NULL,
    acked INTEGER NOT NULL DEFAULT 0,
    ended INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY(chat_id, seq)
);
CREATE TABLE IF NOT EXISTS sends(
    txn_id TEXT PRIMARY KEY,
    room_id TEXT NOT NULL,
    thread_root TEXT,
    purpose TEXT NOT NULL,
    event_id TEXT,
    created_ms INTEGER NOT NULL,
    failed_ms INTEGER,
    failure TEXT,
    content TEXT
);
CREATE INDEX IF NOT EXISTS sends_event ON sends(event_id);
CREATE INDEX IF NOT EXISTS events_room ON events(room_id, ord);
CREATE INDEX IF NOT EXISTS turns_event ON turns(event_id);
CREATE INDEX IF NOT EXISTS sends_thread ON sends(thread_root);
CREATE TABLE IF NOT EXISTS room_settings(
    room_id TEXT PRIMARY KEY,
    every_message INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS delayed_notices(
    turn TEXT PRIMARY KEY,
    room_id TEXT NOT NULL,
    delay_id TEXT NOT NULL,
    created_ms INTEGER NOT NULL
);
"#;

/// [`daemon::now_ms`] as sqlite stores it.
fn now_ms() -> i64 {
    i64::try_from(daemon::now_ms()).unwrap_or(i64::MAX)
}

fn add_column_if_missing(conn: &Connection, table: &str, column: &str, decl: &str) -> Result<()> {
    let present = conn
        .prepare(&format!(
            "SELECT 1 FROM pragma_table_info('{table}') WHERE name = ?1"
        ))?
        .exists([column])?;
    if !present {
        conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {decl}"))?;
    }
    Ok(())
}

/// The schema version this build writes (`PRAGMA user_version`).
const SCHEMA_VERSION: i64 = 1;

/// Brings a journal written by an earlier build up to [`SCHEMA_VERSION`], in one transaction.
///
/// 0 → 1: rows get a `kind` ([`Stored`]). A row with content was a message, or, while it still
/// waits for its room key (disposition `waiting`, also once `late`), the whole encrypted
/// event. (Edits and redactions were kept as message-shaped text then, and still read as the
/// messages they were.)
fn migrate(conn: &Connection) -> Result<()> {
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if version >= SCHEMA_VERSION {
        return Ok(());
    }
    add_column_if_missing(conn, "events", "kind", "TEXT")?;
    conn.execute_batch(&format!(
        "BEGIN;          UPDATE events SET kind = CASE WHEN disposition = 'waiting' THEN 'encrypted'            ELSE 'message' END WHERE kind IS NULL AND content IS NOT NULL;          PRAGMA user_version = {SCHEMA_VERSION};          COMMIT;"
    ))?;
    Ok(())
}

/// A Matrix id column (or an optional one): a value that does not parse is an error of the row.
fn matrix_id<T: MatrixIdColumn>(r: &rusqlite::Row<'_>, i: usize) -> rusqlite::Result<T> {
    T::parse(r.get(i)?)
        .map_err(|e| rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, e))
}

/// What [`matrix_id`] reads: an owned Matrix id, or an optional one.
trait MatrixIdColumn: Sized {
    type Raw: rusqlite::types::FromSql;
    fn parse(raw: Self::Raw)
    -> std::result::Result<Self, Box<dyn std::error::Error + Send + Sync>>;
}

macro_rules! id_column {
    ($($t:ty),*) => {$(
        impl MatrixIdColumn for $t {
            type Raw = String;
            fn parse(raw: String) -> std::result::Result<Self, Box<dyn std::error::Error + Send + Sync>> {
                Ok(<$t>::try_from(raw)?)
            }
        }
        impl MatrixIdColumn for Option<$t> {
            type Raw = Option<String>;
            fn parse(raw: Option<String>) -> std::result::Result<Self, Box<dyn std::error::Error + Send + Sync>> {
                Ok(raw.map(<$t>::try_from).transpose()?)
            }
        }
    )*};
}
id_column!(OwnedEventId, OwnedRoomId, OwnedUserId);

fn chat_id_col(s: Option<String>) -> Option<ChatId> {
    s.and_then(|s| ChatId::new(s).ok())
}

impl Journal {
    /// Opens (creating if needed) the journal at `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let conn = Connection::open(path)?;
        Self::init(conn)
    }

    /// An in-memory journal, for tests.
    pub fn in_memory() -> Result<Self> {
        Self::init(Connection::open_in_memory()?)
    }

    fn init(conn: Connection) -> Result<Self> {
        // WAL keeps readers and the single writer apart. Commits are written to the WAL in
        // order; most need not be flushed to the disk at once (`NORMAL`: a process crash loses
        // nothing, and what a power loss could lose is redone with the same ids: turns are
        // admitted by message id, posts carry deterministic transaction ids). Recording new
        // events is the one commit that must survive power loss before the sync moves on:
        // [`Journal::record`] commits with `FULL`, which flushes every earlier commit too, so an
        // event costs one fsync, not one per step.
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA)?;
        // Journals written before sends could be parked lack these columns.
        for (column, decl) in [
            ("failed_ms", "INTEGER"),
            ("failure", "TEXT"),
            ("content", "TEXT"),
        ] {
            add_column_if_missing(&conn, "sends", column, decl)?;
        }
        // How a turn ended (`ended`, `stopped`, `timeout`, …); none before it was recorded.
        add_column_if_missing(&conn, "turns", "outcome", "TEXT")?;
        migrate(&conn)?;
        Ok(Self {
            conn: Mutex::new(conn),
            changes: tokio::sync::watch::Sender::new(0),
        })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave sqlite half-written (transactions roll
        // back), so a poisoned lock is still usable.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A free-form value stored under `key`.
    pub fn meta(&self, key: &str) -> Result<Option<String>> {
        Ok(self
            .conn()
            .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
            .optional()?)
    }

    /// Stores `value` under `key`.
    pub fn set_meta(&self, key: &str, value: &str) -> Result<()> {
        self.conn().execute(
            "INSERT INTO meta(key, value) VALUES(?1, ?2) ON CONFLICT(key) DO UPDATE SET value = ?2",
            params![key, value],
        )?;
        Ok(())
    }

    /// Whether the room has been seen before (its watermark exists).
    pub fn room_known(&self, room_id: &str) -> Result<bool> {
        Ok(self
            .conn()
            .query_row("SELECT 1 FROM rooms WHERE room_id = ?1", [room_id], |_| {
                Ok(())
            })
            .optional()?
            .is_some())
    }

    /// Whether the event is already journaled.
    pub fn contains(&self, event_id: &str) -> Result<bool> {
        Ok(self
            .conn()
            .query_row(
                "SELECT 1 FROM events WHERE event_id = ?1",
                [event_id],
                |_| Ok(()),
            )
            .optional()?
            .is_some())
    }

    /// Records `events` of one room in order, marks the room known, and returns for each event
    /// whether it was new (already journaled events are left untouched). One transaction.
    pub fn record(&self, room_id: &str, events: &[NewEvent]) -> Result<Vec<bool>> {
        let mut all = self.record_rooms(&[(room_id, events)])?;
        Ok(all.pop().unwrap_or_default())
    }

    /// [`Journal::record`] for several rooms (what one sync brought) in one transaction, so
    /// with one fsync however many rooms spoke: returns, room by room, which events were new.
    pub fn record_rooms(&self, rooms: &[(&str, &[NewEvent])]) -> Result<Vec<Vec<bool>>> {
        let mut conn = self.conn();
        conn.pragma_update(None, "synchronous", "FULL")?;
        let inserted = Self::record_in(&mut conn, rooms);
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        drop(conn);
        if inserted
            .as_ref()
            .is_ok_and(|rooms| rooms.iter().flatten().any(|new| *new))
        {
            self.changed();
        }
        inserted
    }

    /// Follows changes that may have grown a room's feed: the value changes after each one.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn record_in(conn: &mut Connection, rooms: &[(&str, &[NewEvent])]) -> Result<Vec<Vec<bool>>> {
        let tx = conn.transaction()?;
        let now = now_ms();
        let mut out = Vec::with_capacity(rooms.len());
        {
            let mut room_stmt = tx.prepare_cached(
                "INSERT OR IGNORE INTO rooms(room_id, first_seen_ms) VALUES(?1, ?2)",
            )?;
            let mut stmt = tx.prepare_cached(
                "INSERT OR IGNORE INTO events(event_id, room_id, chat_id, thread_root, sender, \
                 sender_name, origin_ts, content, kind, disposition, state, recorded_ms) \
                 VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
            )?;
            let mut chat_stmt = tx.prepare_cached(
                "INSERT OR IGNORE INTO chats(chat_id, room_id, thread_root) VALUES(?1, ?2, ?3)",
            )?;
            for (room_id, events) in rooms {
                room_stmt.execute(params![room_id, now])?;
                let mut inserted = Vec::with_capacity(events.len());
                for e in *events {
                    let content = e.content.as_ref().map(Stored::to_json).transpose()?;
                    let n = stmt.execute(params![
                        e.event_id.as_str(),
                        e.room_id.as_str(),
                        e.chat_id.as_ref().map(ChatId::as_str),
                        e.thread_root.as_ref().map(|t| t.as_str()),
                        e.sender.as_str(),
                        e.sender_name,
                        e.origin_ts as i64,
                        content,
                        e.content.as_ref().map(Stored::kind),
                        e.disposition.as_str(),
                        e.disposition.initial_state(),
                        now,
                    ])?;
                    if let Some(chat) = &e.chat_id {
                        chat_stmt.execute(params![
                            chat.as_str(),
                            e.room_id.as_str(),
                            e.thread_root.as_ref().map(|t| t.as_str())
                        ])?;
                    }
                    inserted.push(n == 1);
                }
                out.push(inserted);
            }
        }
        tx.commit()?;
        Ok(out)
    }

    fn row_to_event(r: &rusqlite::Row<'_>) -> rusqlite::Result<JournaledEvent> {
        Ok(JournaledEvent {
            ord: r.get(0)?,
            event: NewEvent {
                event_id: matrix_id(r, 1)?,
                room_id: matrix_id(r, 2)?,
                chat_id: chat_id_col(r.get(3)?),
                thread_root: matrix_id(r, 4)?,
                sender: matrix_id(r, 5)?,
                sender_name: r.get(6)?,
                origin_ts: r.get::<_, i64>(7)? as u64,
                content: Stored::load(r.get::<_, Option<String>>(10)?.as_deref(), r.get(8)?),
                disposition: Disposition::parse(&r.get::<_, String>(9)?),
            },
        })
    }

    const EVENT_COLS: &str = "ord, event_id, room_id, chat_id, thread_root, sender, sender_name, \
                              origin_ts, content, disposition, kind";

    /// The oldest event of `chat` a lane still has to process. When it is still waiting for
    /// its room key (disposition [`Disposition::Waiting`]), the lane must not go past it.
    pub fn next_pending(&self, chat: &ChatId) -> Result<Option<JournaledEvent>> {
        let sql = format!(
            "SELECT {} FROM events WHERE chat_id = ?1 AND state IN ('pending', 'waiting') \
             ORDER BY ord LIMIT 1",
            Self::EVENT_COLS
        );
        Ok(self
            .conn()
            .query_row(&sql, [chat.as_str()], Self::row_to_event)
            .optional()?)
    }

    /// The next event of `chat` waiting for its lane after arrival order `ord`.
    pub fn next_pending_after(&self, chat: &ChatId, ord: i64) -> Result<Option<JournaledEvent>> {
        let sql = format!(
            "SELECT {} FROM events WHERE chat_id = ?1 AND state = 'pending' AND ord > ?2 \
             ORDER BY ord LIMIT 1",
            Self::EVENT_COLS
        );
        Ok(self
            .conn()
            .query_row(&sql, params![chat.as_str(), ord], Self::row_to_event)
            .optional()?)
    }

    /// Whether a message of `chat` that starts a turn waits after arrival order `ord`.
    pub fn trigger_waits_after(&self, chat: &ChatId, ord: i64) -> Result<bool> {
        Ok(self.conn().query_row(
            "SELECT EXISTS(SELECT 1 FROM events WHERE chat_id = ?1 AND ord > ?2 \
             AND disposition = 'trigger' AND state IN ('pending', 'waiting'))",
            params![chat.as_str(), ord],
            |r| r.get::<_, bool>(0),
        )?)
    }

    /// How many events of `chat` wait for its lane.
    pub fn pending_count(&self, chat: &ChatId) -> Result<u64> {
        Ok(self.conn().query_row(
            "SELECT COUNT(*) FROM events WHERE chat_id = ?1 AND state IN ('pending', 'waiting')",
            [chat.as_str()],
            |r| r.get::<_, i64>(0),
        )? as u64)
    }

    /// Across all chats: messages not handled yet (events pending or waiting, and turns the
    /// agent has not accepted: a message that waits for an unreachable agent counts), how many
    /// wait for a room key, and when the oldest was recorded (ms since the epoch).
    pub fn backlog(&self) -> Result<Backlog> {
        Ok(self.conn().query_row(
            "SELECT COUNT(*), COALESCE(SUM(waiting), 0), MIN(recorded_ms) FROM ( \
               SELECT state = 'waiting' AS waiting, recorded_ms FROM events \
                 WHERE state IN ('pending', 'waiting') \
               UNION ALL \
               SELECT 0, e.recorded_ms FROM turns t \
                 LEFT JOIN events e ON e.event_id = t.event_id \
                 WHERE t.acked = 0 AND t.ended = 0)",
            [],
            |r| {
                Ok(Backlog {
                    unhandled: r.get::<_, i64>(0)? as u64,
                    waiting_for_keys: r.get::<_, i64>(1)? as u64,
                    oldest_ms: r.get::<_, Option<i64>>(2)?.map(|v| v as u64),
                })
            },
        )?)
    }

    /// Chats with pending events or unfinished turns.
    pub fn chats_with_work(&self) -> Result<Vec<ChatRef>> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT chat_id, room_id, thread_root FROM chats WHERE chat_id IN ( \
               SELECT chat_id FROM events WHERE state = 'pending' \
               UNION SELECT chat_id FROM turns WHERE ended = 0)",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok((r.get::<_, String>(0)?, matrix_id(r, 1)?, matrix_id(r, 2)?))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (chat, room_id, thread_root) = row?;
            if let Ok(chat_id) = ChatId::new(chat) {
                out.push(ChatRef {
                    chat_id,
                    room_id,
                    thread_root,
                });
            }
        }
        Ok(out)
    }

    /// Stores the prepared context message of a context event (its files are downloaded).
    pub fn set_context_ready(&self, event_id: &str, msg: &ContextMessage) -> Result<()> {
        let json = serde_json::to_string(msg)?;
        self.conn().execute(
            "UPDATE events SET state = 'ready', context_json = ?2 WHERE event_id = ?1",
            params![event_id, json],
        )?;
        Ok(())
    }

    /// Context messages of `chat` waiting for the next trigger, oldest first, with event ids.
    pub fn ready_context(&self, chat: &ChatId) -> Result<Vec<(String, ContextMessage)>> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT event_id, context_json FROM events \
             WHERE chat_id = ?1 AND state = 'ready' ORDER BY ord",
        )?;
        let rows = stmt.query_map([chat.as_str()], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (id, json) = row?;
            out.push((id, serde_json::from_str(&json)?));
        }
        Ok(out)
    }

    /// Marks an event handled (done, failed visibly, or consumed as an answer).
    pub fn mark_handled(&self, event_id: &str) -> Result<()> {
        self.conn().execute(
            "UPDATE events SET state = 'handled' WHERE event_id = ?1",
            [event_id],
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use matrix_sdk::ruma::events::room::message::MessageType;
    use protocol::{Sender, UserMessage};

    use super::*;

    /// A journal row for tests (also of the child modules): from `@alice:hs`, saying "hi".
    pub(super) fn ev(id: &str, chat: &ChatId, d: Disposition) -> NewEvent {
        NewEvent {
            event_id: id.try_into().unwrap(),
            room_id: "!r:hs".try_into().unwrap(),
            chat_id: (d != Disposition::Skip).then(|| chat.clone()),
            thread_root: None,
            sender: "@alice:hs".try_into().unwrap(),
            sender_name: Some("Alice".into()),
            origin_ts: 1000,
            content: Some(Stored::Message(MessageType::text_plain("hi"))),
            disposition: d,
        }
    }

    fn msg(id: &str) -> UserMessage {
        UserMessage {
            seq: 0,
            id: id.into(),
            room_id: "!r:hs".into(),
            thread_root: None,
            sender: Sender {
                user_id: "@alice:hs".into(),
                display_name: None,
            },
            text: "hi".into(),
            attachments: vec![],
            attachment_info: Default::default(),
            context: vec![],
            timestamp_ms: 1000,
            settings: None,
        }
    }

    #[test]
    fn the_undecrypted_sweep_uses_its_index_not_a_scan() {
        let j = Journal::in_memory().unwrap();
        let sql = format!(
            "EXPLAIN QUERY PLAN SELECT {}, recorded_ms, state FROM events \
             WHERE state IN ('waiting', 'late') ORDER BY ord",
            Journal::EVENT_COLS
        );
        let conn = j.conn();
        let mut stmt = conn.prepare(&sql).unwrap();
        let plan: Vec<String> = stmt
            .query_map([], |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert!(
            plan.iter().any(|p| p.contains("events_undecrypted")),
            "{plan:?}"
        );
    }

    /// A journal written by the build before rows had kinds (made by that code at abf267b:
    /// a handled and a skipped row, pending messages, a file, the message-shaped texts edits
    /// and redactions were stored as, and an event waiting for its room key) opens, every row
    /// reads back as what it was, and opening again changes nothing.
    #[test]
    fn a_journal_from_before_kinds_is_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.sqlite");
        let fixture = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/journal-before-kinds.sqlite3"
        );
        std::fs::copy(fixture, &path).unwrap();
        let version = |j: &Journal| -> i64 {
            j.conn()
                .pragma_query_value(None, "user_version", |r| r.get(0))
                .unwrap()
        };
        for round in 0..2 {
            let j = Journal::open(&path).unwrap();
            assert_eq!(version(&j), SCHEMA_VERSION);
            let rows: Vec<(String, Option<String>)> = j
                .conn()
                .prepare("SELECT event_id, kind FROM events ORDER BY ord")
                .unwrap()
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap();
            let kinds: Vec<(&str, Option<&str>)> = rows
                .iter()
                .map(|(e, k)| (e.as_str(), k.as_deref()))
                .collect();
            assert_eq!(
                kinds,
                [
                    ("$done", Some("message")),
                    ("$skip", None),
                    ("$msg", Some("message")),
                    ("$file", Some("message")),
                    ("$redaction", Some("message")),
                    ("$edit", Some("message")),
                    ("$enc", Some("encrypted")),
                ]
            );
            let chat = ChatId::for_conversation("!room:hs", None);
            if round == 0 {
                let next = j.next_pending(&chat).unwrap().unwrap();
                assert_eq!(next.event.event_id, "$msg");
                assert_eq!(
                    next.event.content,
                    Some(Stored::Message(MessageType::text_plain("hello")))
                );
                j.mark_handled("$msg").unwrap();
            }
            let file = j.next_pending(&chat).unwrap().unwrap().event;
            assert!(
                matches!(&file.content, Some(Stored::Message(MessageType::File(f))) if f.body == "a.txt"),
                "{:?}",
                file.content
            );
            let waiting = j.undecrypted().unwrap();
            assert_eq!(waiting.len(), 1);
            assert!(
                matches!(&waiting[0].journaled.event.content, Some(Stored::Encrypted { json })
                    if json.contains(r#""session_id":"s1""#))
            );
            assert_eq!(
                j.edit_target("$done", "@alice:hs").unwrap(),
                EditTarget::Ran("hi".into())
            );
        }
    }

    #[test]
    fn rooms_of_one_sync_are_recorded_together_each_with_its_own_answer() {
        let j = Journal::in_memory().unwrap();
        let in_room = |id: &str, room: &str| {
            let chat = ChatId::for_conversation(room, None);
            NewEvent {
                room_id: room.try_into().unwrap(),
                ..ev(id, &chat, Disposition::Trigger)
            }
        };
        j.record("!a:hs", &[in_room("$a1", "!a:hs")]).unwrap();
        let a = [in_room("$a1", "!a:hs"), in_room("$a2", "!a:hs")];
        let b = [in_room("$b1", "!b:hs")];
        let new = j
            .record_rooms(&[("!a:hs", &a), ("!quiet:hs", &[]), ("!b:hs", &b)])
            .unwrap();
        assert_eq!(new, vec![vec![false, true], vec![], vec![true]]);
        for room in ["!a:hs", "!quiet:hs", "!b:hs"] {
            assert!(j.room_known(room).unwrap(), "{room}");
        }
        let chat_b = ChatId::for_conversation("!b:hs", None);
        assert_eq!(
            j.next_pending(&chat_b).unwrap().unwrap().event.event_id,
            "$b1"
        );
        // One transaction: a batch that fails part-way leaves nothing of itself behind.
        let first = in_room("$c1", "!c:hs");
        j.conn()
            .execute_batch(
                "CREATE TRIGGER refuse BEFORE INSERT ON events WHEN NEW.event_id = '$bad' \
                 BEGIN SELECT RAISE(ABORT, 'refused'); END;",
            )
            .unwrap();
        let refused = NewEvent {
            event_id: "$bad".try_into().unwrap(),
            ..in_room("$x", "!c:hs")
        };
        assert!(
            j.record_rooms(&[("!c:hs", &[first]), ("!d:hs", &[refused])])
                .is_err()
        );
        assert!(!j.contains("$c1").unwrap());
        assert!(!j.room_known("!c:hs").unwrap());
    }

    #[test]
    fn record_pending_in_order_then_handled_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.sqlite");
        let chat = ChatId::for_conversation("!r:hs", None);
        {
            let j = Journal::open(&path).unwrap();
            assert!(!j.room_known("!r:hs").unwrap());
            let new = j
                .record(
                    "!r:hs",
                    &[
                        ev("$1", &chat, Disposition::Context),
                        ev("$2", &chat, Disposition::Skip),
                        ev("$3", &chat, Disposition::Trigger),
                    ],
                )
                .unwrap();
            assert_eq!(new, vec![true, true, true]);
            // Re-recording (a sync after a backfill) changes nothing.
            assert_eq!(
                j.record("!r:hs", &[ev("$3", &chat, Disposition::Trigger)])
                    .unwrap(),
                vec![false]
            );
            assert!(j.room_known("!r:hs").unwrap());
            assert!(j.contains("$2").unwrap());
            assert_eq!(j.pending_count(&chat).unwrap(), 2);
            let first = j.next_pending(&chat).unwrap().unwrap();
            assert_eq!(first.event.event_id, "$1");
            let after = j.next_pending_after(&chat, first.ord).unwrap().unwrap();
            assert_eq!(after.event.event_id, "$3", "skipped events are not pending");
            assert!(j.next_pending_after(&chat, after.ord).unwrap().is_none());
            assert_eq!(first.event.disposition, Disposition::Context);
            let cm = ContextMessage {
                id: "$1".into(),
                sender: Sender {
                    user_id: "@alice:hs".into(),
                    display_name: None,
                },
                text: "hi".into(),
                attachments: vec![],
                timestamp_ms: 1000,
            };
            j.set_context_ready("$1", &cm).unwrap();
            assert_eq!(j.next_pending(&chat).unwrap().unwrap().event.event_id, "$3");
            assert_eq!(j.ready_context(&chat).unwrap(), vec![("$1".to_owned(), cm)]);
            let before = j.backlog().unwrap();
            assert_eq!(before.unhandled, 1, "the trigger (the context is ready)");
            let m = j.create_turn(&chat, msg("$3"), &["$1".into()]).unwrap();
            assert_eq!(m.seq, 1);
            assert!(j.next_pending(&chat).unwrap().is_none());
            assert!(j.ready_context(&chat).unwrap().is_empty());
            let stored = j.backlog().unwrap();
            assert_eq!(
                stored.unhandled, 1,
                "a turn the agent has not accepted still waits"
            );
            assert!(stored.oldest_ms.is_some());
        }
        // Restart: the unfinished turn is still there, with its seq.
        let j = Journal::open(&path).unwrap();
        assert_eq!(
            j.chats_with_work().unwrap(),
            vec![ChatRef {
                chat_id: chat.clone(),
                room_id: "!r:hs".try_into().unwrap(),
                thread_root: None
            }]
        );
        let unended = j.unended_turns(&chat).unwrap();
        assert_eq!(unended.len(), 1);
        assert_eq!(unended[0].seq, 1);
        assert_eq!(j.turns_to_send(&chat, 1).unwrap(), vec![]);
        assert_eq!(j.backlog().unwrap().unhandled, 1, "also after a restart");
        j.mark_acked(&chat, 1).unwrap();
        assert!(j.is_acked(&chat, 1).unwrap());
        assert_eq!(j.backlog().unwrap(), Backlog::default(), "the agent has it");
        assert_eq!(j.turn_outcome("$3").unwrap(), None, "not over");
        j.finish_turn(&chat, 1, "stopped").unwrap();
        assert_eq!(j.turn_outcome("$3").unwrap().as_deref(), Some("stopped"));
        assert!(j.unended_turns(&chat).unwrap().is_empty());
        assert_eq!(j.ended_turns_after(&chat, 0).unwrap(), 1);
        assert!(j.chats_with_work().unwrap().is_empty());
        // The next turn continues the sequence.
        j.record("!r:hs", &[ev("$4", &chat, Disposition::Trigger)])
            .unwrap();
        assert_eq!(j.create_turn(&chat, msg("$4"), &[]).unwrap().seq, 2);
    }

    #[test]
    fn sends_are_recorded_before_and_after() {
        let j = Journal::in_memory().unwrap();
        assert_eq!(
            j.begin_send("t1", "!r:hs", Some("$root"), "reply").unwrap(),
            SendState::Open
        );
        assert!(!j.bot_in_thread("$root").unwrap());
        // A retry before completion still has no event id: send again with the same txn.
        assert_eq!(
            j.begin_send("t1", "!r:hs", Some("$root"), "reply").unwrap(),
            SendState::Open
        );
        j.finish_send("t1", "$posted").unwrap();
        assert_eq!(
            j.begin_send("t1", "!r:hs", Some("$root"), "reply").unwrap(),
            SendState::Posted("$posted".into())
        );
        assert!(j.is_own_post("$posted").unwrap());
        assert!(j.bot_in_thread("$root").unwrap());
        j.set_meta("k", "v").unwrap();
        assert_eq!(j.meta("k").unwrap().as_deref(), Some("v"));
    }

    #[test]
    fn parked_sends_are_not_tried_again_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("j.sqlite");
        {
            let j = Journal::open(&path).unwrap();
            assert_eq!(j.parked_count().unwrap(), 0);
            j.begin_send("t1", "!r:hs", None, "answer").unwrap();
            j.park_send("t1", "HTTP 403 M_FORBIDDEN: no", r#"{"body":"hi"}"#)
                .unwrap();
            assert_eq!(j.parked_count().unwrap(), 1);
        }
        let j = Journal::open(&path).unwrap();
        assert_eq!(
            j.begin_send("t1", "!r:hs", None, "answer").unwrap(),
            SendState::Parked("HTTP 403 M_FORBIDDEN: no".into())
        );
        assert_eq!(j.parked_count().unwrap(), 1);
    }

    #[test]
    fn a_journal_from_before_parking_gains_the_columns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.sqlite");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(
                "CREATE TABLE sends(txn_id TEXT PRIMARY KEY, room_id TEXT NOT NULL, \
                 thread_root TEXT, purpose TEXT NOT NULL, event_id TEXT, created_ms INTEGER NOT NULL);\
                 INSERT INTO sends VALUES('t0', '!r:hs', NULL, 'answer', '$old', 1);",
            )
            .unwrap();
        }
        let j = Journal::open(&path).unwrap();
        assert_eq!(
            j.begin_send("t0", "!r:hs", None, "answer").unwrap(),
            SendState::Posted("$old".into())
        );
        j.begin_send("t2", "!r:hs", None, "answer").unwrap();
        j.park_send("t2", "refused", "{}").unwrap();
        assert_eq!(j.parked_count().unwrap(), 1);
    }
}
