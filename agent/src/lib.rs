//! The agent worker: serves `/v1/agent_ws/{chat_id}/`, keeps a durable session per chat, runs
//! a brain whose tools are confined to the chat's part of the shared workspace.

pub mod brain;
pub mod config;
pub mod confine;
pub mod connection;
pub mod describe;
pub mod server;
pub mod session;
pub mod store;
pub mod tools;
pub mod turn;

pub use config::Config;
pub use server::{AppState, RunError, app, run};
