//! One typed WebSocket connection: `recv() -> Option<ToAgent>` and `Outbox::send(&ToSurface)`.
//! Nothing else in the agent sees raw frames.
//!
//! A writer task owns the sending half: it drains a bounded queue, pings on an interval and
//! sends the close frame. The receiving half enforces the idle timeout, answers malformed frames
//! with an `error` (the connection stays usable) and ignores unknown message types.

use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, close_code};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use protocol::{ErrorCode, ErrorMsg, ToAgent, ToSurface};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

/// Messages queued for the writer task; at most this many wait before senders are slowed down.
const OUTBOX_CAPACITY: usize = 64;

/// Why a connection is being closed, mapped to a WebSocket close code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// Normal end.
    Normal,
    /// The agent is shutting down.
    Shutdown,
    /// Another connection for the same chat took over.
    Replaced,
    /// The peer stayed silent past the idle timeout.
    Idle,
    /// A frame or message was over the size limit.
    TooBig,
    /// The handshake failed or the peer broke the protocol.
    Protocol,
    /// The agent cannot serve this chat (e.g. its state is unreadable).
    Internal,
}

impl CloseReason {
    fn frame(self) -> CloseFrame {
        let (code, reason) = match self {
            Self::Normal => (close_code::NORMAL, "bye"),
            Self::Shutdown => (close_code::AWAY, "agent shutting down"),
            Self::Replaced => (close_code::NORMAL, "replaced by a newer connection"),
            Self::Idle => (close_code::AWAY, "idle timeout"),
            Self::TooBig => (close_code::SIZE, "message too big"),
            Self::Protocol => (close_code::POLICY, "protocol violation"),
            Self::Internal => (close_code::ERROR, "internal error"),
        };
        CloseFrame {
            code,
            reason: reason.into(),
        }
    }
}

enum Out {
    Frame(String),
    Close(CloseReason),
}

/// The connection is closed; nothing more can be sent.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("connection closed")]
pub struct Closed;

/// Sends typed messages to the surface. Cheap to clone; bounded, so a slow peer slows senders.
#[derive(Debug, Clone)]
pub struct Outbox {
    tx: mpsc::Sender<Out>,
}

impl std::fmt::Debug for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Out::Frame(_) => f.write_str("Frame"),
            Out::Close(r) => write!(f, "Close({r:?})"),
        }
    }
}

impl Outbox {
    /// Queues a message for the surface.
    pub async fn send(&self, msg: &ToSurface) -> Result<(), Closed> {
        let text = serde_json::to_string(msg).map_err(|_| Closed)?;
        self.tx.send(Out::Frame(text)).await.map_err(|_| Closed)
    }

    /// Sends an `error` message.
    pub async fn error(&self, code: ErrorCode, message: impl Into<String>) -> Result<(), Closed> {
        self.send(&ToSurface::Error(ErrorMsg {
            code,
            message: message.into(),
        }))
        .await
    }

    /// Tells the peer that this chat's stored state cannot be read now, and closes (the surface
    /// reconnects and asks again).
    pub async fn refuse_unreadable_state(&self) {
        let _ = self
            .error(
                ErrorCode::Internal,
                "the agent cannot read this chat's state",
            )
            .await;
        self.close(CloseReason::Internal).await;
    }

    /// Whether the connection is gone (nothing sent now reaches the surface).
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Asks the writer to send a close frame and stop.
    pub async fn close(&self, reason: CloseReason) {
        let _ = self.tx.send(Out::Close(reason)).await;
    }
}

/// The receiving half of a connection.
#[derive(Debug)]
pub struct Connection {
    stream: SplitStream<WebSocket>,
    out: Outbox,
    idle_timeout: Duration,
    last_seen: Instant,
    cancel: CancellationToken,
}

/// Keepalive settings.
#[derive(Debug, Clone, Copy)]
pub struct Keepalive {
    /// How often to ping.
    pub ping_interval: Duration,
    /// Close after this long without any frame from the peer.
    pub idle_timeout: Duration,
}

impl Connection {
    /// Splits `socket` into a typed connection and its outbox, spawning the writer task.
    /// `cancel` closes the connection (the close reason is taken from `close_reason` then).
    pub fn new(
        socket: WebSocket,
        keepalive: Keepalive,
        cancel: CancellationToken,
        close_reason: impl Fn() -> CloseReason + Send + 'static,
    ) -> (Self, Outbox, tokio::task::JoinHandle<()>) {
        let (sink, stream) = socket.split();
        let (tx, rx) = mpsc::channel(OUTBOX_CAPACITY);
        let writer = tokio::spawn(write_loop(
            sink,
            rx,
            keepalive,
            cancel.clone(),
            close_reason,
        ));
        let out = Outbox { tx };
        (
            Self {
                stream,
                out: out.clone(),
                idle_timeout: keepalive.idle_timeout,
                last_seen: Instant::now(),
                cancel,
            },
            out,
            writer,
        )
    }

    /// The next message from the surface; `None` once the connection is over (closed by the
    /// peer, cancelled, idle, oversized frame or transport error).
    pub async fn recv(&mut self) -> Option<ToAgent> {
        loop {
            let deadline = self.last_seen + self.idle_timeout;
            let next = tokio::select! {
                _ = self.cancel.cancelled() => return None,
                r = tokio::time::timeout_at(deadline, self.stream.next()) => r,
            };
            let frame = match next {
                Err(_) => {
                    info!("closing idle connection");
                    self.out.close(CloseReason::Idle).await;
                    return None;
                }
                Ok(None) => return None,
                Ok(Some(Err(e))) => {
                    // axum hides the tungstenite error type; its message is stable enough.
                    let too_big = e.to_string().contains("Space limit exceeded");
                    if too_big {
                        warn!(error = %e, "frame over the size limit");
                        let _ = self
                            .out
                            .error(ErrorCode::BadMessage, "message over the size limit")
                            .await;
                        self.out.close(CloseReason::TooBig).await;
                    } else {
                        debug!(error = %e, "websocket read failed");
                        self.out.close(CloseReason::Protocol).await;
                    }
                    return None;
                }
                Ok(Some(Ok(frame))) => frame,
            };
            self.last_seen = Instant::now();
            match frame {
                Message::Text(text) => {
                    if let Some(msg) = self.decode(text.as_str()).await {
                        return Some(msg);
                    }
                }
                Message::Binary(_) => {
                    let _ = self
                        .out
                        .error(ErrorCode::BadMessage, "binary frames are not supported")
                        .await;
                }
                Message::Ping(_) | Message::Pong(_) => {}
                Message::Close(_) => return None,
            }
        }
    }

    /// Decodes one text frame; `None` (after answering or logging) if it is not a known message.
    async fn decode(&self, text: &str) -> Option<ToAgent> {
        match serde_json::from_str::<ToAgent>(text) {
            Ok(ToAgent::Unknown) => {
                let kind = protocol::peek_type(text);
                warn!(
                    kind = kind.as_deref().unwrap_or("?"),
                    "ignoring unknown message type"
                );
                None
            }
            Ok(msg) => Some(msg),
            Err(e) => {
                warn!(kind = protocol::peek_type(text).as_deref().unwrap_or("?"), error = %e, "malformed message");
                let _ = self
                    .out
                    .error(ErrorCode::BadMessage, format!("malformed message: {e}"))
                    .await;
                None
            }
        }
    }

    /// Waits for the next message at most `limit`; `Err` on timeout.
    pub async fn recv_within(&mut self, limit: Duration) -> Result<Option<ToAgent>, Elapsed> {
        tokio::time::timeout(limit, self.recv())
            .await
            .map_err(|_| Elapsed)
    }
}

/// A deadline passed.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("timed out")]
pub struct Elapsed;

async fn write_loop(
    mut sink: SplitSink<WebSocket, Message>,
    mut rx: mpsc::Receiver<Out>,
    keepalive: Keepalive,
    cancel: CancellationToken,
    close_reason: impl Fn() -> CloseReason,
) {
    // However the writer ends, the whole connection ends with it.
    let _end_connection = cancel.clone().drop_guard();
    // A peer that stops reading must not hold the connection (and its senders) forever.
    let stall = keepalive.idle_timeout;
    let mut ping = tokio::time::interval_at(
        Instant::now() + keepalive.ping_interval,
        keepalive.ping_interval,
    );
    let reason = loop {
        let frame = tokio::select! {
            biased;
            out = rx.recv() => match out {
                Some(Out::Frame(text)) => Message::Text(text.into()),
                Some(Out::Close(reason)) => break reason,
                None => break CloseReason::Normal,
            },
            _ = ping.tick() => Message::Ping(Default::default()),
            _ = cancel.cancelled() => {
                // Flush what is already queued (e.g. an `end`) before closing.
                while let Ok(Out::Frame(text)) = rx.try_recv() {
                    if !matches!(
                        tokio::time::timeout(stall, sink.send(Message::Text(text.into()))).await,
                        Ok(Ok(()))
                    ) {
                        return;
                    }
                }
                break close_reason();
            }
        };
        match tokio::time::timeout(stall, sink.send(frame)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                debug!(error = %e, "websocket write failed");
                return;
            }
            Err(_) => {
                warn!("peer stopped reading; dropping the connection");
                return;
            }
        }
    };
    let _ = tokio::time::timeout(stall, async {
        let _ = sink.send(Message::Close(Some(reason.frame()))).await;
        let _ = sink.close().await;
    })
    .await;
}
