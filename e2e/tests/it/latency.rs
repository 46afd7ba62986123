//! Benchmark, not an assertion: how long a user waits for the bot's reply in an encrypted DM,
//! when they answer right after the previous reply (back to back) and when they pause first
//! (paced), next to an echo bot on the same homeserver (`e2e::bench::echo`, a matrix-sdk client
//! that replies at once from its own sync loop): the floor any bot can reach here. Figures are
//! printed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use e2e::e2ee::E2eeUser;
use e2e::{Homeserver, Stack, StackOptions};

use crate::TURN;

/// Messages per series.
const ROUNDS: usize = 15;
/// The pause before each paced message.
const PAUSE: Duration = Duration::from_secs(2);

fn percentile(sorted: &[u128], p: f64) -> u128 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}

/// Sends `ROUNDS` messages to `room`, each after the reply to the previous one (and `pause`),
/// and returns the sorted send-to-reply times in ms.
async fn series(user: &E2eeUser, room: &str, responder: &str, pause: Duration) -> Vec<u128> {
    let mut out = Vec::with_capacity(ROUNDS);
    for i in 0..ROUNDS {
        tokio::time::sleep(pause).await;
        let t = Instant::now();
        let id = user.send_text(room, &format!("ping {i}")).await.unwrap();
        let deadline = t + TURN;
        loop {
            let msgs = user.messages_from(room, responder).await.unwrap();
            if msgs.iter().any(|m| {
                m.in_reply_to.as_deref() == Some(id.as_str())
                    || m.thread_root.as_deref() == Some(id.as_str())
            }) {
                break;
            }
            assert!(Instant::now() < deadline, "no reply to ping {i}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        out.push(t.elapsed().as_millis());
    }
    out.sort_unstable();
    out
}

fn line(name: &str, ms: &[u128]) -> String {
    format!(
        "{name} p50={} p99={} max={}",
        percentile(ms, 0.5),
        percentile(ms, 0.99),
        ms.last().copied().unwrap_or_default()
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn reply_latency_back_to_back_paced_and_next_to_an_echo_bot() {
    let hs = Homeserver::from_env();
    let stack = Stack::start(&hs, StackOptions::default()).await.unwrap();
    let bot = stack.bot.user_id.clone();
    let alice = E2eeUser::register(&hs, "user").await.unwrap();
    let room = alice.create_encrypted_dm(&bot).await.unwrap();
    alice.wait_joined(&room, &bot, TURN).await.unwrap();

    let echo_bot = Arc::new(E2eeUser::register(&hs, "echo").await.unwrap());
    e2e::bench::echo::serve(&echo_bot);
    let echo_room = alice.create_encrypted_dm(&echo_bot.user_id).await.unwrap();
    alice
        .wait_joined(&echo_room, &echo_bot.user_id, TURN)
        .await
        .unwrap();

    // Warm up both (Olm sessions, first turn).
    series_warm(&alice, &room, &bot).await;
    series_warm(&alice, &echo_room, &echo_bot.user_id).await;

    let b2b = series(&alice, &room, &bot, Duration::ZERO).await;
    let paced = series(&alice, &room, &bot, PAUSE).await;
    let echo_b2b = series(&alice, &echo_room, &echo_bot.user_id, Duration::ZERO).await;
    let echo_paced = series(&alice, &echo_room, &echo_bot.user_id, PAUSE).await;
    println!(
        "latency_ms rounds={ROUNDS} {} | {} | {} | {}",
        line("bot_back_to_back", &b2b),
        line("bot_paced", &paced),
        line("echo_back_to_back", &echo_b2b),
        line("echo_paced", &echo_paced),
    );
}

async fn series_warm(user: &E2eeUser, room: &str, responder: &str) {
    let id = user.send_text(room, "warm up").await.unwrap();
    user.wait_for(TURN, "the warm-up reply", || async {
        user.messages_from(room, responder)
            .await
            .ok()?
            .iter()
            .any(|m| {
                m.in_reply_to.as_deref() == Some(id.as_str())
                    || m.thread_root.as_deref() == Some(id.as_str())
            })
            .then_some(())
    })
    .await
    .unwrap();
}
