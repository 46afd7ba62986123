//! Delivery under faults: hundreds of messages in several rooms while the surface and the agent
//! are SIGKILLed at random moments and the test's own Synapse is once paused (SIGSTOP) and once
//! shut down and started again; afterwards every message has exactly one reply, in order per
//! room, and every file is in the inbox exactly once. One more room is what Element makes: an
//! encrypted DM created by its first message (sent before the bot joins), its user a matrix-sdk
//! client.
//!
//! The random schedule comes from one seed, printed at the start; `FAULTS_SEED=<n>` replays it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use e2e::check::{self, BotMessage, RoomTimeline};
use e2e::e2ee::E2eeUser;
use e2e::matrix::Event;
use e2e::{DedicatedSynapse, Stack, StackOptions, User, sha256_hex};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{TURN, media_content};

/// Plain rooms, each a DM of a different user with the same bot (plus the encrypted one).
const ROOMS: usize = 4;
/// Messages per room (N = ROOMS * PER_ROOM >= 300).
const PER_ROOM: usize = 80;
/// Every this many messages of a room is a file.
const FILE_EVERY: usize = 8;
/// Time between two messages of one room.
const PACE: Duration = Duration::from_millis(1800);
const SURFACE_KILLS: usize = 10;
const AGENT_KILLS: usize = 3;
/// How long after the last message every reply must have arrived.
const DRAIN: Duration = Duration::from_secs(300);

/// What a user sent.
#[derive(Debug, Clone)]
struct Sent {
    event_id: String,
    /// SHA-256 of the file, for file messages.
    file: Option<String>,
}

/// One fault the chaos task injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    KillSurface,
    KillAgent,
    PauseSynapse,
    RestartSynapse,
}

impl Fault {
    fn is_synapse(self) -> bool {
        matches!(self, Self::PauseSynapse | Self::RestartSynapse)
    }
}

/// A moment a process came back, for the recovery time.
#[derive(Debug, Clone)]
struct Restart {
    /// `surface`, `agent`, `synapse-pause` or `synapse-restart`.
    what: &'static str,
    at_ms: u64,
    /// Since the chaos started, to find it in the printed schedule.
    t: Duration,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// Sends `PER_ROOM` messages to `room` at a steady pace, every `FILE_EVERY`th one a file.
async fn send_all(user: User, room: String, index: usize, seed: u64, start: Instant) -> Vec<Sent> {
    let mut rng = StdRng::seed_from_u64(seed ^ (index as u64 + 1).wrapping_mul(0x9e37_79b9));
    let mut sent = Vec::with_capacity(PER_ROOM);
    for k in 0..PER_ROOM {
        tokio::time::sleep_until((start + PACE * k as u32).into()).await;
        if k % FILE_EVERY == FILE_EVERY - 1 {
            let len = rng.random_range(1_000..48_000);
            let mut bytes = vec![0u8; len];
            rng.fill(&mut bytes[..]);
            bytes[..16].copy_from_slice(format!("room{index:02}file{k:06}").as_bytes());
            let digest = sha256_hex(&bytes);
            let name = format!("r{index}-m{k}.bin");
            let mxc = user
                .upload(bytes, "application/octet-stream")
                .await
                .expect("upload");
            // A caption makes the file its own turn (no caption from a later message).
            let content = media_content(
                "m.file",
                &format!("file number {k} in room {index}"),
                Some(&name),
                &mxc,
                "application/octet-stream",
                len as u64,
            );
            let event_id = user.send(&room, content).await.expect("send file");
            sent.push(Sent {
                event_id,
                file: Some(digest),
            });
        } else {
            let text = format!(
                "message {k} in room {index}, token {:08x}",
                rng.random::<u32>()
            );
            let event_id = user.send_text(&room, &text).await.expect("send text");
            sent.push(Sent {
                event_id,
                file: None,
            });
        }
    }
    sent
}

/// Like [`send_all`] for the encrypted DM, whose first message (`first`, sent when the room was
/// created) is message 0. A send the homeserver did not confirm is tried again: a duplicate it
/// may leave is a message the checker does not count as a trigger.
async fn send_all_encrypted(
    user: Arc<E2eeUser>,
    room: String,
    first: String,
    index: usize,
    seed: u64,
    start: Instant,
) -> Vec<Sent> {
    let mut rng = StdRng::seed_from_u64(seed ^ (index as u64 + 1).wrapping_mul(0x9e37_79b9));
    let mut sent = vec![Sent {
        event_id: first,
        file: None,
    }];
    for k in 1..PER_ROOM {
        tokio::time::sleep_until((start + PACE * k as u32).into()).await;
        let (file, event_id) = loop {
            let attempt = if k % FILE_EVERY == FILE_EVERY - 1 {
                let len = rng.random_range(1_000..48_000);
                let mut bytes = vec![0u8; len];
                rng.fill(&mut bytes[..]);
                bytes[..16].copy_from_slice(format!("room{index:02}file{k:06}").as_bytes());
                let digest = sha256_hex(&bytes);
                let caption = format!("file number {k} in room {index}");
                user.send_file(
                    &room,
                    &format!("r{index}-m{k}.bin"),
                    "application/octet-stream",
                    bytes,
                    Some(&caption),
                )
                .await
                .map(|id| (Some(digest), id))
            } else {
                let text = format!(
                    "message {k} in room {index}, token {:08x}",
                    rng.random::<u32>()
                );
                user.send_text(&room, &text).await.map(|id| (None, id))
            };
            match attempt {
                Ok(done) => break done,
                Err(e) => {
                    eprintln!("faults: encrypted send {k} failed ({e:#}); trying again");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        sent.push(Sent { event_id, file });
    }
    sent
}

/// Injects the faults at random moments spread over `window`; returns when all processes are
/// running again.
async fn chaos(
    stack: &mut Stack,
    synapse: &mut DedicatedSynapse,
    rng: &mut StdRng,
    window: Duration,
) -> Vec<Restart> {
    let mut plan = vec![Fault::KillSurface; SURFACE_KILLS];
    plan.extend([Fault::KillAgent; AGENT_KILLS]);
    plan.extend([Fault::PauseSynapse, Fault::RestartSynapse]);
    // Shuffle, but never start with a homeserver outage so the stack has warmed up.
    for i in (1..plan.len()).rev() {
        let j = rng.random_range(0..=i);
        plan.swap(i, j);
    }
    if let Some(k) = plan.iter().position(|f| !f.is_synapse()) {
        plan.swap(0, k);
    }
    let slot = window / (plan.len() as u32 + 1);
    let start = Instant::now();
    let mut restarts = Vec::new();
    for (i, fault) in plan.into_iter().enumerate() {
        let jitter = rng.random_range(0..slot.as_millis() as u64 / 2);
        let at = start + slot * (i as u32 + 1) + Duration::from_millis(jitter) - slot / 4;
        tokio::time::sleep_until(at.into()).await;
        match fault {
            Fault::KillSurface => {
                stack.surface.kill9().await;
                let down = rng.random_range(200..3000);
                eprintln!(
                    "faults: t={:?} SIGKILL surface, down {down} ms",
                    start.elapsed()
                );
                tokio::time::sleep(Duration::from_millis(down)).await;
                stack.surface.start().expect("restart surface");
                restarts.push(Restart {
                    what: "surface",
                    at_ms: now_ms(),
                    t: start.elapsed(),
                });
            }
            Fault::KillAgent => {
                stack.agent.kill9().await;
                let down = rng.random_range(200..3000);
                eprintln!(
                    "faults: t={:?} SIGKILL agent, down {down} ms",
                    start.elapsed()
                );
                tokio::time::sleep(Duration::from_millis(down)).await;
                stack.agent.start().expect("restart agent");
                restarts.push(Restart {
                    what: "agent",
                    at_ms: now_ms(),
                    t: start.elapsed(),
                });
            }
            Fault::PauseSynapse => {
                let pause = rng.random_range(5_000..10_000);
                eprintln!(
                    "faults: t={:?} SIGSTOP synapse for {pause} ms",
                    start.elapsed()
                );
                synapse.pause();
                tokio::time::sleep(Duration::from_millis(pause)).await;
                synapse.resume();
                restarts.push(Restart {
                    what: "synapse-pause",
                    at_ms: now_ms(),
                    t: start.elapsed(),
                });
            }
            Fault::RestartSynapse => {
                // Down for this long from the stop, plus however long it takes to start.
                let down = Duration::from_millis(rng.random_range(5_000..10_000));
                let stopped = Instant::now();
                eprintln!(
                    "faults: t={:?} stopping synapse, down {} ms",
                    start.elapsed(),
                    down.as_millis()
                );
                synapse.stop().await.expect("stop synapse");
                tokio::time::sleep_until((stopped + down).into()).await;
                synapse.start_again().await.expect("start synapse again");
                eprintln!(
                    "faults: t={:?} synapse healthy again after {} ms down",
                    start.elapsed(),
                    stopped.elapsed().as_millis()
                );
                restarts.push(Restart {
                    what: "synapse-restart",
                    at_ms: now_ms(),
                    t: start.elapsed(),
                });
            }
        }
    }
    restarts
}

/// A user of one room: raw HTTP, or an E2EE matrix-sdk client.
#[derive(Clone)]
enum Member {
    Plain(User),
    Encrypted(Arc<E2eeUser>),
}

impl Member {
    fn user_id(&self) -> &str {
        match self {
            Self::Plain(u) => &u.user_id,
            Self::Encrypted(u) => &u.user_id,
        }
    }
}

/// Timeline of one room as the user sees it (the encrypted room's events carry no timestamps:
/// its latency is not measured).
async fn timeline(
    member: &Member,
    room: &str,
    bot: &str,
    sent: &[Sent],
) -> (RoomTimeline, Vec<Event>) {
    let triggers = sent.iter().map(|s| s.event_id.clone()).collect();
    let user = match member {
        Member::Plain(u) => u,
        Member::Encrypted(u) => {
            let msgs = u.messages_from(room, bot).await.expect("room messages");
            let bot = msgs
                .into_iter()
                .map(|m| BotMessage {
                    event_id: m.event_id,
                    answers: m.in_reply_to.or(m.thread_root),
                    is_text: m.msgtype == "m.text",
                })
                .collect();
            return (RoomTimeline { triggers, bot }, Vec::new());
        }
    };
    let events = user.messages(room).await.expect("room messages");
    let bot_msgs = events
        .iter()
        .filter(|e| e["sender"] == bot)
        .map(BotMessage::from_event)
        .collect();
    (
        RoomTimeline {
            triggers,
            bot: bot_msgs,
        },
        events,
    )
}

/// Whether every trigger of `t` has a text reply.
fn all_answered(t: &RoomTimeline) -> bool {
    let answered: std::collections::BTreeSet<&str> = t
        .bot
        .iter()
        .filter(|m| m.is_text)
        .filter_map(|m| m.answers.as_deref())
        .collect();
    t.triggers.iter().all(|id| answered.contains(id.as_str()))
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::test(flavor = "multi_thread")]
async fn every_message_is_answered_exactly_once_in_order_through_crashes_and_outages() {
    let seed: u64 = std::env::var("FAULTS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    println!("faults: seed={seed} (FAULTS_SEED={seed} replays the schedule)");
    let mut rng = StdRng::seed_from_u64(seed);

    // Its own homeserver: the chaos stops and restarts it, which other tests must not see.
    let mut synapse = DedicatedSynapse::start(None).await.expect("synapse starts");
    let hs = synapse.homeserver().clone();
    let mut stack = Stack::start(&hs, StackOptions::default())
        .await
        .expect("stack starts");
    let bot = stack.bot.user_id.clone();
    let mut rooms = Vec::new();
    for _ in 0..ROOMS {
        let user = hs
            .register(&e2e::unique("fuser"), false)
            .await
            .expect("register user");
        let room = e2e::open_dm(&user, &bot, TURN).await;
        rooms.push((Member::Plain(user), room));
    }
    // Element's way: the encrypted DM is created by its first message.
    let e2ee = Arc::new(
        E2eeUser::register(&hs, "fuser")
            .await
            .expect("register and log in"),
    );
    let (e2ee_room, e2ee_first) = e2ee
        .start_dm_with_first_message(&bot, "message 0 in the encrypted room")
        .await
        .expect("encrypted DM");
    e2ee.wait_joined(&e2ee_room, &bot, TURN)
        .await
        .expect("bot joins");
    rooms.push((Member::Encrypted(e2ee.clone()), e2ee_room.clone()));

    let start = Instant::now();
    let senders: Vec<_> = rooms
        .iter()
        .enumerate()
        .map(|(i, (member, room))| match member {
            Member::Plain(user) => {
                tokio::spawn(send_all(user.clone(), room.clone(), i, seed, start))
            }
            Member::Encrypted(user) => tokio::spawn(send_all_encrypted(
                user.clone(),
                room.clone(),
                e2ee_first.clone(),
                i,
                seed,
                start,
            )),
        })
        .collect();
    let window = PACE * (PER_ROOM as u32 - 2);
    let restarts = chaos(&mut stack, &mut synapse, &mut rng, window).await;
    let mut sent = Vec::new();
    for s in senders {
        sent.push(s.await.expect("sender task"));
    }
    let sent_at = Instant::now();
    eprintln!(
        "faults: all {} messages sent after {:?}",
        rooms.len() * PER_ROOM,
        start.elapsed()
    );

    // Wait for every reply, then a little longer so late duplicates show up too.
    let deadline = Instant::now() + DRAIN;
    loop {
        let mut done = true;
        for ((user, room), s) in rooms.iter().zip(&sent) {
            let (t, _) = timeline(user, room, &bot, s).await;
            done &= all_answered(&t);
        }
        if done || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!(
        "faults: drained {:?} after the last message",
        sent_at.elapsed()
    );
    tokio::time::sleep(Duration::from_secs(5)).await;

    let mut timelines = Vec::new();
    let mut latencies = Vec::new();
    let mut reply_ts = Vec::new();
    for ((user, room), s) in rooms.iter().zip(&sent) {
        let (t, events) = timeline(user, room, &bot, s).await;
        let ts: BTreeMap<&str, u64> = events
            .iter()
            .filter_map(|e| Some((e["event_id"].as_str()?, e["origin_server_ts"].as_u64()?)))
            .collect();
        let mut first_reply = BTreeMap::new();
        for m in t.bot.iter().filter(|m| m.is_text) {
            let Some(at) = ts.get(m.event_id.as_str()).copied() else {
                continue;
            };
            reply_ts.push(at);
            if let Some(to) = &m.answers {
                first_reply.entry(to.clone()).or_insert(at);
            }
        }
        for trigger in &t.triggers {
            if let (Some(sent), Some(replied)) =
                (ts.get(trigger.as_str()), first_reply.get(trigger))
            {
                latencies.push(replied.saturating_sub(*sent));
            }
        }
        timelines.push(t);
    }
    latencies.sort_unstable();
    reply_ts.sort_unstable();
    let report = check::check(&timelines);

    // Recovery: from each restart to the first reply after it.
    let mut longest = (0u64, "none", Duration::ZERO);
    for r in &restarts {
        let first = reply_ts.iter().find(|&&t| t >= r.at_ms).copied();
        let took = first.map_or(u64::MAX, |t| t - r.at_ms);
        if took >= longest.0 {
            longest = (took, r.what, r.t);
        }
    }

    // Files: each exactly once (by content) in its room's inbox.
    let mut file_problems = Vec::new();
    let mut files = 0;
    for ((user, room), s) in rooms.iter().zip(&sent) {
        let inbox = format!("{}/inbox", protocol::room_dir(user.user_id(), room));
        let mut stored: BTreeMap<String, usize> = BTreeMap::new();
        for f in stack.files_under(&inbox) {
            let bytes = std::fs::read(stack.workspace.join(&f)).expect("read inbox file");
            *stored.entry(sha256_hex(&bytes)).or_default() += 1;
        }
        for digest in s.iter().filter_map(|s| s.file.as_deref()) {
            files += 1;
            let n = stored.get(digest).copied().unwrap_or(0);
            if n != 1 {
                file_problems.push(format!("{inbox}: {digest} stored {n} times"));
            }
        }
    }

    let count = |what: &str| restarts.iter().filter(|r| r.what == what).count();
    let surface_kills = count("surface");
    let agent_kills = count("agent");
    let synapse_pauses = count("synapse-pause");
    let synapse_restarts = count("synapse-restart");
    println!(
        "messages={} encrypted_rooms=1 first_message_dms=1 surface_kills={surface_kills} agent_kills={agent_kills} {} synapse_pauses={synapse_pauses} synapse_restarts={synapse_restarts}",
        report.messages,
        report.summary()
    );
    println!(
        "faults: seed={seed} files={files} file_problems={} stray_replies={} latency_ms p50={} p99={} max={} longest_recovery_ms={} ({} restart at t={:?})",
        file_problems.len(),
        report.stray.len(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or_default(),
        if longest.0 == u64::MAX {
            "never".to_owned()
        } else {
            longest.0.to_string()
        },
        longest.1,
        longest.2,
    );

    let keep = std::env::temp_dir().join(format!("mxbridge-faults-{seed}"));
    let _ = std::fs::create_dir_all(&keep);
    let _ = std::fs::write(keep.join("surface.log"), stack.surface.log());
    let _ = std::fs::write(keep.join("agent.log"), stack.agent.log());
    let _ = std::fs::write(keep.join("homeserver.log"), synapse.log());
    eprintln!("faults: full logs kept in {}", keep.display());
    assert!(
        report.is_clean(),
        "delivery broken (seed {seed}): {}; first lost {:?} duplicated {:?} out of order {:?}",
        report.summary(),
        &report.lost[..report.lost.len().min(5)],
        &report.duplicate_replies[..report.duplicate_replies.len().min(5)],
        &report.out_of_order[..report.out_of_order.len().min(5)],
    );
    assert!(
        file_problems.is_empty(),
        "files (seed {seed}): {file_problems:#?}"
    );
    assert!(surface_kills >= SURFACE_KILLS && agent_kills >= AGENT_KILLS);
    assert!(synapse_pauses == 1 && synapse_restarts == 1);
    assert!(report.messages >= 300);
}
