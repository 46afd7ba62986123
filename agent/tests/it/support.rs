//! Shared helpers: start the real agent on 127.0.0.1:0 and talk to it with a real WebSocket
//! client. Every wait has a deadline; nothing sleeps for synchronization.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agent::Config;
use futures_util::{SinkExt, StreamExt};
use protocol::{
    ChatId, Hello, PROTOCOL_VERSION, Sender, Sentinel, ToAgent, ToSurface, UserMessage, Welcome,
    WorkspacePath, matrix_id_component,
};
use tempfile::TempDir;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tokio_util::sync::CancellationToken;

pub const TOKEN: &str = "test-token-0123456789abcdef";
pub const ROOM: &str = "!room1:test.local";
pub const USER: &str = "@alice:test.local";
/// How long any single wait may take before the test fails.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// A running agent with its own temporary workspace and state directory.
pub struct TestAgent {
    pub addr: SocketAddr,
    pub workspace: TempDir,
    pub state: TempDir,
    shutdown: CancellationToken,
    task: Option<JoinHandle<Result<(), agent::RunError>>>,
}

impl TestAgent {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(tweak: impl FnOnce(&mut Config)) -> Self {
        let workspace = tempfile::tempdir().unwrap();
        let state = tempfile::tempdir().unwrap();
        let mut agent = Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            workspace,
            state,
            shutdown: CancellationToken::new(),
            task: None,
        };
        agent.launch(tweak).await;
        agent
    }

    async fn launch(&mut self, tweak: impl FnOnce(&mut Config)) {
        let mut config = Config::new(
            TOKEN,
            self.workspace.path().to_owned(),
            self.state.path().to_owned(),
        );
        // The suite drives turns with the builtin brain's test hooks (`sleep`, `sendraw`).
        config.test_hooks = true;
        tweak(&mut config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        self.addr = listener.local_addr().unwrap();
        self.shutdown = CancellationToken::new();
        self.task = Some(tokio::spawn(agent::run(
            listener,
            config,
            self.shutdown.clone(),
        )));
    }

    /// Stops the agent through its shutdown token and waits for `run` to return.
    pub async fn stop(&mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            tokio::time::timeout(DEADLINE, task)
                .await
                .expect("agent stops in time")
                .unwrap()
                .unwrap();
        }
    }

    /// Stops and starts again on the same workspace and state directory.
    pub async fn restart(&mut self) {
        self.restart_with(|_| {}).await;
    }

    /// Stops the agent and starts it again on the same folders with `tweak`ed settings.
    pub async fn restart_with(&mut self, tweak: impl FnOnce(&mut Config)) {
        self.stop().await;
        self.launch(tweak).await;
    }

    pub fn url(&self, chat: &str) -> String {
        format!("ws://{}/v1/agent_ws/{chat}/", self.addr)
    }

    pub fn ws_path(&self, rel: &str) -> PathBuf {
        self.workspace.path().join(rel)
    }

    /// Connects with the right token, without the handshake.
    pub async fn connect_raw(&self, chat: &ChatId) -> Client {
        let (ws, _) =
            tokio_tungstenite::connect_async(request(&self.url(chat.as_str()), Some(TOKEN), None))
                .await
                .expect("connect");
        Client {
            ws,
            delivery_error: None,
        }
    }

    /// The agent's `/metrics` (Prometheus text). The recorder is the test process's: every
    /// agent in it serves the same counters, so tests compare with `>=` and unique amounts.
    pub async fn metrics(&self) -> String {
        let url = format!("http://{}/metrics", self.addr);
        let response = tokio::time::timeout(DEADLINE, reqwest::get(url))
            .await
            .expect("/metrics within the deadline")
            .unwrap();
        assert!(response.status().is_success(), "{}", response.status());
        response.text().await.unwrap()
    }

    /// Connects and completes the handshake.
    pub async fn connect(&self, chat: &ChatId) -> (Client, Welcome) {
        let mut c = self.connect_raw(chat).await;
        let welcome = c.hello(None).await;
        (c, welcome)
    }
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// A client request with optional bearer token and Origin header.
pub fn request(
    url: &str,
    token: Option<&str>,
    origin: Option<&str>,
) -> tungstenite::handshake::client::Request {
    let mut req = url.into_client_request().unwrap();
    if let Some(t) = token {
        req.headers_mut().insert(
            "authorization",
            HeaderValue::from_str(&format!("Bearer {t}")).unwrap(),
        );
    }
    if let Some(o) = origin {
        req.headers_mut()
            .insert("origin", HeaderValue::from_str(o).unwrap());
    }
    req
}

/// The HTTP status a refused upgrade got.
pub async fn refused_status(url: &str, token: Option<&str>, origin: Option<&str>) -> u16 {
    match tokio_tungstenite::connect_async(request(url, token, origin)).await {
        Err(tungstenite::Error::Http(resp)) => resp.status().as_u16(),
        Ok(_) => panic!("connection to {url} was accepted"),
        Err(e) => panic!("unexpected error: {e}"),
    }
}

/// The value of one series (`name` or `name{labels}`) in Prometheus text; 0 when absent.
pub fn metric(text: &str, series: &str) -> f64 {
    text.lines()
        .filter_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .filter_map(|v| v.trim().parse::<f64>().ok())
        .sum()
}

pub fn chat() -> ChatId {
    ChatId::for_conversation(ROOM, None)
}

/// `surfaces/matrix/<user>/<room>/inbox` for [`USER`] in `room`.
pub fn inbox(room: &str) -> String {
    format!(
        "surfaces/matrix/{}/{}/inbox",
        matrix_id_component(USER),
        matrix_id_component(room)
    )
}

pub fn write(root: &Path, rel: &str, bytes: &[u8]) -> WorkspacePath {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, bytes).unwrap();
    WorkspacePath::new(rel).unwrap()
}

pub fn message(seq: u64, id: &str, text: &str) -> UserMessage {
    UserMessage {
        seq,
        id: id.to_owned(),
        room_id: ROOM.to_owned(),
        thread_root: None,
        sender: Sender {
            user_id: USER.to_owned(),
            display_name: Some("Alice".to_owned()),
        },
        text: text.to_owned(),
        attachments: Vec::new(),
        attachment_info: Default::default(),
        context: Vec::new(),
        timestamp_ms: 1_700_000_000_000_u64.saturating_add(seq),
        settings: None,
    }
}

pub struct Client {
    pub ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    /// How this test surface reports `send_file` requests: delivered (`None`), or failed with
    /// this error; `expect` answers each one as it passes.
    pub delivery_error: Option<String>,
}

/// Everything one turn produced, in order, up to and including its `end`.
#[derive(Debug, Default)]
pub struct Transcript {
    pub messages: Vec<ToSurface>,
}

impl Transcript {
    pub fn text(&self) -> String {
        self.messages
            .iter()
            .filter_map(|m| match m {
                ToSurface::TextChunk(t) => Some(t.text.as_str()),
                _ => None,
            })
            .collect()
    }

    pub fn tool_calls(&self) -> Vec<&str> {
        self.messages
            .iter()
            .filter_map(|m| match m {
                ToSurface::ToolCallChunk(c) => Some(c.name.as_str()),
                _ => None,
            })
            .collect()
    }

    /// The notices the agent asked the room to show (`custom_update` named `notice`).
    pub fn notices(&self) -> Vec<String> {
        self.messages
            .iter()
            .filter_map(|m| match m {
                ToSurface::CustomUpdate(u) => u.notice_text().map(str::to_owned),
                _ => None,
            })
            .collect()
    }

    pub fn sent_files(&self) -> Vec<&str> {
        self.messages
            .iter()
            .filter_map(|m| match m {
                ToSurface::SendFile(s) => Some(s.path.as_str()),
                _ => None,
            })
            .collect()
    }

    pub fn end(&self) -> &protocol::End {
        match self.messages.last() {
            Some(ToSurface::End(e)) => e,
            other => panic!("transcript does not end with `end`: {other:?}"),
        }
    }
}

impl Client {
    pub async fn send(&mut self, msg: impl Into<ToAgent>) {
        let text = serde_json::to_string(&msg.into()).unwrap();
        self.ws.send(Message::text(text)).await.unwrap();
    }

    pub async fn send_raw(&mut self, text: &str) {
        self.ws.send(Message::text(text.to_owned())).await.unwrap();
    }

    /// The next message, or `None` if the connection closed. Fails after [`DEADLINE`].
    pub async fn recv(&mut self) -> Option<ToSurface> {
        loop {
            let frame = tokio::time::timeout(DEADLINE, self.ws.next())
                .await
                .expect("a message within the deadline");
            match frame {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return None,
                Some(Ok(Message::Text(t))) => {
                    return Some(serde_json::from_str(t.as_str()).expect("valid ToSurface"));
                }
                Some(Ok(_)) => continue,
            }
        }
    }

    pub async fn expect(&mut self) -> ToSurface {
        let msg = self.recv().await.expect("connection still open");
        if let ToSurface::SendFile(f) = &msg {
            let error = self.delivery_error.clone();
            self.send(ToAgent::DeliveryResult(protocol::DeliveryResult {
                request_id: f.request_id.clone(),
                ok: error.is_none(),
                event_id: error.is_none().then(|| "$delivered".to_owned()),
                error,
            }))
            .await;
        }
        msg
    }

    /// Waits for the close: returns the close frame if the agent sent one.
    pub async fn closed(&mut self) -> Option<CloseFrame> {
        loop {
            let frame = tokio::time::timeout(DEADLINE, self.ws.next())
                .await
                .expect("closed within the deadline");
            match frame {
                None | Some(Err(_)) => return None,
                Some(Ok(Message::Close(f))) => return f,
                Some(Ok(_)) => continue,
            }
        }
    }

    pub async fn hello(&mut self, sentinel: Option<Sentinel>) -> Welcome {
        self.send(Hello {
            protocol_version: PROTOCOL_VERSION,
            surface: "test".to_owned(),
            workspace_sentinel: sentinel,
        })
        .await;
        match self.expect().await {
            ToSurface::Welcome(w) => w,
            other => panic!("expected welcome, got {other:?}"),
        }
    }

    /// Sends a user message and expects its `ack`.
    pub async fn submit(&mut self, msg: UserMessage) -> protocol::Ack {
        let seq = msg.seq;
        self.send(msg).await;
        match self.expect().await {
            ToSurface::Ack(a) => {
                assert_eq!(a.seq, seq);
                a
            }
            other => panic!("expected ack, got {other:?}"),
        }
    }

    /// Collects messages up to and including the `end` of `turn`.
    pub async fn until_end(&mut self, turn: &str) -> Transcript {
        let mut t = Transcript::default();
        loop {
            let msg = self.expect().await;
            let done = matches!(&msg, ToSurface::End(e) if e.turn == turn);
            t.messages.push(msg);
            if done {
                return t;
            }
        }
    }

    /// Collects messages until one matches `pred` (returned last in the transcript).
    pub async fn until(&mut self, pred: impl Fn(&ToSurface) -> bool) -> Transcript {
        let mut t = Transcript::default();
        loop {
            let msg = self.expect().await;
            let done = pred(&msg);
            t.messages.push(msg);
            if done {
                return t;
            }
        }
    }

    /// Waits for the next approval request and answers it with `decision` as [`USER`]; what
    /// came until the request (the request last).
    pub async fn answer_approval(&mut self, decision: protocol::Decision) -> Transcript {
        let asked = self
            .until(|m| matches!(m, ToSurface::ApprovalRequest(_)))
            .await;
        let Some(ToSurface::ApprovalRequest(r)) = asked.messages.last() else {
            unreachable!("`until` returns the matching message last")
        };
        self.send(protocol::ApprovalDecision {
            request_id: r.request_id.clone(),
            decision,
            by: USER.into(),
        })
        .await;
        asked
    }

    /// Runs one turn: submit, expect a fresh ack, collect to `end`.
    pub async fn turn(&mut self, msg: UserMessage) -> Transcript {
        let id = msg.id.clone();
        let ack = self.submit(msg).await;
        assert!(!ack.duplicate, "fresh message acked as duplicate");
        self.until_end(&id).await
    }
}
