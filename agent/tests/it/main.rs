//! Integration tests: the real agent on 127.0.0.1:0, driven by a real WebSocket client.

// Helpers outside `#[test]` functions fail tests by panicking, like the tests themselves.
#![allow(clippy::unwrap_used)]

mod acp_hostile;
mod acp_sdk;
mod admission;
mod confinement;
mod connection;
mod doctor;
mod fuzz;
mod hearing;
mod history_cost;
mod hostile;
mod mcp;
mod mcp_hostile;
mod memory;
mod metrics;
mod model_faults;
mod openai;
mod pdf;
mod persistence;
mod postgres;
mod replay;
mod resume;
mod support;
mod turns;
mod vision;
