//! A stranger on the network against every listening port (the agent's WebSocket server, the
//! surface's health endpoint and its MCP server): bad credentials, a browser's `Origin`, frames
//! no surface sends, slow request heads, huge bodies and hundreds of idle sockets, while
//! another user's chat is timed.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use e2e::Stack;
use e2e::agent_ws::{AgentWs, upgrade_status};
use e2e::attack::{all_closed, idle_sockets, raw_request, slow_loris};
use protocol::ToSurface;
use tokio_tungstenite::tungstenite::Message;

use super::{Room, Tally, probe};

/// The servers' head deadline is 5 s; a busy machine gets slack.
const CLOSED_WITHIN: Duration = Duration::from_secs(20);
const HEALTH: &[u8] = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

fn addr(url: &str) -> SocketAddr {
    url.trim_start_matches("http://").parse().unwrap()
}

/// The surface's MCP port and its token.
pub struct Mcp<'a> {
    pub addr: SocketAddr,
    pub token: &'a str,
}

/// Runs every attack while `other`'s chat is probed; returns the probes' round trips.
pub async fn attack_every_port(
    stack: &Stack,
    mcp: &Mcp<'_>,
    other: &Room,
    tally: &mut Tally,
) -> Vec<std::time::Duration> {
    let done = AtomicBool::new(false);
    let bot = &stack.bot.user_id;
    let probes = async {
        let mut out = Vec::new();
        while !done.load(Ordering::Relaxed) || out.len() < 8 {
            out.push(probe::round_trip(other, bot).await);
        }
        out
    };
    let attacks = async {
        attacks(stack, tally).await;
        mcp_attacks(mcp, tally).await;
        done.store(true, Ordering::Relaxed);
    };
    let ((), during) = tokio::join!(attacks, probes);
    during
}

async fn attacks(stack: &Stack, tally: &mut Tally) {
    let agent = addr(&stack.agent_http);
    let health = addr(&stack.surface_health);
    let base = stack.agent_http.replace("http://", "ws://");
    let token = stack.agent_token.as_str();

    // Upgrade requests that must be refused before the WebSocket exists.
    let shorter = &token[..token.len() - 1];
    let longer = format!("{token}x");
    let in_query = format!("access_token={token}");
    let in_query2 = format!("token={token}");
    let evil = Some("https://evil.example");
    let ws_chat = protocol::ChatId::for_conversation("!hostile-ws:localhost", None);
    let ws_chat = ws_chat.as_str();
    // (what, chat, token, origin, query, expected status)
    type Case<'a> = (
        &'a str,
        &'a str,
        Option<&'a str>,
        Option<&'a str>,
        Option<&'a str>,
        u16,
    );
    let cases: [Case; 9] = [
        ("no token", ws_chat, None, None, None, 401),
        (
            "wrong token",
            ws_chat,
            Some("wrong-token-0123456789abcdef"),
            None,
            None,
            401,
        ),
        ("shorter token", ws_chat, Some(shorter), None, None, 401),
        ("longer token", ws_chat, Some(&longer), None, None, 401),
        ("empty token", ws_chat, Some(""), None, None, 401),
        (
            "token in the query",
            ws_chat,
            None,
            None,
            Some(&in_query),
            401,
        ),
        (
            "token in the query (token=)",
            ws_chat,
            None,
            None,
            Some(&in_query2),
            401,
        ),
        ("browser Origin", ws_chat, Some(token), evil, None, 403),
        ("hidden chat id", ".hidden", Some(token), None, None, 400),
    ];
    for (what, chat, token, origin, query, expected) in cases {
        let status = upgrade_status(&base, chat, token, origin, query).await;
        tally.record(format!("upgrade with {what}: {status}"), status == expected);
    }

    frames(&base, token, tally).await;

    // Slow request heads on both ports.
    let head =
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
    for (what, to) in [("agent", agent), ("health", health)] {
        let closed = slow_loris(to, head, Duration::from_millis(200), CLOSED_WITHIN).await;
        tally.record(
            format!("slow head on the {what} port: closed after {closed:?}"),
            closed.is_some(),
        );
    }

    // Hundreds of idle sockets on both ports; meanwhile a new surface connection and a health
    // check must still be served.
    let agent_flood = idle_sockets(agent, 300, 20).await;
    let health_flood = idle_sockets(health, 150, 10).await;
    let mut fresh = AgentWs::connect(&base, "!hostile-fresh:localhost", token)
        .await
        .expect("a new connection beside 300 idle sockets");
    let out = fresh.turn(1, "$fresh1", "help").await.expect("a turn");
    assert!(out.text.contains("commands"), "{}", out.text);
    assert_eq!(
        raw_request(health, HEALTH).await,
        200,
        "health beside 150 idle sockets"
    );
    for (what, flood) in [("agent", &agent_flood), ("health", &health_flood)] {
        let closed = all_closed(flood, CLOSED_WITHIN).await;
        tally.record(
            format!(
                "{} idle sockets on the {what} port: closed after {closed:?}",
                flood.len()
            ),
            closed.is_some(),
        );
    }
}

/// Frames on an accepted connection that no surface sends: each gets an error (or the
/// connection closed) and runs nothing; a second connection for a chat closes the first.
async fn frames(base: &str, token: &str, tally: &mut Tally) {
    let room = "!hostile-frames:localhost";
    let mut ws = AgentWs::connect(base, room, token).await.expect("connect");
    let user_message = |seq: &str, room: &str, attachments: &str| {
        format!(
            r#"{{"type":"user_message","seq":{seq},"id":"$h{seq}","room_id":"{room}","sender":{{"user_id":"@a:hs"}},"text":"help","attachments":[{attachments}],"timestamp_ms":0}}"#
        )
    };
    let refused_frames = [
        (
            "malformed JSON",
            "{\"type\": \"user_message\", \"seq\": ".to_owned(),
        ),
        ("seq 0", user_message("0", room, "")),
        (
            "seq above 2^53",
            user_message("18446744073709551615", room, ""),
        ),
        (
            "another room",
            user_message("1", "!elsewhere:localhost", ""),
        ),
        (
            "a NUL in an attachment",
            user_message("1", room, r#""chats/x/a\u0000b""#),
        ),
        (
            "an escaping attachment",
            user_message("1", room, r#""../../etc/passwd""#),
        ),
    ];
    for (what, frame) in refused_frames {
        ws.send_raw(Message::text(frame)).await.expect("send");
        let answer = ws.next().await.expect("an answer");
        tally.record(
            format!("frame with {what}: {answer:?}"),
            matches!(answer, Some(ToSurface::Error(_))),
        );
    }
    // An unknown type is ignored: the next answer is the next turn's.
    ws.send_raw(Message::text(r#"{"type":"telepathy","payload":[1,2,3]}"#))
        .await
        .expect("send");
    let out = ws.turn(1, "$after-unknown", "help").await;
    tally.record(
        "frame of an unknown type",
        out.is_ok_and(|o| o.status.is_some()),
    );

    // Over the message limit: refused and the connection closed.
    let huge = format!(
        r#"{{"type":"user_message","text":"{}"}}"#,
        "x".repeat(protocol::MAX_MESSAGE_BYTES + 10)
    );
    let _ = ws.send_raw(Message::text(huge)).await;
    let mut closed = false;
    for _ in 0..4 {
        match ws.next().await {
            Ok(None) | Err(_) => {
                closed = true;
                break;
            }
            Ok(Some(_)) => {}
        }
    }
    tally.record("an oversized message", closed);

    // Two connections for one chat: the newer one wins, the older one is closed.
    let twice = "!hostile-twice:localhost";
    let mut first = AgentWs::connect(base, twice, token).await.expect("connect");
    let mut second = AgentWs::connect(base, twice, token).await.expect("connect");
    let first_closed = matches!(first.next().await, Ok(None) | Err(_));
    tally.record(
        "a second connection for one chat (the first is closed)",
        first_closed,
    );
    second
        .turn(1, "$twice1", "help")
        .await
        .expect("the newer connection works");
}

/// The MCP port: refused without the token (also with a 4 MiB body, which is not read), a body
/// over the limit refused with the token, a slow head and 300 idle sockets closed, and a client
/// with the token served beside them.
async fn mcp_attacks(mcp: &Mcp<'_>, tally: &mut Tally) {
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}"#;
    let request = |auth: Option<String>, body: String| {
        let mut head = format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Accept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n",
            body.len()
        );
        if let Some(a) = auth {
            head.push_str(&format!("Authorization: {a}\r\n"));
        }
        head.push_str("\r\n");
        head.push_str(&body);
        head.into_bytes()
    };
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"matrix.send","arguments":{{"text":"{}"}}}}}}"#,
        "x".repeat(4 * 1024 * 1024)
    );
    let bearer = Some(format!("Bearer {}", mcp.token));
    let cases = [
        ("MCP without a token", request(None, init.to_owned()), 401),
        (
            "MCP with a wrong token",
            request(Some("Bearer wrong-token-0123".into()), init.to_owned()),
            401,
        ),
        (
            "MCP 4 MiB call without a token",
            request(None, big.clone()),
            401,
        ),
        (
            "MCP 4 MiB body with the token",
            request(bearer.clone(), big),
            413,
        ),
    ];
    for (what, bytes, expected) in cases {
        let status = post_status(mcp.addr, bytes).await;
        tally.record(format!("{what}: {status}"), status == expected);
    }
    let head = b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaa\r\n";
    let closed = slow_loris(mcp.addr, head, Duration::from_millis(200), CLOSED_WITHIN).await;
    tally.record(
        format!("slow head on the MCP port: closed after {closed:?}"),
        closed.is_some(),
    );
    let flood = idle_sockets(mcp.addr, 300, 20).await;
    let served = post_status(mcp.addr, request(bearer, init.to_owned())).await;
    tally.record(
        format!("MCP client with the token beside 300 idle sockets: {served}"),
        served == 200,
    );
    let closed = all_closed(&flood, CLOSED_WITHIN).await;
    tally.record(
        format!(
            "{} idle sockets on the MCP port: closed after {closed:?}",
            flood.len()
        ),
        closed.is_some(),
    );
}

/// Sends `request` while reading the answer's status line, so that a server that answers
/// before it read the whole body (and closes) is heard; 0 when no status line came.
async fn post_status(to: SocketAddr, request: Vec<u8>) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(stream) = tokio::net::TcpStream::connect(to).await else {
        return 0;
    };
    let (mut read, mut write) = stream.into_split();
    let writer = tokio::spawn(async move {
        let _ = write.write_all(&request).await;
        write
    });
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    let reading = async {
        while !head.windows(2).any(|w| w == b"\r\n") {
            match read.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
    };
    let _ = tokio::time::timeout(CLOSED_WITHIN, reading).await;
    writer.abort();
    String::from_utf8_lossy(&head)
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}
