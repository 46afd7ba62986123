//! The test command's PostgreSQL (`scripts/postgres.sh`, which sets `MXBRIDGE_TEST_DATABASE_URL`
//! and `MXBRIDGE_PG_DIR`): a database of a test's own in it, and a restart of the server.

use std::path::Path;

use anyhow::{Context, Result, bail};

/// A new empty database on the test server and its URL; `None` when the test command did not
/// start one (said on stderr).
pub async fn scratch_database(prefix: &str) -> Result<Option<String>> {
    let Ok(admin) = std::env::var("MXBRIDGE_TEST_DATABASE_URL") else {
        eprintln!("MXBRIDGE_TEST_DATABASE_URL is not set: skipping a PostgreSQL test");
        return Ok(None);
    };
    let name = format!("{prefix}_{:016x}", rand::random::<u64>());
    let (client, connection) = tokio_postgres::connect(&admin, tokio_postgres::NoTls)
        .await
        .context("connect to the test PostgreSQL")?;
    let driver = tokio::spawn(connection);
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .context("create a database")?;
    drop(client);
    let _ = driver.await;
    // `postgres://user:password@host:port/postgres?sslmode=disable` → the new database.
    let Some((server, rest)) = admin.rsplit_once('/') else {
        bail!("MXBRIDGE_TEST_DATABASE_URL is not a postgres:// URL");
    };
    let query = rest
        .split_once('?')
        .map(|(_, q)| format!("?{q}"))
        .unwrap_or_default();
    Ok(Some(format!("{server}/{name}{query}")))
}

/// Restarts the test PostgreSQL (fast shutdown: open connections are cut) and waits until it
/// accepts connections again.
pub fn restart() -> Result<()> {
    let dir = std::env::var("MXBRIDGE_PG_DIR").context("MXBRIDGE_PG_DIR is not set")?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/postgres.sh");
    let status = std::process::Command::new("bash")
        .arg(script)
        .args(["restart", &dir])
        .status()
        .context("run scripts/postgres.sh restart")?;
    if !status.success() {
        bail!("scripts/postgres.sh restart failed: {status}");
    }
    Ok(())
}
