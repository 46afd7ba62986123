//! Running a connection's turns: the worker takes queued turns one at a time while holding
//! the chat's lane, runs each through the brain (or replays a finished one's stored answer),
//! records how it ended, and cancels the running or a queued turn on request.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use protocol::{End, EndStatus, ErrorCode};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, instrument, warn};

use crate::brain::{BrainError, TurnInput};
use crate::chat::Chat;
use crate::confine::{ChatScope, ScopedWorkspace};
use crate::connection::{CloseReason, Outbox};
use crate::lease::Held;
use crate::link::Link;
use crate::metrics::Queued;
use crate::state::AppState;
use crate::store::{Begun, TurnStatus};
use crate::turn::TurnIo;

/// The turn currently running on a connection, so `cancel` can reach it.
pub(super) type Running = Arc<Mutex<Option<(String, CancellationToken)>>>;

/// Cancels `turn` on the user's request: the running turn through its token; a queued one is
/// recorded as cancelled and ended at once, so it never runs.
pub(super) async fn cancel_turn(chat: &Chat, out: &Outbox, running: &Running, turn: &str) {
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
    } else if chat
        .pending_turns()
        .await
        .inspect_err(|e| error!(error = %e, turn, "cannot read the chat's pending turns"))
        .unwrap_or_default()
        .iter()
        .any(|id| id == turn)
    {
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

/// Runs the connection's queued turns one after the other, holding the chat's lane. Each turn
/// keeps its place in the process-wide queue ([`Queued`]) until it starts.
pub(super) async fn turn_worker(
    app: AppState,
    chat: Arc<Chat>,
    link: Link,
    mut turns: mpsc::UnboundedReceiver<(String, Queued)>,
    cancel: CancellationToken,
    running: Running,
) {
    // A turn resumed at connect and resent by the surface is queued twice: run it once.
    let mut seen = HashSet::new();
    // The chat's lease, kept from one turn to the next while more are queued (or follow at once).
    let mut kept: Option<Held> = None;
    loop {
        let (id, queued) = tokio::select! {
            _ = cancel.cancelled() => break,
            next = next_turn(&chat, &mut turns, &mut kept) => match next {
                Some(next) => next,
                None => break,
            },
        };
        if !seen.insert(id.clone()) {
            continue;
        }
        let _lane = tokio::select! {
            _ = cancel.cancelled() => break,
            guard = chat.lane.lock() => guard,
        };
        // One turn at a time across every agent sharing the database, too.
        let lease = match kept.take().filter(|l| !l.lost().is_cancelled()) {
            Some(lease) => lease,
            None => match app.leases.acquire(&chat.id, &id, &cancel).await {
                Some(lease) => lease,
                None => break,
            },
        };
        // Losing the lease ends the turn like losing the connection: it stays pending.
        let turn_scope = cancel.child_token();
        let stop_on_loss = {
            let (lost, turn_scope) = (lease.lost().clone(), turn_scope.clone());
            tokio::spawn(async move {
                tokio::select! {
                    _ = lost.cancelled() => turn_scope.cancel(),
                    _ = turn_scope.cancelled() => {}
                }
            })
        };
        run_turn(&app, &chat, &link, &id, queued, &turn_scope, &running).await;
        stop_on_loss.abort();
        if turn_scope.is_cancelled() && !cancel.is_cancelled() {
            // Stopped by the lease's loss (the renewal said why), unfinished: it stays pending.
            // Only a new connection runs a pending turn again, so this one ends: the surface
            // reconnects and sends the turn again, to run wherever the lease is then held.
            warn!(chat_id = %chat.id, turn_id = %id, "the chat's lease was lost during the turn; it stays pending, and the connection closes so that the surface sends it again");
            link.out.close(CloseReason::Internal).await;
            break;
        }
        kept = Some(lease);
    }
    chat.idle().await;
}

/// How long a chat's lease is kept once its queue is empty, for a next turn that follows at once
/// (messages sent in a burst, or on reading an answer): taking it again costs two statements.
const LINGER: std::time::Duration = std::time::Duration::from_millis(200);

/// The next queued turn (`None`: the connection's queue closed). A kept lease is given back
/// when none comes within [`LINGER`], before waiting on: another agent may run the chat's next
/// turn (and the chat's record drops what it held to begin the next turn sooner).
async fn next_turn(
    chat: &Chat,
    turns: &mut mpsc::UnboundedReceiver<(String, Queued)>,
    kept: &mut Option<Held>,
) -> Option<(String, Queued)> {
    if kept.is_some() {
        if let Ok(next) = tokio::time::timeout(LINGER, turns.recv()).await {
            return next;
        }
        *kept = None;
        chat.idle().await;
    }
    turns.recv().await
}

#[instrument(skip_all, fields(chat_id = %chat.id, turn = %id))]
async fn run_turn(
    app: &AppState,
    chat: &Arc<Chat>,
    link: &Link,
    id: &str,
    queued: Queued,
    conn_cancel: &CancellationToken,
    running: &Running,
) {
    let Begun {
        mut turn,
        history,
        room_id,
        steps,
    } = match chat.begin(id).await {
        Ok(Some(begun)) => begun,
        Ok(None) => {
            // Finished already: its answer is sent again; it does not run, so no wait counts.
            drop(queued);
            replay(chat, link, id).await;
            return;
        }
        Err(e) => {
            // Stays pending: it runs on the next connection.
            error!(error = %e, "cannot read the turn from the chat's history");
            return;
        }
    };
    if !steps.is_empty() {
        crate::metrics::turn_resumed();
        info!(
            steps = steps.len(),
            "the turn was interrupted; it resumes after its recorded steps"
        );
    }
    let waited = queued.started();
    info!(
        seq = turn.seq,
        attachments = turn.attachments.len(),
        waited_ms = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
        "turn starts"
    );
    let scope = ChatScope::new(chat.id.clone(), room_id.as_deref());
    let ws = ScopedWorkspace {
        workspace: app.workspace.clone(),
        scope,
    };
    let turn_cancel = conn_cancel.child_token();
    *running.lock().unwrap_or_else(|e| e.into_inner()) = Some((id.to_owned(), turn_cancel.clone()));
    if let Some(transcriber) = &app.perception.transcriber {
        tokio::select! {
            _ = super::hearing::hear(transcriber, chat, link, &ws, &mut turn, waited) => {}
            _ = turn_cancel.cancelled() => {}
        }
    }
    let mut io = TurnIo::new(
        link.clone(),
        ws,
        app.registry.clone(),
        app.memory.clone(),
        app.perception.clone(),
        id.to_owned(),
        turn.sender.user_id.clone(),
    )
    .with_room_tools(
        turn.settings
            .as_ref()
            .map(|s| s.tools.clone())
            .unwrap_or_default(),
    )
    .resuming(steps);
    let input = TurnInput {
        chat_id: chat.id.clone(),
        turn,
        history,
    };
    let started = std::time::Instant::now();
    let result = think(app, &input, &mut io, &turn_cancel).await;
    *running.lock().unwrap_or_else(|e| e.into_inner()) = None;

    if conn_cancel.is_cancelled() {
        // Closed, replaced or shutting down: the turn stays pending and runs on the next
        // connection (its acknowledgement already promised that).
        info!("connection ended during the turn; it will run again on reconnect");
        return;
    }
    finish(chat, link, id, result, io, started).await;
}

/// Runs the brain on `input` until it ends or `cancel` fires (`None`); a turn cancelled while
/// its recordings were transcribed does not start.
async fn think(
    app: &AppState,
    input: &TurnInput,
    io: &mut TurnIo,
    cancel: &CancellationToken,
) -> Option<Result<(), BrainError>> {
    metrics::gauge!(crate::metrics::RUNNING).increment(1.0);
    let result = if cancel.is_cancelled() {
        None
    } else {
        tokio::select! {
            r = app.brain.run_turn(input, io) => Some(r),
            _ = cancel.cancelled() => None,
        }
    };
    metrics::gauge!(crate::metrics::RUNNING).decrement(1.0);
    result
}

/// Records how turn `id` ended (`result`: `None` when cancelled) with what it said and sent,
/// and tells the surface; a turn whose surface went away stays pending instead.
async fn finish(
    chat: &Chat,
    link: &Link,
    id: &str,
    result: Option<Result<(), BrainError>>,
    io: TurnIo,
    started: std::time::Instant,
) {
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
    if !record_end(chat, link, id, status, output, sent_files, error.clone()).await {
        // Stays pending and runs again: an `end` now would make the surface forget a turn that
        // is not over, and drop what its next run sends. It reconnects and resends it instead.
        let _ = link
            .out
            .error(
                ErrorCode::Internal,
                "the agent could not store the end of a turn",
            )
            .await;
        link.out.close(CloseReason::Internal).await;
        return;
    }
    let end_status = end_status(status);
    crate::metrics::turn(
        match end_status {
            EndStatus::Completed => "completed",
            EndStatus::Failed => "failed",
            EndStatus::Cancelled => "cancelled",
        },
        started.elapsed(),
    );
    info!(status = ?end_status, "turn ends");
    let _ = link
        .emit(End {
            turn: id.to_owned(),
            status: end_status,
            error,
        })
        .await;
}

/// How long the end of a turn is tried to be stored (a database restart takes seconds).
const END_PATIENCE: std::time::Duration = std::time::Duration::from_secs(20);

/// Stores how turn `id` ended, trying again for [`END_PATIENCE`] while the surface is there;
/// whether it is stored.
async fn record_end(
    chat: &Chat,
    link: &Link,
    id: &str,
    status: TurnStatus,
    output: String,
    sent_files: Vec<protocol::WorkspacePath>,
    error: Option<String>,
) -> bool {
    let deadline = tokio::time::Instant::now() + END_PATIENCE;
    let mut wait = std::time::Duration::from_millis(250);
    loop {
        let stored = chat
            .finish(
                id,
                status,
                output.clone(),
                sent_files.clone(),
                error.clone(),
            )
            .await;
        match stored {
            Ok(()) => return true,
            Err(e) if link.out.is_closed() || tokio::time::Instant::now() + wait > deadline => {
                error!(error = %e, "cannot record the end of the turn; it stays pending");
                return false;
            }
            Err(e) => warn!(error = %e, "cannot record the end of the turn yet; trying again"),
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(std::time::Duration::from_secs(4));
    }
}

fn end_status(status: TurnStatus) -> EndStatus {
    match status {
        TurnStatus::Completed | TurnStatus::Pending => EndStatus::Completed,
        TurnStatus::Failed => EndStatus::Failed,
        TurnStatus::Cancelled => EndStatus::Cancelled,
    }
}

/// Sends the stored answer of a finished turn again. The surface resends turns it never saw
/// end (the connection that carried the answer may have died with it); its sends are
/// idempotent per turn and output index, so a repeated answer is not posted twice.
/// Files the turn sent are not sent again.
async fn replay(chat: &Chat, link: &Link, id: &str) {
    let turn = match chat.finished(id).await {
        Ok(Some(turn)) => turn,
        Ok(None) => return,
        Err(e) => {
            error!(error = %e, "cannot read the finished turn to replay it");
            return;
        }
    };
    info!(status = ?turn.status, "replaying the stored answer of a finished turn");
    if link.emit_text(id, &turn.output).await.is_err() {
        return;
    }
    let _ = link
        .emit(End {
            turn: id.to_owned(),
            status: end_status(turn.status),
            error: turn.error,
        })
        .await;
}
