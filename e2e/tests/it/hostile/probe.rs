//! Round trips of an ordinary user's chat: `help`, answered in its thread.

use std::time::{Duration, Instant};

use super::Room;
use crate::TURN;

/// Sends `help` `n` times, one after the other, and returns each reply's round trip.
pub async fn round_trips(room: &Room, bot: &str, n: usize) -> Vec<Duration> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(round_trip(room, bot).await);
    }
    out
}

/// One `help` and the time until its reply is seen.
pub async fn round_trip(room: &Room, bot: &str) -> Duration {
    let start = Instant::now();
    let id = room.user.send_text(&room.id, "help").await.expect("send");
    loop {
        let all = room
            .user
            .messages_from(&room.id, bot)
            .await
            .expect("messages");
        if !Room::answers(&all, &id).is_empty() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < TURN,
            "no reply to a probe within {TURN:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The 99th percentile in milliseconds (the largest of fewer than 100).
pub fn p99_ms(samples: &[Duration]) -> u128 {
    let mut ms: Vec<u128> = samples.iter().map(Duration::as_millis).collect();
    ms.sort_unstable();
    if ms.is_empty() {
        return 0;
    }
    let at = ((ms.len() * 99).div_ceil(100)).saturating_sub(1);
    ms[at]
}
