//! One MCP session: the rmcp `ServerHandler` that answers resource reads, subscriptions and
//! tool calls from the journal and through [`super::actions`]. rmcp's types stay in this file
//! and in `super`.

use std::collections::HashMap;
use std::sync::Mutex;

use rmcp::handler::server::common::schema_for_type;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, CustomNotification,
    Implementation, ListResourceTemplatesResult, ListResourcesResult, ListToolsResult,
    PaginatedRequestParams, ProtocolVersion, ReadResourceRequestParams, ReadResourceResponse,
    ReadResourceResult, Resource, ResourceContents, ResourceTemplate, ServerCapabilities,
    ServerConfig, ServerNotification, SubscribeRequestParams, Tool, UnsubscribeRequestParams,
};
use rmcp::service::{Peer, RequestContext};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::actions;
use super::feed::{self, RoomUri};
use crate::context::Ctx;

/// How many new messages one notification carries at most (more follow at once).
const NOTIFY_BATCH: usize = 200;

/// One client session's handler; its subscriptions end with it.
#[derive(Debug)]
pub struct Session {
    ctx: Ctx,
    subscriptions: Mutex<HashMap<String, CancellationToken>>,
}

impl Session {
    /// A handler for a new session.
    pub fn new(ctx: Ctx) -> Self {
        Self {
            ctx,
            subscriptions: Mutex::default(),
        }
    }

    fn subs(&self) -> std::sync::MutexGuard<'_, HashMap<String, CancellationToken>> {
        self.subscriptions.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn journal_error(e: impl std::fmt::Display) -> McpError {
        warn!(error = %e, "MCP read failed");
        McpError::internal_error("the surface could not read its journal", None)
    }

    /// Messages of `room` after `after_event_id` (from the start when `None`).
    async fn read_since(
        &self,
        room: &str,
        after_event_id: Option<&str>,
        limit: usize,
    ) -> Result<Value, String> {
        actions::visible_room(&self.ctx, room).await?;
        let after = match after_event_id {
            None => 0,
            Some(id) => match self.ctx.journal.feed_position(id) {
                Ok(Some((r, ord))) if r == room => ord,
                Ok(_) => {
                    return Err(format!(
                        "{id} is not an event of {room} that this surface has seen"
                    ));
                }
                Err(e) => return Err(Self::journal_error(e).message.into_owned()),
            },
        };
        let rows = self
            .ctx
            .journal
            .feed_after(room, after, limit)
            .map_err(|e| Self::journal_error(e).message.into_owned())?;
        Ok(feed::batch(&rows, after_event_id))
    }

    /// The latest messages of `room` (the `last` resource).
    async fn last(&self, room: &str) -> Result<Value, String> {
        actions::visible_room(&self.ctx, room).await?;
        let j = &self.ctx.journal;
        let end = j
            .feed_end(room)
            .map_err(|e| Self::journal_error(e).message.into_owned())?;
        let rows = j
            .feed_last(room, end, feed::LAST_COUNT)
            .map_err(|e| Self::journal_error(e).message.into_owned())?;
        Ok(feed::batch(&rows, None))
    }

    fn subscribe_room(&self, room: String, peer: Peer<RoleServer>) -> Result<(), McpError> {
        let start = self
            .ctx
            .journal
            .feed_end(&room)
            .map_err(Self::journal_error)?;
        let stop = self.ctx.shutdown.child_token();
        if let Some(old) = self.subs().insert(room.clone(), stop.clone()) {
            old.cancel();
        }
        info!(room_id = %room, "MCP client subscribed");
        self.ctx
            .tracker
            .spawn(follow(self.ctx.clone(), room, start, peer, stop));
        Ok(())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        for stop in self.subs().values() {
            stop.cancel();
        }
    }
}

/// Sends `notifications/resources/updated` for `room` with every new message, in order, each
/// once, until the session or the surface ends.
async fn follow(
    ctx: Ctx,
    room: String,
    mut after: i64,
    peer: Peer<RoleServer>,
    stop: CancellationToken,
) {
    let mut changes = ctx.journal.changes();
    let uri = feed::last_uri(&room);
    loop {
        let rows = match ctx.journal.feed_after(&room, after, NOTIFY_BATCH) {
            Ok(rows) => rows,
            Err(e) => {
                warn!(room_id = %room, error = %e, "MCP feed read failed; the subscription ends");
                return;
            }
        };
        if let Some(last) = rows.last() {
            let mut params = feed::batch(&rows, None);
            params["uri"] = json!(uri);
            let note = ServerNotification::CustomNotification(CustomNotification::new(
                "notifications/resources/updated",
                Some(params),
            ));
            if let Err(e) = peer.send_notification(note).await {
                debug!(room_id = %room, error = %e, "MCP client gone; subscription ends");
                return;
            }
            after = last.ord;
            if rows.len() == NOTIFY_BATCH {
                continue;
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = changes.changed() => if changed.is_err() { return },
        }
    }
}

fn tool<T: schemars::JsonSchema + 'static>(name: &'static str, description: &'static str) -> Tool {
    Tool::new(name, description, schema_for_type::<T>())
}

fn args<T: DeserializeOwned>(req: &CallToolRequestParams) -> Result<T, String> {
    let raw = Value::Object(req.arguments.clone().unwrap_or_default());
    serde_json::from_value(raw).map_err(|e| format!("arguments of {}: {e}", req.name))
}

fn result(outcome: Result<Value, String>) -> CallToolResponse {
    match outcome {
        Ok(v) => CallToolResult::structured(v),
        Err(e) => CallToolResult::error(vec![ContentBlock::text(e)]),
    }
    .into()
}

impl ServerHandler for Session {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::new(
            ServerCapabilities::builder()
                .enable_resources()
                .enable_resources_subscribe()
                .enable_tools()
                .build(),
        );
        info.server_info = Implementation::new("mxbridge-surface", env!("CARGO_PKG_VERSION"));
        info.instructions = Some(
            "Matrix rooms of this bot. Subscribe to matrix://room/<room_id>/last for new \
             messages (each notification carries every message since the previous one, in \
             order); keep the last event id you handled and catch up with matrix.read_since \
             after a reconnect. The bot's own messages are never listed."
                .into(),
        );
        info
    }

    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        // Subscriptions are `resources/subscribe`, which the 2026 revision replaced.
        std::borrow::Cow::Borrowed(ProtocolVersion::known_up_to(&ProtocolVersion::V_2025_11_25))
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        let resources = actions::visible_rooms(&self.ctx)
            .await
            .into_iter()
            .map(|room| {
                let name = room
                    .cached_display_name()
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| room.room_id().to_string());
                Resource::new(feed::last_uri(room.room_id().as_str()), name)
                    .with_description("the latest messages (subscribe for new ones)")
                    .with_mime_type("application/json")
            })
            .collect();
        Ok(ListResourcesResult::with_all_items(resources))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, McpError> {
        Ok(ListResourceTemplatesResult::with_all_items(vec![
            ResourceTemplate::new("matrix://room/{room_id}/last", "latest messages")
                .with_mime_type("application/json"),
            ResourceTemplate::new(
                "matrix://room/{room_id}/since/{event_id}",
                "messages strictly after an event",
            )
            .with_mime_type("application/json"),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let uri = RoomUri::parse(&request.uri)
            .ok_or_else(|| McpError::resource_not_found("no such resource", None))?;
        let read = match &uri {
            RoomUri::Last(room) => self.last(room).await,
            RoomUri::Since(room, id) => self.read_since(room, Some(id), feed::DEFAULT_LIMIT).await,
        };
        let value = read.map_err(|e| McpError::resource_not_found(e, None))?;
        Ok(ReadResourceResult::new(vec![
            ResourceContents::text(value.to_string(), request.uri)
                .with_mime_type("application/json"),
        ])
        .into())
    }

    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let Some(RoomUri::Last(room)) = RoomUri::parse(&request.uri) else {
            return Err(McpError::invalid_params(
                "only matrix://room/<room_id>/last can be subscribed to",
                None,
            ));
        };
        actions::visible_room(&self.ctx, &room)
            .await
            .map_err(|e| McpError::resource_not_found(e, None))?;
        self.subscribe_room(room, context.peer)
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        if let Some(uri) = RoomUri::parse(&request.uri)
            && let Some(stop) = self.subs().remove(uri.room())
        {
            stop.cancel();
        }
        Ok(())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let mut tools = vec![
            tool::<feed::ReadSince>(
                "matrix.read_since",
                "Messages of a room strictly after an event id you keep (your watermark), in \
                 order; returns {messages, upto_event_id}. Call again from upto_event_id until \
                 messages is empty.",
            ),
            tool::<feed::ReadMarker>(
                "matrix.set_read_marker",
                "Moves the bot's read marker and read receipt in a room to an event.",
            ),
        ];
        let may_send = self.ctx.config.mcp.as_ref().is_some_and(|m| m.send);
        if may_send {
            tools.push(tool::<feed::Send>(
                "matrix.send",
                "Posts markdown text to a room as the bot (optionally in a thread).",
            ));
            tools.push(tool::<feed::SendFile>(
                "matrix.send_file",
                "Posts a workspace file (the room's inbox or outbox) as native Matrix media.",
            ));
        }
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let ctx = &self.ctx;
        let may_send = ctx.config.mcp.as_ref().is_some_and(|m| m.send);
        if let Err(e) = feed::gate(&request.name, may_send) {
            info!(tool = %request.name, reason = %e, "MCP tool call refused");
            return Ok(result(Err(e)));
        }
        let outcome = match request.name.as_ref() {
            "matrix.read_since" => match args::<feed::ReadSince>(&request) {
                Ok(a) => {
                    self.read_since(
                        &a.room_id,
                        a.after_event_id.as_deref(),
                        feed::limit(a.limit),
                    )
                    .await
                }
                Err(e) => Err(e),
            },
            "matrix.set_read_marker" => match args::<feed::ReadMarker>(&request) {
                Ok(a) => actions::set_read_marker(ctx, &a).await,
                Err(e) => Err(e),
            },
            "matrix.send" => match args::<feed::Send>(&request) {
                Ok(a) => actions::send_text(ctx, &a).await,
                Err(e) => Err(e),
            },
            "matrix.send_file" => match args::<feed::SendFile>(&request) {
                Ok(a) => actions::send_file(ctx, &a).await,
                Err(e) => Err(e),
            },
            other => {
                return Err(McpError::invalid_params(format!("no tool {other}"), None));
            }
        };
        if let Err(e) = &outcome {
            info!(tool = %request.name, reason = %e, "MCP tool call refused");
        }
        Ok(result(outcome))
    }
}
