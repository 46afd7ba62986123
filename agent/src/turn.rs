//! What a running turn can do: emit text, call tools through the registry (which asks the user
//! and waits for approvals over the [`Link`]), describe files. Brains only ever talk to the
//! surface through [`TurnIo`].

use std::sync::Arc;

use protocol::{SendFile, WorkspacePath};

use crate::confine::{ChatScope, ConfineError, ScopedWorkspace};
use crate::connection::Closed;
use crate::describe::{FileDescription, describe};
use crate::link::{Link, new_id};
use crate::memory::Memory;
use crate::perceive::Perception;
use crate::tools::{Registry, ToolCx, ToolOutcome, ToolSpec, TurnGrants};

/// What a brain gets to act during one turn.
#[derive(Debug)]
pub struct TurnIo {
    link: Link,
    ws: ScopedWorkspace,
    registry: Arc<Registry>,
    memory: Memory,
    perception: Perception,
    turn: String,
    /// Who started the turn.
    user: String,
    grants: TurnGrants,
    output: String,
    sent_files: Vec<WorkspacePath>,
}

impl TurnIo {
    /// A turn's I/O.
    pub fn new(
        link: Link,
        ws: ScopedWorkspace,
        registry: Arc<Registry>,
        memory: Memory,
        perception: Perception,
        turn: String,
        user: String,
    ) -> Self {
        Self {
            link,
            ws,
            registry,
            memory,
            perception,
            turn,
            user,
            grants: TurnGrants::new(),
            output: String::new(),
            sent_files: Vec::new(),
        }
    }

    /// The turn id.
    pub fn turn_id(&self) -> &str {
        &self.turn
    }

    /// What the chat may touch.
    pub fn scope(&self) -> &ChatScope {
        &self.ws.scope
    }

    /// The agent's senses: pictures for the model, transcription.
    pub fn perception(&self) -> &Perception {
        &self.perception
    }

    /// The workspace as this chat may see it.
    pub fn workspace(&self) -> &ScopedWorkspace {
        &self.ws
    }

    /// Tells the room something in one plain sentence (a notice beside the answer, not part
    /// of it).
    pub async fn notice(&self, text: impl Into<String>) -> Result<(), Closed> {
        self.link
            .emit(protocol::CustomUpdate::notice(self.turn.clone(), text))
            .await
    }

    /// The tools (for their schemas).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The tools this chat may call, MCP servers' included (which may start them).
    pub async fn tool_specs(&self) -> Vec<ToolSpec> {
        self.registry.specs_for(self.ws.scope.chat()).await
    }

    /// Streams answer text to the surface.
    pub async fn say(&mut self, text: impl Into<String>) -> Result<(), Closed> {
        let text = text.into();
        if text.is_empty() {
            return Ok(());
        }
        self.output.push_str(&text);
        self.link.emit_text(&self.turn, &text).await
    }

    /// Calls a tool through the registry (policy, approval, reporting included).
    pub async fn call_tool(&mut self, name: &str, arguments: &str) -> ToolOutcome {
        let cx = ToolCx {
            ws: &self.ws,
            turn: &self.turn,
            user: &self.user,
            link: &self.link,
            memory: &self.memory,
            perception: &self.perception,
        };
        let outcome = self
            .registry
            .invoke(name, arguments, &cx, &mut self.grants)
            .await;
        if let Some(path) = &outcome.sent_file {
            self.sent_files.push(path.clone());
        }
        crate::metrics::tool_call(
            self.registry.label(name),
            if outcome.ok { "ok" } else { "error" },
        );
        outcome
    }

    /// Describes a file the chat may read.
    pub async fn describe(&self, path: &WorkspacePath) -> Result<FileDescription, ConfineError> {
        let ws = self.ws.clone();
        let path = path.clone();
        tokio::task::spawn_blocking(move || describe(&ws, &path))
            .await
            .unwrap_or_else(|e| {
                Err(ConfineError::Io {
                    path: WorkspacePath::new("unknown").expect("constant is valid"),
                    source: std::io::Error::other(e),
                })
            })
    }

    /// Emits `send_file` for `path` without checking it (for testing the surface's handling
    /// of missing files).
    pub async fn send_file_unchecked(&mut self, path: WorkspacePath) -> Result<(), Closed> {
        self.sent_files.push(path.clone());
        self.link
            .emit(SendFile {
                turn: self.turn.clone(),
                request_id: new_id("send"),
                path,
                caption: None,
                voice: false,
            })
            .await
    }

    /// The text said and the files sent, for the turn's record.
    pub fn into_output(self) -> (String, Vec<WorkspacePath>) {
        (self.output, self.sent_files)
    }

    /// The text said so far.
    pub fn output(&self) -> &str {
        &self.output
    }
}
