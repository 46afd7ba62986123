//! The driver of one connection to a chat: handshake, admission of turns (stored, then
//! acknowledged), replies, and the worker that runs the chat's turns one at a time, in order.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::ws::WebSocket;
use protocol::{
    Ack, ChatId, End, EndStatus, ErrorCode, Hello, PROTOCOL_VERSION, Sentinel, TextChunk, ToAgent,
    UserMessage, Welcome, WorkspaceCheck, WorkspacePath,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, info, info_span, instrument, warn};

use crate::brain::{BrainError, TurnInput};
use crate::chat::{Admission, Chat};
use crate::confine::{ChatScope, ScopedWorkspace, Workspace};
use crate::connection::{CloseReason, Connection, Keepalive, Outbox};
use crate::link::{Link, Replies, new_id};
use crate::state::AppState;
use crate::store::TurnStatus;
use crate::turn::TurnIo;

static NEXT_CONNECTION: AtomicU64 = AtomicU64::new(1);

/// The turn currently running on a connection, so `cancel` can reach it.
type Running = Arc<Mutex<Option<(String, CancellationToken)>>>;

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
        let _ = turns_tx.send(id);
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
                    let _ = turns_tx.send(m.id);
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

/// Waits for `hello` and checks its version. `None` (after telling the peer) if it fails.
async fn handshake(
    conn: &mut Connection,
    out: &Outbox,
    limits: &crate::config::Limits,
) -> Option<Hello> {
    let (code, message) = match conn.recv_within(limits.handshake_timeout).await {
        Ok(Some(ToAgent::Hello(hello))) if hello.protocol_version == PROTOCOL_VERSION => {
            return Some(hello);
        }
        Ok(Some(ToAgent::Hello(hello))) => (
            ErrorCode::UnsupportedVersion,
            format!(
                "protocol version {} is not supported; this agent speaks {PROTOCOL_VERSION}",
                hello.protocol_version
            ),
        ),
        Ok(Some(_)) => (
            ErrorCode::BadHandshake,
            "the first message must be hello".to_owned(),
        ),
        Ok(None) => return None,
        Err(_) => (
            ErrorCode::BadHandshake,
            format!("no hello within {:?}", limits.handshake_timeout),
        ),
    };
    warn!(?code, %message, "handshake failed");
    let _ = out.error(code, message).await;
    out.close(CloseReason::Protocol).await;
    None
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

async fn cancel_turn(chat: &Chat, out: &Outbox, running: &Running, turn: &str) {
    let token = {
        let running = running.lock().unwrap_or_else(|e| e.into_inner());
        running
            .as_ref()
            .filter(|(id, _)| id == turn)
            .map(|(_, t)| t.clone())
    };
    if let Some(token) = token {
        info!(turn, "cancelling the running turn");
        token.cancel();
    } else if chat.pending_turns().await.iter().any(|id| id == turn) {
        // Queued but not started: it never runs.
        if chat
            .finish(turn, TurnStatus::Cancelled, String::new(), Vec::new(), None)
            .await
            .is_ok()
        {
            let _ = out
                .send(
                    &End {
                        turn: turn.to_owned(),
                        status: EndStatus::Cancelled,
                        error: None,
                    }
                    .into(),
                )
                .await;
        }
    }
}

/// Runs the connection's queued turns one after the other, holding the chat's lane.
async fn turn_worker(
    app: AppState,
    chat: Arc<Chat>,
    link: Link,
    mut turns: mpsc::UnboundedReceiver<String>,
    cancel: CancellationToken,
    running: Running,
) {
    // A turn resumed at connect and resent by the surface is queued twice: run it once.
    let mut seen = HashSet::new();
    loop {
        let id = tokio::select! {
            _ = cancel.cancelled() => return,
            id = turns.recv() => match id {
                Some(id) => id,
                None => return,
            },
        };
        if !seen.insert(id.clone()) {
            continue;
        }
        let _lane = tokio::select! {
            _ = cancel.cancelled() => return,
            guard = chat.lane.lock() => guard,
        };
        run_turn(&app, &chat, &link, &id, &cancel, &running).await;
    }
}

#[instrument(skip_all, fields(chat_id = %chat.id, turn = %id))]
async fn run_turn(
    app: &AppState,
    chat: &Arc<Chat>,
    link: &Link,
    id: &str,
    conn_cancel: &CancellationToken,
    running: &Running,
) {
    let Some((turn, history, room_id)) = chat.begin(id).await else {
        replay(chat, link, id).await;
        return;
    };
    info!(
        seq = turn.seq,
        attachments = turn.attachments.len(),
        "turn starts"
    );
    let scope = ChatScope::new(chat.id.clone(), room_id.as_deref());
    let ws = ScopedWorkspace {
        workspace: app.workspace.clone(),
        scope,
    };
    let turn_cancel = conn_cancel.child_token();
    *running.lock().unwrap_or_else(|e| e.into_inner()) = Some((id.to_owned(), turn_cancel.clone()));
    let mut io = TurnIo::new(link.clone(), ws, app.registry.clone(), id.to_owned());
    let input = TurnInput {
        chat_id: chat.id.clone(),
        turn,
        history,
    };
    let result = tokio::select! {
        r = app.brain.run_turn(&input, &mut io) => Some(r),
        _ = turn_cancel.cancelled() => None,
    };
    *running.lock().unwrap_or_else(|e| e.into_inner()) = None;

    if conn_cancel.is_cancelled() {
        // Closed, replaced or shutting down: the turn stays pending and runs on the next
        // connection (its acknowledgement already promised that).
        info!("connection ended during the turn; it will run again on reconnect");
        return;
    }
    let (status, error) = match result {
        None => (TurnStatus::Cancelled, None),
        Some(Ok(())) => (TurnStatus::Completed, None),
        Some(Err(BrainError::Disconnected)) => {
            info!("surface went away during the turn; it will run again on reconnect");
            return;
        }
        Some(Err(e)) => {
            error!(error = %e, "turn failed");
            (TurnStatus::Failed, Some(e.public_message()))
        }
    };
    let (output, sent_files) = io.into_output();
    if let Err(e) = chat
        .finish(id, status, output, sent_files, error.clone())
        .await
    {
        error!(error = %e, "cannot record the end of the turn");
    }
    let end_status = end_status(status);
    info!(status = ?end_status, "turn ends");
    let _ = link
        .emit(End {
            turn: id.to_owned(),
            status: end_status,
            error,
        })
        .await;
}

fn end_status(status: TurnStatus) -> EndStatus {
    match status {
        TurnStatus::Completed | TurnStatus::Pending => EndStatus::Completed,
        TurnStatus::Failed => EndStatus::Failed,
        TurnStatus::Cancelled => EndStatus::Cancelled,
    }
}

/// Largest text chunk of a replayed answer, well below the message size limit.
const REPLAY_CHUNK: usize = 16 * 1024;

/// Sends the stored answer of a finished turn again. The surface resends turns it never saw
/// end (the connection that carried the answer may have died with it); its sends are
/// idempotent per turn and output index, so a repeated answer is not posted twice.
/// Files the turn sent are not sent again.
async fn replay(chat: &Chat, link: &Link, id: &str) {
    let Some(turn) = chat.finished(id).await else {
        return;
    };
    info!(status = ?turn.status, "replaying the stored answer of a finished turn");
    let mut rest = turn.output.as_str();
    while !rest.is_empty() {
        let mut cut = rest.len().min(REPLAY_CHUNK);
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        let (piece, tail) = rest.split_at(cut);
        rest = tail;
        let chunk = TextChunk {
            turn: id.to_owned(),
            text: piece.to_owned(),
        };
        if link.emit(chunk).await.is_err() {
            return;
        }
    }
    let _ = link
        .emit(End {
            turn: id.to_owned(),
            status: end_status(turn.status),
            error: turn.error,
        })
        .await;
}

/// Checks the surface's sentinel and writes the agent's own, so each side can prove the two
/// processes see the same workspace.
async fn check_workspace(
    workspace: &Workspace,
    chat: &ChatId,
    sentinel: Option<Sentinel>,
) -> WorkspaceCheck {
    let workspace = workspace.clone();
    let chat = chat.clone();
    let span = info_span!("workspace_check");
    tokio::task::spawn_blocking(move || {
        let _enter = span.enter();
        let surface_sentinel_ok = sentinel.map(|s| {
            let allowed =
                WorkspacePath::new("surfaces/matrix/.sentinel").expect("constant is valid");
            let ok = s.path.starts_with(&allowed)
                && workspace
                    .read_prefix(&s.path, 4096)
                    .is_ok_and(|(bytes, _)| bytes == s.nonce.as_bytes());
            if ok {
                info!(path = %s.path, "surface sentinel found: the workspace is shared");
            } else {
                error!(
                    path = %s.path,
                    "WORKSPACE MISMATCH: the surface's sentinel file is missing or different here; \
                     the surface and the agent do not see the same workspace"
                );
            }
            ok
        });
        let nonce = new_id("agent");
        let agent_sentinel = WorkspacePath::new(format!("chats/.sentinel/{chat}"))
            .ok()
            .and_then(|path| match workspace.write_file(&path, nonce.as_bytes()) {
                Ok(()) => Some(Sentinel { path, nonce }),
                Err(e) => {
                    error!(error = %e, "cannot write the agent's workspace sentinel");
                    None
                }
            });
        WorkspaceCheck {
            surface_sentinel_ok,
            agent_sentinel,
        }
    })
    .await
    .unwrap_or(WorkspaceCheck {
        surface_sentinel_ok: Some(false),
        agent_sentinel: None,
    })
}
