//! The messages of the WebSocket protocol, one internally tagged enum per direction.
//!
//! Every frame is one JSON object with a `"type"` field. A `type` this version does not know
//! decodes to the `Unknown` variant of its direction, which receivers log and ignore.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::WorkspacePath;

/// Messages the surface sends to the agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToAgent {
    /// First frame of every connection.
    Hello(Hello),
    /// A turn: something a user said, with its attachments.
    UserMessage(UserMessage),
    /// The user's answer to an [`ApprovalRequest`].
    ApprovalDecision(ApprovalDecision),
    /// The user's answer to an [`AskUser`] question.
    Answer(Answer),
    /// Outcome of a [`SendFile`] (or of posting text).
    DeliveryResult(DeliveryResult),
    /// Stop the running turn.
    Cancel(Cancel),
    /// A `type` this version does not know. Never sent.
    #[serde(other)]
    Unknown,
}

/// Messages the agent sends to the surface.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToSurface {
    /// Reply to [`Hello`].
    Welcome(Welcome),
    /// The user message with this `seq` is stored durably.
    Ack(Ack),
    /// Streamed answer text.
    TextChunk(TextChunk),
    /// A tool call being formed.
    ToolCallChunk(ToolCallChunk),
    /// A tool finished.
    ToolResult(ToolResult),
    /// Progress or status of a turn.
    CustomUpdate(CustomUpdate),
    /// Deliver a workspace file to the room.
    SendFile(SendFile),
    /// A tool call needs the user's consent.
    ApprovalRequest(ApprovalRequest),
    /// A question the user must answer.
    AskUser(AskUser),
    /// The turn is over.
    End(End),
    /// A connection-level problem.
    Error(ErrorMsg),
    /// A `type` this version does not know. Never sent.
    #[serde(other)]
    Unknown,
}

/// Identifies a turn: the id of the [`UserMessage`] that started it (the Matrix event id).
pub type TurnId = String;

/// Handshake from the surface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Must equal [`crate::PROTOCOL_VERSION`].
    pub protocol_version: u32,
    /// Name of the surface, e.g. `matrix`.
    pub surface: String,
    /// A file the surface has just written, proving what it sees under the workspace root.
    pub workspace_sentinel: Option<Sentinel>,
}

/// A file at `path` (relative to the workspace) whose whole content is `nonce`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sentinel {
    /// Where the file is.
    pub path: WorkspacePath,
    /// Its exact content: random, so an unrelated folder cannot match by chance.
    pub nonce: String,
}

/// Handshake reply from the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    /// The agent's [`crate::PROTOCOL_VERSION`].
    pub protocol_version: u32,
    /// Agent implementation name.
    pub agent: String,
    /// Agent implementation version.
    pub agent_version: String,
    /// Highest `seq` of this chat the agent has stored; the surface resends everything after it.
    pub last_seq: u64,
    /// What the agent found when checking the shared workspace.
    pub workspace: WorkspaceCheck,
    /// The models a room may choose for its turns ([`TurnSettings::model`]); empty when the
    /// operator offers no choice (and from older agents).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
}

/// The agent's side of the shared-workspace proof.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceCheck {
    /// Whether the surface's sentinel was found with the right content (`None`: none was sent).
    pub surface_sentinel_ok: Option<bool>,
    /// A sentinel the agent wrote, for the surface to check in turn.
    pub agent_sentinel: Option<Sentinel>,
}

/// Who sent a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sender {
    /// Matrix user id, e.g. `@alice:example.org`.
    pub user_id: String,
    /// Display name at the time of sending, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
}

/// What the surface learned about an attachment while downloading it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachmentInfo {
    /// Name the user gave the file (after sanitizing).
    pub name: String,
    /// MIME type from the download (content sniffing checked against the declared type).
    pub mime: String,
    /// Size in bytes.
    pub size: u64,
    /// Play length of audio and video, in milliseconds, as the sender's message declared it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// The sender's client recorded it as a voice message (MSC3245).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub voice: bool,
    /// The inode number of the file as the surface wrote it: the agent may open that very
    /// file at once, where any other file must first have been still for a moment
    /// (`confine::SETTLE`). Absent from older surfaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inode: Option<u64>,
}

/// A turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserMessage {
    /// Per-chat sequence number, strictly increasing, starting at 1.
    pub seq: u64,
    /// Unique id of the message (the Matrix event id); also the turn id.
    pub id: String,
    /// Matrix room id.
    pub room_id: String,
    /// Thread root event id when the conversation is a thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_root: Option<String>,
    /// Who wrote it.
    pub sender: Sender,
    /// The user's text, or a synthetic line when only attachments were sent.
    pub text: String,
    /// Files that came with the message, relative to the workspace.
    #[serde(default)]
    pub attachments: Vec<WorkspacePath>,
    /// Download facts per attachment path.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attachment_info: BTreeMap<WorkspacePath, AttachmentInfo>,
    /// Earlier messages that did not trigger a turn themselves, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub context: Vec<ContextMessage>,
    /// Origin server timestamp, milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
    /// The room's settings for this turn (its state event, as the surface read it when the
    /// turn was stored). Absent from older surfaces and where a room set nothing; an agent that
    /// does not know the field ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<Box<TurnSettings>>,
}

/// What a room asked of the agent for its turns (its settings state event): applied within what
/// the operator allows, never beyond.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TurnSettings {
    /// The model to answer with: one of the agent's [`Welcome::models`], else ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Instructions added to the system prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// Per-tool policy: only ever stricter than the operator's for the same tool.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tools: BTreeMap<String, ToolPolicy>,
}

/// What happens when a tool is called, from the loosest to the strictest (so the stricter of
/// two is their `max`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolPolicy {
    /// Run it.
    Allow,
    /// Ask the user first.
    Ask,
    /// Refuse it.
    Deny,
}

/// A non-triggering message carried along with a turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextMessage {
    /// Matrix event id.
    pub id: String,
    /// Who wrote it.
    pub sender: Sender,
    /// Its text.
    pub text: String,
    /// Its files.
    #[serde(default)]
    pub attachments: Vec<WorkspacePath>,
    /// Origin server timestamp, milliseconds since the Unix epoch.
    pub timestamp_ms: u64,
}

/// A user's decision on an approval request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Run this one call.
    AllowOnce,
    /// Run it and do not ask again for this (tool, resource).
    AllowAlways,
    /// Do not run it.
    Deny,
}

/// Answer to an [`ApprovalRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalDecision {
    /// The request being answered.
    pub request_id: String,
    /// What the user decided.
    pub decision: Decision,
    /// Who decided (Matrix user id).
    pub by: String,
}

/// Answer to an [`AskUser`] question.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// The question being answered.
    pub question_id: String,
    /// The answer text.
    pub text: String,
    /// Who answered (Matrix user id).
    pub by: String,
}

/// Outcome of a delivery to the room.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryResult {
    /// The [`SendFile::request_id`] this answers.
    pub request_id: String,
    /// Whether the room got it.
    pub ok: bool,
    /// The Matrix event id of what was posted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    /// Why it failed, fit to show a model or a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Stop a turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cancel {
    /// The turn to stop.
    pub turn: TurnId,
}

/// The message with this `seq` is stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    /// The acknowledged sequence number.
    pub seq: u64,
    /// True when this message id had already been stored (a resend): it will not run again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub duplicate: bool,
}

/// Streamed answer text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TextChunk {
    /// The turn.
    pub turn: TurnId,
    /// Text to append to the answer.
    pub text: String,
}

/// Part of a tool call being formed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallChunk {
    /// The turn.
    pub turn: TurnId,
    /// Correlates the chunks and the [`ToolResult`] of one call.
    pub call_id: String,
    /// Tool name.
    pub name: String,
    /// A piece of the JSON arguments.
    pub arguments: String,
}

/// A tool call finished.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The turn.
    pub turn: TurnId,
    /// The call this finishes.
    pub call_id: String,
    /// Whether it succeeded.
    pub ok: bool,
    /// A short, human-readable summary of the output.
    pub output: String,
}

/// Progress or status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CustomUpdate {
    /// The turn.
    pub turn: TurnId,
    /// What kind of update.
    pub name: String,
    /// Free-form payload.
    #[serde(default)]
    pub data: serde_json::Value,
}

impl CustomUpdate {
    /// The `name` of an update that is a notice for the room: `data` is `{"text": …}`, one
    /// plain sentence such as what was heard in a voice message. A surface that does not know
    /// it ignores it, like any custom update.
    pub const NOTICE: &'static str = "notice";

    /// A notice for the room about `turn`.
    pub fn notice(turn: impl Into<TurnId>, text: impl Into<String>) -> Self {
        Self {
            turn: turn.into(),
            name: Self::NOTICE.to_owned(),
            data: serde_json::json!({ "text": text.into() }),
        }
    }

    /// The text of a notice update; `None` for any other update.
    pub fn notice_text(&self) -> Option<&str> {
        (self.name == Self::NOTICE)
            .then(|| self.data.get("text").and_then(serde_json::Value::as_str))
            .flatten()
    }
}

/// Deliver a workspace file to the room.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendFile {
    /// The turn.
    pub turn: TurnId,
    /// Correlates the [`DeliveryResult`].
    pub request_id: String,
    /// The file, relative to the workspace.
    pub path: WorkspacePath,
    /// Text to post with the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caption: Option<String>,
    /// Post it as a voice message (OGG/Opus audio only; other files are sent as they are).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub voice: bool,
}

/// A tool call needs consent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalRequest {
    /// The turn.
    pub turn: TurnId,
    /// Correlates the [`ApprovalDecision`].
    pub request_id: String,
    /// Tool name.
    pub tool: String,
    /// What the tool would act on (a path, a URL...).
    pub resource: String,
    /// One sentence for the person deciding.
    pub summary: String,
}

/// A question for the user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AskUser {
    /// The turn.
    pub turn: TurnId,
    /// Correlates the [`Answer`].
    pub question_id: String,
    /// The question.
    pub text: String,
    /// Suggested answers, if any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// How a turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndStatus {
    /// It ran to the end.
    Completed,
    /// It failed; see [`End::error`].
    Failed,
    /// It was cancelled.
    Cancelled,
}

/// The turn is over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct End {
    /// The turn.
    pub turn: TurnId,
    /// How it ended.
    pub status: EndStatus,
    /// Why it failed, fit to show a person.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Connection-level error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// A frame was not valid JSON or not a valid message.
    BadMessage,
    /// The handshake was missing, late or wrong.
    BadHandshake,
    /// The peer speaks an incompatible protocol version.
    UnsupportedVersion,
    /// The two processes do not see the same workspace.
    WorkspaceMismatch,
    /// A message referenced something unknown (request id, question id...).
    UnknownReference,
    /// The agent failed internally.
    Internal,
    /// A code this version does not know.
    #[serde(other)]
    Other,
}

/// A connection-level problem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorMsg {
    /// Machine-readable code.
    pub code: ErrorCode,
    /// Human-readable explanation (never contains secrets).
    pub message: String,
}

macro_rules! impl_from {
    ($enum:ident { $($variant:ident($payload:ident)),* $(,)? }) => {
        $(impl From<$payload> for $enum {
            fn from(m: $payload) -> Self { $enum::$variant(m) }
        })*
    };
}

impl_from!(ToAgent {
    Hello(Hello),
    UserMessage(UserMessage),
    ApprovalDecision(ApprovalDecision),
    Answer(Answer),
    DeliveryResult(DeliveryResult),
    Cancel(Cancel),
});

impl_from!(ToSurface {
    Welcome(Welcome),
    Ack(Ack),
    TextChunk(TextChunk),
    ToolCallChunk(ToolCallChunk),
    ToolResult(ToolResult),
    CustomUpdate(CustomUpdate),
    SendFile(SendFile),
    ApprovalRequest(ApprovalRequest),
    AskUser(AskUser),
    End(End),
    Error(ErrorMsg),
});

/// The `"type"` of a frame, for logging unknown messages. `None` if it is not a JSON object
/// with a string `type`.
pub fn peek_type(frame: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Tag {
        #[serde(rename = "type")]
        kind: String,
    }
    serde_json::from_str::<Tag>(frame).ok().map(|t| t.kind)
}
