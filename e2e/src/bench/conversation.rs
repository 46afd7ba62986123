//! Conversation figures, the bot next to the echo bot measured the same way in the same run:
//! reply latency in an encrypted DM (back to back and paced) and throughput (a burst in one room,
//! and the same burst spread over many rooms).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::Sizes;
use super::figures::{Fig, RunFigures, Sample, Stat};
use super::setup::{POLL, Setup, TURN};
use super::stats::{percentile, sorted};

/// Reply latency, both series, bot and echo bot.
pub async fn reply_latency(s: &Setup, sizes: &Sizes) -> Result<RunFigures> {
    let mut out = RunFigures::new();
    for (paced, pause) in [(false, Duration::ZERO), (true, sizes.pause)] {
        let bot = series(s, &s.enc_dm, &s.bot, sizes.rounds, pause).await?;
        let echo = series(s, &s.echo_dm, &s.echo.user_id, sizes.rounds, pause).await?;
        for stat in [Stat::P50, Stat::P99] {
            if let (Some(b), Some(e)) = (percentile(&bot, stat.p()), percentile(&echo, stat.p())) {
                out.insert(Fig::Reply { paced, stat }, Sample::new(b, e));
            }
        }
    }
    Ok(out)
}

/// Sends `rounds` messages to `room`, each right after the reply to the previous one (and
/// `pause`), and returns the sorted send-to-reply times in ms.
async fn series(
    s: &Setup,
    room: &str,
    responder: &str,
    rounds: usize,
    pause: Duration,
) -> Result<Vec<f64>> {
    let mut out = Vec::with_capacity(rounds);
    for i in 0..rounds {
        tokio::time::sleep(pause).await;
        let t = Instant::now();
        let id = s.alice.send_text(room, &format!("ping {i}")).await?;
        let (_, seen) = s.wait_answer(room, responder, &id, TURN, |_| true).await?;
        out.push((seen - t).as_secs_f64() * 1000.0);
    }
    Ok(sorted(out))
}

/// Throughput in one room and over `--rooms` rooms, bot and echo bot.
pub async fn throughput(s: &Setup, sizes: &Sizes) -> Result<RunFigures> {
    let mut out = RunFigures::new();
    let echo = s.echo.user_id.clone();
    let figs = [
        (Fig::OneRoom, Fig::OneRoomSending, Fig::OneRoomProgress, 1),
        (
            Fig::Rooms,
            Fig::RoomsSending,
            Fig::RoomsProgress,
            sizes.rooms,
        ),
    ];
    for (rate, sending, progress, n_rooms) in figs {
        let bot_rooms = s.open_rooms(&s.bot, n_rooms).await?;
        let echo_rooms = s.open_rooms(&echo, n_rooms).await?;
        let signals_before = progress_signals(s).await?;
        let bot = burst(s, &bot_rooms, &s.bot, sizes.messages).await?;
        let signals = progress_signals(s).await? - signals_before;
        let echo = burst(s, &echo_rooms, &echo, sizes.messages).await?;
        out.insert(rate, Sample::new(bot.rate, echo.rate));
        out.insert(
            sending,
            Sample::new(bot.sending * 100.0, echo.sending * 100.0),
        );
        // The echo bot sends its answers and nothing else.
        out.insert(progress, Sample::new(signals / sizes.messages as f64, 0.0));
    }
    Ok(out)
}

/// The read receipts and typing notices the surface has sent so far (its metrics). A notice
/// taken down after a burst's last answer arrived is not counted (one request per room, at
/// most).
async fn progress_signals(s: &Setup) -> Result<f64> {
    let metrics = s.stack.surface_metrics().await?;
    let name = "mxbridge_surface_progress_signals_total";
    Ok(["read_receipt", "typing"]
        .iter()
        .map(|kind| crate::metric(&metrics, name, &[("kind", kind)]))
        .sum())
}

/// How many of `messages` go to room `i` of `rooms` (spread as evenly as possible).
pub fn share(messages: usize, rooms: usize, i: usize) -> usize {
    messages / rooms + usize::from(i < messages % rooms)
}

/// What a burst measured.
#[derive(Debug, Clone, Copy)]
struct Burst {
    /// Messages answered per second.
    rate: f64,
    /// The share of the time spent sending (0 to 1).
    sending: f64,
}

/// Sends `messages` spread over `rooms` (each room's share back to back, the rooms in
/// parallel) without waiting for replies, and returns messages answered per second, from the
/// first send until every message has its reply from `responder`.
async fn burst(s: &Setup, rooms: &[String], responder: &str, messages: usize) -> Result<Burst> {
    let started = Instant::now();
    let senders = rooms.iter().enumerate().map(|(i, room)| async move {
        let mut ids = Vec::new();
        for j in 0..share(messages, rooms.len(), i) {
            ids.push(s.user.send_text(room, &format!("burst {j}")).await?);
        }
        anyhow::Ok((room.as_str(), ids))
    });
    let sent = futures_util::future::try_join_all(senders).await?;
    let sending = started.elapsed().as_secs_f64();
    let timeout = TURN + Duration::from_millis(200) * messages as u32;
    loop {
        let mut missing = 0;
        for (room, ids) in &sent {
            let answered: BTreeSet<String> = s
                .alice
                .messages_from(room, responder)
                .await?
                .iter()
                .filter_map(|m| m.answers().map(str::to_owned))
                .collect();
            missing += ids.iter().filter(|id| !answered.contains(*id)).count();
        }
        if missing == 0 {
            let total = started.elapsed().as_secs_f64();
            return Ok(Burst {
                rate: messages as f64 / total,
                sending: sending / total,
            });
        }
        if started.elapsed() > timeout {
            bail!("{missing} of {messages} messages to {responder} not answered after {timeout:?}");
        }
        tokio::time::sleep(POLL * 4).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_spread_evenly() {
        let cases = [
            (100, 20, vec![5; 20]),
            (10, 4, vec![3, 3, 2, 2]),
            (2, 3, vec![1, 1, 0]),
        ];
        for (messages, rooms, want) in cases {
            let got: Vec<usize> = (0..rooms).map(|i| share(messages, rooms, i)).collect();
            assert_eq!(got, want, "{messages} over {rooms}");
            assert_eq!(got.iter().sum::<usize>(), messages);
        }
    }
}
