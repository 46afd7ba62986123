//! Three agents sharing one PostgreSQL (issue 38): 20 chats (two of them encrypted DMs started by
//! their first message, as Element does), 15 messages each, while agents are SIGKILLed ten times
//! at random moments (turns holding a `sleep`, tool calls among them) and PostgreSQL is restarted
//! once. Afterwards every message has exactly one reply, in order; each chat's `history` counts
//! every message it was sent; a fact remembered in its first turn is recalled at its end, on
//! whichever agent runs it then; each file a chat wrote and sent reached the room exactly once
//! per request (two `note` turns, each writing and sending it).
//!
//! The schedule comes from one seed, printed at the start; `FAULTS_SEED=<n>` replays it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use e2e::check::{self, BotMessage, RoomTimeline};
use e2e::{Child, E2eeUser, Stack, StackOptions, User};
use protocol::ChatId;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::TURN;

const PLAIN_CHATS: usize = 18;
const ENCRYPTED_CHATS: usize = 2;
const PER_CHAT: usize = 15;
/// Time between two messages of one chat.
const PACE: Duration = Duration::from_millis(3000);
const AGENT_KILLS: usize = 10;
/// How long after the last message every reply must have arrived.
const DRAIN: Duration = Duration::from_secs(240);

/// What message `k` of chat `i` says (message 0 is sent when an encrypted DM is created).
fn text(i: usize, k: usize) -> String {
    match k {
        0 => format!("remember colour of chat {i} is teal-{i}"),
        3 | 7 | 11 => "sleep 1500".to_owned(),
        // Two tool calls in one turn: write_file, then send_file.
        5 | 9 => format!("note n{i}.txt written by chat {i}"),
        13 => "recall teal".to_owned(),
        14 => "history".to_owned(),
        _ => format!("message {k} in chat {i}"),
    }
}

#[derive(Clone)]
enum Member {
    Plain(User),
    Encrypted(Arc<E2eeUser>),
}

impl Member {
    async fn send(&self, room: &str, text: &str) -> anyhow::Result<String> {
        match self {
            Self::Plain(u) => u.send_text(room, text).await,
            Self::Encrypted(u) => u.send_text(room, text).await,
        }
    }

    /// The bot's messages in `room`: (event id, the event it answers, msgtype, bodies of it and
    /// of its edits).
    async fn bot_messages(&self, room: &str, bot: &str) -> Vec<(BotMessage, String)> {
        match self {
            Self::Plain(u) => {
                let events = u.messages(room).await.unwrap_or_default();
                let mut out: Vec<(BotMessage, String)> = Vec::new();
                for e in events.iter().filter(|e| e["sender"] == bot) {
                    let body = e["content"]["body"].as_str().unwrap_or_default().to_owned();
                    let new = e["content"]["m.new_content"]["body"].as_str();
                    let edited = e["content"]["m.relates_to"]["event_id"].as_str();
                    match (new, edited) {
                        (Some(new), Some(of)) => {
                            if let Some((_, b)) = out.iter_mut().find(|(m, _)| m.event_id == of) {
                                b.push('\n');
                                b.push_str(new);
                            }
                        }
                        _ => out.push((BotMessage::from_event(e), body)),
                    }
                }
                out
            }
            Self::Encrypted(u) => {
                let msgs = u.messages_from(room, bot).await.unwrap_or_default();
                let mut out: Vec<(BotMessage, String)> = Vec::new();
                for m in msgs {
                    if let Some(of) = &m.replaces {
                        if let Some((_, b)) = out.iter_mut().find(|(x, _)| &x.event_id == of) {
                            b.push('\n');
                            b.push_str(&m.body);
                        }
                        continue;
                    }
                    let message = BotMessage {
                        event_id: m.event_id.clone(),
                        answers: m.in_reply_to.clone().or(m.thread_root.clone()),
                        is_text: m.msgtype == "m.text",
                    };
                    out.push((message, format!("{}\t{}", m.msgtype, m.body)));
                }
                out
            }
        }
    }
}

/// One chat: who talks in it, its room, what was sent.
struct Chat {
    member: Member,
    room: String,
    sent: Vec<String>,
}

async fn send_chat(
    member: Member,
    room: String,
    i: usize,
    first: Option<String>,
    start: Instant,
) -> Vec<String> {
    let mut sent = Vec::with_capacity(PER_CHAT);
    sent.extend(first);
    for k in sent.len()..PER_CHAT {
        tokio::time::sleep_until((start + PACE * k as u32).into()).await;
        let event_id = loop {
            match member.send(&room, &text(i, k)).await {
                Ok(id) => break id,
                Err(e) => {
                    eprintln!("pg_failover: send {k} in chat {i} failed ({e:#}); trying again");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        sent.push(event_id);
    }
    sent
}

/// Kills a random agent `AGENT_KILLS` times and restarts PostgreSQL once, spread over `window`.
async fn chaos(agents: &mut [&mut Child], rng: &mut StdRng, window: Duration) -> usize {
    let faults = AGENT_KILLS + 1;
    let pg_at = rng.random_range(2..faults);
    let slot = window / (faults as u32 + 1);
    let start = Instant::now();
    let mut kills = 0;
    for n in 0..faults {
        let jitter = rng.random_range(0..slot.as_millis() as u64 / 2);
        let at = start + slot * (n as u32 + 1) + Duration::from_millis(jitter) - slot / 4;
        tokio::time::sleep_until(at.into()).await;
        if n == pg_at {
            eprintln!("pg_failover: t={:?} restarting PostgreSQL", start.elapsed());
            tokio::task::spawn_blocking(e2e::postgres::restart)
                .await
                .expect("restart task")
                .expect("PostgreSQL restarts");
            continue;
        }
        let which = rng.random_range(0..agents.len());
        let down = rng.random_range(300..2000);
        eprintln!(
            "pg_failover: t={:?} SIGKILL agent {which}, down {down} ms",
            start.elapsed()
        );
        agents[which].kill9().await;
        tokio::time::sleep(Duration::from_millis(down)).await;
        agents[which].start().expect("restart agent");
        kills += 1;
    }
    kills
}

fn ran_on(log: &str, chat: &ChatId) -> bool {
    let needle = format!("chat_id={chat}");
    log.lines()
        .any(|l| l.contains("turn starts") && l.contains(&needle))
}

/// The stack on the database `url` with two more agents, the surface routing over all three.
async fn three_agents(hs: &e2e::Homeserver, url: String) -> (Stack, Child, Child) {
    let mut opts = StackOptions::default();
    opts.agent_env.insert("AGENT_DATABASE_URL".into(), url);
    let mut stack = Stack::start(hs, opts).await.expect("stack");
    let (b, b_url) = stack.start_another_agent("agent-b").await.expect("agent B");
    let (c, c_url) = stack.start_another_agent("agent-c").await.expect("agent C");
    let a_url = stack.agent_ws();
    stack.surface.stop().await;
    stack
        .surface
        .set_env("AGENT_URL", Some(&format!("{a_url},{b_url},{c_url}")));
    stack.surface.start().expect("surface with three agents");
    stack.wait_surface_healthy().await;
    (stack, b, c)
}

/// The plain DMs (each a user of its own) and the encrypted ones, started by their first
/// message: (member, room, that first message).
async fn open_chats(hs: &e2e::Homeserver, bot: &str) -> Vec<(Member, String, Option<String>)> {
    let mut chats = futures_util::future::join_all((0..PLAIN_CHATS).map(|_| async move {
        let user = hs.register(&e2e::unique("pgf"), false).await.expect("user");
        let room = e2e::open_dm(&user, bot, TURN).await;
        (Member::Plain(user), room, None)
    }))
    .await;
    for i in PLAIN_CHATS..PLAIN_CHATS + ENCRYPTED_CHATS {
        let user = Arc::new(E2eeUser::register(hs, "pgfe").await.expect("e2ee user"));
        let (room, first) = user
            .start_dm_with_first_message(bot, &text(i, 0))
            .await
            .expect("encrypted DM");
        user.wait_joined(&room, bot, TURN).await.expect("bot joins");
        chats.push((Member::Encrypted(user), room, Some(first)));
    }
    chats
}

/// Waits until every message has a reply (or `DRAIN` passed), then a little longer so late
/// duplicates show up too.
async fn drain(chats: &[Chat], bot: &str) {
    let deadline = Instant::now() + DRAIN;
    loop {
        let mut timelines = Vec::new();
        for chat in chats {
            let bot_msgs = chat.member.bot_messages(&chat.room, bot).await;
            timelines.push(RoomTimeline {
                triggers: chat.sent.clone(),
                bot: bot_msgs.into_iter().map(|(m, _)| m).collect(),
            });
        }
        if check::check(&timelines).lost.is_empty() || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
}

/// What the chats show after the run.
#[derive(Default)]
struct Tally {
    timelines: Vec<RoomTimeline>,
    history_ok: usize,
    recalled: usize,
    files_once: usize,
    moved: usize,
}

/// Reads every chat's replies: its `history` count, its recall, its files, and whether its
/// turns ran on more than one agent (`logs`).
async fn tally(chats: &[Chat], bot: &str, logs: &[String]) -> Tally {
    let mut t = Tally::default();
    for (i, chat) in chats.iter().enumerate() {
        let msgs = chat.member.bot_messages(&chat.room, bot).await;
        let reply = |k: usize| -> String {
            msgs.iter()
                .filter(|(m, _)| m.is_text && m.answers.as_deref() == Some(&chat.sent[k]))
                .map(|(_, body)| body.clone())
                .collect::<Vec<_>>()
                .join("\n")
        };
        if reply(14).contains(&format!("{} earlier turn(s)", PER_CHAT - 1)) {
            t.history_ok += 1;
        } else {
            eprintln!("pg_failover: chat {i} history: {:?}", reply(14));
        }
        if reply(13).contains(&format!("teal-{i}")) {
            t.recalled += 1;
        } else {
            eprintln!("pg_failover: chat {i} recall: {:?}", reply(13));
        }
        let file = format!("n{i}.txt");
        let posted = msgs
            .iter()
            .filter(|(m, body)| !m.is_text && body.ends_with(&file) && !body.contains('⚠'))
            .count();
        if posted == 2 {
            t.files_once += 1;
        } else {
            let bodies: Vec<_> = msgs
                .iter()
                .filter(|(m, _)| !m.is_text)
                .map(|(_, b)| b)
                .collect();
            eprintln!("pg_failover: chat {i}: {file} posted {posted} times, not 2: {bodies:?}");
        }
        let id = ChatId::for_conversation(&chat.room, None);
        if logs.iter().filter(|l| ran_on(l, &id)).count() > 1 {
            t.moved += 1;
        }
        t.timelines.push(RoomTimeline {
            triggers: chat.sent.clone(),
            bot: msgs.into_iter().map(|(m, _)| m).collect(),
        });
    }
    t
}

#[tokio::test(flavor = "multi_thread")]
async fn three_agents_on_postgres_lose_nothing_through_kills_and_a_database_restart() {
    let Some(url) = e2e::postgres::scratch_database("e2e")
        .await
        .expect("database")
    else {
        return;
    };
    let seed: u64 = std::env::var("FAULTS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random());
    println!("pg_failover: seed={seed} (FAULTS_SEED={seed} replays the schedule)");
    let mut rng = StdRng::seed_from_u64(seed);
    // The database password, which no log line may show.
    let password = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('@'))
        .and_then(|(userinfo, _)| userinfo.split_once(':'))
        .map(|(_, p)| p.to_owned())
        .unwrap_or_default();
    let hs = e2e::Homeserver::from_env();
    let (mut stack, mut b, mut c) = three_agents(&hs, url).await;
    let bot = stack.bot.user_id.clone();
    let chats = open_chats(&hs, &bot).await;

    let start = Instant::now();
    let senders: Vec<_> = chats
        .iter()
        .enumerate()
        .map(|(i, (m, room, first))| {
            tokio::spawn(send_chat(m.clone(), room.clone(), i, first.clone(), start))
        })
        .collect();
    let window = PACE * (PER_CHAT as u32 - 1);
    let kills = {
        let mut agents = [&mut stack.agent, &mut b, &mut c];
        chaos(&mut agents, &mut rng, window).await
    };
    let mut sent_chats = Vec::new();
    for ((member, room, _), s) in chats.into_iter().zip(senders) {
        let sent = s.await.expect("sender");
        sent_chats.push(Chat { member, room, sent });
    }
    eprintln!("pg_failover: all messages sent after {:?}", start.elapsed());
    drain(&sent_chats, &bot).await;

    let logs = [stack.agent.log(), b.log(), c.log()];
    let t = tally(&sent_chats, &bot, &logs).await;
    let report = check::check(&t.timelines);
    let n = PLAIN_CHATS + ENCRYPTED_CHATS;
    // Every lease taken over from a killed agent is logged with its chat and the turn it runs.
    let takeovers: Vec<&str> = logs
        .iter()
        .flat_map(|l| l.lines())
        .filter(|l| l.contains("took the chat's lease over"))
        .collect();
    for line in &takeovers {
        assert!(
            line.contains("chat_id=")
                && line.contains("turn_id=")
                && line.contains("previous_holder="),
            "{line}"
        );
    }
    println!(
        "pg_failover: chats={n} messages={} agent_kills={kills} postgres_restarts=1 \
         moved_chats={} lease_takeovers={} {} history_ok={} recalled={} \
         files_sent_once_per_request={}",
        report.messages,
        t.moved,
        takeovers.len(),
        report.summary(),
        t.history_ok,
        t.recalled,
        t.files_once
    );
    if !report.is_clean() || (t.history_ok, t.recalled, t.files_once) != (n, n, n) {
        // The whole logs, for the ids of what went wrong (a dump shows only their tails).
        let dir = std::env::temp_dir().join(format!("mxbridge-pg-failover-{seed}"));
        let _ = std::fs::create_dir_all(&dir);
        for (name, log) in ["agent-0", "agent-1", "agent-2"].iter().zip(&logs) {
            let _ = std::fs::write(dir.join(format!("{name}.log")), log);
        }
        let _ = std::fs::write(dir.join("surface.log"), stack.surface.log());
        eprintln!("pg_failover: logs kept in {}", dir.display());
    }
    assert!(report.is_clean(), "{report:#?}");
    assert_eq!(report.messages, n * PER_CHAT);
    assert_eq!(kills, AGENT_KILLS);
    assert_eq!((t.history_ok, t.recalled, t.files_once), (n, n, n));
    assert!(
        t.moved > 0,
        "no chat ran on more than one agent: the kills moved nothing"
    );
    assert!(password.len() >= 8, "the test database has a password");
    for log in logs.iter().chain([&stack.surface.log()]) {
        assert!(
            !log.contains(&password),
            "a log shows the database password"
        );
    }
}
