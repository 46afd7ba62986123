//! What MCP tool calls do in Matrix: which rooms a client may name, posting text and files
//! through the journaled send path, and moving the read marker. Errors are sentences for the
//! client (they never carry a token or a host path).

use matrix_sdk::Room;
use matrix_sdk::ruma::api::client::receipt::create_receipt::v3::ReceiptType;
use matrix_sdk::ruma::events::receipt::ReceiptThread;
use matrix_sdk::ruma::{EventId, RoomId};
use protocol::{ChatId, WorkspacePath};
use serde_json::{Value, json};
use tracing::{info, warn};

use super::feed;
use crate::context::Ctx;
use crate::media;
use crate::purpose::Purpose;
use crate::render::{self, ReplyTarget};
use crate::send::{self, Outgoing, PostError};
use crate::workspace::ChatScope;

/// The longest text `matrix.send` posts (one event; longer text is refused, not cut).
pub const MAX_TEXT_BYTES: usize = 32 * 1024;

/// A room the client may see: allowed by `SURFACE_ALLOWED_ROOMS` and joined by the bot. Any
/// other room id — left, never joined, outside the allowlist, malformed — gets the same
/// answer, so a client learns nothing about rooms it may not see.
pub async fn visible_room(ctx: &Ctx, room_id: &str) -> Result<Room, String> {
    let unknown = || format!("no room {room_id} here");
    let id = RoomId::parse(room_id).map_err(|_| unknown())?;
    let room = ctx
        .client
        .get_room(&id)
        .filter(|r| r.state() == matrix_sdk::RoomState::Joined)
        .ok_or_else(unknown)?;
    let mut aliases: Vec<String> = room.alt_aliases().iter().map(|a| a.to_string()).collect();
    if let Some(a) = room.canonical_alias() {
        aliases.push(a.to_string());
    }
    if ctx
        .config
        .is_room_allowed(room_id, aliases.iter().map(String::as_str))
    {
        Ok(room)
    } else {
        Err(unknown())
    }
}

/// Every room a client may see.
pub async fn visible_rooms(ctx: &Ctx) -> Vec<Room> {
    let mut out = Vec::new();
    for room in ctx.client.joined_rooms() {
        if visible_room(ctx, room.room_id().as_str()).await.is_ok() {
            out.push(room);
        }
    }
    out
}

/// The thread a client asks to post in: an event id of `room` itself (the journal knows, or
/// the homeserver shows it in that room), so that no post can be aimed at another room's
/// event, which the homeserver would refuse and the surface would park.
async fn thread(ctx: &Ctx, room: &Room, root: Option<&str>) -> Result<Option<ReplyTarget>, String> {
    let Some(r) = root else { return Ok(None) };
    let id = EventId::parse(r).map_err(|_| format!("thread_root {r} is not an event id"))?;
    let here = room.room_id().as_str();
    let known = ctx.journal.room_of_event(r).map_err(|e| {
        warn!(error = %e, "journal read failed");
        "the surface could not check thread_root".to_owned()
    })?;
    let in_room = match known {
        Some(room_id) => room_id == here,
        None => room.load_or_fetch_event(&id, None).await.is_ok(),
    };
    if !in_room {
        return Err(format!("thread_root {r} is not an event of room {here}"));
    }
    Ok(Some(ReplyTarget {
        event_id: id.clone(),
        thread_root: Some(id),
    }))
}

async fn post(
    ctx: &Ctx,
    room: &Room,
    content: matrix_sdk::ruma::events::room::message::RoomMessageEventContent,
    key: Option<&str>,
    target: Option<&ReplyTarget>,
    purpose: Purpose,
) -> Result<Value, String> {
    let txn = render::mcp_txn_id(room.room_id().as_str(), key);
    let out = Outgoing {
        txn: &txn,
        thread_root: target.map(ReplyTarget::root),
        about: None,
        purpose,
    };
    match send::post(ctx, room, content, out).await {
        Ok(id) => {
            info!(room_id = %room.room_id(), event_id = %id, %purpose, "posted for an MCP client");
            Ok(json!({ "event_id": id }))
        }
        Err(PostError::Refused(r)) => Err(format!("the homeserver refused the post: {r}")),
        Err(PostError::AlreadyParked(why)) => Err(format!("this post was refused earlier: {why}")),
        Err(PostError::Shutdown) => Err("the surface is shutting down; try again".into()),
        Err(e @ PostError::Journal(_)) => {
            warn!(error = %e, "MCP post failed");
            Err("the surface could not record the post".into())
        }
    }
}

/// `matrix.send`: markdown text, optionally in a thread.
pub async fn send_text(ctx: &Ctx, a: &feed::Send) -> Result<Value, String> {
    let room = visible_room(ctx, &a.room_id).await?;
    if a.text.trim().is_empty() {
        return Err("text is empty".into());
    }
    if a.text.len() > MAX_TEXT_BYTES {
        return Err(format!(
            "text is {} bytes; at most {MAX_TEXT_BYTES} are posted in one message",
            a.text.len()
        ));
    }
    let target = thread(ctx, &room, a.thread_root.as_deref()).await?;
    let content = match &target {
        Some(t) => t.markdown(&a.text),
        None => render::safe_markdown(&a.text),
    };
    let key = a.idempotency_key.as_deref();
    post(ctx, &room, content, key, target.as_ref(), Purpose::Mcp).await
}

/// `matrix.send_file`: a workspace file the room may reach (its inbox, outbox or chat folder),
/// uploaded as native media like the agent's files.
pub async fn send_file(ctx: &Ctx, a: &feed::SendFile) -> Result<Value, String> {
    let room = visible_room(ctx, &a.room_id).await?;
    let path = WorkspacePath::new(&a.path).map_err(|e| format!("path {:?}: {e}", a.path))?;
    let target = thread(ctx, &room, a.thread_root.as_deref()).await?;
    let room_id = room.room_id().to_string();
    let scope = ChatScope::new(ChatId::for_conversation(&room_id, None), room_id);
    let mut content = ctx
        .prepare_file(&path, &scope, media::Posting::default())
        .await
        .map_err(|e| format!("{} was not sent: {}", e.name, e.failure))?;
    if let Some(t) = &target {
        content = t.apply(content);
    }
    let key = a.idempotency_key.as_deref();
    post(ctx, &room, content, key, target.as_ref(), Purpose::McpFile).await
}

/// `matrix.set_read_marker`: the bot's fully-read marker and read receipt at the event.
pub async fn set_read_marker(ctx: &Ctx, a: &feed::ReadMarker) -> Result<Value, String> {
    let room = visible_room(ctx, &a.room_id).await?;
    let id =
        EventId::parse(&a.event_id).map_err(|_| format!("{} is not an event id", a.event_id))?;
    room.send_single_receipt(
        ReceiptType::FullyRead,
        ReceiptThread::Unthreaded,
        id.clone(),
    )
    .await
    .map_err(|e| format!("the homeserver did not take the read marker: {e}"))?;
    room.send_single_receipt(ReceiptType::Read, ReceiptThread::Unthreaded, id)
        .await
        .map_err(|e| format!("the homeserver did not take the read receipt: {e}"))?;
    Ok(json!({"ok": true}))
}
