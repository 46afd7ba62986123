//! The surface as an MCP server, used by an independent client (the official Python SDK,
//! `mcp_client.py`) against the real Synapse, in an encrypted DM made by a matrix-sdk user:
//! the client subscribes and is notified of every message the user sends, in order, once, and
//! never of the bot's own answers; the surface is killed, more messages arrive while it is
//! down, and after its restart the client catches up from its watermark with
//! `matrix.read_since` and has each of them exactly once, in order. A wrong or missing token
//! gets 401; `matrix.send` posts once per idempotency key.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use e2e::procs::free_port;
use e2e::{E2eeUser, Stack, StackOptions};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::TURN;

fn python() -> PathBuf {
    PathBuf::from(std::env::var_os("MXBRIDGE_MCP_PYTHON").expect(
        "MXBRIDGE_MCP_PYTHON: a Python with the `mcp` package (scripts/test.sh installs it)",
    ))
}

fn client(url: &str, token: &str, args: &[&str]) -> tokio::process::Command {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/it/mcp_client.py");
    let mut cmd = tokio::process::Command::new(python());
    cmd.arg(script)
        .arg(args[0])
        .arg(url)
        .args(&args[1..])
        .env("MCP_TOKEN", token)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// Runs the client to its end; its last stdout line as JSON.
async fn run(url: &str, token: &str, args: &[&str]) -> Value {
    let out = tokio::time::timeout(Duration::from_secs(200), client(url, token, args).output())
        .await
        .expect("the MCP client finished in time")
        .expect("run the MCP client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "mcp_client {args:?} failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("JSON result")
}

fn bodies(messages: &[Value]) -> Vec<String> {
    messages
        .iter()
        .map(|m| m["body"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_mcp_client_gets_every_message_once_in_order_across_a_restart() {
    let hs = e2e::Homeserver::from_env();
    let port = free_port();
    let token = "mcp-token-0123456789abcdef";
    let mut opts = StackOptions::default();
    for (k, v) in [
        ("SURFACE_MCP_BIND", format!("127.0.0.1:{port}")),
        ("SURFACE_MCP_TOKEN", token.to_owned()),
        ("SURFACE_MCP_SEND", "true".to_owned()),
    ] {
        opts.surface_env.insert(k.into(), v);
    }
    let mut stack = Stack::start(&hs, opts).await.expect("stack");
    let url = format!("http://127.0.0.1:{port}/mcp");
    let bot = stack.bot.user_id.clone();
    let user = E2eeUser::register(&hs, "mcpuser").await.expect("user");
    let room = user.create_encrypted_dm(&bot).await.expect("DM");
    user.wait_joined(&room, &bot, TURN).await.expect("join");

    // The doctor sees the MCP server up and guarded.
    let (_, report) = crate::doctor::doctor(&stack, &[]).await;
    assert!(
        report
            .lines()
            .any(|l| l.starts_with("ok") && l.contains("mcp:") && l.contains("may post")),
        "{report}"
    );
    assert!(!report.contains(token), "the token is not in the report");

    // Strangers get 401 (and no session).
    let http = reqwest::Client::new();
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}}"#;
    for auth in [None, Some("Bearer wrong-token-0123456789"), Some(token)] {
        let mut req = http
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(init);
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let status = req.send().await.expect("POST /mcp").status();
        assert_eq!(status.as_u16(), 401, "authorization {auth:?}");
    }

    // The port is guarded like /healthz: a slow request head is closed, 300 silent sockets
    // from 20 addresses are closed, and a client with the token is served beside them.
    let mcp_addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let head = b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaa\r\n";
    let slow = e2e::attack::slow_loris(mcp_addr, head, Duration::from_millis(200), TURN).await;
    assert!(
        slow.is_some(),
        "a slow request head on the MCP port is closed"
    );
    let flood = e2e::attack::idle_sockets(mcp_addr, 300, 20).await;
    let served = http
        .post(&url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("authorization", format!("Bearer {token}"))
        .body(init)
        .send()
        .await
        .expect("POST /mcp beside 300 idle sockets")
        .status();
    assert_eq!(served.as_u16(), 200, "a client with the token is served");
    let closed = e2e::attack::all_closed(&flood, TURN).await;
    assert!(closed.is_some(), "the idle sockets are closed");
    eprintln!(
        "mcp port: slow head closed after {slow:?}, {} idle sockets closed after {closed:?}",
        flood.len()
    );

    // Subscribed: N messages from the user are notified, in order, once; the bot's answers
    // to them (it answers each) never are.
    const N: usize = 5;
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("notified.jsonl");
    let out_arg = out.display().to_string();
    let n_arg = N.to_string();
    let mut listener = client(&url, token, &["listen", &room, &n_arg, &out_arg])
        .spawn()
        .expect("start the MCP listener");
    let mut lines = BufReader::new(listener.stdout.take().expect("stdout")).lines();
    let first = tokio::time::timeout(TURN, lines.next_line())
        .await
        .expect("the listener subscribed in time")
        .expect("listener stdout");
    assert_eq!(first.as_deref(), Some("subscribed"), "{first:?}");
    let mut sent = Vec::new();
    for i in 1..=N {
        let text = format!("to the orchestrator {i}");
        user.send_text(&room, &text).await.expect("send");
        sent.push(text);
    }
    let status = tokio::time::timeout(Duration::from_secs(200), listener.wait())
        .await
        .expect("the listener got every message in time")
        .expect("listener exit");
    let mut stderr = String::new();
    if let Some(mut e) = listener.stderr.take() {
        use tokio::io::AsyncReadExt;
        let _ = e.read_to_string(&mut stderr).await;
    }
    assert!(status.success(), "listener failed: {stderr}");
    let notified: Vec<Value> = std::fs::read_to_string(&out)
        .expect("notified messages")
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(bodies(&notified), sent, "every message once, in order");
    assert!(
        notified
            .iter()
            .all(|m| m["sender"] == user.user_id.as_str()),
        "only the user's messages, never the bot's: {notified:?}"
    );
    let watermark = notified[N - 1]["event_id"]
        .as_str()
        .expect("event id")
        .to_owned();
    // The bot answered (so there were self messages to leave out).
    user.wait_for(TURN, "the bot's answers", || async {
        let n = user
            .messages_from(&room, &bot)
            .await
            .unwrap_or_default()
            .len();
        (n >= N).then_some(())
    })
    .await
    .expect("answers");

    // Killed; messages arrive while it is down; restarted; caught up from the watermark.
    stack.surface.kill9().await;
    const M: usize = 4;
    let mut later = Vec::new();
    for i in 1..=M {
        let text = format!("while the surface was down {i}");
        user.send_text(&room, &text).await.expect("send");
        later.push(text);
    }
    stack.surface.start().expect("restart the surface");
    stack.wait_surface_healthy().await;
    let caught = run(&url, token, &["catchup", &room, &watermark, &M.to_string()]).await;
    let messages = caught["messages"].as_array().cloned().unwrap_or_default();
    assert_eq!(bodies(&messages), later, "each exactly once, in order");
    assert!(
        caught["rest"].as_array().is_some_and(Vec::is_empty),
        "{caught}"
    );
    assert_eq!(caught["unknown_room_is_error"], true);
    // The `last` resource: the latest messages, oldest first, the bot's answers left out.
    let last = caught["last"].as_array().cloned().unwrap_or_default();
    let everything: Vec<String> = bodies(&notified).into_iter().chain(later.clone()).collect();
    assert_eq!(bodies(&last), everything, "the last messages, in order");
    eprintln!(
        "mcp: notified={} caught_up_after_restart={} duplicates=0 self_messages=0",
        notified.len(),
        messages.len()
    );

    // matrix.send: posted once for one idempotency key, seen by the user; matrix.send_file: a
    // file the room reaches, as native media (a path out of the workspace is refused); the
    // read marker moves.
    let chat_dir = protocol::chat_dir(&protocol::ChatId::for_conversation(&room, None));
    let report = format!("{}/report.txt", chat_dir.as_str());
    let on_disk = stack.workspace.join(&report);
    std::fs::create_dir_all(on_disk.parent().expect("parent")).expect("chat dir");
    std::fs::write(&on_disk, "numbers for the orchestrator\n").expect("report");
    let sent = run(
        &url,
        token,
        &[
            "send",
            &room,
            "posted by the orchestrator",
            "k1",
            &report,
            &watermark,
        ],
    )
    .await;
    assert_eq!(
        sent["first"]["event_id"], sent["again"]["event_id"],
        "{sent}"
    );
    assert_eq!(sent["escape_refused"], true, "{sent}");
    assert_eq!(sent["foreign_thread_refused"], true, "{sent}");
    assert!(
        sent["foreign_thread_error"]
            .as_str()
            .is_some_and(|e| e.contains("is not an event of room")),
        "{sent}"
    );
    let health: Value = reqwest::get(format!("{}/healthz", stack.surface_health))
        .await
        .expect("healthz")
        .json()
        .await
        .expect("healthz json");
    assert_eq!(health["parked_sends"], 0, "nothing was parked: {health}");
    assert_eq!(sent["marker"]["ok"], true, "{sent}");
    let file = user
        .wait_for(TURN, "the orchestrator's file", || async {
            user.messages_from(&room, &bot)
                .await
                .unwrap_or_default()
                .into_iter()
                .find(|m| {
                    m.msgtype == "m.file"
                        && (m.filename.as_deref() == Some("report.txt") || m.body == "report.txt")
                })
        })
        .await
        .expect("file");
    assert_eq!(
        file.event_id,
        sent["file"]["event_id"].as_str().unwrap_or_default()
    );
    let bytes = user
        .download(file.source.as_ref().expect("media"))
        .await
        .expect("download");
    assert_eq!(bytes, b"numbers for the orchestrator\n");
    let posted = user
        .wait_for(TURN, "the orchestrator's post", || async {
            let all = user.messages_from(&room, &bot).await.unwrap_or_default();
            let hits: Vec<_> = all
                .into_iter()
                .filter(|m| m.body == "posted by the orchestrator")
                .collect();
            (!hits.is_empty()).then_some(hits)
        })
        .await
        .expect("post");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(posted.len(), 1, "one post for one key");
    assert!(
        posted[0].was_encrypted,
        "posted encrypted in an encrypted room"
    );
}
