//! The Matrix surface: the only process that talks to Matrix. It journals incoming messages,
//! downloads their media into the shared workspace, runs one lane per chat that forwards turns
//! to the agent over a WebSocket, and renders the agent's answers back into the room.

pub mod agent_link;
pub mod config;
pub mod connection;
pub mod decide;
pub mod filename;
pub mod health;
pub mod journal;
pub mod mime;
pub mod render;
pub mod session;
pub mod workspace;
pub mod media;
