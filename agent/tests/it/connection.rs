//! Authentication, handshake, limits and message handling of one connection.

use futures_util::SinkExt;
use protocol::{EndStatus, ErrorCode, Hello, PROTOCOL_VERSION, Sentinel, ToSurface, WorkspacePath};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::Message;

use crate::support::*;

#[tokio::test]
async fn refuses_before_upgrade_without_valid_token_or_with_origin() {
    let agent = TestAgent::start().await;
    let url = agent.url(chat().as_str());
    assert_eq!(refused_status(&url, None, None).await, 401);
    assert_eq!(
        refused_status(&url, Some("wrong-token-0123456789"), None).await,
        401
    );
    assert_eq!(
        refused_status(&url, Some(TOKEN), Some("https://evil.example")).await,
        403
    );
    assert_eq!(
        refused_status(&url, None, Some("https://evil.example")).await,
        401
    );
    // Tokens of another length: a prefix, the token plus one byte, empty.
    let longer = format!("{TOKEN}x");
    for token in [&TOKEN[..TOKEN.len() - 1], longer.as_str(), ""] {
        assert_eq!(
            refused_status(&url, Some(token), None).await,
            401,
            "{token:?}"
        );
    }
    // A token in the query string is not a credential (it would end up in access logs).
    for query in ["access_token", "token"] {
        let with_query = format!("{url}?{query}={TOKEN}");
        assert_eq!(
            refused_status(&with_query, None, None).await,
            401,
            "{query}"
        );
    }
    assert_eq!(
        refused_status(&agent.url(".hidden"), Some(TOKEN), None).await,
        400
    );
    let health = reqwest::get(format!("http://{}/healthz", agent.addr))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    assert_eq!(health.text().await.unwrap(), "ok");
}

#[tokio::test]
async fn handshake_checks_sentinels_both_ways() {
    let agent = TestAgent::start().await;
    let nonce = "surface-nonce-123";
    let path = write(
        agent.workspace.path(),
        &format!("surfaces/matrix/.sentinel/{nonce}"),
        nonce.as_bytes(),
    );
    let mut c = agent.connect_raw(&chat()).await;
    let welcome = c
        .hello(Some(Sentinel {
            path,
            nonce: nonce.to_owned(),
        }))
        .await;
    assert_eq!(welcome.protocol_version, PROTOCOL_VERSION);
    assert_eq!(welcome.last_seq, 0);
    assert_eq!(welcome.workspace.surface_sentinel_ok, Some(true));
    let mine = welcome.workspace.agent_sentinel.expect("agent sentinel");
    assert!(mine.path.as_str().starts_with("chats/.sentinel/"));
    let content = std::fs::read_to_string(agent.ws_path(mine.path.as_str())).unwrap();
    assert_eq!(content, mine.nonce);

    // A sentinel the agent cannot see (different workspace) is reported.
    let mut c = agent.connect_raw(&chat()).await;
    let welcome = c
        .hello(Some(Sentinel {
            path: WorkspacePath::new("surfaces/matrix/.sentinel/other").unwrap(),
            nonce: "other".to_owned(),
        }))
        .await;
    assert_eq!(welcome.workspace.surface_sentinel_ok, Some(false));
}

#[tokio::test]
async fn handshake_refuses_wrong_version_and_non_hello() {
    let agent = TestAgent::start().await;
    let mut c = agent.connect_raw(&chat()).await;
    c.send(Hello {
        protocol_version: PROTOCOL_VERSION + 1,
        surface: "test".to_owned(),
        workspace_sentinel: None,
    })
    .await;
    match c.expect().await {
        ToSurface::Error(e) => assert_eq!(e.code, ErrorCode::UnsupportedVersion),
        other => panic!("expected error, got {other:?}"),
    }
    assert!(c.recv().await.is_none(), "connection closed after refusal");

    let mut c = agent.connect_raw(&chat()).await;
    c.send(message(1, "$m1", "help")).await;
    match c.expect().await {
        ToSurface::Error(e) => assert_eq!(e.code, ErrorCode::BadHandshake),
        other => panic!("expected error, got {other:?}"),
    }
    assert!(c.recv().await.is_none());
}

#[tokio::test]
async fn handshake_must_come_in_time() {
    let agent = TestAgent::start_with(|c| {
        c.limits.handshake_timeout = std::time::Duration::from_millis(300);
    })
    .await;
    let mut c = agent.connect_raw(&chat()).await;
    // Say nothing: the agent gives up on its own.
    match c.expect().await {
        ToSurface::Error(e) => {
            assert_eq!(e.code, ErrorCode::BadHandshake);
            assert!(e.message.contains("no hello"), "{}", e.message);
        }
        other => panic!("expected error, got {other:?}"),
    }
    assert!(c.recv().await.is_none());
}

#[tokio::test]
async fn oversized_frame_closes_the_connection() {
    let agent = TestAgent::start().await;
    let (mut c, _) = agent.connect(&chat()).await;
    let huge = format!(
        r#"{{"type":"user_message","text":"{}"}}"#,
        "x".repeat(protocol::MAX_MESSAGE_BYTES + 10)
    );
    let _ = c.ws.send(Message::text(huge)).await;
    // The agent answers with an error and/or a close frame with code 1009, then closes.
    let mut saw_refusal = false;
    loop {
        match tokio::time::timeout(DEADLINE, futures_util::StreamExt::next(&mut c.ws))
            .await
            .expect("closed within the deadline")
        {
            Some(Ok(Message::Text(t))) => {
                let msg: ToSurface = serde_json::from_str(t.as_str()).unwrap();
                assert!(matches!(msg, ToSurface::Error(_)), "{msg:?}");
                saw_refusal = true;
            }
            Some(Ok(Message::Close(frame))) => {
                if let Some(f) = frame {
                    assert_eq!(u16::from(f.code), 1009);
                    saw_refusal = true;
                }
                break;
            }
            Some(Ok(_)) => {}
            None | Some(Err(_)) => break,
        }
    }
    assert!(saw_refusal, "no error and no close code 1009");
}

#[tokio::test]
async fn malformed_json_gets_an_error_and_unknown_types_are_ignored() {
    let agent = TestAgent::start().await;
    let (mut c, _) = agent.connect(&chat()).await;
    c.send_raw("{not json").await;
    match c.expect().await {
        ToSurface::Error(e) => assert_eq!(e.code, ErrorCode::BadMessage),
        other => panic!("expected error, got {other:?}"),
    }
    c.send_raw(r#"{"type":"user_message","seq":"one"}"#).await;
    match c.expect().await {
        ToSurface::Error(e) => assert_eq!(e.code, ErrorCode::BadMessage),
        other => panic!("expected error, got {other:?}"),
    }
    // Unknown type: no answer at all, so the next thing we get is the ack of the next turn.
    c.send_raw(r#"{"type":"from_the_future","x":1}"#).await;
    let t = c.turn(message(1, "$m1", "help")).await;
    assert!(t.text().contains("note <filename> <text>"), "{}", t.text());
    assert_eq!(t.end().status, EndStatus::Completed);
}

#[tokio::test]
async fn message_for_another_room_is_refused() {
    let agent = TestAgent::start().await;
    let (mut c, _) = agent.connect(&chat()).await;
    let mut m = message(1, "$m1", "help");
    m.room_id = "!other:test.local".to_owned();
    c.send(m).await;
    match c.expect().await {
        ToSurface::Error(e) => assert_eq!(e.code, ErrorCode::BadMessage),
        other => panic!("expected error, got {other:?}"),
    }
    assert_eq!(
        c.turn(message(1, "$m2", "help")).await.end().status,
        EndStatus::Completed
    );
}

#[tokio::test]
async fn a_second_connection_replaces_the_first() {
    let agent = TestAgent::start().await;
    let (mut first, _) = agent.connect(&chat()).await;
    let (mut second, _) = agent.connect(&chat()).await;
    let frame = first.closed().await.expect("a close frame");
    assert_eq!(frame.reason.as_str(), "replaced by a newer connection");
    let t = second.turn(message(1, "$m1", "help")).await;
    assert_eq!(t.end().status, EndStatus::Completed);
}

#[tokio::test]
async fn idle_connections_are_closed() {
    let agent = TestAgent::start_with(|c| {
        c.limits.ping_interval = std::time::Duration::from_millis(250);
        c.limits.idle_timeout = std::time::Duration::from_millis(1500);
    })
    .await;
    let (mut c, _) = agent.connect(&chat()).await;
    // Reading answers the agent's pings, so the connection stays up while we read...
    let t = c.turn(message(1, "$m1", "sleep 2500")).await;
    assert_eq!(t.end().status, EndStatus::Completed);
    // ...and a peer that never answers pings is dropped by the idle timeout.
    let mut raw = raw_handshake(&agent).await;
    let mut buf = vec![0u8; 4096];
    let mut received = Vec::new();
    loop {
        let n = tokio::time::timeout(DEADLINE, raw.read(&mut buf))
            .await
            .expect("idle connection closed within the deadline")
            .unwrap_or(0);
        if n == 0 {
            break;
        }
        received.extend_from_slice(&buf[..n]);
    }
    // The agent said why: a close frame (opcode 8) with code 1001.
    let close = received
        .windows(4)
        .any(|w| w[0] == 0x88 && w[2..4] == 1001u16.to_be_bytes());
    assert!(close, "no close frame with code 1001 in {received:?}");
}

/// A WebSocket client written by hand that completes the handshake (HTTP upgrade and `hello`)
/// and then never reads, so it never answers pings.
async fn raw_handshake(agent: &TestAgent) -> tokio::net::TcpStream {
    let mut tcp = tokio::net::TcpStream::connect(agent.addr).await.unwrap();
    let req = format!(
        "GET /v1/agent_ws/{}/ HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\
         Authorization: Bearer {TOKEN}\r\n\r\n",
        chat(),
        agent.addr
    );
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        tcp.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 101"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let hello = serde_json::to_vec(&protocol::ToAgent::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        surface: "raw".to_owned(),
        workspace_sentinel: None,
    }))
    .unwrap();
    assert!(hello.len() < 126);
    // Text frame, FIN, masked with an all-zero key (the payload is sent as is).
    let mut frame = vec![0x81, 0x80 | hello.len() as u8, 0, 0, 0, 0];
    frame.extend_from_slice(&hello);
    tcp.write_all(&frame).await.unwrap();
    tcp
}
