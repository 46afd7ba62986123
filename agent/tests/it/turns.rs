//! Turns through the builtin brain: attachments, files, questions, approvals, duplicates.

use protocol::{Answer, ApprovalDecision, AttachmentInfo, Cancel, Decision, EndStatus, ToSurface};
use sha2::{Digest, Sha256};

use crate::support::*;

/// A PNG header (signature and IHDR) for a 3x2 RGB image: enough for sniffing and dimensions.
fn png_3x2() -> Vec<u8> {
    let mut png = vec![0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a];
    png.extend_from_slice(&13u32.to_be_bytes());
    png.extend_from_slice(b"IHDR");
    png.extend_from_slice(&3u32.to_be_bytes());
    png.extend_from_slice(&2u32.to_be_bytes());
    png.extend_from_slice(&[8, 2, 0, 0, 0]);
    png.extend_from_slice(&[0x12, 0x34, 0x56, 0x78]);
    png.extend_from_slice(&[0, 0, 0, 0]);
    png.extend_from_slice(b"IEND");
    png.extend_from_slice(&[0xae, 0x42, 0x60, 0x82]);
    png
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

#[tokio::test]
async fn attachments_are_described() {
    let agent = TestAgent::start().await;
    let root = agent.workspace.path();
    let png = png_3x2();
    let text = b"line one\nline two\nline three\n";
    let png_path = write(
        root,
        &format!("{}/20260101T120000Z-abcd1234-pic.png", inbox(ROOM)),
        &png,
    );
    let txt_path = write(
        root,
        &format!("{}/20260101T120001Z-efgh5678-notes.txt", inbox(ROOM)),
        text,
    );

    let (mut c, _) = agent.connect(&chat()).await;
    let mut m = message(1, "$m1", "User sent one or more attachments.");
    m.attachments = vec![png_path.clone(), txt_path.clone()];
    m.attachment_info.insert(
        png_path.clone(),
        AttachmentInfo {
            name: "pic.png".into(),
            mime: "image/png".into(),
            size: png.len() as u64,
            ..Default::default()
        },
    );
    let t = c.turn(m).await;
    let out = t.text();
    assert_eq!(t.end().status, EndStatus::Completed);
    assert!(
        !out.contains("surfaces/matrix"),
        "no workspace path for people: {out}"
    );
    for needle in [
        "File: pic.png",
        "mime: image/png",
        &format!("size {} bytes", png.len()),
        &format!("sha256 {}", sha256(&png)),
        "image 3x2",
        "File: notes.txt",
        "mime: text/plain",
        &format!("sha256 {}", sha256(text)),
        "line one",
        "line three",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
    }
}

#[tokio::test]
async fn note_writes_and_sends_a_file() {
    let agent = TestAgent::start().await;
    let (mut c, _) = agent.connect(&chat()).await;
    let t = c.turn(message(1, "$m1", "note a.txt hello")).await;
    let expected = format!("chats/{}/a.txt", chat());
    assert_eq!(t.sent_files(), [expected.as_str()]);
    assert_eq!(t.tool_calls(), ["write_file", "send_file"]);
    assert_eq!(
        std::fs::read_to_string(agent.ws_path(&expected)).unwrap(),
        "hello"
    );
    assert!(
        t.messages
            .iter()
            .any(|m| matches!(m, ToSurface::ToolResult(r) if r.ok))
    );

    // `send` with a bare name finds it again; `files` lists it.
    let t = c.turn(message(2, "$m2", "send a.txt")).await;
    assert_eq!(t.sent_files(), [expected.as_str()]);
    let t = c.turn(message(3, "$m3", "files paths")).await;
    assert!(
        t.text()
            .contains(&format!("- `a.txt` — 5 B, just now — `{expected}`")),
        "{}",
        t.text()
    );
}

#[tokio::test]
async fn send_refuses_missing_and_foreign_files_alike() {
    let agent = TestAgent::start().await;
    let root = agent.workspace.path();
    write(root, "chats/someone-else/secret.txt", b"secret");
    write(
        root,
        &format!(
            "{}/20260101T120000Z-abcd1234-x.txt",
            inbox("!other:test.local")
        ),
        b"x",
    );
    let (mut c, _) = agent.connect(&chat()).await;
    let missing = c
        .turn(message(
            1,
            "$m1",
            &format!("send chats/{}/nothere.txt", chat()),
        ))
        .await;
    let foreign = c
        .turn(message(2, "$m2", "send chats/someone-else/secret.txt"))
        .await;
    let other_room = c
        .turn(message(
            3,
            "$m3",
            &format!(
                "send {}/20260101T120000Z-abcd1234-x.txt",
                inbox("!other:test.local")
            ),
        ))
        .await;
    let escape = c.turn(message(4, "$m4", "send ../etc/passwd")).await;
    for t in [&missing, &foreign, &other_room, &escape] {
        assert!(t.sent_files().is_empty(), "{t:?}");
        assert!(t.text().contains("I could not send"), "{}", t.text());
    }
    assert!(missing.text().contains("not found"));
    assert!(
        foreign
            .text()
            .contains("not found: chats/someone-else/secret.txt")
    );
    assert!(other_room.text().contains("not found"));
    assert!(escape.text().contains("`..`"), "{}", escape.text());

    // `sendraw` names the path without checking it.
    let raw = c
        .turn(message(5, "$m5", "sendraw chats/x/missing.bin"))
        .await;
    assert_eq!(raw.sent_files(), ["chats/x/missing.bin"]);
}

#[tokio::test]
async fn a_download_in_progress_is_out_of_reach() {
    let agent = TestAgent::start().await;
    let root = agent.workspace.path();
    let done = write(
        root,
        &format!("{}/20260101T120000Z-abcd1234-done.txt", inbox(ROOM)),
        b"done",
    );
    // What the surface writes while a download is still streaming in.
    let partial = write(
        root,
        &format!("{}/.partial-abcdef0123456789", inbox(ROOM)),
        b"half",
    );
    let (mut c, _) = agent.connect(&chat()).await;

    let mut m = message(1, "$m1", "User sent one or more attachments.");
    m.attachments = vec![partial.clone()];
    let described = c.turn(m).await;
    let not_found = format!("not found: {partial}");
    assert!(
        described
            .text()
            .contains(&format!("could not read it: {not_found}")),
        "{}",
        described.text()
    );

    let sent = c.turn(message(2, "$m2", &format!("send {partial}"))).await;
    assert!(sent.sent_files().is_empty(), "{sent:?}");
    assert!(sent.text().contains(&not_found), "{}", sent.text());

    let listed = c.turn(message(3, "$m3", "files paths")).await;
    assert!(listed.text().contains(done.as_str()), "{}", listed.text());
    assert!(!listed.text().contains(".partial-"), "{}", listed.text());
}

#[tokio::test]
async fn ask_user_then_answer() {
    let agent = TestAgent::start().await;
    let (mut c, _) = agent.connect(&chat()).await;
    c.submit(message(1, "$m1", "ask What is your favourite colour?"))
        .await;
    let asked = c.until(|m| matches!(m, ToSurface::AskUser(_))).await;
    let Some(ToSurface::AskUser(q)) = asked.messages.last() else {
        unreachable!()
    };
    assert_eq!(q.text, "What is your favourite colour?");
    assert_eq!(q.turn, "$m1");
    c.send(Answer {
        question_id: q.question_id.clone(),
        text: "blue".into(),
        by: USER.into(),
    })
    .await;
    let t = c.until_end("$m1").await;
    assert!(t.text().contains("You answered: `blue`"), "{}", t.text());

    // An answer nobody waits for is an error, and the connection stays usable.
    c.send(Answer {
        question_id: "q-unknown".into(),
        text: "x".into(),
        by: USER.into(),
    })
    .await;
    assert!(matches!(c.expect().await, ToSurface::Error(_)));
}

/// Runs `approve <action>` and answers its approval request with `decision`.
async fn approve_with(c: &mut Client, seq: u64, action: &str, decision: Decision) -> String {
    let id = format!("$a{seq}");
    c.submit(message(seq, &id, &format!("approve {action}")))
        .await;
    let asked = c
        .until(|m| matches!(m, ToSurface::ApprovalRequest(_)))
        .await;
    let Some(ToSurface::ApprovalRequest(r)) = asked.messages.last() else {
        unreachable!()
    };
    assert_eq!(r.tool, "dangerous_action");
    assert_eq!(r.resource, action);
    c.send(ApprovalDecision {
        request_id: r.request_id.clone(),
        decision,
        by: USER.into(),
    })
    .await;
    c.until_end(&id).await.text()
}

#[tokio::test]
async fn approvals_each_decision_and_always_is_remembered() {
    let agent = TestAgent::start().await;
    let (mut c, _) = agent.connect(&chat()).await;
    let denied = approve_with(&mut c, 1, "launch", Decision::Deny).await;
    assert!(denied.contains("Denied: `launch`"), "{denied}");
    let once = approve_with(&mut c, 2, "launch", Decision::AllowOnce).await;
    assert!(once.contains("Approved: `launch`"), "{once}");
    let always = approve_with(&mut c, 3, "launch", Decision::AllowAlways).await;
    assert!(always.contains("Approved: `launch`"), "{always}");

    // Remembered: no approval_request this time, also after a restart.
    let t = c.turn(message(4, "$a4", "approve launch")).await;
    assert!(t.text().contains("Approved: `launch`"), "{}", t.text());
    assert!(
        !t.messages
            .iter()
            .any(|m| matches!(m, ToSurface::ApprovalRequest(_)))
    );
    drop(c);
    let mut agent = agent;
    agent.restart().await;
    let (mut c, _) = agent.connect(&chat()).await;
    let t = c.turn(message(5, "$a5", "approve launch")).await;
    assert!(t.text().contains("Approved: `launch`"), "{}", t.text());
    assert!(
        !t.messages
            .iter()
            .any(|m| matches!(m, ToSurface::ApprovalRequest(_)))
    );
    // Another resource still asks.
    let other = approve_with(&mut c, 6, "something else", Decision::Deny).await;
    assert!(other.contains("Denied"), "{other}");

    // `always` was Alice's: Bob, in the same chat, is asked for the same action.
    let mut bobs = message(7, "$a7", "approve launch");
    bobs.sender.user_id = "@bob:test.local".into();
    c.submit(bobs).await;
    let asked = c
        .until(|m| matches!(m, ToSurface::ApprovalRequest(_)))
        .await;
    assert!(
        asked
            .messages
            .iter()
            .any(|m| matches!(m, ToSurface::ApprovalRequest(r) if r.resource == "launch")),
        "Bob is asked"
    );
}

#[tokio::test]
async fn duplicates_are_acked_and_not_run_again() {
    let agent = TestAgent::start().await;
    let (mut c, welcome) = agent.connect(&chat()).await;
    assert_eq!(welcome.last_seq, 0);
    let first = c.turn(message(1, "$m1", "hello agent")).await;
    assert!(
        first
            .text()
            .contains("I received your message: `hello agent`")
    );

    // Same id resent: acked as duplicate (a new id with an old seq is new: see `admission`).
    let ack = c.submit(message(1, "$m1", "hello agent")).await;
    assert!(ack.duplicate);
    // The next thing that runs is the new turn; nothing from a second run of $m1.
    let t = c.turn(message(2, "$m2", "help")).await;
    for m in &t.messages {
        if let ToSurface::TextChunk(chunk) = m {
            assert_eq!(chunk.turn, "$m2");
        }
    }
    let (_c2, welcome) = agent.connect(&chat()).await;
    assert_eq!(welcome.last_seq, 2);
}

#[tokio::test]
async fn a_finished_turn_resent_on_a_new_connection_replays_its_answer() {
    let agent = TestAgent::start().await;
    let (mut c, _) = agent.connect(&chat()).await;
    let first = c.turn(message(1, "$m1", "hello agent")).await;
    drop(c);
    // The surface never saw that end (its connection died): it resends the turn.
    let (mut c, welcome) = agent.connect(&chat()).await;
    assert_eq!(welcome.last_seq, 1);
    let ack = c.submit(message(1, "$m1", "hello agent")).await;
    assert!(ack.duplicate);
    let again = c.until_end("$m1").await;
    assert_eq!(
        again.text(),
        first.text(),
        "the stored answer, not a new run"
    );
    assert_eq!(again.end().status, EndStatus::Completed);
    // It did not run again: the next turn sees one earlier turn.
    let t = c.turn(message(2, "$m2", "history")).await;
    assert!(t.text().contains("1 earlier turn(s)"), "{}", t.text());
}

#[tokio::test]
async fn turns_run_in_order_and_cancel_stops_one() {
    let agent = TestAgent::start().await;
    let (mut c, _) = agent.connect(&chat()).await;
    c.submit(message(1, "$slow", "sleep 60000")).await;
    c.submit(message(2, "$next", "history")).await;
    c.send(Cancel {
        turn: "$slow".into(),
    })
    .await;
    let slow = c.until_end("$slow").await;
    assert_eq!(slow.end().status, EndStatus::Cancelled);
    let next = c.until_end("$next").await;
    assert!(next.text().contains("1 earlier turn(s)"), "{}", next.text());
}

#[tokio::test]
async fn unfinished_turn_runs_again_on_reconnect() {
    let agent = TestAgent::start().await;
    let (mut c, _) = agent.connect(&chat()).await;
    c.submit(message(1, "$q", "ask Still there?")).await;
    c.until(|m| matches!(m, ToSurface::AskUser(_))).await;
    drop(c);
    // The stored turn did not finish: it runs again on the next connection.
    let (mut c, welcome) = agent.connect(&chat()).await;
    assert_eq!(welcome.last_seq, 1);
    let asked = c.until(|m| matches!(m, ToSurface::AskUser(_))).await;
    let Some(ToSurface::AskUser(q)) = asked.messages.last() else {
        unreachable!()
    };
    assert_eq!(q.turn, "$q");
    c.send(Answer {
        question_id: q.question_id.clone(),
        text: "yes".into(),
        by: USER.into(),
    })
    .await;
    let t = c.until_end("$q").await;
    assert!(t.text().contains("You answered: `yes`"));
}

#[tokio::test]
async fn denied_tools_return_an_error_to_the_brain() {
    let agent = TestAgent::start_with(|c| {
        c.tool_policy
            .insert("write_file".into(), agent::config::Policy::Deny);
    })
    .await;
    let (mut c, _) = agent.connect(&chat()).await;
    let t = c.turn(message(1, "$m1", "note a.txt hello")).await;
    assert_eq!(t.end().status, EndStatus::Completed);
    assert!(
        t.text()
            .contains("write_file is not allowed by the agent's policy"),
        "{}",
        t.text()
    );
    assert!(t.sent_files().is_empty());
    assert!(
        t.messages
            .iter()
            .any(|m| matches!(m, ToSurface::ToolResult(r) if !r.ok))
    );
    assert!(!agent.ws_path(&format!("chats/{}/a.txt", chat())).exists());
}

/// A long answer (the builtin brain quotes a 900 KiB message back) reaches the surface in
/// chunks far below its frame limit, and whole.
#[tokio::test]
async fn a_long_answer_streams_in_bounded_chunks() {
    let agent = TestAgent::start().await;
    let (mut c, _) = agent.connect(&chat()).await;
    let long = "word ".repeat(900 * 1024 / 5);
    let t = c.turn(message(1, "$m1", &long)).await;
    let chunks: Vec<usize> = t
        .messages
        .iter()
        .filter_map(|m| match m {
            ToSurface::TextChunk(c) => Some(c.text.len()),
            _ => None,
        })
        .collect();
    assert!(t.text().contains(long.trim()), "the whole text came back");
    let largest = chunks.iter().max().copied().unwrap_or_default();
    assert!(
        largest <= agent::link::MAX_TEXT_CHUNK,
        "largest chunk {largest} bytes"
    );
    assert!(chunks.len() > 50, "{} chunks", chunks.len());
}
