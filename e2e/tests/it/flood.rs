//! A flood: one user sends `FLOOD_MESSAGES` (default 1,000) messages as fast as the homeserver
//! takes them, while another user's chat with the same bot keeps being answered (its round
//! trips are printed, never asserted on time). Every flood message is answered exactly once, in
//! order, and the room is told once that messages are queued (the first flood message is a slow
//! turn, so the backlog is real on any machine: the bot alone might keep up with one sender).

use std::time::{Duration, Instant};

use e2e::check;
use e2e::matrix::in_thread;
use e2e::{StackOptions, eventually};

use crate::outages::{assert_clean, is_notice, timeline};
use crate::{Dm, TURN, body};

fn percentile(sorted: &[u128], p: f64) -> u128 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_in_one_room_does_not_starve_another() {
    let n: usize = std::env::var("FLOOD_MESSAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let dm = Dm::start(StackOptions::default()).await;
    let bot = dm.stack.bot.user_id.clone();
    let other = dm
        .hs
        .register(&e2e::unique("calm"), false)
        .await
        .expect("register");
    let calm_room = e2e::open_dm(&other, &bot, TURN).await;

    let started = Instant::now();
    let flooder = {
        let (user, room) = (dm.user.clone(), dm.room.clone());
        tokio::spawn(async move {
            let mut ids = Vec::with_capacity(n);
            for i in 0..n {
                // The first turn is slow, so a backlog builds however fast this machine answers.
                let text = if i == 0 {
                    "sleep 6000".to_owned()
                } else {
                    format!("flood {i}")
                };
                ids.push(user.send_text(&room, &text).await.expect("send"));
            }
            ids
        })
    };

    // The calm chat, meanwhile: one message at a time, each waited for.
    let mut rounds = Vec::new();
    while !flooder.is_finished() || rounds.len() < 3 {
        let t = Instant::now();
        let id = other
            .send_text(&calm_room, &format!("calm {}", rounds.len()))
            .await
            .expect("send");
        eventually(TURN, "the calm chat's reply", || async {
            let msgs = other.messages_from(&calm_room, &bot).await.ok()?;
            msgs.iter().any(|e| in_thread(e, &id)).then_some(())
        })
        .await;
        rounds.push(t.elapsed().as_millis());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let triggers = flooder.await.expect("flooder");
    let sent_s = started.elapsed().as_secs_f64();

    // Every flood message answered (polled slowly: the room holds thousands of events).
    let deadline = Instant::now() + Duration::from_secs(900);
    let report = loop {
        let report = check::check(&[timeline(&dm.user, &dm.room, &bot, &triggers).await]);
        if report.lost.is_empty() || Instant::now() > deadline {
            break report;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
    };
    let drained_s = started.elapsed().as_secs_f64();
    let notices = dm
        .user
        .messages_from(&dm.room, &bot)
        .await
        .expect("messages")
        .into_iter()
        .filter(|e| is_notice(e) && body(e).contains("messages are queued"))
        .count();
    rounds.sort_unstable();
    println!(
        "flood: messages={n} sent_s={sent_s:.1} drained_s={drained_s:.1} answered_per_s={:.1} \
         backlog_notices={notices} {} other_chat_rounds={} other_chat_p50_ms={} other_chat_p99_ms={}",
        n as f64 / drained_s,
        report.summary(),
        rounds.len(),
        percentile(&rounds, 0.5),
        percentile(&rounds, 0.99),
    );
    assert_clean(&report);
    assert_eq!(notices, 1, "the backlog is announced once");
}
