//! What one message costs the store as a chat's history grows. Prints figures, never asserts
//! time: the cost of the first messages against the last ones, next to the raw cost of the
//! same appends and fsyncs on a plain file in the same folder, and the resident memory before
//! and after.
//!
//! `HISTORY_BENCH_TURNS` (default 20,000; e.g. 100000) and `HISTORY_BENCH_BYTES` (text and
//! answer size per turn, default 200) tune it. Run with `--nocapture` to see the figures.

use std::io::Write;
use std::time::{Duration, Instant};

use agent::chat::{Admission, Chats};
use agent::store::{Backend, Store, TurnStatus};

use crate::support::*;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Resident memory of this process in KiB (Linux), 0 where unknown.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn per_message(d: Duration, count: u64) -> String {
    format!("{:>8.1} µs", d.as_secs_f64() * 1e6 / count.max(1) as f64)
}

#[tokio::test]
async fn cost_per_message_stays_flat_as_history_grows() {
    let turns = env_or("HISTORY_BENCH_TURNS", 20_000).max(2);
    let bytes = env_or("HISTORY_BENCH_BYTES", 200) as usize;
    let window = (turns / 10).clamp(1, 1_000);
    let id = chat();
    let state = tempfile::tempdir().unwrap();
    let chats = Chats::new(Backend::Files(Store::open(state.path()).unwrap()));
    let chat = chats.chat(&id).unwrap();
    let text = "x".repeat(bytes);

    let rss_before = rss_kib();
    let mut first = Duration::ZERO;
    let mut last = Duration::ZERO;
    let started = Instant::now();
    for seq in 1..=turns {
        let t = Instant::now();
        let m = message(seq, &format!("$bench{seq}"), &text);
        assert_eq!(chat.admit(&m).await.unwrap(), Admission::New);
        chat.finish(&m.id, TurnStatus::Completed, text.clone(), Vec::new(), None)
            .await
            .unwrap();
        if seq <= window {
            first += t.elapsed();
        } else if seq > turns - window {
            last += t.elapsed();
        }
    }
    let total = started.elapsed();
    let rss_after = rss_kib();

    // The comparator: two appended lines of the same size, each fsynced, per message.
    let raw = {
        let mut file = std::fs::File::create(state.path().join("raw-fsync")).unwrap();
        let line = format!("{text}{text}\n");
        let t = Instant::now();
        for _ in 0..window * 2 {
            file.write_all(line.as_bytes()).unwrap();
            file.sync_data().unwrap();
        }
        t.elapsed()
    };

    // Every turn is still known after a restart: a resend is a duplicate.
    let reload = Instant::now();
    let chats = Chats::new(Backend::Files(Store::open(state.path()).unwrap()));
    let chat = chats.chat(&id).unwrap();
    let reload = reload.elapsed();
    assert_eq!(chat.last_seq().await.unwrap(), turns);
    let resend = message(1, "$bench1", &text);
    assert_eq!(chat.admit(&resend).await.unwrap(), Admission::Duplicate);

    println!(
        "history cost: {turns} turns of {bytes} B, windows of {window} messages\n\
         \x20 first {window}: {} per message\n\
         \x20 last  {window}: {} per message\n\
         \x20 raw fsync comparator (2 appends + fsyncs): {} per message\n\
         \x20 total {:.1} s ({:.0} messages/s); reload {:.0} ms\n\
         \x20 VmRSS before {} KiB, after {} KiB (+{} KiB)",
        per_message(first, window),
        per_message(last, window),
        per_message(raw, window),
        total.as_secs_f64(),
        turns as f64 / total.as_secs_f64(),
        reload.as_secs_f64() * 1e3,
        rss_before,
        rss_after,
        rss_after.saturating_sub(rss_before),
    );
}
