//! What a running turn can do: emit text, call tools through the registry (which asks the user
//! and waits for approvals over the [`Link`]), describe files. Brains only ever talk to the
//! surface through [`TurnIo`].
//!
//! Every step that completes (a tool call with its outcome, a brain's own step such as a model
//! response) is recorded with the turn before the turn goes on. A turn that runs again after a
//! crash, here or on another agent, gets its recorded steps back in order: a tool call that
//! matches the next one is not run again (its recorded outcome is returned, a file it sent is
//! not sent twice), and a brain takes its recorded steps instead of redoing them. A call that
//! had started but not completed when the agent died was never recorded, so it runs again.

use std::collections::BTreeMap;
use std::sync::Arc;

use protocol::{SendFile, WorkspacePath};

use crate::confine::{ChatScope, ConfineError, ScopedWorkspace};
use crate::connection::Closed;
use crate::describe::{FileDescription, describe};
use crate::link::{Link, new_id};
use crate::memory::Memory;
use crate::perceive::Perception;
use crate::store::Step;
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
    /// The turn's steps recorded by an earlier run, and how many of them were taken again.
    recorded: Vec<Step>,
    replayed: usize,
    /// The number the next recorded step gets.
    next_step: u32,
    /// The tool policies the turn's room set.
    room_tools: BTreeMap<String, protocol::ToolPolicy>,
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
            recorded: Vec::new(),
            replayed: 0,
            next_step: 0,
            room_tools: BTreeMap::new(),
        }
    }

    /// Applies the tool policies the turn's room set (only where stricter than the operator's).
    pub fn with_room_tools(mut self, tools: BTreeMap<String, protocol::ToolPolicy>) -> Self {
        self.room_tools = tools;
        self
    }

    /// Resumes after `steps`, recorded by an earlier run of the turn.
    pub fn resuming(mut self, steps: Vec<Step>) -> Self {
        self.next_step = u32::try_from(steps.len()).unwrap_or(u32::MAX);
        self.recorded = steps;
        self
    }

    /// The next recorded step if it is a brain's own: the brain takes it instead of redoing
    /// it. `None` once the recorded steps are used up (or the turn went another way).
    pub fn replay_brain_step(&mut self) -> Option<serde_json::Value> {
        match self.recorded.get(self.replayed) {
            Some(Step::Brain { data }) => {
                self.replayed += 1;
                tracing::info!(
                    step = self.replayed - 1,
                    "resuming the turn after a recorded step"
                );
                Some(data.clone())
            }
            Some(_) => {
                self.diverged();
                None
            }
            None => None,
        }
    }

    /// Records a brain's own step (see [`TurnIo::replay_brain_step`]).
    pub async fn record_brain_step(&mut self, data: serde_json::Value) {
        self.record(Step::Brain { data }).await;
    }

    /// The turn no longer follows its recorded steps: the rest are not taken.
    fn diverged(&mut self) {
        if self.replayed < self.recorded.len() {
            tracing::warn!(
                replayed = self.replayed,
                recorded = self.recorded.len(),
                "the turn went another way than its recorded steps; running the rest anew"
            );
            self.replayed = self.recorded.len();
        }
    }

    /// Records a completed step durably; a turn whose step cannot be recorded goes on (it
    /// would only redo the step if it also crashed), and the failure is logged.
    async fn record(&mut self, step: Step) {
        let n = self.next_step;
        self.next_step = n.saturating_add(1);
        if let Err(e) = self.link.chat.record_step(&self.turn, n, &step).await {
            tracing::warn!(error = %e, step = n, "cannot record the turn's step");
        }
    }

    /// The recorded outcome of the next step if it is this very tool call.
    fn replay_tool(&mut self, name: &str, arguments: &str) -> Option<ToolOutcome> {
        match self.recorded.get(self.replayed) {
            Some(Step::Tool {
                name: n,
                arguments: a,
                ok,
                output,
                sent_file,
                picture,
            }) if n == name && a == arguments => {
                let outcome = ToolOutcome {
                    ok: *ok,
                    output: output.clone(),
                    sent_file: sent_file.clone(),
                    picture: picture.clone(),
                };
                self.replayed += 1;
                tracing::info!(
                    tool = name,
                    "tool call completed before the turn was interrupted; not run again"
                );
                Some(outcome)
            }
            Some(_) => {
                self.diverged();
                None
            }
            None => None,
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

    /// Calls a tool through the registry (policy, approval, reporting included), unless the
    /// turn's record says this call completed before: then its outcome is returned.
    pub async fn call_tool(&mut self, name: &str, arguments: &str) -> ToolOutcome {
        if let Some(outcome) = self.replay_tool(name, arguments) {
            if let Some(path) = &outcome.sent_file {
                self.sent_files.push(path.clone());
            }
            return outcome;
        }
        let outcome = self.run_tool(name, arguments).await;
        if self.link.out.is_closed() {
            // It may have failed only for want of the surface (an approval, a delivery report):
            // the turn runs again on the next connection, and so does this call.
            return outcome;
        }
        self.record(Step::Tool {
            name: name.to_owned(),
            arguments: arguments.to_owned(),
            ok: outcome.ok,
            output: outcome.output.clone(),
            sent_file: outcome.sent_file.clone(),
            picture: outcome.picture.clone(),
        })
        .await;
        outcome
    }

    /// What a tool gets, and the turn's grants (borrowed apart).
    fn cx(&mut self) -> (ToolCx<'_>, &mut TurnGrants) {
        (
            ToolCx {
                ws: &self.ws,
                turn: &self.turn,
                user: &self.user,
                link: &self.link,
                memory: &self.memory,
                perception: &self.perception,
                step: self.next_step,
                room: &self.room_tools,
            },
            &mut self.grants,
        )
    }

    async fn run_tool(&mut self, name: &str, arguments: &str) -> ToolOutcome {
        let registry = self.registry.clone();
        let (cx, grants) = self.cx();
        let outcome = registry.invoke(name, arguments, &cx, grants).await;
        if let Some(path) = &outcome.sent_file {
            self.sent_files.push(path.clone());
        }
        crate::metrics::tool_call(
            self.registry.label(name),
            if outcome.ok { "ok" } else { "error" },
        );
        outcome
    }

    /// Shows a tool call an agent runs itself (an ACP agent's) as started.
    pub async fn tool_started(
        &mut self,
        call_id: &str,
        name: &str,
        arguments: &str,
    ) -> Result<(), Closed> {
        self.link
            .emit(protocol::ToolCallChunk {
                turn: self.turn.clone(),
                call_id: call_id.to_owned(),
                name: name.to_owned(),
                arguments: arguments.to_owned(),
            })
            .await
    }

    /// Shows a tool call an agent runs itself as finished.
    pub async fn tool_finished(
        &mut self,
        call_id: &str,
        ok: bool,
        output: &str,
    ) -> Result<(), Closed> {
        crate::metrics::tool_call("acp", if ok { "ok" } else { "error" });
        self.link
            .emit(protocol::ToolResult {
                turn: self.turn.clone(),
                call_id: call_id.to_owned(),
                ok,
                output: output.to_owned(),
            })
            .await
    }

    /// Decides whether an ACP agent may run a tool (`key`: its policy entry, `acp__<kind>`) on
    /// `resource`, asking the user when the policy says so, as for our own tools.
    pub async fn permit_acp(
        &mut self,
        key: &str,
        resource: String,
        summary: &str,
    ) -> Result<(), crate::tools::ToolError> {
        let registry = self.registry.clone();
        let (cx, grants) = self.cx();
        let policy = cx.within_room(key, registry.acp_policy(key));
        registry
            .permit_as(policy, key, resource, summary, &cx, grants)
            .await
    }

    /// A picture the chat may read, prepared for a model: base64 data and its MIME type.
    pub async fn picture(
        &self,
        path: &WorkspacePath,
        inode: Option<u64>,
    ) -> Option<(String, String)> {
        use base64::Engine as _;
        match self.perception.images.prepare(&self.ws, path, inode).await {
            Ok(p) => Some((
                base64::engine::general_purpose::STANDARD.encode(&p.bytes),
                p.mime.to_string(),
            )),
            Err(e) => {
                tracing::warn!(%path, error = %e, "the picture cannot be given to the agent");
                None
            }
        }
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
