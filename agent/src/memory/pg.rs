//! The memory in PostgreSQL: a row per scope (its next fact number) and a row per fact. A change
//! locks its scope's row, so agents changing one user's memory at once lose nothing, and numbers
//! are never reused, as in the files.

use deadpool_postgres::GenericClient;

use super::{
    Fact, MAX_FACTS, MemoryError, Remembered, Scope, ScopeKind, parse_id, unknown_id, validate_fact,
};
use crate::db::{Database, Imported, describe};

/// The memory tables of a database. Cheap to clone.
#[derive(Debug, Clone)]
pub struct PgMemory {
    db: Database,
}

fn db_error(e: tokio_postgres::Error) -> MemoryError {
    MemoryError::Database(describe(&e))
}

fn kind_name(kind: ScopeKind) -> &'static str {
    match kind {
        ScopeKind::User => "user",
        ScopeKind::Room => "room",
    }
}

fn fact_id(kind: ScopeKind, n: i64) -> String {
    format!("{}{n}", kind.id_prefix())
}

impl PgMemory {
    /// The memory kept in `db`.
    pub fn new(db: Database) -> Self {
        Self { db }
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, MemoryError> {
        self.db
            .get()
            .await
            .map_err(|e| MemoryError::Database(e.to_string()))
    }

    /// The facts of `scope`, oldest first.
    pub async fn facts(&self, scope: &Scope) -> Result<Vec<Fact>, MemoryError> {
        let client = self.client().await?;
        facts_in(&client, scope).await
    }

    /// Remembers `text` in `scope`: the same text is found, not stored twice.
    pub async fn remember(&self, scope: &Scope, text: &str) -> Result<Remembered, MemoryError> {
        let text = validate_fact(text)?;
        let kind = kind_name(scope.kind());
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_error)?;
        crate::db::execute(
            &tx,
            "INSERT INTO memory_scopes (kind, owner, next_n) VALUES ($1, $2, 1) \
             ON CONFLICT DO NOTHING",
            &[&kind, &scope.id()],
        )
        .await
        .map_err(db_error)?;
        let next: i64 = crate::db::query_one(
            &tx,
            "SELECT next_n FROM memory_scopes WHERE kind = $1 AND owner = $2 FOR UPDATE",
            &[&kind, &scope.id()],
        )
        .await
        .map_err(db_error)?
        .get(0);
        let facts = facts_in(&tx, scope).await?;
        if let Some(f) = facts.iter().find(|f| f.text == text) {
            return Ok(Remembered::Already(f.id.clone()));
        }
        if facts.len() >= MAX_FACTS {
            return Err(MemoryError::Full);
        }
        let highest = facts
            .iter()
            .filter_map(|f| parse_id(&f.id).map(|(_, n)| n))
            .max()
            .unwrap_or(0);
        let n = next.max(i64::try_from(highest).unwrap_or(i64::MAX).saturating_add(1));
        let now = i64::try_from(daemon::now_ms()).unwrap_or(i64::MAX);
        crate::db::execute(&tx,
            "INSERT INTO memory_facts (kind, owner, n, text, created_ms) VALUES ($1, $2, $3, $4, $5)",
            &[&kind, &scope.id(), &n, &text, &now],
        )
        .await
        .map_err(db_error)?;
        crate::db::execute(
            &tx,
            "UPDATE memory_scopes SET next_n = $3 WHERE kind = $1 AND owner = $2",
            &[&kind, &scope.id(), &n.saturating_add(1)],
        )
        .await
        .map_err(db_error)?;
        tx.commit().await.map_err(db_error)?;
        Ok(Remembered::New(fact_id(scope.kind(), n)))
    }

    /// Forgets the fact `id` of `scope` (its kind already checked) and returns it.
    pub async fn forget(&self, scope: &Scope, id: &str) -> Result<Fact, MemoryError> {
        let Some((_, n)) = parse_id(id) else {
            return Err(unknown_id(id));
        };
        let n = i64::try_from(n).map_err(|_| unknown_id(id))?;
        let client = self.client().await?;
        let row = crate::db::query_opt(
            &client,
            "DELETE FROM memory_facts WHERE kind = $1 AND owner = $2 AND n = $3 \
                 RETURNING text, created_ms",
            &[&kind_name(scope.kind()), &scope.id(), &n],
        )
        .await
        .map_err(db_error)?
        .ok_or_else(|| unknown_id(id))?;
        Ok(Fact {
            id: id.to_owned(),
            text: row.get(0),
            created_ms: u64::try_from(row.get::<_, i64>(1)).unwrap_or(0),
        })
    }
}

async fn facts_in(client: &impl GenericClient, scope: &Scope) -> Result<Vec<Fact>, MemoryError> {
    let rows = crate::db::query(
        client,
        "SELECT n, text, created_ms FROM memory_facts WHERE kind = $1 AND owner = $2 \
             ORDER BY n",
        &[&kind_name(scope.kind()), &scope.id()],
    )
    .await
    .map_err(db_error)?;
    Ok(rows
        .iter()
        .map(|r| Fact {
            id: fact_id(scope.kind(), r.get(0)),
            text: r.get(1),
            created_ms: u64::try_from(r.get::<_, i64>(2)).unwrap_or(0),
        })
        .collect())
}

impl PgMemory {
    /// Stores a scope as read from the files, in one transaction: a scope the database does
    /// not know is stored whole; one holding the same facts is left as it is; one holding
    /// others is refused (never overwritten).
    pub async fn import(
        &self,
        scope: &Scope,
        next: u64,
        facts: &[Fact],
    ) -> Result<Imported, MemoryError> {
        let kind = kind_name(scope.kind());
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_error)?;
        let inserted = crate::db::execute(
            &tx,
            "INSERT INTO memory_scopes (kind, owner, next_n) VALUES ($1, $2, $3) \
                 ON CONFLICT DO NOTHING",
            &[&kind, &scope.id(), &i64::try_from(next).unwrap_or(i64::MAX)],
        )
        .await
        .map_err(db_error)?;
        if inserted == 0 {
            let held = facts_in(&tx, scope).await?;
            return Ok(if held == facts {
                Imported::Already
            } else {
                Imported::Refused(format!(
                    "the database holds {} fact(s) for this {}, the state directory {}, and \
                     they differ; the database's are kept",
                    held.len(),
                    kind,
                    facts.len()
                ))
            });
        }
        for fact in facts {
            let Some((_, n)) = parse_id(&fact.id) else {
                return Ok(Imported::Refused(format!(
                    "a fact has the malformed id {:?}",
                    fact.id
                )));
            };
            crate::db::execute(&tx,
                "INSERT INTO memory_facts (kind, owner, n, text, created_ms) VALUES ($1, $2, $3, $4, $5)",
                &[
                    &kind,
                    &scope.id(),
                    &i64::try_from(n).unwrap_or(i64::MAX),
                    &fact.text,
                    &i64::try_from(fact.created_ms).unwrap_or(i64::MAX),
                ],
            )
            .await
            .map_err(db_error)?;
        }
        tx.commit().await.map_err(db_error)?;
        Ok(Imported::New)
    }
}
