//! Wire types shared by the surface and the agent: messages, ids and `WorkspacePath`. No I/O.

mod layout;
mod messages;
mod path;
mod secret;

pub use layout::{
    ChatId, ChatIdError, chat_dir, matrix_id_component, original_name, room_dir, surface_root,
};
pub use messages::*;
pub use path::{MAX_COMPONENT_BYTES, MAX_DEPTH, MAX_PATH_BYTES, WorkspacePath, WorkspacePathError};
pub use secret::{PUBLIC_DEFAULT_PREFIX, Secret};

/// Version of this protocol. A peer with another version is refused at the handshake.
pub const PROTOCOL_VERSION: u32 = 1;

/// Largest message either side accepts, in bytes. Attachments travel as paths, so this is plenty.
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;

/// Path of the WebSocket endpoint for a chat.
pub fn agent_ws_path(chat: &ChatId) -> String {
    format!("/v1/agent_ws/{chat}/")
}
