//! The agent link against a fake agent: handshake, resend from `last_seq` after a reconnect,
//! ack recording, and a loud refusal on a workspace mismatch.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use matrix_sdk::ruma::events::room::message::MessageType;
use protocol::{
    Ack, ChatId, PROTOCOL_VERSION, Sender, Sentinel, ToAgent, ToSurface, UserMessage, Welcome,
    WorkspaceCheck, WorkspacePath,
};
use surface::agent_link::{self, AgentEndpoint, HandshakeError, LinkEvent, WorkspaceProof};
use surface::config::Secret;
use surface::health::Health;
use surface::journal::{Disposition, Journal, NewEvent, Stored};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

const TOKEN: &str = "test-token-0123456789";
const AGENT_NONCE: &str = "agent-nonce";

struct FakeProof;

impl WorkspaceProof for FakeProof {
    fn write_sentinel(&self) -> Result<Sentinel, String> {
        Ok(Sentinel {
            path: WorkspacePath::new("surfaces/matrix/.sentinel/s1").unwrap(),
            nonce: "surface-nonce".into(),
        })
    }
    fn check_sentinel(&self, s: &Sentinel) -> Result<(), String> {
        if s.nonce == AGENT_NONCE {
            Ok(())
        } else {
            Err("content differs".into())
        }
    }
}

fn endpoint(addr: std::net::SocketAddr, health: Arc<Health>) -> AgentEndpoint {
    AgentEndpoint {
        urls: vec![format!("ws://{addr}").parse().unwrap()],
        token: Secret::new(TOKEN),
        proof: Arc::new(FakeProof),
        health,
    }
}

/// Accepts one connection, checking the bearer token like the real agent.
async fn accept(listener: &TcpListener) -> WebSocketStream<TcpStream> {
    let (tcp, _) = listener.accept().await.unwrap();
    let check = |req: &Request, resp: Response| -> Result<Response, ErrorResponse> {
        let ok = req
            .headers()
            .get("authorization")
            .is_some_and(|v| v == &format!("Bearer {TOKEN}"));
        if ok {
            Ok(resp)
        } else {
            let mut r = ErrorResponse::new(None);
            *r.status_mut() = StatusCode::UNAUTHORIZED;
            Err(r)
        }
    };
    tokio_tungstenite::accept_hdr_async(tcp, check)
        .await
        .unwrap()
}

async fn recv(ws: &mut WebSocketStream<TcpStream>) -> ToAgent {
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("frame in time")
            .expect("open")
            .unwrap();
        if let Message::Text(t) = frame {
            return serde_json::from_str(t.as_str()).unwrap();
        }
    }
}

async fn send(ws: &mut WebSocketStream<TcpStream>, msg: ToSurface) {
    ws.send(Message::text(serde_json::to_string(&msg).unwrap()))
        .await
        .unwrap();
}

fn welcome(last_seq: u64, surface_ok: bool, agent_nonce: &str) -> ToSurface {
    ToSurface::Welcome(Welcome {
        protocol_version: PROTOCOL_VERSION,
        agent: "fake".into(),
        agent_version: "0".into(),
        last_seq,
        workspace: WorkspaceCheck {
            surface_sentinel_ok: Some(surface_ok),
            agent_sentinel: Some(Sentinel {
                path: WorkspacePath::new("chats/.sentinel/a1").unwrap(),
                nonce: agent_nonce.into(),
            }),
        },
        models: vec![],
    })
}

fn store_turn(journal: &Journal, chat: &ChatId, id: &str) -> u64 {
    journal
        .record(
            "!r:hs",
            &[NewEvent {
                event_id: id.try_into().unwrap(),
                room_id: "!r:hs".try_into().unwrap(),
                chat_id: Some(chat.clone()),
                thread_root: None,
                sender: "@alice:hs".try_into().unwrap(),
                sender_name: None,
                origin_ts: 1,
                content: Some(Stored::Message(MessageType::text_plain("hi"))),
                disposition: Disposition::Trigger,
            }],
        )
        .unwrap();
    let msg = UserMessage {
        seq: 0,
        id: id.into(),
        room_id: "!r:hs".into(),
        thread_root: None,
        sender: Sender {
            user_id: "@alice:hs".into(),
            display_name: None,
        },
        text: format!("text of {id}"),
        attachments: vec![],
        attachment_info: Default::default(),
        context: vec![],
        timestamp_ms: 1,
        settings: None,
    };
    journal.create_turn(chat, msg, &[]).unwrap().seq
}

async fn next_event(rx: &mut tokio::sync::mpsc::Receiver<LinkEvent>) -> LinkEvent {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("link event in time")
        .expect("link alive")
}

#[tokio::test]
async fn handshake_resend_after_reconnect_and_acks() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let journal = Arc::new(Journal::in_memory().unwrap());
    let chat = ChatId::for_conversation("!r:hs", None);
    for id in ["$1", "$2", "$3"] {
        store_turn(&journal, &chat, id);
    }
    let health = Arc::new(Health::default());
    let shutdown = CancellationToken::new();
    let tracker = TaskTracker::new();
    let (handle, mut events) = agent_link::spawn(
        endpoint(addr, health.clone()),
        chat.clone(),
        journal.clone(),
        shutdown.clone(),
        &tracker,
    );

    // First connection: the agent already has seq 1.
    let mut ws = accept(&listener).await;
    let ToAgent::Hello(hello) = recv(&mut ws).await else {
        panic!("hello first")
    };
    assert_eq!(hello.protocol_version, PROTOCOL_VERSION);
    assert_eq!(hello.workspace_sentinel.unwrap().nonce, "surface-nonce");
    send(&mut ws, welcome(1, true, AGENT_NONCE)).await;
    assert_eq!(
        next_event(&mut events).await,
        LinkEvent::Connected { last_seq: 1 }
    );
    // Every unended turn is sent, also seq 1 that the agent has: its duplicate ack lets the
    // lane wait for the stored answer the old connection may have lost.
    let mut seqs = vec![];
    for _ in 0..3 {
        let ToAgent::UserMessage(m) = recv(&mut ws).await else {
            panic!("user message")
        };
        seqs.push(m.seq);
    }
    assert_eq!(seqs, vec![1, 2, 3]);
    journal.finish_turn(&chat, 1, "ended").unwrap();
    send(
        &mut ws,
        ToSurface::Ack(Ack {
            seq: 2,
            duplicate: false,
        }),
    )
    .await;
    assert!(matches!(
        next_event(&mut events).await,
        LinkEvent::Message(ToSurface::Ack(Ack { seq: 2, .. }))
    ));
    assert!(journal.is_acked(&chat, 2).unwrap());
    journal.finish_turn(&chat, 2, "ended").unwrap();
    // An answer sent while connected arrives.
    handle.send(ToAgent::Answer(protocol::Answer {
        question_id: "q".into(),
        text: "blue".into(),
        by: "@alice:hs".into(),
    }));
    assert!(matches!(recv(&mut ws).await, ToAgent::Answer(_)));
    // The agent drops the connection before acking seq 3.
    drop(ws);
    assert_eq!(next_event(&mut events).await, LinkEvent::Disconnected);

    // Second connection: only seq 3 (stored, unended) is resent.
    let mut ws = accept(&listener).await;
    assert!(matches!(recv(&mut ws).await, ToAgent::Hello(_)));
    send(&mut ws, welcome(2, true, AGENT_NONCE)).await;
    assert_eq!(
        next_event(&mut events).await,
        LinkEvent::Connected { last_seq: 2 }
    );
    let ToAgent::UserMessage(m) = recv(&mut ws).await else {
        panic!("resent user message")
    };
    assert_eq!((m.seq, m.id.as_str()), (3, "$3"));
    send(
        &mut ws,
        ToSurface::Ack(Ack {
            seq: 3,
            duplicate: false,
        }),
    )
    .await;
    assert!(matches!(
        next_event(&mut events).await,
        LinkEvent::Message(ToSurface::Ack(_))
    ));
    assert!(journal.is_acked(&chat, 3).unwrap());

    // A new turn stored later is sent once notified.
    let seq = store_turn(&journal, &chat, "$4");
    handle.turns_stored();
    let ToAgent::UserMessage(m) = recv(&mut ws).await else {
        panic!("new user message")
    };
    assert_eq!(m.seq, seq);
    // Unknown message types are ignored, the link keeps going.
    ws.send(Message::text(r#"{"type":"from_the_future","x":1}"#))
        .await
        .unwrap();
    send(
        &mut ws,
        ToSurface::Ack(Ack {
            seq: 4,
            duplicate: true,
        }),
    )
    .await;
    assert!(matches!(
        next_event(&mut events).await,
        LinkEvent::Message(ToSurface::Ack(Ack {
            seq: 4,
            duplicate: true
        }))
    ));
    assert_eq!(
        health.report().status,
        "starting",
        "not synced, but agent ok"
    );

    shutdown.cancel();
    tracker.close();
    tokio::time::timeout(Duration::from_secs(5), tracker.wait())
        .await
        .unwrap();
}

#[tokio::test]
async fn workspace_mismatch_is_refused_and_reported() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let health = Arc::new(Health::default());
    let ep = endpoint(addr, health.clone());
    let chat = ChatId::for_conversation("!r:hs", None);
    let agent = tokio::spawn(async move {
        // 1: the agent did not find our sentinel. 2: we do not find the agent's.
        for (ok, nonce) in [(false, AGENT_NONCE), (true, "other")] {
            let mut ws = accept(&listener).await;
            let _ = recv(&mut ws).await;
            send(&mut ws, welcome(0, ok, nonce)).await;
            let _ = ws.next().await;
        }
        // 3: a wrong token never gets a socket.
        let (tcp, _) = listener.accept().await.unwrap();
        let _ = tokio_tungstenite::accept_hdr_async(
            tcp,
            |_: &Request, _: Response| -> Result<Response, ErrorResponse> {
                let mut r = ErrorResponse::new(None);
                *r.status_mut() = StatusCode::UNAUTHORIZED;
                Err(r)
            },
        )
        .await;
    });
    for _ in 0..2 {
        let err = agent_link::handshake(&ep, &ep.urls[0], &chat)
            .await
            .unwrap_err();
        assert!(matches!(err, HandshakeError::Workspace(_)), "{err}");
    }
    let err = agent_link::handshake(&ep, &ep.urls[0], &chat)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("401"), "{err}");
    agent.await.unwrap();
}

/// Collects everything the subscriber writes.
#[derive(Clone, Default)]
struct Capture(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn the_token_never_reaches_the_log_at_trace() {
    // tungstenite logs through the `log` crate; bridge it like the binary's `init` does. Its
    // records go to this thread's subscriber (the test runtime has one thread).
    let _ = tracing_log::LogTracer::init();
    let out = Capture::default();
    let writer = out.clone();
    let subscriber = surface::logging::subscriber(
        tracing_subscriber::EnvFilter::new("trace"),
        false,
        false,
        move || writer.clone(),
        false,
    );
    let _guard = tracing::subscriber::set_default(subscriber);

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ep = endpoint(listener.local_addr().unwrap(), Arc::new(Health::default()));
    let chat = ChatId::for_conversation("!r:hs", None);
    let agent = tokio::spawn(async move {
        let mut ws = accept(&listener).await;
        let _ = recv(&mut ws).await;
        send(&mut ws, welcome(0, true, AGENT_NONCE)).await;
        ws
    });
    let (conn, _) = agent_link::handshake(&ep, &ep.urls[0], &chat)
        .await
        .unwrap();
    let _ws = agent.await.unwrap();
    drop(conn);

    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    // The capture saw the libraries' TRACE lines, so the absence below means something.
    assert!(text.contains("tungstenite::handshake"), "{text}");
    assert!(!text.contains(TOKEN), "{text}");
}
