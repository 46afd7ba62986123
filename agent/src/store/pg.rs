//! Chats' records in PostgreSQL (`AGENT_DATABASE_URL`), shared by every agent of a deployment:
//! whichever agent serves a chat next finds all of it. The only thing held in the process is the
//! last few ended turns while this agent runs the chat's turns one after the other
//! ([`super::recent`]: ended turns never change, so they are never stale).
//!
//! A turn is a row of `turns` (the message as admitted in `record`, how it ended in `ended`);
//! admission is a call of `admit_turn` (migrations V3, V5), which locks the chat's row for the
//! look-up and the insert, so two agents given the same message at once store it once.

use std::collections::BTreeMap;

use deadpool_postgres::GenericClient;
use protocol::{ChatId, UserMessage, WorkspacePath};
use tokio_postgres::Row;
use tokio_postgres::types::Json;

use super::admission::{Admission, MAX_SEQ, MAX_SEQ_AHEAD, decide, warn_out_of_line};
use super::pgjson::PgJson;
use super::recent::Recent;
use super::record::{Begun, ChatRecord};
use super::{History, Perceived, RECENT_TURNS, Step, StoreError, TurnEnd, TurnRecord, TurnStatus};
use crate::db::{Database, DbError, Imported, describe};

/// The chats of a database. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PgChats {
    db: Database,
}

impl PgChats {
    /// The chats kept in `db`.
    pub fn new(db: Database) -> Self {
        Self { db }
    }

    /// The record of chat `id` (rows are read when asked for).
    pub fn chat(&self, id: &ChatId) -> PgChat {
        PgChat {
            db: self.db.clone(),
            chat_id: id.to_string(),
            recent: Recent::default(),
        }
    }
}

/// One chat's record in the database.
#[derive(Debug)]
pub struct PgChat {
    db: Database,
    chat_id: String,
    /// The last ended turns while this agent runs the chat's turns.
    recent: Recent,
}

/// Turns as read with how they ended (`record`, `ended`).
type TurnsWithEnds = Vec<(TurnRecord, Option<TurnEnd>)>;

/// The status as stored in `turns.status`.
pub(super) fn status_name(status: TurnStatus) -> &'static str {
    match status {
        TurnStatus::Pending => "pending",
        TurnStatus::Completed => "completed",
        TurnStatus::Failed => "failed",
        TurnStatus::Cancelled => "cancelled",
    }
}

/// A `u64` counter as a PostgreSQL `bigint` (values past `i64::MAX` are refused at admission).
pub(super) fn big(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn db_error(e: tokio_postgres::Error) -> StoreError {
    StoreError::Database(describe(&e))
}

impl From<DbError> for StoreError {
    fn from(e: DbError) -> Self {
        StoreError::Database(e.to_string())
    }
}

/// The turn of a row holding `record` and `ended`, with how it ended applied.
fn turn_of(row: &Row, chat: &str) -> Result<TurnRecord, StoreError> {
    let bad = |e: tokio_postgres::Error| {
        StoreError::Database(format!("unreadable turn of chat {chat}: {}", describe(&e)))
    };
    let Json(mut turn): Json<TurnRecord> = row.try_get("record").map_err(bad)?;
    let ended: Option<Json<TurnEnd>> = row.try_get("ended").map_err(bad)?;
    if let Some(Json(end)) = ended {
        turn.apply(end);
    }
    Ok(turn)
}

impl PgChat {
    /// Makes sure the chat has its row (turns and approvals refer to it).
    async fn ensure_row(&self, client: &impl GenericClient) -> Result<(), StoreError> {
        crate::db::execute(
            client,
            "INSERT INTO chats (chat_id) VALUES ($1) ON CONFLICT DO NOTHING",
            &[&self.chat_id],
        )
        .await
        .map_err(db_error)?;
        Ok(())
    }

    /// Writes `end` over the turn's last end in one statement, keeping what was perceived when
    /// `end` says nothing of it, and drops the turn's steps once it is over; nothing happens for
    /// an unknown id. `durable`: the commit waits for the disk (what was perceived); otherwise
    /// not (how a turn ended: lost in a crash of the database server, the turn runs again from
    /// its recorded steps, as with the file store). Whether what was stored differs from `end`
    /// ([`PgJson::scrubbed`]).
    async fn end(&self, end: &TurnEnd, durable: bool) -> Result<bool, StoreError> {
        let stored = PgJson::new(end)?;
        let client = if durable {
            self.db.get().await?
        } else {
            self.db.get_relaxed().await?
        };
        let keep_perceived = end.perceived.is_empty();
        crate::db::execute(
            &client,
            "WITH gone AS (DELETE FROM turn_steps WHERE chat_id = $1 AND turn_id = $2 \
             AND $3 <> 'pending') \
             UPDATE turns SET status = $3, ended = CASE WHEN $5 THEN $4::jsonb || \
             jsonb_build_object('perceived', COALESCE(ended -> 'perceived', '{}'::jsonb)) \
             ELSE $4::jsonb END WHERE chat_id = $1 AND id = $2",
            &[
                &self.chat_id,
                &end.id,
                &status_name(end.status),
                &stored,
                &keep_perceived,
            ],
        )
        .await
        .map_err(db_error)?;
        Ok(stored.scrubbed())
    }
}

impl ChatRecord for PgChat {
    async fn admit(&mut self, msg: &UserMessage) -> Result<Admission, StoreError> {
        let record = TurnRecord::from_message(msg);
        let attachments = record.all_attachments().count();
        let turn = PgJson::new(&record)?;
        let client = self.db.get().await?;
        // One round trip (migrations V3, V5): the function locks the chat's row, looks the id
        // up and stores the turn when `decide` would say "new", with `decide`'s bounds.
        let row = crate::db::query_one(
            &client,
            "SELECT was_stored, prior_last_seq, inserted \
             FROM admit_turn($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            &[
                &self.chat_id,
                &msg.id,
                &big(msg.seq),
                &big(MAX_SEQ),
                &big(MAX_SEQ_AHEAD),
                &big(attachments as u64),
                &turn,
                &msg.room_id,
                &msg.thread_root,
            ],
        )
        .await
        .map_err(db_error)?;
        let (stored, last_seq, inserted): (bool, i64, bool) = (row.get(0), row.get(1), row.get(2));
        let last_seq = u64::try_from(last_seq).unwrap_or(0);
        let admission = decide(stored, msg.seq, last_seq);
        if inserted != (admission == Admission::New) {
            // The function and `decide` disagree: a schema that does not match this agent.
            return Err(StoreError::Database(format!(
                "admission of {} in chat {}: the database {} the turn, the agent decided {admission:?}",
                msg.id,
                self.chat_id,
                if inserted { "stored" } else { "did not store" }
            )));
        }
        if admission == Admission::New {
            warn_out_of_line(msg.seq, last_seq);
        }
        Ok(admission)
    }

    async fn last_seq(&mut self) -> Result<u64, StoreError> {
        let client = self.db.get().await?;
        let row = crate::db::query_opt(
            &client,
            "SELECT last_seq FROM chats WHERE chat_id = $1",
            &[&self.chat_id],
        )
        .await
        .map_err(db_error)?;
        Ok(row.map_or(0, |r| u64::try_from(r.get::<_, i64>(0)).unwrap_or(0)))
    }

    async fn pending(&mut self) -> Result<Vec<String>, StoreError> {
        let client = self.db.get().await?;
        let rows = crate::db::query(
            &client,
            "SELECT id FROM turns WHERE chat_id = $1 AND status = 'pending' ORDER BY n",
            &[&self.chat_id],
        )
        .await
        .map_err(db_error)?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    async fn begin(&mut self, id: &str) -> Result<Option<Begun>, StoreError> {
        let client = self.db.get().await?;
        // The turn, its room, the turns before it and its recorded steps, in one round trip:
        // `n - 1` turns came before, with `attachments_before` attachments; the last few in full,
        // unless they are held here already (the turn follows turn `$4`, the last one held).
        let Some(row) = crate::db::query_opt(
            &client,
            "SELECT t.n, t.attachments_before, t.record, t.ended, c.room_id, \
             CASE WHEN t.n - 1 = $4 THEN NULL ELSE \
             (SELECT COALESCE(jsonb_agg(jsonb_build_array(r.record, r.ended) ORDER BY r.n), \
             '[]'::jsonb) FROM (SELECT n, record, ended FROM turns \
             WHERE chat_id = $1 AND n < t.n ORDER BY n DESC LIMIT $3) r) END AS recent, \
             (SELECT COALESCE(jsonb_agg(s.step ORDER BY s.n), '[]'::jsonb) FROM turn_steps s \
             WHERE s.chat_id = $1 AND s.turn_id = $2) AS steps \
             FROM turns t JOIN chats c ON c.chat_id = t.chat_id \
             WHERE t.chat_id = $1 AND t.id = $2 AND t.status = 'pending'",
            &[
                &self.chat_id,
                &id,
                &big(RECENT_TURNS as u64),
                &self.recent.last(),
            ],
        )
        .await
        .map_err(db_error)?
        else {
            return Ok(None);
        };
        let n: i64 = row.get("n");
        let before: i64 = row.get("attachments_before");
        let room_id: Option<String> = row.get("room_id");
        let turn = turn_of(&row, &self.chat_id)?;
        let unreadable = |e: tokio_postgres::Error| {
            StoreError::Database(format!(
                "unreadable history of chat {}: {}",
                self.chat_id,
                describe(&e)
            ))
        };
        let read: Option<Json<TurnsWithEnds>> = row.try_get("recent").map_err(unreadable)?;
        let recent = match read {
            Some(Json(pairs)) => {
                let recent: Vec<TurnRecord> = pairs
                    .into_iter()
                    .map(|(mut turn, end)| {
                        if let Some(end) = end {
                            turn.apply(end);
                        }
                        turn
                    })
                    .collect();
                self.recent.begin(n, &turn, Some(&recent));
                recent
            }
            None => {
                let Some(held) = self.recent.before(n) else {
                    return Err(StoreError::Database(format!(
                        "the history of chat {} before turn {n} was neither read nor held",
                        self.chat_id
                    )));
                };
                self.recent.begin(n, &turn, None);
                held
            }
        };
        let Json(steps): Json<Vec<Step>> = row.try_get("steps").map_err(|e| {
            StoreError::Database(format!(
                "unreadable steps of turn {id} in chat {}: {}",
                self.chat_id,
                describe(&e)
            ))
        })?;
        let history = History {
            earlier: usize::try_from(n - 1).unwrap_or(0),
            attachments: usize::try_from(before).unwrap_or(0),
            recent,
        };
        Ok(Some(Begun {
            turn,
            history,
            room_id,
            steps,
        }))
    }

    async fn turn(&mut self, id: &str) -> Result<Option<TurnRecord>, StoreError> {
        let client = self.db.get().await?;
        let row = crate::db::query_opt(
            &client,
            "SELECT record, ended FROM turns WHERE chat_id = $1 AND id = $2",
            &[&self.chat_id, &id],
        )
        .await
        .map_err(db_error)?;
        row.map(|r| turn_of(&r, &self.chat_id)).transpose()
    }

    async fn finish(&mut self, end: TurnEnd) -> Result<(), StoreError> {
        match self.end(&end, false).await {
            Ok(false) => {
                self.recent.ended(&end);
                Ok(())
            }
            Ok(true) => {
                // Stored otherwise than given: read again from the database.
                self.recent.clear();
                Ok(())
            }
            Err(e) => {
                // It may have been stored or not: what is held is doubtful.
                self.recent.clear();
                Err(e)
            }
        }
    }

    async fn perceive(
        &mut self,
        id: &str,
        perceived: BTreeMap<WorkspacePath, Perceived>,
    ) -> Result<(), StoreError> {
        let Some(current) = ChatRecord::turn(self, id).await? else {
            return Ok(());
        };
        let end = TurnEnd::perceived(current, perceived);
        if self.end(&end, true).await? {
            self.recent.clear();
        } else {
            self.recent.perceived(id, &end.perceived);
        }
        Ok(())
    }

    async fn is_always_allowed(
        &mut self,
        user: &str,
        key: &(String, String),
    ) -> Result<bool, StoreError> {
        if holds_nul(user, key) {
            // Never stored (below), so never allowed: asked again.
            return Ok(false);
        }
        let client = self.db.get().await?;
        let row = crate::db::query_opt(
            &client,
            "SELECT 1 FROM approvals WHERE chat_id = $1 AND user_id IN ($2, '') \
                 AND tool = $3 AND resource = $4 LIMIT 1",
            &[&self.chat_id, &user, &key.0, &key.1],
        )
        .await
        .map_err(db_error)?;
        Ok(row.is_some())
    }

    async fn allow_always(&mut self, user: &str, key: (String, String)) -> Result<(), StoreError> {
        if holds_nul(user, &key) {
            return Err(StoreError::Database(format!(
                "an approval of {} whose resource holds U+0000 cannot be remembered (the \
                 database's text refuses it, and replacing it would make two resources one \
                 approval); it is asked for again",
                key.0.escape_debug()
            )));
        }
        let client = self.db.get().await?;
        self.ensure_row(&client).await?;
        crate::db::execute(
            &client,
            "INSERT INTO approvals (chat_id, user_id, tool, resource) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
            &[&self.chat_id, &user, &key.0, &key.1],
        )
        .await
        .map_err(db_error)?;
        Ok(())
    }

    async fn steps(&mut self, id: &str) -> Result<Vec<Step>, StoreError> {
        let client = self.db.get().await?;
        let rows = crate::db::query(
            &client,
            "SELECT s.step FROM turn_steps s JOIN turns t \
                 ON t.chat_id = s.chat_id AND t.id = s.turn_id \
                 WHERE s.chat_id = $1 AND s.turn_id = $2 AND t.status = 'pending' ORDER BY s.n",
            &[&self.chat_id, &id],
        )
        .await
        .map_err(db_error)?;
        rows.iter()
            .map(|r| {
                r.try_get::<_, Json<Step>>(0).map(|Json(s)| s).map_err(|e| {
                    StoreError::Database(format!(
                        "unreadable step of turn {id} in chat {}: {}",
                        self.chat_id,
                        describe(&e)
                    ))
                })
            })
            .collect()
    }

    async fn record_step(&mut self, id: &str, n: u32, step: &Step) -> Result<(), StoreError> {
        let client = self.db.get().await?;
        crate::db::execute(
            &client,
            "INSERT INTO turn_steps (chat_id, turn_id, n, step) \
                 SELECT $1, $2, $3, $4 WHERE EXISTS (SELECT 1 FROM turns \
                 WHERE chat_id = $1 AND id = $2 AND status = 'pending') \
                 ON CONFLICT DO NOTHING",
            &[
                &self.chat_id,
                &id,
                &i32::try_from(n).unwrap_or(i32::MAX),
                &PgJson::new(step)?,
            ],
        )
        .await
        .map_err(db_error)?;
        Ok(())
    }

    fn idle(&mut self) {
        self.recent.clear();
    }
}

/// Whether an approval's user, tool or resource holds U+0000, which PostgreSQL's `text` refuses
/// (a model's tool arguments can hold it; paths are refused before this).
fn holds_nul(user: &str, (tool, resource): &(String, String)) -> bool {
    [user, tool, resource].iter().any(|s| s.contains('\0'))
}

impl PgChats {
    /// Stores chat `id` as exported from a file log, in one transaction: a chat the database
    /// does not know is stored whole; one it holds with the same turns is left as it is; one it
    /// holds differently is refused (newer data there is never overwritten).
    pub async fn import(
        &self,
        id: &ChatId,
        chat: &super::Exported,
    ) -> Result<Imported, StoreError> {
        let chat_id = id.to_string();
        let mut client = self.db.get().await?;
        let tx = client.transaction().await.map_err(db_error)?;
        crate::db::execute(
            &tx,
            "INSERT INTO chats (chat_id) VALUES ($1) ON CONFLICT DO NOTHING",
            &[&chat_id],
        )
        .await
        .map_err(db_error)?;
        crate::db::execute(
            &tx,
            "SELECT 1 FROM chats WHERE chat_id = $1 FOR UPDATE",
            &[&chat_id],
        )
        .await
        .map_err(db_error)?;
        let held: Vec<String> = crate::db::query(
            &tx,
            "SELECT id FROM turns WHERE chat_id = $1 ORDER BY n",
            &[&chat_id],
        )
        .await
        .map_err(db_error)?
        .iter()
        .map(|r| r.get(0))
        .collect();
        let ours: Vec<&str> = chat.turns.iter().map(|t| t.id.as_str()).collect();
        if !held.is_empty() {
            return Ok(if held == ours {
                Imported::Already
            } else {
                Imported::Refused(format!(
                    "the database holds {} turn(s) of this chat, the state directory {}, and \
                     they differ; the database's are kept",
                    held.len(),
                    ours.len()
                ))
            });
        }
        let before = insert_turns(&tx, &chat_id, &chat.turns).await?;
        crate::db::execute(
            &tx,
            "UPDATE chats SET room_id = $2, thread_root = $3, last_seq = $4, turns = $5, \
             attachments = $6 WHERE chat_id = $1",
            &[
                &chat_id,
                &chat.room_id,
                &chat.thread_root,
                &big(chat.last_seq),
                &big(chat.turns.len() as u64),
                &before,
            ],
        )
        .await
        .map_err(db_error)?;
        insert_approvals(&tx, &chat_id, &chat.allowed).await?;
        tx.commit().await.map_err(db_error)?;
        Ok(Imported::New)
    }
}

/// Inserts `turns` as the chat's turns 1, 2, …; the attachments they have in all.
async fn insert_turns(
    tx: &deadpool_postgres::Transaction<'_>,
    chat_id: &str,
    turns: &[TurnRecord],
) -> Result<i64, StoreError> {
    let mut before: i64 = 0;
    for (n, turn) in (1_i64..).zip(turns) {
        let ended = (turn.status != TurnStatus::Pending || !turn.perceived.is_empty())
            .then(|| {
                PgJson::new(&TurnEnd {
                    id: turn.id.clone(),
                    status: turn.status,
                    output: turn.output.clone(),
                    sent_files: turn.sent_files.clone(),
                    error: turn.error.clone(),
                    perceived: turn.perceived.clone(),
                })
            })
            .transpose()?;
        let attachments = i32::try_from(turn.all_attachments().count()).unwrap_or(i32::MAX);
        crate::db::execute(
            tx,
            "INSERT INTO turns (chat_id, n, id, seq, status, attachments, \
                 attachments_before, record, ended) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            &[
                &chat_id,
                &n,
                &turn.id,
                &big(turn.seq),
                &status_name(turn.status),
                &attachments,
                &before,
                &PgJson::new(turn)?,
                &ended,
            ],
        )
        .await
        .map_err(db_error)?;
        before += i64::from(attachments);
    }
    Ok(before)
}

/// Inserts the approvals for good of an imported chat (those it has already are kept).
async fn insert_approvals(
    tx: &deadpool_postgres::Transaction<'_>,
    chat_id: &str,
    allowed: &[(Option<String>, String, String)],
) -> Result<(), StoreError> {
    for (user, tool, resource) in allowed {
        crate::db::execute(
            tx,
            "INSERT INTO approvals (chat_id, user_id, tool, resource) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT DO NOTHING",
            &[&chat_id, &user.as_deref().unwrap_or(""), tool, resource],
        )
        .await
        .map_err(db_error)?;
    }
    Ok(())
}
