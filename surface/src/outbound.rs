//! Background work that is not tied to a message: posting files dropped into a room's
//! `outbox/` (once each, with a transaction id derived from path and content), and the inbox
//! retention sweep.

use std::time::Duration;

use matrix_sdk::Room;
use protocol::{ChatId, WorkspacePath};
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use tracing::{Instrument, error, info, info_span, warn};

use crate::context::Ctx;
use crate::media;
use crate::outbox::{self, OutboxItem};
use crate::purpose::Purpose;
use crate::render;
use crate::retention;
use crate::send::{self, Outgoing, PostError};
use crate::workspace::{ChatScope, Outcome, user_reason};

/// Watches the outboxes and posts what appears, until shutdown.
pub async fn run_outbox(ctx: Ctx) {
    let (tx, mut rx) = mpsc::channel(64);
    let _watcher = match outbox::watch_outboxes(ctx.config.workspace_root.clone(), tx) {
        Ok(w) => w,
        Err(e) => {
            error!(error = %e, "outbox watcher could not start; files dropped in outboxes are not posted");
            return;
        }
    };
    loop {
        let item = tokio::select! {
            _ = ctx.shutdown.cancelled() => return,
            item = rx.recv() => item,
        };
        let Some(item) = item else { return };
        let span = info_span!("outbox", path = %item.path);
        post_outbox_file(&ctx, item).instrument(span).await;
    }
}

fn room_for(ctx: &Ctx, component: &str) -> Option<Room> {
    ctx.client
        .joined_rooms()
        .into_iter()
        .find(|r| outbox::room_component_matches(r.room_id().as_str(), component))
}

async fn sha256_of(ctx: &Ctx, path: &WorkspacePath, scope: &ChatScope) -> Result<String, String> {
    let opened = ctx
        .workspace
        .open_for_upload(path, scope, ctx.config.max_file_size)
        .map_err(|e| user_reason(&e))?;
    let mut reader = opened.reader().map_err(|e| e.to_string())?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = reader.read(&mut buf).await.map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

async fn post_outbox_file(ctx: &Ctx, item: OutboxItem) {
    let Some(room) = room_for(ctx, &item.room_component) else {
        warn!("outbox of a room the bot is not in; leaving the file");
        return;
    };
    let room_id = room.room_id().to_string();
    let scope = ChatScope::new(ChatId::for_conversation(&room_id, None), room_id.clone());
    let outcome = match sha256_of(ctx, &item.path, &scope).await {
        Err(reason) => {
            warn!(room_id = %room_id, reason = %reason, "outbox file refused");
            Outcome::Failed
        }
        Ok(sha) => {
            let txn = render::outbox_txn_id(&item.path, &sha);
            let content = ctx
                .prepare_file(&item.path, &scope, media::Posting::default())
                .await;
            match content {
                Ok(content) => {
                    let out = Outgoing {
                        txn: &txn,
                        thread_root: None,
                        about: None,
                        purpose: Purpose::Outbox,
                    };
                    match send::post(ctx, &room, content, out).await {
                        Ok(event_id) => {
                            info!(room_id = %room_id, event_id = %event_id, "outbox file posted");
                            Outcome::Sent
                        }
                        Err(PostError::Refused(r)) => {
                            send::report_refusal(ctx, &room, out, None, &r).await;
                            Outcome::Failed
                        }
                        Err(PostError::AlreadyParked(_)) => Outcome::Failed,
                        Err(e) => {
                            // Left in place: a restart reports it again and the same txn id
                            // keeps it from being posted twice.
                            error!(room_id = %room_id, error = %e, "could not post outbox file");
                            return;
                        }
                    }
                }
                Err(e) => {
                    warn!(room_id = %room_id, reason = %e.failure, "outbox file not sent");
                    Outcome::Failed
                }
            }
        }
    };
    if let Err(e) = ctx.workspace.move_aside(&item.path, outcome) {
        warn!(error = %e, "could not move the outbox file aside");
    }
}

/// Removes old inbox files periodically, if `SURFACE_INBOX_RETENTION` is set.
pub async fn run_retention(ctx: Ctx) {
    let Some(max_age) = ctx.config.inbox_retention else {
        return;
    };
    let every = (max_age / 10).clamp(Duration::from_secs(60), Duration::from_secs(3600));
    loop {
        let report = retention::sweep_inboxes(&ctx.workspace, max_age).await;
        if report.removed > 0 || report.partials_removed > 0 {
            info!(
                removed = report.removed,
                partials = report.partials_removed,
                "inbox retention sweep"
            );
        }
        tokio::select! {
            _ = ctx.shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}
