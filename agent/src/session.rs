//! The driver of one connection to a chat: handshake, admission of turns (stored, then
//! acknowledged), routing of replies and cancels, and the worker that runs the chat's turns one
//! at a time, in order.

mod handshake;
mod hearing;
mod worker;

use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::ws::WebSocket;
use protocol::{Ack, ChatId, DeliveryResult, ErrorCode, ToAgent, UserMessage};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, info, instrument, warn};

use self::handshake::{handshake, welcome};
use self::worker::{Running, cancel_turn, turn_worker};
use crate::chat::{Admission, Chat};
use crate::connection::{CloseReason, Connection, Keepalive, Outbox};
use crate::link::{Link, Replies};
use crate::metrics::{QUEUE, Queued};
use crate::state::AppState;

static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(1);

/// Serves one WebSocket connection for `chat_id` until it closes.
#[instrument(skip_all, fields(chat_id = %chat_id, conn))]
pub async fn serve(app: AppState, chat_id: ChatId, socket: WebSocket) {
    let conn_id = NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed);
    tracing::Span::current().record("conn", conn_id);
    let limits = &app.config.limits;
    let cancel = app.shutdown.child_token();
    let keepalive = Keepalive {
        ping_interval: limits.ping_interval,
        idle_timeout: limits.idle_timeout,
    };
    let chat = match app.chats.chat(&chat_id) {
        Ok(chat) => chat,
        Err(e) => {
            error!(error = %e, "cannot load the chat's record");
            return refuse(socket, keepalive, cancel).await;
        }
    };
    let close_reason = close_reason(&app, &chat, conn_id);
    let (mut conn, out, writer) = Connection::new(socket, keepalive, cancel.clone(), close_reason);
    let Some(hello) = handshake(&mut conn, &out, limits).await else {
        drop((conn, out));
        let _ = writer.await;
        return;
    };
    let models = app.config.brain.room_models();
    if !welcome(&app.workspace, &chat, &out, hello, models).await {
        return;
    }
    let unfinished = match chat.pending_turns().await {
        Ok(unfinished) => unfinished,
        Err(e) => {
            // They stay stored; the surface reconnects and they are resumed then.
            error!(error = %e, "cannot read the chat's unfinished turns");
            out.refuse_unreadable_state().await;
            drop((conn, out));
            let _ = writer.await;
            return;
        }
    };
    chat.attach(conn_id, cancel.clone());
    let session = Session::start(&app, &chat, &out, unfinished, cancel.clone()).await;
    while let Some(msg) = conn.recv().await {
        if session.route(msg).await.is_break() {
            break;
        }
    }
    info!("connection closed");
    cancel.cancel();
    session.end().await;
    drop(out);
    let _ = writer.await;
    chat.detach(conn_id);
}

/// Tells the peer that this chat's state cannot be loaded, and closes the connection.
async fn refuse(socket: WebSocket, keepalive: Keepalive, cancel: CancellationToken) {
    let (conn, out, writer) = Connection::new(socket, keepalive, cancel, || CloseReason::Internal);
    let _ = out
        .error(
            ErrorCode::Internal,
            "the agent cannot load this chat's state",
        )
        .await;
    out.close(CloseReason::Internal).await;
    drop((conn, out));
    let _ = writer.await;
}

/// Why connection `conn_id` of `chat` closes, asked when it does: the agent shuts down, the
/// connection simply ended, or a newer connection of the chat replaced it.
fn close_reason(
    app: &AppState,
    chat: &Arc<Chat>,
    conn_id: u64,
) -> impl Fn() -> CloseReason + Send + 'static {
    let shutdown = app.shutdown.clone();
    let chat = chat.clone();
    move || {
        if shutdown.is_cancelled() {
            CloseReason::Shutdown
        } else if chat.is_current(conn_id) {
            CloseReason::Normal
        } else {
            CloseReason::Replaced
        }
    }
}

/// One attached connection's side of its chat: where admitted turns go, the requests waiting
/// for a reply, and the worker that runs the turns.
struct Session {
    chat: Arc<Chat>,
    out: Outbox,
    replies: Arc<Replies>,
    running: Running,
    turns: mpsc::UnboundedSender<(String, Queued)>,
    worker: JoinHandle<()>,
}

impl Session {
    /// Starts the chat's turn worker, with the stored turns that did not finish queued first.
    async fn start(
        app: &AppState,
        chat: &Arc<Chat>,
        out: &Outbox,
        unfinished: Vec<String>,
        cancel: CancellationToken,
    ) -> Self {
        let replies = Arc::new(Replies::default());
        let running: Running = Arc::default();
        let link = Link {
            out: out.clone(),
            replies: replies.clone(),
            chat: chat.clone(),
            limits: app.config.limits.clone(),
        };
        let (turns, queued) = mpsc::unbounded_channel();
        if !unfinished.is_empty() {
            info!(
                count = unfinished.len(),
                "resuming stored turns that did not finish"
            );
        }
        for id in unfinished {
            let _ = turns.send((id, QUEUE.enter()));
        }
        let worker = turn_worker(
            app.clone(),
            chat.clone(),
            link,
            queued,
            cancel,
            running.clone(),
        );
        Self {
            chat: chat.clone(),
            out: out.clone(),
            replies,
            running,
            turns,
            worker: app.tracker.spawn(worker.in_current_span()),
        }
    }

    /// Acts on one message from the surface; `Break` ends the connection.
    async fn route(&self, msg: ToAgent) -> ControlFlow<()> {
        match msg {
            ToAgent::Hello(_) => {
                let _ = self
                    .out
                    .error(ErrorCode::BadHandshake, "hello was already received")
                    .await;
            }
            ToAgent::UserMessage(m) => match admit(&self.chat, &self.out, &m).await {
                Next::Run | Next::Replay => {
                    let _ = self.turns.send((m.id, QUEUE.enter()));
                }
                Next::Skip => {}
                Next::Disconnect => return ControlFlow::Break(()),
            },
            ToAgent::ApprovalDecision(d) => {
                if !self.replies.approval(&d.request_id, d.decision) {
                    self.unknown(format!("no pending approval request {}", d.request_id))
                        .await;
                }
            }
            ToAgent::Answer(a) => {
                if !self.replies.answer(&a.question_id, a.text) {
                    self.unknown(format!("no pending question {}", a.question_id))
                        .await;
                }
            }
            ToAgent::DeliveryResult(r) => self.delivered(r),
            ToAgent::Cancel(c) => cancel_turn(&self.chat, &self.out, &self.running, &c.turn).await,
            ToAgent::Unknown => {}
        }
        ControlFlow::Continue(())
    }

    /// Tells the surface that its reply names no request waiting here.
    async fn unknown(&self, message: String) {
        let _ = self.out.error(ErrorCode::UnknownReference, message).await;
    }

    /// Logs the surface's report on a `send_file` and hands it to the waiting request. A
    /// report nobody waits for (its turn ended, or it came after the timeout) is only logged.
    fn delivered(&self, r: DeliveryResult) {
        if r.ok {
            info!(request_id = %r.request_id, event_id = r.event_id.as_deref().unwrap_or(""), "delivered");
        } else {
            warn!(request_id = %r.request_id, error = r.error.as_deref().unwrap_or(""), "delivery failed");
        }
        self.replies.delivery(r);
    }

    /// Waits for the worker: the queue closes, and the running turn has been cancelled.
    async fn end(self) {
        drop(self.turns);
        let _ = self.worker.await;
    }
}

/// What the receive loop does after [`admit`].
enum Next {
    /// Queue the turn.
    Run,
    /// A resend of a stored turn: queue it so a finished one has its answer sent again.
    Replay,
    /// Nothing more to do (not for this chat, or refused).
    Skip,
    /// End the connection (nothing could be stored).
    Disconnect,
}

/// Stores a user message and acknowledges it.
#[instrument(skip_all, fields(chat_id = %chat.id, seq = m.seq, id = %m.id))]
async fn admit(chat: &Chat, out: &Outbox, m: &UserMessage) -> Next {
    if ChatId::for_conversation(&m.room_id, m.thread_root.as_deref()) != chat.id {
        warn!(room_id = %m.room_id, "message for another conversation");
        let _ = out
            .error(
                ErrorCode::BadMessage,
                format!(
                    "room_id/thread_root of message {} do not belong to chat {}",
                    m.id, chat.id
                ),
            )
            .await;
        return Next::Skip;
    }
    match chat.admit(m).await {
        Ok(Admission::Refused(why)) => {
            // Not stored and not acknowledged: the chat goes on with the next message.
            warn!(reason = %why, "message refused");
            let _ = out
                .error(
                    ErrorCode::BadMessage,
                    format!("message {} refused: {why}", m.id),
                )
                .await;
            Next::Skip
        }
        Ok(admission) => {
            let duplicate = admission == Admission::Duplicate;
            if duplicate {
                info!("duplicate message: acknowledged, not run again");
            }
            if out
                .send(
                    &Ack {
                        seq: m.seq,
                        duplicate,
                    }
                    .into(),
                )
                .await
                .is_err()
            {
                // Stored but not acknowledged: it runs on the next connection.
                return Next::Disconnect;
            }
            if duplicate { Next::Replay } else { Next::Run }
        }
        Err(e) => {
            // Without durable storage nothing may be acknowledged: the surface will resend.
            error!(error = %e, "cannot store the turn");
            let _ = out
                .error(ErrorCode::Internal, "the agent could not store the message")
                .await;
            Next::Disconnect
        }
    }
}
