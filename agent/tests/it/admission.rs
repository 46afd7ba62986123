//! Admission by message id: a new id runs whatever its (plausible) seq, a stored id is not run
//! twice, an implausible seq is refused with an error and leaves the chat usable.

use protocol::{ErrorCode, ToSurface};

use crate::support::*;

/// Sends `msg` and expects an `error` (not an ack) naming its id.
async fn refused(c: &mut Client, msg: protocol::UserMessage) -> String {
    let id = msg.id.clone();
    c.send(msg).await;
    match c.expect().await {
        ToSurface::Error(e) => {
            assert_eq!(e.code, ErrorCode::BadMessage);
            assert!(e.message.contains(&id), "{}", e.message);
            e.message
        }
        other => panic!("expected error, got {other:?}"),
    }
}

/// The chat's stored turns (the `turn` lines of its log), in stored order.
fn stored_turns(agent: &TestAgent) -> Vec<serde_json::Value> {
    let path = agent.state.path().join(format!("chats/{}.jsonl", chat()));
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|l| l["type"] == "turn")
        .collect()
}

/// The ids of the chat's stored turns, in stored order.
fn stored_ids(agent: &TestAgent) -> Vec<String> {
    stored_turns(agent)
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_huge_seq_is_refused_and_the_chat_goes_on_also_after_restart() {
    let mut agent = TestAgent::start().await;
    {
        let (mut c, _) = agent.connect(&chat()).await;
        c.turn(message(1, "$m1", "hello agent")).await;
        let why = refused(&mut c, message(u64::MAX, "$huge", "poison")).await;
        assert!(why.contains(&u64::MAX.to_string()), "{why}");
        // Far ahead of the last stored seq, and 0, are refused too.
        refused(
            &mut c,
            message(2 + agent::chat::MAX_SEQ_AHEAD, "$far", "far"),
        )
        .await;
        refused(&mut c, message(0, "$zero", "zero")).await;

        let t = c.turn(message(2, "$m2", "history")).await;
        assert!(t.text().contains("1 earlier turn(s)"), "{}", t.text());
        assert!(!t.text().contains("poison"), "{}", t.text());
    }
    assert_eq!(stored_ids(&agent), ["$m1", "$m2"]);

    agent.restart().await;
    let (mut c, welcome) = agent.connect(&chat()).await;
    assert_eq!(welcome.last_seq, 2, "the refused seq left no trace");
    let t = c.turn(message(3, "$m3", "history")).await;
    assert!(t.text().contains("2 earlier turn(s)"), "{}", t.text());

    // Refused again after the restart; the next sane message still runs.
    refused(&mut c, message(u64::MAX, "$huge", "poison")).await;
    let t = c.turn(message(4, "$m4", "history")).await;
    assert!(t.text().contains("3 earlier turn(s)"), "{}", t.text());
    // Nothing was stored under the refused id: sent again with a sane seq, it is new.
    let t = c.turn(message(5, "$huge", "hello again")).await;
    assert!(
        t.text().contains("I received your message: `hello again`"),
        "{}",
        t.text()
    );
    assert_eq!(stored_ids(&agent), ["$m1", "$m2", "$m3", "$m4", "$huge"]);
    let (_c2, welcome) = agent.connect(&chat()).await;
    assert_eq!(welcome.last_seq, 5);
}

#[tokio::test]
async fn a_chat_poisoned_by_an_older_agent_runs_new_messages_again() {
    let mut agent = TestAgent::start().await;
    {
        let (mut c, _) = agent.connect(&chat()).await;
        c.turn(message(1, "$m1", "hello agent")).await;
    }
    agent.stop().await;
    // What an agent that admitted by seq left behind after a turn with seq u64::MAX, in the
    // single-record format of those agents.
    let mut turn = stored_turns(&agent).remove(0);
    turn.as_object_mut().unwrap().remove("type");
    turn["seq"] = u64::MAX.into();
    turn["status"] = "completed".into();
    let record = serde_json::json!({
        "version": 1,
        "chat_id": chat().to_string(),
        "room_id": ROOM,
        "last_seq": u64::MAX,
        "turns": [turn],
    });
    let chats = agent.state.path().join("chats");
    std::fs::remove_file(chats.join(format!("{}.jsonl", chat()))).unwrap();
    std::fs::write(
        chats.join(format!("{}.json", chat())),
        serde_json::to_vec(&record).unwrap(),
    )
    .unwrap();

    agent.restart().await;
    let (mut c, welcome) = agent.connect(&chat()).await;
    assert_eq!(
        welcome.last_seq, 0,
        "the absurd seq is not reported as stored"
    );
    let t = c.turn(message(2, "$m2", "history")).await;
    assert!(t.text().contains("1 earlier turn(s)"), "{}", t.text());
    refused(&mut c, message(u64::MAX, "$huge", "poison")).await;
    assert_eq!(stored_ids(&agent), ["$m1", "$m2"]);
}

#[tokio::test]
async fn a_new_id_reusing_an_old_seq_is_stored_and_run() {
    let mut agent = TestAgent::start().await;
    let (mut c, _) = agent.connect(&chat()).await;
    c.turn(message(1, "$m1", "first")).await;
    c.turn(message(2, "$m2", "second")).await;

    // The same seq as the last stored one, then a lower one: fresh acks, and both run.
    let t = c.turn(message(2, "$r2", "history")).await;
    assert!(t.text().contains("2 earlier turn(s)"), "{}", t.text());
    let t = c.turn(message(1, "$r1", "history")).await;
    assert!(t.text().contains("3 earlier turn(s)"), "{}", t.text());
    drop(c);

    // Stored in arrival order; last_seq is still the highest stored seq.
    assert_eq!(stored_ids(&agent), ["$m1", "$m2", "$r2", "$r1"]);
    agent.restart().await;
    let (mut c, welcome) = agent.connect(&chat()).await;
    assert_eq!(welcome.last_seq, 2);
    let t = c.turn(message(3, "$m3", "history")).await;
    let text = t.text();
    assert!(text.contains("4 earlier turn(s)"), "{text}");
    let order: Vec<usize> = [(1, "first"), (2, "second"), (2, "history"), (1, "history")]
        .iter()
        .map(|(seq, said)| {
            let line = format!("#{seq} Alice ({USER}): {said}");
            text.find(&line)
                .unwrap_or_else(|| panic!("{line:?} missing: {text}"))
        })
        .collect();
    assert!(order.is_sorted(), "history in arrival order: {text}");
}

#[tokio::test]
async fn the_same_id_resent_is_not_run_twice() {
    let mut agent = TestAgent::start().await;
    let (mut c, _) = agent.connect(&chat()).await;
    let first = c.turn(message(1, "$m1", "hello agent")).await;

    // Resent with its seq, and with another (even an implausible) one: duplicates.
    for seq in [1, 7, u64::MAX] {
        let ack = c.submit(message(seq, "$m1", "hello agent")).await;
        assert!(ack.duplicate, "seq {seq}");
    }
    let t = c.turn(message(2, "$m2", "history")).await;
    assert!(t.text().contains("1 earlier turn(s)"), "{}", t.text());
    for m in &t.messages {
        if let ToSurface::TextChunk(chunk) = m {
            assert_eq!(chunk.turn, "$m2", "nothing from a second run of $m1");
        }
    }
    drop(c);

    // After a restart, a resend replays the stored answer instead of running again.
    agent.restart().await;
    let (mut c, welcome) = agent.connect(&chat()).await;
    assert_eq!(welcome.last_seq, 2, "a duplicate does not move last_seq");
    let ack = c.submit(message(1, "$m1", "hello agent")).await;
    assert!(ack.duplicate);
    let again = c.until_end("$m1").await;
    assert_eq!(
        again.text(),
        first.text(),
        "the stored answer, not a new run"
    );
    let t = c.turn(message(3, "$m3", "history")).await;
    assert!(t.text().contains("2 earlier turn(s)"), "{}", t.text());
    assert_eq!(stored_ids(&agent), ["$m1", "$m2", "$m3"]);
}
