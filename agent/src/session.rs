//! The driver of one connection to a chat: handshake, admission of turns (stored, then
//! acknowledged), routing of replies and cancels, and the worker that runs the chat's turns one
//! at a time, in order.

mod handshake;
mod hearing;
mod worker;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::ws::WebSocket;
use protocol::{Ack, ChatId, ErrorCode, PROTOCOL_VERSION, ToAgent, UserMessage, Welcome};
use tokio::sync::mpsc;
use tracing::{Instrument, error, info, instrument, warn};

use self::handshake::{check_workspace, handshake};
use self::worker::{Running, cancel_turn, turn_worker};
use crate::chat::{Admission, Chat};
use crate::connection::{CloseReason, Connection, Keepalive, Outbox};
use crate::link::{Link, Replies};
use crate::metrics::QUEUE;
use crate::state::AppState;

static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(1);

/// Serves one WebSocket connection for `chat_id` until it closes.
#[instrument(skip_all, fields(chat_id = %chat_id, conn))]
pub async fn serve(app: AppState, chat_id: ChatId, socket: WebSocket) {
    let conn_id = NEXT_CONNECTION.fetch_add(1, Ordering::Relaxed);
    tracing::Span::current().record("conn", conn_id);
    let limits = app.config.limits.clone();
    let cancel = app.shutdown.child_token();

    let keepalive = Keepalive {
        ping_interval: limits.ping_interval,
        idle_timeout: limits.idle_timeout,
    };
    let chat = match app.chats.chat(&chat_id) {
        Ok(chat) => chat,
        Err(e) => {
            error!(error = %e, "cannot load the chat's record");
            let (conn, out, writer) =
                Connection::new(socket, keepalive, cancel, || CloseReason::Internal);
            let _ = out
                .error(
                    ErrorCode::Internal,
                    "the agent cannot load this chat's state",
                )
                .await;
            out.close(CloseReason::Internal).await;
            drop((conn, out));
            let _ = writer.await;
            return;
        }
    };
    let close_reason = {
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
    };
    let (mut conn, out, writer) = Connection::new(socket, keepalive, cancel.clone(), close_reason);

    let Some(hello) = handshake(&mut conn, &out, &limits).await else {
        drop(conn);
        drop(out);
        let _ = writer.await;
        return;
    };
    info!(surface = %hello.surface, "handshake");
    let workspace = check_workspace(&app.workspace, &chat_id, hello.workspace_sentinel).await;
    let welcome = Welcome {
        protocol_version: PROTOCOL_VERSION,
        agent: env!("CARGO_PKG_NAME").to_owned(),
        agent_version: env!("CARGO_PKG_VERSION").to_owned(),
        last_seq: chat.last_seq().await,
        workspace,
    };
    if out.send(&welcome.into()).await.is_err() {
        return;
    }
    chat.attach(conn_id, cancel.clone());

    let replies = Arc::new(Replies::default());
    let running: Running = Arc::default();
    let link = Link {
        out: out.clone(),
        replies: replies.clone(),
        chat: chat.clone(),
        limits: limits.clone(),
    };
    let (turns_tx, turns_rx) = mpsc::unbounded_channel();
    let unfinished = chat.pending_turns().await;
    if !unfinished.is_empty() {
        info!(
            count = unfinished.len(),
            "resuming stored turns that did not finish"
        );
    }
    for id in unfinished {
        let _ = turns_tx.send((id, QUEUE.enter()));
    }
    let worker = app.tracker.spawn(
        turn_worker(
            app.clone(),
            chat.clone(),
            link,
            turns_rx,
            cancel.clone(),
            running.clone(),
        )
        .in_current_span(),
    );

    while let Some(msg) = conn.recv().await {
        match msg {
            ToAgent::Hello(_) => {
                let _ = out
                    .error(ErrorCode::BadHandshake, "hello was already received")
                    .await;
            }
            ToAgent::UserMessage(m) => match admit(&chat, &out, &m).await {
                Next::Run | Next::Replay => {
                    let _ = turns_tx.send((m.id, QUEUE.enter()));
                }
                Next::Skip => {}
                Next::Disconnect => break,
            },
            ToAgent::ApprovalDecision(d) => {
                if !replies.approval(&d.request_id, d.decision) {
                    let _ = out
                        .error(
                            ErrorCode::UnknownReference,
                            format!("no pending approval request {}", d.request_id),
                        )
                        .await;
                }
            }
            ToAgent::Answer(a) => {
                if !replies.answer(&a.question_id, a.text) {
                    let _ = out
                        .error(
                            ErrorCode::UnknownReference,
                            format!("no pending question {}", a.question_id),
                        )
                        .await;
                }
            }
            ToAgent::DeliveryResult(r) => {
                if r.ok {
                    info!(request_id = %r.request_id, event_id = r.event_id.as_deref().unwrap_or(""), "delivered");
                } else {
                    warn!(request_id = %r.request_id, error = r.error.as_deref().unwrap_or(""), "delivery failed");
                }
                // A report for a request nobody waits for (its turn ended, or it came after
                // the timeout) is only logged.
                replies.delivery(r);
            }
            ToAgent::Cancel(c) => cancel_turn(&chat, &out, &running, &c.turn).await,
            ToAgent::Unknown => {}
        }
    }
    info!("connection closed");
    cancel.cancel();
    drop(turns_tx);
    let _ = worker.await;
    drop(out);
    let _ = writer.await;
    chat.detach(conn_id);
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
