//! Harness for the end-to-end tests: a real Synapse (started by `scripts/synapse.sh`, shared by
//! the suite or a [`DedicatedSynapse`] of one test), the real `agent` and `surface` binaries as
//! child processes, and a Matrix user speaking the client-server API over HTTP, or end-to-end
//! encryption through matrix-sdk ([`E2eeUser`]).

pub mod agent_ws;
pub mod attack;
pub mod bench;
pub mod canary;
pub mod check;
pub mod e2ee;
pub mod keyproxy;
pub mod matrix;
pub mod postgres;
pub mod procs;
pub mod synapse;

use std::future::Future;
use std::time::{Duration, Instant};

pub use e2ee::{E2eeUser, Received};
pub use keyproxy::KeyProxy;
pub use matrix::{Homeserver, User};
pub use procs::{Child, Stack, StackOptions, metric};
pub use synapse::DedicatedSynapse;

/// Polls `f` every `every` until it returns `Some`; fails naming `what` after `timeout`.
pub async fn poll<T, F, Fut>(
    timeout: Duration,
    every: Duration,
    what: &str,
    mut f: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if Instant::now() > deadline {
            anyhow::bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(every).await;
    }
}

/// Polls `f` until it returns `Some`, or panics with `what` after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    poll(timeout, Duration::from_millis(250), what, f)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Creates a direct chat between `user` and `bot` and waits until the bot has joined it.
pub async fn open_dm(user: &User, bot: &str, timeout: Duration) -> String {
    let room = user.create_room(&[bot], true).await.expect("create room");
    wait_joined(user, &room, bot, timeout).await;
    room
}

/// Waits until `member` has joined `room` (as `user` sees it), polling every `every`.
pub async fn joined(
    user: &User,
    room: &str,
    member: &str,
    timeout: Duration,
    every: Duration,
) -> anyhow::Result<()> {
    poll(
        timeout,
        every,
        &format!("{member} to join {room}"),
        || async {
            user.joined_members(room)
                .await
                .ok()?
                .iter()
                .any(|m| m == member)
                .then_some(())
        },
    )
    .await
}

/// Waits until `member` has joined `room` (as `user` sees it); panics after `timeout`.
pub async fn wait_joined(user: &User, room: &str, member: &str, timeout: Duration) {
    joined(user, room, member, timeout, Duration::from_millis(250))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// A short random lowercase id for unique user names and file names.
pub fn unique(prefix: &str) -> String {
    use rand::Rng;
    let n: u64 = rand::rng().random();
    format!("{prefix}{:012x}", n & 0xffff_ffff_ffff)
}
