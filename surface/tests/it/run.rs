//! The whole surface (`surface::run_with`) against a mock homeserver (wiremock, on port 0) and
//! a fake agent (a WebSocket server on port 0): a message in a synced room becomes a turn at
//! the agent and the agent's answer a threaded reply in the room; a message that cannot be
//! decrypted holds its chat until the key wait is over, then the room is told and the chat goes
//! on; a request the agent sends for a turn the surface has finished is refused at once. Fast
//! and hermetic; the real-homeserver suite (the `e2e` crate) stays the proof.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::{SinkExt, StreamExt};
use matrix_sdk::authentication::matrix::MatrixSession;
use matrix_sdk::store::RoomLoadSettings;
use matrix_sdk::{Client, SessionMeta, SessionTokens};
use protocol::{
    Ack, End, EndStatus, PROTOCOL_VERSION, Sentinel, TextChunk, ToAgent, ToSurface, UserMessage,
    Welcome, WorkspaceCheck, WorkspacePath,
};
use serde_json::{Value, json};
use surface::config::Config;
use tokio::net::TcpListener;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;
use wiremock::matchers::{method, path, path_regex};
use wiremock::{Mock, MockServer, ResponseTemplate};

const TOKEN: &str = "test-token-0123456789";
const BOT: &str = "@bot:localhost";
const ALICE: &str = "@alice:localhost";
const ROOM: &str = "!room:localhost";
const AGENT_SENTINEL: &str = "chats/.sentinel/fake-agent";
const AGENT_NONCE: &str = "fake-agent-nonce";

/// What the fake agent received.
type Received = Arc<Mutex<Vec<UserMessage>>>;

/// Every answer to a request the fake agent received (delivery results, decisions, answers),
/// from every test of this file (their request ids differ).
static ANSWERS: Mutex<Vec<ToAgent>> = Mutex::new(Vec::new());

/// Requests the fake agent sends, after the end of a turn whose text has `late`, for that turn:
/// the agent running it again (another agent took the chat) after the surface finished it.
fn late_requests(turn: &str) -> Vec<ToSurface> {
    let wire = |v: Value| serde_json::from_value(v).unwrap();
    vec![
        wire(
            json!({"type": "send_file", "turn": turn, "request_id": format!("late-file-{turn}"),
                    "path": "chats/x/late.txt"}),
        ),
        wire(
            json!({"type": "ask_user", "turn": turn, "question_id": format!("late-ask-{turn}"),
                    "text": "still there?"}),
        ),
    ]
}

/// A fake agent on port 0: handshakes (its sentinel written into `workspace`), acks every
/// turn and answers `echo: <text>`.
async fn fake_agent(workspace: PathBuf) -> (String, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}", listener.local_addr().unwrap());
    let received: Received = Arc::default();
    let seen = received.clone();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (seen, workspace) = (seen.clone(), workspace.clone());
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                    return;
                };
                while let Some(Ok(frame)) = ws.next().await {
                    let Message::Text(t) = frame else { continue };
                    let replies = match serde_json::from_str::<ToAgent>(t.as_str()).unwrap() {
                        ToAgent::Hello(_) => vec![welcome(&workspace)],
                        ToAgent::UserMessage(m) => {
                            seen.lock().unwrap().push(m.clone());
                            vec![
                                ToSurface::Ack(Ack {
                                    seq: m.seq,
                                    duplicate: false,
                                }),
                                ToSurface::TextChunk(TextChunk {
                                    turn: m.id.clone(),
                                    text: format!("echo: {}", m.text),
                                }),
                                ToSurface::End(End {
                                    turn: m.id,
                                    status: EndStatus::Completed,
                                    error: None,
                                }),
                            ]
                        }
                        ToAgent::DeliveryResult(_)
                        | ToAgent::Answer(_)
                        | ToAgent::ApprovalDecision(_) => {
                            ANSWERS
                                .lock()
                                .unwrap()
                                .push(serde_json::from_str(t.as_str()).unwrap());
                            vec![]
                        }
                        _ => vec![],
                    };
                    let late = replies.iter().find_map(|r| match r {
                        ToSurface::End(e) if e.turn.contains("late") => Some(e.turn.clone()),
                        _ => None,
                    });
                    for r in replies {
                        let text = serde_json::to_string(&r).unwrap();
                        if ws.send(Message::text(text)).await.is_err() {
                            return;
                        }
                    }
                    if let Some(turn) = late {
                        // Well after the surface has finished the turn.
                        tokio::time::sleep(Duration::from_millis(700)).await;
                        for r in late_requests(&turn) {
                            let text = serde_json::to_string(&r).unwrap();
                            if ws.send(Message::text(text)).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    (url, received)
}

fn welcome(workspace: &Path) -> ToSurface {
    let file = workspace.join(AGENT_SENTINEL);
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, AGENT_NONCE).unwrap();
    ToSurface::Welcome(Welcome {
        protocol_version: PROTOCOL_VERSION,
        agent: "fake".into(),
        agent_version: "0".into(),
        last_seq: 0,
        workspace: WorkspaceCheck {
            surface_sentinel_ok: Some(true),
            agent_sentinel: Some(Sentinel {
                path: WorkspacePath::new(AGENT_SENTINEL).unwrap(),
                nonce: AGENT_NONCE.into(),
            }),
        },
        models: vec![],
    })
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A first sync with a DM (alice and the bot) whose timeline is `events`; later syncs are
/// empty and slow (a long-poll that times out).
async fn homeserver(events: Vec<Value>) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/_matrix/client/versions"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"versions": ["v1.11"]})))
        .mount(&server)
        .await;
    let member = |who: &str, id: &str| {
        json!({"type": "m.room.member", "state_key": who, "sender": who, "event_id": id,
               "origin_server_ts": 1, "content": {"membership": "join"}})
    };
    let first = json!({
        "next_batch": "s1",
        "rooms": {"join": {ROOM: {
            "summary": {"m.joined_member_count": 2, "m.invited_member_count": 0},
            "state": {"events": [
                {"type": "m.room.create", "state_key": "", "sender": ALICE, "event_id": "$create",
                 "origin_server_ts": 1, "content": {"room_version": "10"}},
                member(ALICE, "$alice-join"),
                member(BOT, "$bot-join"),
            ]},
            "timeline": {"limited": false, "prev_batch": "p0", "events": events},
        }}}
    });
    Mock::given(method("GET"))
        .and(path("/_matrix/client/v3/sync"))
        .respond_with(ResponseTemplate::new(200).set_body_json(first))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/_matrix/client/v3/sync"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({"next_batch": "s2"}))
                .set_delay(Duration::from_millis(300)),
        )
        .mount(&server)
        .await;
    // An unencrypted room: Synapse's answer for a state event that does not exist.
    Mock::given(method("GET"))
        .and(path_regex(
            r"^/_matrix/client/v3/rooms/[^/]+/state/m\.room\.encryption/?$",
        ))
        .respond_with(
            ResponseTemplate::new(404)
                .set_body_json(json!({"errcode": "M_NOT_FOUND", "error": "Event not found."})),
        )
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(path_regex(r"^/_matrix/client/v3/rooms/[^/]+/typing/"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({})))
        .mount(&server)
        .await;
    Mock::given(method("PUT"))
        .and(path_regex(
            r"^/_matrix/client/v3/rooms/[^/]+/send/m\.room\.message/[^/]+$",
        ))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"event_id": "$posted"})))
        .mount(&server)
        .await;
    server
}

/// The surface running against `server` and the fake agent at `agent_url`.
struct Running {
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    _dir: tempfile::TempDir,
}

async fn start(server: &MockServer, extra: &[(&str, &str)]) -> (Running, Received) {
    let dir = tempfile::tempdir().unwrap();
    let workspace = dir.path().join("workspace");
    std::fs::create_dir_all(&workspace).unwrap();
    let (agent_url, received) = fake_agent(workspace.clone()).await;
    let state = dir.path().join("state");
    let vars: Vec<(String, String)> = [
        ("MATRIX_HOMESERVER_URL", server.uri()),
        ("MATRIX_USER_ID", BOT.to_owned()),
        ("MATRIX_ACCESS_TOKEN", "bot-token".to_owned()),
        ("MATRIX_DEVICE_ID", "BOTDEVICE".to_owned()),
        ("AGENT_URL", agent_url),
        ("AGENT_TOKEN", TOKEN.to_owned()),
        ("WORKSPACE_ROOT", workspace.display().to_string()),
        ("SURFACE_STATE_DIR", state.display().to_string()),
        ("SURFACE_ALLOWED_USERS", "@*:localhost".to_owned()),
        ("SURFACE_HEALTH_BIND", "127.0.0.1:0".to_owned()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .chain(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    )
    .collect();
    let config =
        Config::from_lookup(|name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
            .unwrap();
    let client = Client::builder()
        .homeserver_url(server.uri())
        .sqlite_store(state.join("matrix-store"), None)
        .build()
        .await
        .unwrap();
    client
        .matrix_auth()
        .restore_session(
            MatrixSession {
                meta: SessionMeta {
                    user_id: BOT.try_into().unwrap(),
                    device_id: "BOTDEVICE".into(),
                },
                tokens: SessionTokens {
                    access_token: "bot-token".into(),
                    refresh_token: None,
                },
            },
            RoomLoadSettings::default(),
        )
        .await
        .unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(surface::run_with(
        config,
        client,
        listener,
        None,
        shutdown.clone(),
    ));
    let running = Running {
        shutdown,
        task,
        _dir: dir,
    };
    (running, received)
}

impl Running {
    async fn stop(self) {
        self.shutdown.cancel();
        let result = tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("the surface stops in time")
            .unwrap();
        result.expect("the surface ran without error");
    }
}

/// The messages the surface posted to the room, in order.
async fn posts(server: &MockServer) -> Vec<Value> {
    server
        .received_requests()
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r.method.as_str() == "PUT" && r.url.path().contains("/send/m.room.message/"))
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect()
}

/// Waits until `f` holds, or panics naming `what`.
async fn until<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn text_event(id: &str, body: &str, ts: u64) -> Value {
    json!({"type": "m.room.message", "sender": ALICE, "event_id": id, "origin_server_ts": ts,
           "content": {"msgtype": "m.text", "body": body}})
}

#[tokio::test(flavor = "multi_thread")]
async fn a_synced_message_becomes_a_turn_and_its_answer_a_threaded_reply() {
    let ts = now_ms() + 60_000;
    let server = homeserver(vec![text_event("$hello", "hello from alice", ts)]).await;
    let (running, received) = start(&server, &[]).await;

    until("the turn at the agent", || async {
        !received.lock().unwrap().is_empty()
    })
    .await;
    let turn = received.lock().unwrap()[0].clone();
    assert_eq!(turn.id, "$hello");
    assert_eq!(turn.text, "hello from alice");
    assert_eq!(turn.room_id, ROOM);
    assert_eq!(turn.sender.user_id, ALICE);
    assert_eq!(turn.seq, 1);

    until("the reply in the room", || async {
        !posts(&server).await.is_empty()
    })
    .await;
    let reply = posts(&server).await.remove(0);
    assert_eq!(reply["body"], "echo: hello from alice", "{reply}");
    assert_eq!(reply["m.relates_to"]["rel_type"], "m.thread", "{reply}");
    assert_eq!(reply["m.relates_to"]["event_id"], "$hello", "{reply}");
    assert_eq!(
        reply["m.relates_to"]["m.in_reply_to"]["event_id"], "$hello",
        "{reply}"
    );
    running.stop().await;
    assert_eq!(received.lock().unwrap().len(), 1, "one turn, once");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_for_a_turn_that_is_over_is_refused_at_once() {
    let ts = now_ms() + 60_000;
    let server = homeserver(vec![text_event("$late-turn", "hello", ts)]).await;
    let (running, _received) = start(&server, &[]).await;
    let answered = |id: &'static str| {
        move || async move {
            ANSWERS.lock().unwrap().iter().any(|a| {
                let v = serde_json::to_value(a).unwrap();
                v["request_id"] == id || v["question_id"] == id
            })
        }
    };
    until("the late file refused", answered("late-file-$late-turn")).await;
    until(
        "the late question answered",
        answered("late-ask-$late-turn"),
    )
    .await;
    let answers: Vec<Value> = ANSWERS
        .lock()
        .unwrap()
        .iter()
        .map(|a| serde_json::to_value(a).unwrap())
        .collect();
    let file = answers
        .iter()
        .find(|a| a["request_id"] == "late-file-$late-turn")
        .unwrap();
    assert_eq!(file["ok"], false, "{file}");
    assert!(
        file["error"].as_str().unwrap().contains("is over"),
        "{file}"
    );
    // Nothing was posted for them: the answer only.
    assert_eq!(posts(&server).await.len(), 1);
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_undecryptable_message_holds_its_chat_then_the_room_is_told() {
    let ts = now_ms() + 60_000;
    let encrypted = json!({"type": "m.room.encrypted", "sender": ALICE, "event_id": "$secret",
        "origin_server_ts": ts, "content": {"algorithm": "m.megolm.v1.aes-sha2",
        "ciphertext": "AwgAEnACgAkLmt6qF84IK++J7UDH2Za1YVchHyprqTqsg", "device_id": "ALICEDEV",
        "sender_key": "peI8PxxTAKs4WsYgDBX6Y5jv9jmVUjqYOmR7RyChJ3I",
        "session_id": "missing-session"}});
    let server = homeserver(vec![
        encrypted,
        text_event("$after", "the next one", ts + 1),
    ])
    .await;
    let (running, received) = start(&server, &[("SURFACE_KEY_WAIT", "2s")]).await;

    until("the notice and the next answer", || async {
        posts(&server).await.len() >= 2
    })
    .await;
    let posted = posts(&server).await;
    let notice = &posted[0];
    assert_eq!(notice["msgtype"], "m.notice", "{notice}");
    let body = notice["body"].as_str().unwrap();
    assert!(
        body.contains("could not decrypt") && body.contains(ALICE),
        "{body}"
    );
    assert_eq!(notice["m.relates_to"]["event_id"], "$secret", "{notice}");
    assert_eq!(
        posted[1]["body"], "echo: the next one",
        "the chat went on after the notice"
    );
    let turns = received.lock().unwrap().clone();
    assert_eq!(
        turns.len(),
        1,
        "only the readable message became a turn: {turns:?}"
    );
    running.stop().await;
}
