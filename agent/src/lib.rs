//! The agent worker: serves `/v1/agent_ws/{chat_id}/`, keeps a durable session per chat, runs
//! a brain whose tools are confined to the chat's part of the shared workspace.
//!
//! Module map, top to bottom; a module imports only modules listed below it:
//! * [`doctor`]: `agent doctor`, the operator's checks of configuration, folders, address and
//!   model server (pure verdicts over what it observed).
//! * [`import`]: `agent import-state`, a state directory moved into the database.
//! * [`server`]: routes, bearer-token check before the upgrade, `run` and shutdown; until a
//!   connection upgrades it has a deadline and a place at the gate (caps per peer and overall).
//! * [`session`]: one connection: handshake, acknowledging turns, replies, the turn worker.
//! * [`state`]: [`AppState`], what every connection shares, built once at start.
//! * [`brain`]: the `Brain` trait, the builtin command interpreter and the OpenAI client.
//! * [`turn`]: what a running turn may do ([`turn::TurnIo`]).
//! * [`tools`]: the typed tool registry applying the policies; the tools themselves (files,
//!   questions, memory) and those of the operator's MCP servers (`server__tool`).
//! * [`link`]: the way from a turn to the surface and back: emit, ask, wait for approvals.
//! * [`perceive`]: what the agent makes of files people send: pictures prepared for vision
//!   models (cached per file version), speech transcribed, PDF text extracted.
//! * [`chat`]: one chat's durable history, its turn lane and current connection; admission by
//!   message id (decide and store under one lock).
//! * [`describe`]: MIME sniffing, hashes, image sizes and previews of files.
//! * [`speaker`]: who wrote a turn, as the brains show it (a member's display name, cleaned,
//!   beside the user id).
//! * [`config`]: the typed configuration from environment variables (secrets redacted), tool
//!   policies included.
//! * [`confine`]: opening files beneath the workspace handle; what a chat may touch.
//! * [`connection`]: the one typed WebSocket connection (limits, keepalive, close codes).
//! * [`logging`]: the binary's tracing set-up, with the credential rule both binaries share
//!   (the `daemon` crate).
//! * [`metrics`]: every Prometheus metric's name and help text, and the exporter.
//! * [`lease`]: one turn at a time per chat across agents sharing a database (a renewed lease
//!   with a fencing token).
//! * [`store`]: chats' durable records behind one trait: PostgreSQL rows, or one append-only
//!   log per chat (a JSON line per change) indexed in memory.
//! * [`memory`]: the durable fact store of the memory tools: PostgreSQL rows, or one file per
//!   Matrix user and per room, replaced atomically under a per-scope lock.
//! * [`db`]: the PostgreSQL pool and its embedded, versioned schema migrations.

pub mod brain;
pub mod chat;
pub mod config;
pub mod confine;
pub mod connection;
pub mod db;
pub mod describe;
pub mod doctor;
pub mod import;
pub mod lease;
pub mod link;
pub mod logging;
pub mod memory;
pub mod metrics;
pub mod perceive;
pub mod server;
pub mod session;
pub mod speaker;
pub mod state;
pub mod store;
pub mod tools;
pub mod turn;

pub use config::Config;
pub use server::{RunError, app, run};
pub use state::AppState;
