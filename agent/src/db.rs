//! PostgreSQL, when the agent keeps its state there (`AGENT_DATABASE_URL`): the connection
//! pool, the embedded schema migrations (refinery, `agent/migrations/`), and the refusal to run
//! against a schema newer than this agent knows.
//!
//! Several agents may start at once against one database: migrations run under a session-level
//! advisory lock, so exactly one applies them and the others find them applied. TLS is used
//! when the URL asks for it (`sslmode=require`), or tried first with the default `prefer`;
//! server certificates are checked against the system's roots.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{
    GenericClient, Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime,
};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;
use tracing::info;

use protocol::Secret;

refinery::embed_migrations!("migrations");

/// Key of the advisory lock held while migrations run (any constant; "mxbridge" in ASCII).
const MIGRATION_LOCK: i64 = 0x6d78_6272_6964_6765;

/// The table refinery records applied migrations in.
const HISTORY_TABLE: &str = "agent_schema_history";

/// Longest wait for a connection from the pool (a database that does not answer fails the
/// operation instead of hanging a turn).
const CHECKOUT_TIMEOUT: Duration = Duration::from_secs(10);

/// How often opening the database is tried again at start (see [`Database::open_waiting`]).
pub const RETRY_EVERY: Duration = Duration::from_secs(1);

/// Whether opening the database is tried again after `e`, `waited` into a wait of `wait`: only
/// while no connection could be made (a server starting, a password being set up); a URL that
/// is no URL or a schema newer than this agent will not change by waiting.
pub fn try_again(e: &DbError, waited: Duration, wait: Duration) -> bool {
    matches!(e, DbError::Connect(_)) && waited + RETRY_EVERY <= wait
}

/// Where the durable state lives when it is in PostgreSQL.
#[derive(Debug, Clone)]
pub struct DatabaseConfig {
    /// The connection URL (`AGENT_DATABASE_URL`, or `_FILE`); holds a password. Never printed.
    pub url: Secret,
    /// Most connections one agent opens (`AGENT_DATABASE_POOL`, default 16).
    pub pool_size: usize,
    /// Longest any statement may run before the server cancels it ([`STATEMENT_TIMEOUT`]): a
    /// database that holds a statup (a lock never released, an overloaded server) fails a
    /// turn's step instead of hanging it. Migrations are not bound by it.
    pub statement_timeout: Duration,
    /// How long to keep trying at start while no connection can be made
    /// (`AGENT_DATABASE_WAIT`, default 0: fail at once).
    pub wait: Duration,
}

/// The default [`DatabaseConfig::statement_timeout`].
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(15);

impl DatabaseConfig {
    /// `url` with `pool_size` connections and the default statement timeout.
    pub fn new(url: Secret, pool_size: usize) -> Self {
        Self {
            url,
            pool_size,
            statement_timeout: STATEMENT_TIMEOUT,
            wait: Duration::ZERO,
        }
    }
}

/// Why the database cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// `AGENT_DATABASE_URL` is not a PostgreSQL connection string (never echoed: it may hold a
    /// password).
    #[error("AGENT_DATABASE_URL is not a PostgreSQL connection URL")]
    BadUrl,
    /// No connection could be made or used.
    #[error("PostgreSQL: {0}")]
    Connect(String),
    /// Applying the schema migrations failed.
    #[error("PostgreSQL schema migration failed: {0}")]
    Migrate(String),
    /// The database was migrated by a newer agent.
    #[error(
        "the database schema is at version {found}, newer than this agent knows ({known}); \
         run a newer agent"
    )]
    SchemaNewer {
        /// The version found.
        found: i64,
        /// The newest this agent knows.
        known: i64,
    },
}

/// What importing one chat or memory scope into the database did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Imported {
    /// Stored (it was not in the database).
    New,
    /// The database already held exactly this (an earlier import): nothing changed.
    Already,
    /// The database holds something else for it: nothing changed, and why.
    Refused(String),
}

/// A pool of connections to the agent's database. Cheap to clone.
#[derive(Clone)]
pub struct Database {
    pool: Pool,
    /// Connections whose commits do not wait for the disk (`synchronous_commit = off`), for
    /// writes a crash of the database server may lose without breaking a promise: how a turn
    /// ended (it runs again from its recorded steps, as with the file store, whose `end` lines
    /// are not fsynced) and leases (renewed, and fenced by their token).
    relaxed: Pool,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let status = self.pool.status();
        f.debug_struct("Database")
            .field("size", &status.size)
            .field("max_size", &status.max_size)
            .finish()
    }
}

/// The newest schema version this agent knows.
pub fn known_version() -> i64 {
    migrations::runner()
        .get_migrations()
        .iter()
        .map(|m| i64::from(m.version()))
        .max()
        .unwrap_or(0)
}

impl Database {
    /// Connects, checks the schema version and applies the migrations this agent knows.
    pub async fn open(config: &DatabaseConfig) -> Result<Self, DbError> {
        let db = Self::connect(config)?;
        db.migrate().await?;
        Ok(db)
    }

    /// [`Database::open`], tried again every [`RETRY_EVERY`] while no connection can be made,
    /// until `config.wait` has passed ([`try_again`]); said once in the log while waiting.
    pub async fn open_waiting(config: &DatabaseConfig) -> Result<Self, DbError> {
        let start = tokio::time::Instant::now();
        let mut said = false;
        loop {
            match Self::open(config).await {
                Ok(db) => return Ok(db),
                Err(e) if try_again(&e, start.elapsed(), config.wait) => {
                    if !said {
                        tracing::warn!(error = %e, wait_s = config.wait.as_secs(), "AGENT_DATABASE_URL: PostgreSQL cannot be used yet; waiting for it");
                        said = true;
                    }
                    tokio::time::sleep(RETRY_EVERY).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The pool, without touching the database yet.
    pub fn connect(config: &DatabaseConfig) -> Result<Self, DbError> {
        let mut pg =
            tokio_postgres::Config::from_str(config.url.expose()).map_err(|_| DbError::BadUrl)?;
        // A server gone silent (no answer, no reset) is noticed by TCP within half a minute.
        pg.keepalives(true)
            .keepalives_idle(Duration::from_secs(10))
            .keepalives_interval(Duration::from_secs(5))
            .keepalives_retries(3);
        // Added to the URL's own `options`, if it has any.
        let given = pg.get_options().unwrap_or_default().to_owned();
        let timeout_ms = config.statement_timeout.as_millis();
        pg.options(format!("{given} -c statement_timeout={timeout_ms}").trim());
        let mut relaxed = pg.clone();
        relaxed.options(
            format!("{given} -c statement_timeout={timeout_ms} -c synchronous_commit=off").trim(),
        );
        // A quarter of the connections (at least one) for the relaxed writes.
        let relaxed_size = (config.pool_size / 4).max(1);
        Ok(Self {
            pool: pool(pg, config.pool_size)?,
            relaxed: pool(relaxed, relaxed_size)?,
        })
    }

    /// Sets the pools' gauges ([`crate::metrics::pool_use`]), before a scrape.
    pub fn record_pool_use(&self) {
        crate::metrics::pool_use("durable", self.pool.status());
        crate::metrics::pool_use("relaxed", self.relaxed.status());
    }

    /// A connection whose commits do not wait for the disk (see [`Database`]).
    pub async fn get_relaxed(&self) -> Result<Object, DbError> {
        self.relaxed.get().await.map_err(pool_error)
    }

    /// A connection from the pool.
    pub async fn get(&self) -> Result<Object, DbError> {
        self.pool.get().await.map_err(pool_error)
    }

    /// The schema version applied (0: none).
    pub async fn version(&self) -> Result<i64, DbError> {
        let client = self.get().await?;
        let exists: bool = client
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&HISTORY_TABLE])
            .await
            .map_err(connect_error)?
            .get(0);
        if !exists {
            return Ok(0);
        }
        let row = client
            .query_one(
                &format!("SELECT COALESCE(MAX(version), 0)::bigint FROM {HISTORY_TABLE}"),
                &[],
            )
            .await
            .map_err(connect_error)?;
        Ok(row.get(0))
    }

    /// Applies the migrations this agent knows, under the advisory lock; refuses a schema
    /// newer than them.
    async fn migrate(&self) -> Result<(), DbError> {
        let mut client = self.get().await?;
        // Waiting for another agent's migration, and migrating, may take longer than a turn's
        // statements may; the connection goes back to the pool with its limit restored.
        client
            .batch_execute("SET statement_timeout = 0")
            .await
            .map_err(connect_error)?;
        client
            .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(connect_error)?;
        let result = self.migrate_locked(&mut client).await;
        // Released on the same connection (session-level lock); a lost connection drops it.
        let _ = client
            .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
            .await;
        let _ = client.batch_execute("RESET statement_timeout").await;
        result
    }

    async fn migrate_locked(&self, client: &mut Object) -> Result<(), DbError> {
        let known = known_version();
        let found = self.version().await?;
        if found > known {
            return Err(DbError::SchemaNewer { found, known });
        }
        let client: &mut tokio_postgres::Client = client.as_mut();
        let report = migrations::runner()
            .set_migration_table_name(HISTORY_TABLE)
            .run_async(client)
            .await
            .map_err(|e| DbError::Migrate(e.to_string()))?;
        for m in report.applied_migrations() {
            info!(
                version = m.version(),
                name = m.name(),
                "applied a schema migration"
            );
        }
        Ok(())
    }
}

/// Runs `sql` as a statement prepared once per connection (deadpool's statement cache): one
/// round trip per query instead of two (prepare, then execute).
pub async fn query<C: GenericClient>(
    c: &C,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>, tokio_postgres::Error> {
    let stmt = c.prepare_cached(sql).await?;
    c.query(&stmt, params).await
}

/// [`query`] for exactly one row.
pub async fn query_one<C: GenericClient>(
    c: &C,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Row, tokio_postgres::Error> {
    let stmt = c.prepare_cached(sql).await?;
    c.query_one(&stmt, params).await
}

/// [`query`] for at most one row.
pub async fn query_opt<C: GenericClient>(
    c: &C,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Option<Row>, tokio_postgres::Error> {
    let stmt = c.prepare_cached(sql).await?;
    c.query_opt(&stmt, params).await
}

/// [`query`] for a statement without rows; how many rows it changed.
pub async fn execute<C: GenericClient>(
    c: &C,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<u64, tokio_postgres::Error> {
    let stmt = c.prepare_cached(sql).await?;
    c.execute(&stmt, params).await
}

/// A pool of at most `size` connections configured by `pg`.
fn pool(pg: tokio_postgres::Config, size: usize) -> Result<Pool, DbError> {
    let tls = tokio_postgres_rustls::MakeRustlsConnect::new(tls_config()?);
    let manager = Manager::from_config(
        pg,
        tls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager)
        .max_size(size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(CHECKOUT_TIMEOUT))
        .create_timeout(Some(CHECKOUT_TIMEOUT))
        .build()
        .map_err(|e| DbError::Connect(e.to_string()))
}

/// No connection from the pool, said as the server or the network said it.
fn pool_error(e: deadpool_postgres::PoolError) -> DbError {
    match e {
        deadpool_postgres::PoolError::Backend(e) => connect_error(e),
        deadpool_postgres::PoolError::Timeout(_) => DbError::Connect(format!(
            "no connection within {} s",
            CHECKOUT_TIMEOUT.as_secs()
        )),
        other => DbError::Connect(other.to_string()),
    }
}

/// A database error as a [`DbError`] (its text names the server's complaint, never the URL).
pub fn connect_error(e: tokio_postgres::Error) -> DbError {
    DbError::Connect(describe(&e))
}

/// A one-line description of a database error: the server's own message when there is one.
pub fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        // "error connecting to server" says why only in its cause.
        None => match std::error::Error::source(e) {
            Some(cause) => format!("{e}: {cause}"),
            None => e.to_string(),
        },
    }
}

/// Certificates checked against the system's roots; no client certificate.
fn tls_config() -> Result<rustls::ClientConfig, DbError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| DbError::Connect(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// Creates an empty database named `name` through the server of `admin_url` (a database the
/// caller may connect to, with the right to create databases) and returns its URL. For tests
/// and the benchmark: each gets a database of its own on one server.
pub async fn create_scratch(admin_url: &str, name: &str) -> Result<String, DbError> {
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    {
        return Err(DbError::Connect(format!(
            "not a plain database name: {name:?}"
        )));
    }
    let config = tokio_postgres::Config::from_str(admin_url).map_err(|_| DbError::BadUrl)?;
    let (client, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .map_err(connect_error)?;
    let driver = tokio::spawn(connection);
    let created = client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .map_err(connect_error);
    drop(client);
    let _ = driver.await;
    created?;
    Ok(url_of(admin_url, name))
}

/// `admin_url` with its database replaced by `name` (a `postgres://` URL whose path is the
/// database, or a key=value string).
fn url_of(admin_url: &str, name: &str) -> String {
    if let Some(rest) = admin_url
        .strip_prefix("postgres://")
        .or_else(|| admin_url.strip_prefix("postgresql://"))
    {
        let (authority, query) = match rest.split_once('/') {
            Some((authority, path)) => (authority, path.split_once('?').map(|(_, q)| q)),
            None => (
                rest.split_once('?').map_or(rest, |(a, _)| a),
                rest.split_once('?').map(|(_, q)| q),
            ),
        };
        match query {
            Some(q) => format!("postgres://{authority}/{name}?{q}"),
            None => format!("postgres://{authority}/{name}"),
        }
    } else {
        format!("{admin_url} dbname={name}")
    }
}

/// The settings of a fresh database on the test server named by `MXBRIDGE_TEST_DATABASE_URL`
/// (the test command starts one); `None` when it is not set, after saying so: the PostgreSQL half
/// of the shared suites is then skipped (the test command always sets it).
#[cfg(test)]
pub(crate) async fn test_config() -> Option<DatabaseConfig> {
    let Ok(admin) = std::env::var("MXBRIDGE_TEST_DATABASE_URL") else {
        eprintln!("MXBRIDGE_TEST_DATABASE_URL is not set: skipping the PostgreSQL case");
        return None;
    };
    let name = format!("t_{:016x}", rand::random::<u64>());
    let url = create_scratch(&admin, &name)
        .await
        .expect("create a scratch database");
    Some(DatabaseConfig::new(Secret::new(url), 8))
}

/// A fresh, migrated database on the test server (see [`test_config`]).
#[cfg(test)]
pub(crate) async fn test_database() -> Option<Database> {
    let config = test_config().await?;
    Some(
        Database::open(&config)
            .await
            .expect("open the scratch database"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_connection_that_cannot_be_made_is_waited_for_and_only_so_long() {
        let secs = Duration::from_secs;
        let refused = || DbError::Connect("connection refused".into());
        let cases = [
            (refused(), secs(0), secs(0), false),
            (refused(), secs(0), secs(30), true),
            (refused(), secs(29), secs(30), true),
            (refused(), secs(30), secs(30), false),
            (DbError::BadUrl, secs(0), secs(30), false),
            (DbError::Migrate("x".into()), secs(0), secs(30), false),
            (
                DbError::SchemaNewer { found: 9, known: 6 },
                secs(0),
                secs(30),
                false,
            ),
        ];
        for (e, waited, wait, again) in cases {
            assert_eq!(
                try_again(&e, waited, wait),
                again,
                "{e} {waited:?} {wait:?}"
            );
        }
    }

    #[test]
    fn url_of_names_another_database_on_the_same_server() {
        let cases = [
            (
                "postgres://u:p@h:5/postgres?sslmode=disable",
                "postgres://u:p@h:5/x?sslmode=disable",
            ),
            ("postgresql://u@h/postgres", "postgres://u@h/x"),
            ("postgres://u@h", "postgres://u@h/x"),
            (
                "postgres://u@h?sslmode=require",
                "postgres://u@h/x?sslmode=require",
            ),
            ("host=h user=u", "host=h user=u dbname=x"),
        ];
        for (admin, want) in cases {
            assert_eq!(url_of(admin, "x"), want, "{admin}");
        }
    }

    #[tokio::test]
    async fn migrations_apply_once_and_a_newer_schema_is_refused() {
        let Some(config) = test_config().await else {
            return;
        };
        // Three agents starting at once: one applies the migrations, the others find them.
        let opened = futures_util::future::join_all((0..3).map(|_| Database::open(&config))).await;
        assert!(opened.iter().all(Result::is_ok));
        let db = Database::open(&config).await.unwrap();
        assert_eq!(db.version().await.unwrap(), known_version());
        let newer = i32::try_from(known_version() + 1).unwrap();
        db.get()
            .await
            .unwrap()
            .execute(
                &format!(
                    "INSERT INTO {HISTORY_TABLE} (version, name, applied_on, checksum) \
                     VALUES ($1, 'from_the_future', '', '0')"
                ),
                &[&newer],
            )
            .await
            .unwrap();
        let refused = Database::open(&config).await.unwrap_err();
        assert!(
            matches!(refused, DbError::SchemaNewer { found, known } if found == known + 1),
            "{refused}"
        );
        assert!(!refused.to_string().contains(config.url.expose()));
    }

    #[tokio::test]
    async fn a_bad_url_is_refused_without_echoing_it() {
        let config =
            DatabaseConfig::new(Secret::new("postgres://user:hunter2@host:notaport/db"), 1);
        let e = Database::connect(&config).unwrap_err();
        assert!(!e.to_string().contains("hunter2"), "{e}");
    }
}
