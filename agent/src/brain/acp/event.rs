//! What an ACP agent (and our tool relay) sends to the running turn, in order: the one type
//! [`super::conn`] and [`super::relay`] both produce.

use tokio::sync::oneshot;

use super::wire::{Permission, Update};

/// What the agent sent, in order.
#[derive(Debug)]
pub enum Event {
    /// A `session/update` (of the session the turn runs; others are dropped here).
    Update(Update),
    /// `session/request_permission`: answer with the option id chosen (`None`: cancelled).
    Permission(Permission, oneshot::Sender<Option<String>>),
    /// The prompt's response: its stop reason, or why there is none.
    PromptDone(Result<String, PromptFailed>),
    /// A call of one of our tools (through the relay, [`super::relay`]): its name and JSON
    /// arguments; answer with whether it worked and its output.
    Tool(String, String, oneshot::Sender<(bool, String)>),
}

/// Why a prompt has no stop reason.
#[derive(Debug)]
pub enum PromptFailed {
    /// The agent answered with an error.
    Answered(String),
    /// The connection ended first (the process died, closed its output).
    Gone(String),
}
