//! ACP agents that are broken or hostile (`acp_hostile.py`, plain JSON-RPC on stdio): each
//! ends the turn with one clear sentence for the room (the `end`'s error) and a log line, other
//! chats go on, nothing escapes the chat's folder, and no process is left behind.

use std::path::Path;
use std::time::{Duration, Instant};

use agent::config::{AcpConfig, BrainConfig, Config, Policy};
use protocol::{ChatId, EndStatus, ToSurface, UserMessage};

use crate::support::*;

/// The agent's settings for `acp_hostile.py MODE` (a short start timeout).
fn hostile(mode: &'static str) -> impl FnOnce(&mut Config) {
    move |c: &mut Config| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/acp_hostile.py");
        let mut acp = AcpConfig::new(
            "python3",
            vec![script.display().to_string(), mode.to_owned()],
        );
        acp.start_timeout = Duration::from_secs(3);
        c.brain = BrainConfig::Acp(acp);
    }
}

/// A chat of its own (its folder name contains `name`).
fn chat_named(name: &str) -> (ChatId, String) {
    let room = format!("!{name}:test.local");
    (ChatId::for_conversation(&room, None), room)
}

fn in_room(room: &str, seq: u64, id: &str, text: &str) -> UserMessage {
    let mut m = message(seq, id, text);
    m.room_id = room.to_owned();
    m
}

/// One turn of `mode` in a fresh agent: its transcript.
async fn one_turn(mode: &'static str, tweak: impl FnOnce(&mut Config)) -> (TestAgent, Transcript) {
    let agent = TestAgent::start_with(|c| {
        hostile(mode)(c);
        tweak(c);
    })
    .await;
    let (chat, room) = chat_named(mode);
    let (mut c, _) = agent.connect(&chat).await;
    let t = c.turn(in_room(&room, 1, "$h1", "go")).await;
    (agent, t)
}

fn failed_with(t: &Transcript, words: &str) {
    let end = t.end();
    assert_eq!(end.status, EndStatus::Failed, "{t:?}");
    let error = end.error.as_deref().unwrap_or_default();
    assert!(error.contains(words), "{error:?} says {words:?}");
    assert!(
        !error.contains('\n') && error.len() < 400,
        "one sentence: {error:?}"
    );
}

/// Processes whose command line has `needle`.
fn processes_with(needle: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            e.file_name().to_str()?.parse::<u32>().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            cmdline.contains(needle).then_some(cmdline)
        })
        .collect()
}

/// Zombie children of this test process (the agent runs in it) that were hostile agents (the
/// script names itself `acp_hostile`: other tests' Python children are not this test's).
fn zombies() -> Vec<String> {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let fields: Vec<&str> = stat.rsplit(')').next()?.split_whitespace().collect();
            let ours = stat.contains("(acp_hostile)");
            (ours && fields.first() == Some(&"Z") && fields.get(1) == Some(&me.as_str()))
                .then_some(stat)
        })
        .collect()
}

async fn gone(mut agent: TestAgent, mode: &str) {
    agent.stop().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    let needle = format!("acp_hostile.py {mode}");
    // A killed child is reaped by the runtime soon after; other tests' children come and go.
    while (!processes_with(&needle).is_empty() || !zombies().is_empty())
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        processes_with(&needle),
        Vec::<String>::new(),
        "left running"
    );
    assert_eq!(zombies(), Vec::<String>::new(), "left as zombies");
}

#[tokio::test]
async fn an_agent_that_never_answers_initialize_fails_in_one_sentence() {
    let (agent, t) = one_turn("mute", |_| {}).await;
    failed_with(
        &t,
        "the agent could not start: the agent did not answer initialize in time",
    );
    gone(agent, "mute").await;
}

#[tokio::test]
async fn an_agent_that_exits_at_once_fails_in_one_sentence() {
    let (agent, t) = one_turn("exit", |_| {}).await;
    failed_with(
        &t,
        "the agent could not start: it exited or closed its output",
    );
    gone(agent, "exit").await;
}

#[tokio::test]
async fn an_agent_printing_what_is_not_json_is_named_for_it() {
    let (agent, t) = one_turn("noise", |_| {}).await;
    failed_with(&t, "it printed text that is not JSON: \"this is not JSON\"");
    gone(agent, "noise").await;
}

#[tokio::test]
async fn a_flood_of_notifications_ends_in_the_answer() {
    let (agent, t) = one_turn("flood", |_| {}).await;
    assert_eq!(t.end().status, EndStatus::Completed, "{:?}", t.end());
    assert_eq!(t.text(), "done after the flood");
    gone(agent, "flood").await;
}

#[tokio::test]
async fn a_50_mb_message_ends_the_connection_not_the_agent() {
    let (agent, t) = one_turn("huge", |_| {}).await;
    failed_with(&t, "the agent sent a message larger than 8 MiB");
    assert_eq!(
        t.notices()
            .iter()
            .filter(|n| n.contains("The agent stopped"))
            .count(),
        1,
        "tried again once, and said so: {:?}",
        t.notices()
    );
    gone(agent, "huge").await;
}

#[tokio::test]
async fn file_requests_reach_only_the_chats_own_folder() {
    let agent = TestAgent::start_with(hostile("escape")).await;
    write(
        agent.workspace.path(),
        "chats/another-chat/secret.txt",
        b"not yours",
    );
    let (chat, room) = chat_named("escape");
    let (mut c, _) = agent.connect(&chat).await;
    let t = c.turn(in_room(&room, 1, "$e1", "go")).await;
    assert_eq!(t.end().status, EndStatus::Completed, "{:?}", t.end());
    let text = t.text();
    assert_eq!(text.matches("refused").count(), 3, "{text}");
    assert!(text.contains("write own: ok"), "{text}");
    assert!(!agent.ws_path("chats/escaped.txt").exists());
    let own = agent.ws_path(&format!("{}/mine.txt", protocol::chat_dir(&chat)));
    assert_eq!(std::fs::read(own).unwrap(), b"in my folder");
    gone(agent, "escape").await;
}

#[tokio::test]
async fn a_permission_the_policy_denies_is_rejected_without_asking() {
    let deny = |c: &mut Config| {
        c.tool_policy
            .insert("acp__execute".to_owned(), Policy::Deny);
    };
    let (agent, t) = one_turn("ask", deny).await;
    assert_eq!(t.end().status, EndStatus::Completed, "{:?}", t.end());
    assert_eq!(t.text(), "permission: selected no");
    assert!(
        !t.messages
            .iter()
            .any(|m| matches!(m, ToSurface::ApprovalRequest(_))),
        "nobody was asked"
    );
    assert_eq!(t.tool_calls(), vec!["rm -rf /"], "the call is shown");
    gone(agent, "ask").await;

    let allow = |c: &mut Config| {
        c.tool_policy.insert("acp__*".to_owned(), Policy::Allow);
    };
    let (agent, t) = one_turn("ask", allow).await;
    assert_eq!(t.text(), "permission: selected yes");
    gone(agent, "ask").await;
}

#[tokio::test]
async fn a_stuck_agent_does_not_hold_up_another_chat() {
    let agent = TestAgent::start_with(|c| {
        hostile("mute")(c);
        if let BrainConfig::Acp(a) = &mut c.brain {
            // Longer than the test client waits for a message: were the good chat's turn held
            // up behind it, its `turn` would fail.
            a.start_timeout = DEADLINE * 3;
        }
    })
    .await;
    let (stuck, stuck_room) = chat_named("stuck");
    let (mut s, _) = agent.connect(&stuck).await;
    s.submit(in_room(&stuck_room, 1, "$s1", "go")).await;
    let (good, good_room) = chat_named("good");
    let (mut g, _) = agent.connect(&good).await;
    let t = g.turn(in_room(&good_room, 1, "$g1", "hi")).await;
    assert_eq!(t.text(), "hello from a good agent");
    gone(agent, "mute").await;
}

#[tokio::test]
async fn a_cancelled_turn_cancels_the_agents_prompt() {
    let agent = TestAgent::start_with(hostile("slow")).await;
    let (chat, room) = chat_named("slow");
    let (mut c, _) = agent.connect(&chat).await;
    c.submit(in_room(&room, 1, "$c1", "go")).await;
    c.until(|m| matches!(m, ToSurface::TextChunk(t) if t.text == "working"))
        .await;
    c.send(protocol::Cancel {
        turn: "$c1".to_owned(),
    })
    .await;
    let t = c.until_end("$c1").await;
    assert_eq!(t.end().status, EndStatus::Cancelled, "{:?}", t.end());
    let marker = agent.ws_path(&format!("{}/cancelled", protocol::chat_dir(&chat)));
    let deadline = Instant::now() + DEADLINE;
    while !marker.exists() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(marker.exists(), "the agent got session/cancel");
    gone(agent, "slow").await;
}

/// Processes of `acp_hostile.py good`.
fn good_agents() -> usize {
    processes_with("acp_hostile.py good").len()
}

#[tokio::test]
async fn sessions_are_capped_and_idle_ones_closed() {
    let agent = TestAgent::start_with(|c| {
        hostile("good")(c);
        if let BrainConfig::Acp(a) = &mut c.brain {
            a.max_sessions = 1;
            a.idle = Duration::from_secs(1);
        }
    })
    .await;
    for name in ["good-one", "good-two"] {
        let (chat, room) = chat_named(name);
        let (mut c, _) = agent.connect(&chat).await;
        let t = c.turn(in_room(&room, 1, "$g", "hi")).await;
        assert_eq!(t.text(), "hello from a good agent");
        // One process at a time: the first chat's was closed to make room for the second's.
        assert_eq!(good_agents(), 1, "{:?}", processes_with("acp_hostile.py"));
    }
    // Idle past AGENT_ACP_IDLE (checked every second here): closed.
    let deadline = Instant::now() + DEADLINE;
    while good_agents() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(good_agents(), 0, "the idle session was closed");
    gone(agent, "good").await;
}
