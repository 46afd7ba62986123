//! Delivery when the homeserver gets in the way: it restarts while an answer is being produced,
//! rate limits the bot, refuses an answer outright, or would refuse one for its size; and when
//! messages pile up, the room is told once.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use e2e::check::{self, BotMessage, Report, RoomTimeline};
use e2e::matrix::{Event, in_thread, replied_to};
use e2e::{DedicatedSynapse, Homeserver, Stack, StackOptions, User, eventually};
use rand::Rng;
use serde_json::{Value, json};

use crate::{Dm, TURN, body};

/// How long to keep looking after the last expected reply, so a late duplicate shows up.
const SETTLE: Duration = Duration::from_secs(5);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

fn is_text(e: &Event) -> bool {
    e["content"]["msgtype"] == "m.text"
}

pub(crate) fn is_notice(e: &Event) -> bool {
    e["content"]["msgtype"] == "m.notice"
}

/// The room as the delivery checker reads it: `triggers` and every message of `bot`.
pub(crate) async fn timeline(
    user: &User,
    room: &str,
    bot: &str,
    triggers: &[String],
) -> RoomTimeline {
    let events = user.messages_from(room, bot).await.expect("room messages");
    RoomTimeline {
        triggers: triggers.to_vec(),
        bot: events.iter().map(BotMessage::from_event).collect(),
    }
}

/// Waits (up to `timeout`) until every trigger has a text reply of `bot`, then [`SETTLE`] more,
/// and returns what the checker finds. Does not panic on a timeout: the report names the lost.
async fn replies_settled(
    user: &User,
    room: &str,
    bot: &str,
    triggers: &[String],
    timeout: Duration,
) -> Report {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let report = check::check(&[timeline(user, room, bot, triggers).await]);
        if report.lost.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(SETTLE).await;
    check::check(&[timeline(user, room, bot, triggers).await])
}

pub(crate) fn assert_clean(report: &Report) {
    assert!(
        report.is_clean() && report.stray.is_empty(),
        "every message gets exactly one text reply, in order: {} stray={}; {report:#?}",
        report.summary(),
        report.stray.len()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_synapse_restart_loses_nothing() {
    let mut synapse = DedicatedSynapse::start(None).await.expect("synapse starts");
    let hs = synapse.homeserver().clone();
    let mut stack = Stack::start(&hs, StackOptions::default())
        .await
        .expect("stack starts");
    let bot = stack.bot.user_id.clone();
    let user = hs
        .register(&e2e::unique("user"), true)
        .await
        .expect("register user");
    let room = e2e::open_dm(&user, &bot, TURN).await;

    let first = user.send_text(&room, "sleep 4000").await.expect("send");
    // Stop the homeserver as soon as the agent has the turn, so the answer is produced while
    // the homeserver is down.
    eventually(TURN, "the agent to receive the first message", || async {
        stack.agent_turn(&first).map(|_| ())
    })
    .await;
    let stopped = Instant::now();
    synapse.stop().await.expect("stop synapse");
    tokio::time::sleep_until((stopped + Duration::from_secs(8)).into()).await;
    let turn_while_down = stack
        .agent_turn(&first)
        .map(|t| t["status"].clone())
        .unwrap_or_default();
    assert!(
        stack.surface.is_running(),
        "the surface exited while the homeserver was down"
    );
    synapse.start_again().await.expect("start synapse again");
    let down_ms = stopped.elapsed().as_millis();
    let back_at = now_ms();

    let mut triggers = vec![first];
    for i in 1..=3 {
        let text = format!("after the restart, message {i}");
        triggers.push(user.send_text(&room, &text).await.expect("send"));
    }
    let report = replies_settled(&user, &room, &bot, &triggers, TURN * 2).await;

    let first_reply_ms = user
        .messages_from(&room, &bot)
        .await
        .expect("messages")
        .iter()
        .filter(|e| is_text(e))
        .filter_map(|e| e["origin_server_ts"].as_u64())
        .min()
        .map_or("none".to_owned(), |ts| {
            ts.saturating_sub(back_at).to_string()
        });
    println!(
        "synapse_restart: down_ms={down_ms} first_reply_after_restart_ms={first_reply_ms} \
         agent_turn_while_down={turn_while_down} messages={} {}",
        report.messages,
        report.summary()
    );
    assert_clean(&report);
}

#[tokio::test(flavor = "multi_thread")]
async fn rate_limited_replies_are_waited_out_not_lost() {
    let synapse = DedicatedSynapse::start(Some("{per_second: 0.5, burst_count: 3}"))
        .await
        .expect("synapse starts");
    let hs = synapse.homeserver().clone();
    // Only the bot is limited: the user sends at full speed.
    let user = hs
        .register(&e2e::unique("user"), true)
        .await
        .expect("register user");
    user.admin_override_ratelimit(&user.user_id, 0, 0)
        .await
        .expect("exempt the user from the rate limit");
    let stack = Stack::start(&hs, StackOptions::default())
        .await
        .expect("stack starts");
    let bot = stack.bot.user_id.clone();
    let room = e2e::open_dm(&user, &bot, TURN).await;

    let started = Instant::now();
    let mut triggers = Vec::new();
    for i in 1..=10 {
        let text = format!("rate limit probe {i}");
        triggers.push(user.send_text(&room, &text).await.expect("send"));
    }
    let report = replies_settled(&user, &room, &bot, &triggers, TURN * 2).await;
    let elapsed_ms = started.elapsed().as_millis();
    let waits = stack
        .surface
        .log()
        .lines()
        .filter(|l| l.contains("rate limited by the homeserver"))
        .count();
    let replies = report.messages - report.lost.len();
    println!(
        "rate_limit: replies={replies} waits={waits} elapsed_ms={elapsed_ms} {}",
        report.summary()
    );
    assert_clean(&report);
    let m = stack.surface_metrics().await.expect("surface /metrics");
    let retries = e2e::metric(
        &m,
        "mxbridge_surface_send_retries_total",
        &[("reason", "rate_limited")],
    );
    println!("rate_limit: retries counted {retries}");
    assert!(
        retries >= waits as f64,
        "every wait is counted: {retries} < {waits}"
    );
    assert!(
        waits >= 1,
        "the surface never logged `rate limited by the homeserver`: the limit was not hit, or \
         the waits are not reported"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_queue_is_announced_in_the_room() {
    let dm = Dm::start(StackOptions::default()).await;
    let bot = dm.stack.bot.user_id.clone();
    let mut triggers = vec![dm.user.send_text(&dm.room, "sleep 4000").await.unwrap()];
    for i in 1..=7 {
        let text = format!("queued behind the sleep, message {i}");
        triggers.push(dm.user.send_text(&dm.room, &text).await.unwrap());
    }
    let report = replies_settled(&dm.user, &dm.room, &bot, &triggers, TURN * 2).await;
    let notices: Vec<Event> = dm
        .user
        .messages_from(&dm.room, &bot)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| is_notice(e) && body(e).contains("messages are queued"))
        .collect();
    println!(
        "full_queue: messages={} queue_notices={} {}",
        report.messages,
        notices.len(),
        report.summary()
    );
    assert_eq!(
        notices.len(),
        1,
        "exactly one notice that messages are queued: {notices:#?}"
    );
    assert_clean(&report);
}

/// Whether `e` is the bot's `⚠️` reaction to `trigger`.
fn is_warning_reaction(e: &Event, bot: &str, trigger: &str) -> bool {
    let rel = &e["content"]["m.relates_to"];
    e["type"] == "m.reaction"
        && e["sender"] == bot
        && rel["rel_type"] == "m.annotation"
        && rel["event_id"] == trigger
        && rel["key"] == "⚠️"
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_answer_is_parked_and_reported_and_the_chat_goes_on() {
    let hs = Homeserver::from_env();
    let stack = Stack::start(&hs, StackOptions::default())
        .await
        .expect("stack starts");
    let bot = stack.bot.user_id.clone();
    let user = hs
        .register(&e2e::unique("user"), true)
        .await
        .expect("register user");
    // Messages need power 50; the bot has the default 0, the creator keeps 100. Reactions are
    // not listed, so the bot may still react.
    let room = user
        .create_room_with(json!({
            "preset": "private_chat",
            "invite": [bot],
            "is_direct": true,
            "power_level_content_override": {"events": {"m.room.message": 50}},
        }))
        .await
        .expect("create room");
    e2e::wait_joined(&user, &room, &bot, TURN).await;
    let levels = user
        .state(&room, "m.room.power_levels", "")
        .await
        .expect("power levels");
    let bot_level = levels["users"][&bot]
        .as_i64()
        .or_else(|| levels["users_default"].as_i64())
        .unwrap_or(0);
    assert!(
        levels["events"]["m.room.message"] == 50 && bot_level < 50,
        "the bot may not post messages: {levels}"
    );

    let hello = user.send_text(&room, "hello").await.expect("send");
    let parked_line = eventually(
        TURN,
        "a surface log line saying the refused reply is parked",
        || async {
            stack
                .surface
                .log()
                .lines()
                .find(|l| l.contains("parked") && l.contains(hello.as_str()))
                .map(str::to_owned)
        },
    )
    .await;
    eventually(
        TURN,
        "the bot's ⚠️ reaction to the refused message",
        || async {
            user.events(&room)
                .await
                .ok()?
                .into_iter()
                .find(|e| is_warning_reaction(e, &bot, &hello))
        },
    )
    .await;
    let health: Value = reqwest::get(format!("{}/healthz", stack.surface_health))
        .await
        .expect("healthz")
        .json()
        .await
        .expect("healthz json");
    let parked = health["parked_sends"].as_u64();
    assert!(
        parked.is_some_and(|n| n >= 1),
        "healthz counts the parked send: {health}"
    );
    let m = stack.surface_metrics().await.expect("surface /metrics");
    assert!(
        e2e::metric(&m, "mxbridge_surface_parked_sends", &[]) >= 1.0,
        "the parked-sends gauge: {m}"
    );

    // Give the bot its voice back: the conversation goes on, the parked reply stays parked.
    let mut levels = levels;
    levels["events"]["m.room.message"] = json!(0);
    user.put_state(&room, "m.room.power_levels", "", levels)
        .await
        .expect("lower the power needed for messages");
    let again = user.send_text(&room, "again").await.expect("send");
    let reply = eventually(TURN, "the bot's reply to `again`", || async {
        user.messages_from(&room, &bot)
            .await
            .ok()?
            .into_iter()
            .find(|e| is_text(e) && replied_to(e).as_deref() == Some(again.as_str()))
    })
    .await;
    tokio::time::sleep(SETTLE).await;
    let bot_msgs = user.messages_from(&room, &bot).await.expect("messages");
    let hello_replies = bot_msgs
        .iter()
        .filter(|e| is_text(e) && replied_to(e).as_deref() == Some(hello.as_str()))
        .count();
    println!(
        "refused_answer: parked_sends={} hello_text_replies={hello_replies} again_answered=true",
        parked.unwrap_or_default()
    );
    println!(
        "refused_answer: parked log line: {}",
        strip_ansi(&parked_line)
    );
    assert!(
        body(&reply).contains("again"),
        "the reply answers `again`: {reply}"
    );
    assert_eq!(
        hello_replies, 0,
        "the refused reply to `hello` was parked, not sent later: {bot_msgs:#?}"
    );
}

/// `line` without terminal colour codes.
fn strip_ansi(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ parameters final-letter
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Removes all whitespace, so text split at a space (and trimmed) still matches.
fn squash(s: &str) -> String {
    s.chars().filter(|c| !c.is_whitespace()).collect()
}

/// Numbered paragraphs of random words, at least `len` bytes in all.
fn paragraphs(len: usize) -> Vec<String> {
    const WORDS: &[&str] = &[
        "river", "lantern", "copper", "meadow", "quartz", "harbor", "violet", "thunder", "pebble",
        "saffron", "glacier", "orchard", "falcon", "ember", "tundra", "marble", "willow", "cobalt",
        "juniper", "canyon", "velvet", "beacon", "summit", "pepper", "walnut", "drizzle",
    ];
    let mut rng = rand::rng();
    let mut out: Vec<String> = Vec::new();
    let mut total = 0;
    while total < len {
        // No `word: ` near the start: the builtin brain would take it for a mention and drop it.
        let mut p = format!("Paragraph {}.", out.len() + 1);
        let target = rng.random_range(300..1500);
        while p.len() < target {
            p.push(' ');
            p.push_str(WORDS[rng.random_range(0..WORDS.len())]);
            if rng.random_range(0..12) == 0 {
                p.push_str(&format!(" {}.", rng.random_range(0..100_000)));
            }
        }
        total += p.len() + 2;
        out.push(p);
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn long_answers_are_split_not_refused() {
    const LEN: usize = 50_000;
    let dm = Dm::start(StackOptions::default()).await;
    let bot = dm.stack.bot.user_id.clone();
    let mut text = paragraphs(LEN + 2).join("\n\n");
    text.truncate(LEN);
    let paras: Vec<&str> = text.split("\n\n").filter(|p| !p.is_empty()).collect();
    assert_eq!(text.len(), LEN);

    let id = dm.user.send_text(&dm.room, &text).await.expect("send");
    let wanted: Vec<String> = paras.iter().map(|p| squash(p)).collect();
    // Until every paragraph is back, or the bot posts a notice (a failure report).
    let deadline = Instant::now() + TURN;
    while Instant::now() < deadline {
        let msgs = dm.user.messages_from(&dm.room, &bot).await.unwrap();
        let joined: String = msgs
            .iter()
            .filter(|e| is_text(e) && in_thread(e, &id))
            .map(|e| squash(body(e)))
            .collect();
        if wanted.iter().all(|p| joined.contains(p.as_str())) || msgs.iter().any(is_notice) {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    tokio::time::sleep(SETTLE).await;
    let msgs = dm.user.messages_from(&dm.room, &bot).await.unwrap();
    let parts: Vec<&Event> = msgs
        .iter()
        .filter(|e| is_text(e) && in_thread(e, &id))
        .collect();
    let joined: String = parts.iter().map(|e| squash(body(e))).collect();
    let missing = wanted
        .iter()
        .filter(|p| !joined.contains(p.as_str()))
        .count();
    let notices: Vec<&str> = msgs.iter().filter(|e| is_notice(e)).map(body).collect();
    let sizes: Vec<usize> = parts.iter().map(|e| body(e).len()).collect();
    println!(
        "long_answer: bytes={} paragraphs={} parts={} part_bytes={sizes:?} missing_paragraphs={missing} notices={}",
        text.len(),
        paras.len(),
        parts.len(),
        notices.len()
    );
    assert!(
        notices.is_empty(),
        "the bot reported a problem: {notices:?}"
    );
    assert!(
        parts.len() >= 2,
        "the answer is too large for one event, so it comes in parts: {sizes:?}"
    );
    let first_missing = wanted.iter().position(|p| !joined.contains(p.as_str()));
    assert_eq!(
        missing,
        0,
        "every paragraph of the message is in the answer's parts; first missing: {:?}",
        first_missing.map(|i| &paras[i][..paras[i].len().min(120)])
    );
}

/// A homeserver that fails `/messages` while the surface fills a gap (a limited sync: more
/// messages came than one sync returns, here while the surface was frozen) costs no message:
/// the backfill is tried again until it works. The faults test once lost a message exactly
/// so, when its Synapse restarted in the middle of a backfill.
#[tokio::test(flavor = "multi_thread")]
async fn a_gap_whose_backfill_fails_at_first_is_still_filled() {
    const GAP: usize = 40;
    let upstream = Homeserver::from_env();
    let proxy = e2e::KeyProxy::start(&upstream.url).await.expect("proxy");
    let mut opts = StackOptions::default();
    opts.surface_env
        .insert("MATRIX_HOMESERVER_URL".into(), proxy.url().to_owned());
    let dm = Dm::start(opts).await;
    let bot = dm.stack.bot.user_id.clone();
    let (first, _) = dm.ask("hello").await;

    let pid = dm.stack.surface.pid().expect("surface runs").to_string();
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    };
    signal("-STOP");
    let mut triggers = vec![first];
    for i in 0..GAP {
        let id = dm.user.send_text(&dm.room, &format!("gap {i}")).await;
        triggers.push(id.expect("send"));
    }
    // The gap is there; now the homeserver "restarts" just as the surface wakes up to fill it.
    proxy.fail_messages_for(Duration::from_secs(8));
    signal("-CONT");

    let report = replies_settled(&dm.user, &dm.room, &bot, &triggers, TURN * 3).await;
    let metrics = dm.stack.surface_metrics().await.unwrap_or_default();
    println!(
        "backfill_gap: limited_syncs={} backfilled={}",
        e2e::metric(&metrics, "mxbridge_surface_limited_syncs_total", &[]),
        e2e::metric(&metrics, "mxbridge_surface_backfilled_events_total", &[])
    );
    let retried = dm
        .stack
        .surface
        .log()
        .matches("backfill failed; trying again")
        .count();
    println!(
        "backfill_gap: messages={GAP} failed_backfill_requests={} retried={retried} {}",
        proxy.failed_messages(),
        report.summary()
    );
    assert!(
        proxy.failed_messages() > 0 && retried > 0,
        "the surface backfilled the gap (the sync was limited), met the failures and retried"
    );
    assert_clean(&report);
}
