//! Admissions of many chats written together (group commit). Every chat's admission in this
//! agent goes to one writer, which sends all those waiting at that moment to PostgreSQL as one
//! call of `admit_turns` (migration V6): one statement, one transaction, one wait for the disk,
//! instead of one of each per message. An admission alone is one call of `admit_turn`, as
//! before; a few batches may be in flight at once ([`IN_FLIGHT`]), so one slow batch does not
//! hold every chat.
//!
//! Nothing changes for the caller: its answer comes once its batch committed. A batch the
//! server refuses (one admission's fault, a lock timeout) is tried again one admission at a
//! time, so an admission fails only for a reason of its own ([`after_failure`]).

use std::sync::{Arc, OnceLock};

use tokio::sync::{Semaphore, mpsc, oneshot};
use tracing::debug;

use super::StoreError;
use super::admission::{MAX_SEQ, MAX_SEQ_AHEAD};
use super::pg::big;
use super::pgjson::PgJson;
use crate::db::{Database, describe};

/// Most admissions sent in one call.
const MAX_BATCH: usize = 64;

/// Most batches being written at once.
const IN_FLIGHT: usize = 2;

/// Admissions waiting for the writer before senders wait too.
const QUEUE: usize = 1024;

/// One message to admit in a chat, as `admit_turn` takes it.
#[derive(Debug)]
pub(super) struct Admit {
    pub chat: String,
    pub id: String,
    pub seq: u64,
    pub attachments: i64,
    /// The turn as admitted, encoded.
    pub turn: PgJson,
    pub room: String,
    pub thread: Option<String>,
}

/// What the database answered for one admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Answer {
    /// The id was stored already.
    pub stored: bool,
    /// The chat's last `seq` before this admission.
    pub last_seq: i64,
    /// The turn was stored now.
    pub inserted: bool,
}

type Reply = oneshot::Sender<Result<Answer, StoreError>>;

/// The admissions of one agent's chats. Cheap to clone; the writer starts with the first
/// admission and stops when the last clone is dropped.
#[derive(Debug, Clone)]
pub(super) struct Admitter {
    db: Database,
    writer: Arc<OnceLock<mpsc::Sender<(Admit, Reply)>>>,
}

impl Admitter {
    pub fn new(db: Database) -> Self {
        Self {
            db,
            writer: Arc::default(),
        }
    }

    /// Admits `admit` with whatever else is waiting; its answer once that is committed.
    pub async fn admit(&self, admit: Admit) -> Result<Answer, StoreError> {
        let writer = self.writer.get_or_init(|| {
            let (tx, rx) = mpsc::channel(QUEUE);
            tokio::spawn(write_all(self.db.clone(), rx));
            tx
        });
        let (reply, answer) = oneshot::channel();
        let stopped = || StoreError::Database("the admission writer stopped".into());
        writer.send((admit, reply)).await.map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

/// Takes the admissions waiting, a batch at a time, until every sender is gone.
async fn write_all(db: Database, mut rx: mpsc::Receiver<(Admit, Reply)>) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    while let Some(first) = rx.recv().await {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break;
        };
        // Whatever arrived while the slot was awaited joins this batch.
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let db = db.clone();
        tokio::spawn(async move {
            write(&db, batch).await;
            drop(slot);
        });
    }
}

/// What to do when writing a batch failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Then {
    /// Every admission of the batch fails with the batch's error.
    FailAll,
    /// Each admission is tried again on its own.
    OneByOne,
}

/// Decides after a failed batch of `len` admissions; `server_refused`: the server answered with
/// an error (a statement's fault, a lock or statement timeout), as opposed to no connection.
/// Alone, or without a server to ask, trying again would only fail again.
fn after_failure(len: usize, server_refused: bool) -> Then {
    if len > 1 && server_refused {
        Then::OneByOne
    } else {
        Then::FailAll
    }
}

/// A failed write: its description and whether the server answered it.
struct Failure {
    text: String,
    server_refused: bool,
}

impl From<tokio_postgres::Error> for Failure {
    fn from(e: tokio_postgres::Error) -> Self {
        Self {
            server_refused: e.as_db_error().is_some(),
            text: describe(&e),
        }
    }
}

impl From<crate::db::DbError> for Failure {
    fn from(e: crate::db::DbError) -> Self {
        Self {
            text: e.to_string(),
            server_refused: false,
        }
    }
}

/// Writes `batch` and answers each admission of it.
async fn write(db: &Database, batch: Vec<(Admit, Reply)>) {
    let written = if let [(admit, _)] = batch.as_slice() {
        one(db, admit).await.map(|a| vec![a])
    } else {
        many(db, &batch).await
    };
    let failure = match written {
        Ok(answers) => {
            debug!(admissions = batch.len(), "admitted in one commit");
            for ((_, reply), answer) in batch.into_iter().zip(answers) {
                let _ = reply.send(Ok(answer));
            }
            return;
        }
        Err(failure) => failure,
    };
    match after_failure(batch.len(), failure.server_refused) {
        Then::FailAll => {
            for (_, reply) in batch {
                let _ = reply.send(Err(StoreError::Database(failure.text.clone())));
            }
        }
        Then::OneByOne => {
            debug!(admissions = batch.len(), error = %failure.text, "a batch of admissions failed; admitting them one by one");
            for (admit, reply) in batch {
                let db = db.clone();
                tokio::spawn(async move {
                    let answer = one(&db, &admit)
                        .await
                        .map_err(|f| StoreError::Database(f.text));
                    let _ = reply.send(answer);
                });
            }
        }
    }
}

/// One admission, one call of `admit_turn` (migration V5).
async fn one(db: &Database, a: &Admit) -> Result<Answer, Failure> {
    let client = db.get().await?;
    let row = crate::db::query_one(
        &client,
        "SELECT was_stored, prior_last_seq, inserted \
         FROM admit_turn($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        &[
            &a.chat,
            &a.id,
            &big(a.seq),
            &big(MAX_SEQ),
            &big(MAX_SEQ_AHEAD),
            &a.attachments,
            &a.turn,
            &a.room,
            &a.thread,
        ],
    )
    .await?;
    Ok(Answer {
        stored: row.try_get(0)?,
        last_seq: row.try_get(1)?,
        inserted: row.try_get(2)?,
    })
}

/// The admissions of `batch` in one call of `admit_turns` (migration V6), in the batch's order.
async fn many(db: &Database, batch: &[(Admit, Reply)]) -> Result<Vec<Answer>, Failure> {
    let admits = || batch.iter().map(|(a, _)| a);
    let chats: Vec<&str> = admits().map(|a| a.chat.as_str()).collect();
    let ids: Vec<&str> = admits().map(|a| a.id.as_str()).collect();
    let seqs: Vec<i64> = admits().map(|a| big(a.seq)).collect();
    let attachments: Vec<i64> = admits().map(|a| a.attachments).collect();
    let turns: Vec<&PgJson> = admits().map(|a| &a.turn).collect();
    let rooms: Vec<&str> = admits().map(|a| a.room.as_str()).collect();
    let threads: Vec<Option<&str>> = admits().map(|a| a.thread.as_deref()).collect();
    let client = db.get().await?;
    let rows = crate::db::query(
        &client,
        "SELECT k, was_stored, prior_last_seq, inserted \
         FROM admit_turns($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        &[
            &chats,
            &ids,
            &seqs,
            &big(MAX_SEQ),
            &big(MAX_SEQ_AHEAD),
            &attachments,
            &turns,
            &rooms,
            &threads,
        ],
    )
    .await?;
    let mut answers: Vec<Option<Answer>> = vec![None; batch.len()];
    for row in rows {
        let k: i64 = row.try_get(0)?;
        let answer = Answer {
            stored: row.try_get(1)?,
            last_seq: row.try_get(2)?,
            inserted: row.try_get(3)?,
        };
        if let Some(slot) = usize::try_from(k - 1).ok().and_then(|i| answers.get_mut(i)) {
            *slot = Some(answer);
        }
    }
    let answered = answers.iter().flatten().count();
    answers.into_iter().collect::<Option<Vec<_>>>().ok_or(Failure {
        text: format!(
            "admit_turns answered {answered} of {} admissions: a schema this agent does not match",
            batch.len()
        ),
        server_refused: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::test_database;
    use crate::store::TurnRecord;
    use crate::store::suite::message;

    fn admit(chat: &str, seq: u64, id: &str) -> Admit {
        let msg = message(seq, id);
        Admit {
            chat: chat.into(),
            id: id.into(),
            seq,
            attachments: 1,
            turn: PgJson::new(&TurnRecord::from_message(&msg)).unwrap(),
            room: msg.room_id,
            thread: None,
        }
    }

    /// Writes `admits` as one batch; each one's answer, in order.
    async fn batch(db: &Database, admits: Vec<Admit>) -> Vec<Result<Answer, StoreError>> {
        let (batch, answers): (Vec<_>, Vec<_>) = admits
            .into_iter()
            .map(|a| {
                let (tx, rx) = oneshot::channel();
                ((a, tx), rx)
            })
            .unzip();
        write(db, batch).await;
        let mut out = vec![];
        for answer in answers {
            out.push(answer.await.expect("answered"));
        }
        out
    }

    fn answer(stored: bool, last_seq: i64, inserted: bool) -> Answer {
        Answer {
            stored,
            last_seq,
            inserted,
        }
    }

    /// One call admits several chats' messages with `admit_turn`'s answers each, in the batch's
    /// order within a chat (a duplicate sees the admission before it), whatever the chats' order.
    #[tokio::test]
    async fn a_batch_answers_each_admission_as_alone() {
        let Some(db) = test_database().await else {
            return;
        };
        let answers = batch(
            &db,
            vec![
                admit("zz", 1, "$z1"),
                admit("aa", 1, "$a1"),
                admit("zz", 2, "$z2"),
                admit("aa", 1, "$a1"),
                admit("zz", 0, "$z0"),
                admit("mm", MAX_SEQ_AHEAD + 1, "$far"),
            ],
        )
        .await;
        let answers: Vec<Answer> = answers.into_iter().map(Result::unwrap).collect();
        assert_eq!(
            answers,
            [
                answer(false, 0, true),
                answer(false, 0, true),
                answer(false, 1, true),
                answer(true, 1, false),
                answer(false, 2, false),
                answer(false, 0, false),
            ]
        );
        // The next batch finds them stored.
        let again = batch(&db, vec![admit("zz", 2, "$z2"), admit("aa", 2, "$a2")]).await;
        let again: Vec<Answer> = again.into_iter().map(Result::unwrap).collect();
        assert_eq!(again, [answer(true, 2, false), answer(false, 1, true)]);
    }

    /// An admission the server refuses fails alone; the rest of its batch is admitted.
    #[tokio::test]
    async fn one_refused_admission_fails_alone() {
        let Some(db) = test_database().await else {
            return;
        };
        // A text column cannot hold a NUL: the server refuses the whole statement.
        let answers = batch(
            &db,
            vec![
                admit("c1", 1, "$1"),
                admit("c2", 1, "$bad\0"),
                admit("c3", 1, "$3"),
            ],
        )
        .await;
        assert_eq!(answers[0].as_ref().unwrap(), &answer(false, 0, true));
        assert!(answers[1].is_err(), "{:?}", answers[1]);
        assert_eq!(answers[2].as_ref().unwrap(), &answer(false, 0, true));
    }

    #[test]
    fn a_failed_batch_is_tried_one_by_one_only_when_the_server_refused_it() {
        let cases = [
            (1, true, Then::FailAll),
            (1, false, Then::FailAll),
            (2, true, Then::OneByOne),
            (2, false, Then::FailAll),
            (MAX_BATCH, true, Then::OneByOne),
        ];
        for (len, refused, then) in cases {
            assert_eq!(after_failure(len, refused), then, "{len} {refused}");
        }
    }
}
