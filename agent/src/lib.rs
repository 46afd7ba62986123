//! The agent worker: serves `/v1/agent_ws/{chat_id}/`, keeps a durable session per chat, runs
//! a brain whose tools are confined to the chat's part of the shared workspace.
//!
//! Module map:
//! * [`config`]: the typed configuration from environment variables (secrets redacted).
//! * [`server`]: routes, bearer-token check before the upgrade, `run` and shutdown.
//! * [`state`]: [`AppState`], what every connection shares, built once at start.
//! * [`connection`]: the one typed WebSocket connection (limits, keepalive, close codes).
//! * [`session`]: one connection: handshake, acknowledging turns, replies, running turns.
//! * [`chat`]: one chat's durable record, its turn lane and current connection; admission by
//!   message id (decide and store under one lock).
//! * [`store`]: one JSON record per chat, replaced atomically.
//! * [`turn`]: what a running turn may do ([`turn::TurnIo`]).
//! * [`link`]: the way from a turn to the surface and back: emit, ask, wait for approvals.
//! * [`tools`]: the typed tool registry with policies; the tools themselves.
//! * [`confine`]: opening files beneath the workspace handle; what a chat may touch.
//! * [`describe`]: MIME sniffing, hashes, image sizes and previews of files.
//! * [`brain`]: the `Brain` trait, the builtin command interpreter and the OpenAI client.

pub mod brain;
pub mod chat;
pub mod config;
pub mod confine;
pub mod connection;
pub mod describe;
pub mod link;
pub mod server;
pub mod session;
pub mod state;
pub mod store;
pub mod tools;
pub mod turn;

pub use config::Config;
pub use server::{RunError, app, run};
pub use state::AppState;
