//! The memory tools through the builtin brain: facts remembered in one turn are recalled in
//! later ones and after a restart, per user and per room, forgotten on request, and governed
//! by the tool policy like every tool.

use agent::config::Policy;
use protocol::{ApprovalDecision, ChatId, Decision, EndStatus, ToSurface, UserMessage};

use crate::support::*;

const BOB: &str = "@bob:test.local";

/// A message of `user` in [`ROOM`].
fn from(user: &str, seq: u64, id: &str, text: &str) -> UserMessage {
    let mut m = message(seq, id, text);
    m.sender.user_id = user.to_owned();
    m.sender.display_name = None;
    m
}

/// The text of a completed turn.
async fn say(c: &mut Client, m: UserMessage) -> String {
    let t = c.turn(m).await;
    assert_eq!(t.end().status, EndStatus::Completed, "{}", t.text());
    t.text()
}

#[tokio::test]
async fn remember_then_recall_in_a_later_turn() {
    let agent = TestAgent::start().await;
    let (mut c, _) = agent.connect(&chat()).await;
    let t = c.turn(message(1, "$m1", "remember I like green tea")).await;
    assert_eq!(t.tool_calls(), ["remember"]);
    assert!(t.text().contains("Remembered as u1."), "{}", t.text());

    let text = say(&mut c, message(2, "$m2", "recall")).await;
    assert!(text.contains("`u1` (yours): `I like green tea`"), "{text}");
    let text = say(&mut c, message(3, "$m3", "recall GREEN")).await;
    assert!(text.contains("`I like green tea`"), "{text}");
    let text = say(&mut c, message(4, "$m4", "recall coffee")).await;
    assert!(
        text.contains("I remember nothing containing `coffee`"),
        "{text}"
    );
    // Saying it again stores nothing new.
    let text = say(&mut c, message(5, "$m5", "remember  I like green tea ")).await;
    assert!(text.contains("Already remembered as u1."), "{text}");
}

#[tokio::test]
async fn facts_survive_a_restart() {
    let mut agent = TestAgent::start().await;
    {
        let (mut c, _) = agent.connect(&chat()).await;
        say(&mut c, message(1, "$r1", "remember my desk is 4.12")).await;
        say(
            &mut c,
            message(2, "$r2", "remember room the wifi is guest-5"),
        )
        .await;
    }
    agent.restart().await;
    let (mut c, _) = agent.connect(&chat()).await;
    let text = say(&mut c, message(3, "$r3", "recall")).await;
    assert!(text.contains("`u1` (yours): `my desk is 4.12`"), "{text}");
    assert!(
        text.contains("`r1` (this room): `the wifi is guest-5`"),
        "{text}"
    );

    // On disk: one file per scope, named by a hash, never by the Matrix id.
    let dir = agent.state.path().join("memory");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names.len(), 2, "{names:?}");
    for name in &names {
        let hash = name.strip_suffix(".json").unwrap();
        assert!(
            hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit()),
            "{name}"
        );
    }
}

#[tokio::test]
async fn user_facts_stay_private_room_facts_are_shared() {
    let agent = TestAgent::start().await;
    let (mut c, _) = agent.connect(&chat()).await;
    say(
        &mut c,
        from(USER, 1, "$p1", "remember my locker code is 1234"),
    )
    .await;
    say(
        &mut c,
        from(USER, 2, "$p2", "remember room standup is at ten"),
    )
    .await;

    let text = say(&mut c, from(BOB, 3, "$p3", "recall")).await;
    assert!(
        text.contains("`r1` (this room): `standup is at ten`"),
        "{text}"
    );
    assert!(!text.contains("locker"), "Bob sees Alice's fact: {text}");
    let text = say(&mut c, from(BOB, 4, "$p4", "recall locker")).await;
    assert!(text.contains("I remember nothing"), "{text}");
    // Bob cannot forget Alice's `u1`: in his memory there is none.
    let text = say(&mut c, from(BOB, 5, "$p5", "forget u1")).await;
    assert!(
        text.contains("no remembered fact has the id \"u1\""),
        "{text}"
    );
    // Bob's own facts are numbered in his own memory.
    let text = say(&mut c, from(BOB, 6, "$p6", "remember I prefer tea")).await;
    assert!(text.contains("Remembered as u1."), "{text}");

    let text = say(&mut c, from(USER, 7, "$p7", "recall")).await;
    assert!(text.contains("`my locker code is 1234`"), "{text}");
    assert!(text.contains("`standup is at ten`"), "{text}");
    assert!(!text.contains("tea"), "Alice sees Bob's fact: {text}");

    // A thread is a chat of its own, but the room's memory is the room's.
    drop(c);
    let thread = ChatId::for_conversation(ROOM, Some("$root"));
    let (mut t, _) = agent.connect(&thread).await;
    let mut m = from(BOB, 1, "$t1", "recall");
    m.thread_root = Some("$root".to_owned());
    let text = say(&mut t, m).await;
    assert!(
        text.contains("`r1` (this room): `standup is at ten`"),
        "{text}"
    );
    assert!(text.contains("`I prefer tea`"), "{text}");
}

#[tokio::test]
async fn forget_removes_a_fact() {
    let agent = TestAgent::start().await;
    let (mut c, _) = agent.connect(&chat()).await;
    say(&mut c, message(1, "$f1", "remember the cat is called Miso")).await;
    say(&mut c, message(2, "$f2", "remember room lunch is at noon")).await;
    let t = c.turn(message(3, "$f3", "forget u1")).await;
    assert_eq!(t.tool_calls(), ["forget"]);
    assert!(t.text().contains("Forgot `u1`."), "{}", t.text());
    let text = say(&mut c, message(4, "$f4", "recall")).await;
    assert!(!text.contains("Miso"), "{text}");
    assert!(
        text.contains("`r1` (this room): `lunch is at noon`"),
        "{text}"
    );
    let text = say(&mut c, message(5, "$f5", "forget r1")).await;
    assert!(text.contains("Forgot `r1`."), "{text}");
    let text = say(&mut c, message(6, "$f6", "recall")).await;
    assert!(text.contains("I remember nothing"), "{text}");

    // Unknown ids and ids that are no ids are refused in words.
    for (seq, id) in [(7, "u1"), (8, "m1"), (9, "../../etc")] {
        let text = say(
            &mut c,
            message(seq, &format!("$f{seq}"), &format!("forget {id}")),
        )
        .await;
        assert!(text.contains("I could not forget"), "{text}");
        assert!(text.contains("no remembered fact has the id"), "{text}");
    }
    // A forgotten number is not given out again.
    let text = say(
        &mut c,
        message(10, "$f10", "remember the dog is called Udon"),
    )
    .await;
    assert!(text.contains("Remembered as u2."), "{text}");
}

#[tokio::test]
async fn a_denied_policy_refuses() {
    let agent = TestAgent::start_with(|c| {
        c.tool_policy.insert("remember".into(), Policy::Deny);
        c.tool_policy.insert("recall".into(), Policy::Deny);
    })
    .await;
    let (mut c, _) = agent.connect(&chat()).await;
    let text = say(&mut c, message(1, "$d1", "remember I like tea")).await;
    assert!(
        text.contains("I could not remember that: remember is not allowed by the agent's policy"),
        "{text}"
    );
    let text = say(&mut c, message(2, "$d2", "recall")).await;
    assert!(
        text.contains("I could not recall: recall is not allowed"),
        "{text}"
    );
    let stored = std::fs::read_dir(agent.state.path().join("memory"))
        .unwrap()
        .count();
    assert_eq!(stored, 0, "nothing was stored");
}

#[tokio::test]
async fn an_ask_policy_asks_with_the_scope_as_resource() {
    let agent = TestAgent::start_with(|c| {
        c.tool_policy.insert("remember".into(), Policy::Ask);
    })
    .await;
    let (mut c, _) = agent.connect(&chat()).await;
    c.submit(message(1, "$a1", "remember room the door code is 9876"))
        .await;
    let asked = c
        .until(|m| matches!(m, ToSurface::ApprovalRequest(_)))
        .await;
    let Some(ToSurface::ApprovalRequest(r)) = asked.messages.last() else {
        unreachable!()
    };
    assert_eq!(r.tool, "remember");
    assert_eq!(r.resource, "memory:room");
    c.send(ApprovalDecision {
        request_id: r.request_id.clone(),
        decision: Decision::Deny,
        by: USER.into(),
    })
    .await;
    let text = c.until_end("$a1").await.text();
    assert!(text.contains("I could not remember that"), "{text}");
    let text = say(&mut c, message(2, "$a2", "recall")).await;
    assert!(text.contains("I remember nothing"), "{text}");
}
