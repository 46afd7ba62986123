//! The brain behind one trait: it gets a stored turn with the chat's earlier turns and acts
//! through [`TurnIo`] (text, tools, questions). `builtin` is offline and deterministic;
//! `openai` talks to an OpenAI-compatible chat-completions server.

pub mod acp;
pub mod builtin;
pub mod openai;

use std::sync::Arc;

use futures_util::future::BoxFuture;
use protocol::ChatId;

use crate::config::{BrainConfig, Config};
use crate::connection::Closed;
use crate::store::{History, TurnRecord};
use crate::turn::TurnIo;

/// What a brain gets for one turn.
#[derive(Debug, Clone)]
pub struct TurnInput {
    /// The chat.
    pub chat_id: ChatId,
    /// The turn to answer.
    pub turn: TurnRecord,
    /// The chat's earlier turns: how many, and the last few in full.
    pub history: History,
}

/// Why a turn could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum BrainError {
    /// The surface went away; the turn stays pending and runs again on reconnect.
    #[error("the surface is disconnected")]
    Disconnected,
    /// The model server failed or answered nonsense.
    #[error("model request failed: {0}")]
    Model(String),
    /// The brain stopped a turn that was going nowhere (a tool-call loop).
    #[error("stopped: {0}")]
    Stopped(String),
    /// An ACP agent failed (would not start, answered with an error, stopped twice).
    #[error("agent failed: {0}")]
    Agent(String),
}

impl BrainError {
    /// A message fit for the room: what went wrong with the model, in a sentence built by the
    /// brain (no URL, no key; a server's own error message is cut to 300 characters).
    pub fn public_message(&self) -> String {
        match self {
            Self::Disconnected => "the surface disconnected".to_owned(),
            Self::Model(why) => format!("the language model could not answer: {why}"),
            Self::Stopped(why) => why.clone(),
            Self::Agent(why) => why.clone(),
        }
    }
}

impl From<Closed> for BrainError {
    fn from(_: Closed) -> Self {
        Self::Disconnected
    }
}

/// Something that answers turns.
pub trait Brain: Send + Sync + std::fmt::Debug {
    /// Answers one turn.
    fn run_turn<'a>(
        &'a self,
        input: &'a TurnInput,
        io: &'a mut TurnIo,
    ) -> BoxFuture<'a, Result<(), BrainError>>;
}

/// The brain selected by the configuration (`db`: the agent's database, if its state is
/// there).
pub fn from_config(config: &Config, db: Option<&crate::db::Database>) -> Arc<dyn Brain> {
    match &config.brain {
        BrainConfig::Builtin => Arc::new(builtin::Builtin::new(config.test_hooks)),
        BrainConfig::OpenAi(c) => Arc::new(openai::OpenAi::new(c.clone())),
        BrainConfig::Acp(c) => {
            let sessions = match db {
                Some(db) => acp::sessions::SessionIds::Postgres(db.clone()),
                None => acp::sessions::SessionIds::Files(config.state_dir.join("acp-sessions")),
            };
            Arc::new(acp::Acp::new(
                c.clone(),
                config.workspace_root.clone(),
                sessions,
            ))
        }
    }
}
