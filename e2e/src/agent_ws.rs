//! A minimal surface speaking the wire protocol to a real agent process, for tests that need
//! many turns quickly or frames a real surface would never send.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use futures_util::{SinkExt, StreamExt};
use protocol::{
    ApprovalDecision, ChatId, Decision, DeliveryResult, EndStatus, Hello, PROTOCOL_VERSION, Sender,
    ToAgent, ToSurface, UserMessage, WorkspacePath, agent_ws_path,
};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// How long one frame may take before the client gives up.
const FRAME: Duration = Duration::from_secs(60);

/// What one turn produced.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The streamed text, joined.
    pub text: String,
    /// Paths the agent asked the surface to send (this client never delivers them).
    pub sent_files: Vec<WorkspacePath>,
    /// How the turn ended.
    pub status: Option<EndStatus>,
}

/// Message `seq` (event id `id`) from the test user in `room_id`, as a surface sends it.
pub fn user_message(seq: u64, id: &str, room_id: &str, text: &str) -> ToAgent {
    ToAgent::UserMessage(UserMessage {
        seq,
        id: id.to_owned(),
        room_id: room_id.to_owned(),
        thread_root: None,
        sender: Sender {
            user_id: "@e2e:localhost".into(),
            display_name: None,
        },
        text: text.to_owned(),
        attachments: vec![],
        attachment_info: BTreeMap::new(),
        context: vec![],
        timestamp_ms: 0,
        settings: None,
    })
}

/// One WebSocket connection to the agent, past the handshake.
#[derive(Debug)]
pub struct AgentWs {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    room_id: String,
}

/// The status of an upgrade request to `base` (`ws://host:port`) for `chat`, with an optional
/// bearer token, `Origin` header and query string (101 when it is accepted).
pub async fn upgrade_status(
    base: &str,
    chat: &str,
    token: Option<&str>,
    origin: Option<&str>,
    query: Option<&str>,
) -> u16 {
    let mut url = format!("{base}/v1/agent_ws/{chat}/");
    if let Some(q) = query {
        url.push('?');
        url.push_str(q);
    }
    let Ok(mut req) = url.into_client_request() else {
        return 0;
    };
    let headers = req.headers_mut();
    if let Some(Ok(v)) = token.map(|t| format!("Bearer {t}").parse()) {
        headers.insert("authorization", v);
    }
    if let Some(Ok(v)) = origin.map(str::parse) {
        headers.insert("origin", v);
    }
    match tokio_tungstenite::connect_async(req).await {
        Ok(_) => 101,
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => resp.status().as_u16(),
        Err(_) => 0,
    }
}

impl AgentWs {
    /// Connects to `base` (`ws://host:port`) for the chat of room `room_id` and says hello.
    pub async fn connect(base: &str, room_id: &str, token: &str) -> Result<Self> {
        let chat = ChatId::for_conversation(room_id, None);
        let mut req = format!("{base}{}", agent_ws_path(&chat)).into_client_request()?;
        req.headers_mut()
            .insert("authorization", format!("Bearer {token}").parse()?);
        let (ws, _) = tokio_tungstenite::connect_async(req)
            .await
            .context("connect to the agent")?;
        let mut me = Self {
            ws,
            room_id: room_id.to_owned(),
        };
        me.send(&ToAgent::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            surface: "e2e".into(),
            workspace_sentinel: None,
        }))
        .await?;
        match me.next().await? {
            Some(ToSurface::Welcome(_)) => Ok(me),
            other => bail!("expected welcome, got {other:?}"),
        }
    }

    /// Sends a protocol message.
    pub async fn send(&mut self, msg: &ToAgent) -> Result<()> {
        self.send_raw(Message::text(serde_json::to_string(msg)?))
            .await
    }

    /// Sends any WebSocket message, however malformed its content.
    pub async fn send_raw(&mut self, msg: Message) -> Result<()> {
        self.ws.send(msg).await.context("send to the agent")
    }

    /// The next protocol message; `None` when the agent closed the connection.
    pub async fn next(&mut self) -> Result<Option<ToSurface>> {
        loop {
            let frame = tokio::time::timeout(FRAME, self.ws.next())
                .await
                .context("the agent went silent")?;
            match frame {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return Ok(None),
                Some(Ok(Message::Text(t))) => return Ok(Some(serde_json::from_str(t.as_str())?)),
                Some(Ok(_)) => continue,
            }
        }
    }

    /// Runs one turn: sends `text` as message `seq` with id `id` and collects what comes back
    /// until its end. Approvals are denied, questions answered empty, file sends reported
    /// failed (nothing is uploaded).
    pub async fn turn(&mut self, seq: u64, id: &str, text: &str) -> Result<Outcome> {
        self.send(&user_message(seq, id, &self.room_id, text))
            .await?;
        let mut out = Outcome::default();
        loop {
            let Some(msg) = self.next().await? else {
                bail!("the agent closed the connection during turn {id}");
            };
            match msg {
                ToSurface::TextChunk(c) => out.text.push_str(&c.text),
                ToSurface::SendFile(f) => {
                    out.sent_files.push(f.path);
                    self.send(&ToAgent::DeliveryResult(DeliveryResult {
                        request_id: f.request_id,
                        ok: false,
                        event_id: None,
                        error: Some("this test client does not deliver files".into()),
                    }))
                    .await?;
                }
                ToSurface::ApprovalRequest(a) => {
                    self.send(&ToAgent::ApprovalDecision(ApprovalDecision {
                        request_id: a.request_id,
                        decision: Decision::Deny,
                        by: "@e2e:localhost".into(),
                    }))
                    .await?;
                }
                ToSurface::AskUser(q) => {
                    self.send(&ToAgent::Answer(protocol::Answer {
                        question_id: q.question_id,
                        text: String::new(),
                        by: "@e2e:localhost".into(),
                    }))
                    .await?;
                }
                ToSurface::End(e) if e.turn == id => {
                    out.status = Some(e.status);
                    return Ok(out);
                }
                ToSurface::Error(e) => bail!("the agent refused turn {id}: {}", e.message),
                _ => {}
            }
        }
    }
}
