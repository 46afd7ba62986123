//! History survives a restart of the agent.

use protocol::EndStatus;

use crate::support::*;

#[tokio::test]
async fn history_survives_restart() {
    let mut agent = TestAgent::start().await;
    let root = agent.workspace.path().to_owned();
    let file = write(
        &root,
        &format!("{}/20260101T120000Z-abcd1234-doc.txt", inbox(ROOM)),
        b"doc\n",
    );
    {
        let (mut c, _) = agent.connect(&chat()).await;
        c.turn(message(1, "$h1", "first")).await;
        let mut m = message(2, "$h2", "here is a file");
        m.attachments = vec![file.clone()];
        c.turn(m).await;
    }
    agent.restart().await;
    let (mut c, welcome) = agent.connect(&chat()).await;
    assert_eq!(welcome.last_seq, 2);
    let t = c.turn(message(3, "$h3", "history")).await;
    assert_eq!(t.end().status, EndStatus::Completed);
    let text = t.text();
    assert!(
        text.contains("2 earlier turn(s) with 1 attachment(s)"),
        "{text}"
    );
    assert!(text.contains(file.as_str()), "{text}");

    // The history on disk is plain JSON lines, one per turn and one per end of a turn.
    let log = std::fs::read_to_string(agent.state.path().join(format!("chats/{}.jsonl", chat())))
        .unwrap();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let turns: Vec<_> = lines.iter().filter(|l| l["type"] == "turn").collect();
    assert_eq!(turns.len(), 3);
    assert_eq!(turns[1]["attachments"][0], file.as_str());
    assert_eq!(lines.iter().filter(|l| l["type"] == "end").count(), 3);
}

#[tokio::test]
async fn an_unreadable_record_is_reported_not_overwritten() {
    let agent = TestAgent::start().await;
    let record = agent.state.path().join(format!("chats/{}.json", chat()));
    // The agent may still be starting: do not rely on it having created the folder yet.
    std::fs::create_dir_all(record.parent().unwrap()).unwrap();
    std::fs::write(&record, b"{ not json").unwrap();
    let mut c = agent.connect_raw(&chat()).await;
    match c.expect().await {
        protocol::ToSurface::Error(e) => assert_eq!(e.code, protocol::ErrorCode::Internal),
        other => panic!("expected error, got {other:?}"),
    }
    let frame = c.closed().await.expect("close frame");
    assert_eq!(u16::from(frame.code), 1011);
    assert_eq!(std::fs::read(&record).unwrap(), b"{ not json");
}
