//! Why the bot posts something: one value per kind of post, named in logs, kept in the
//! journal's `sends` table, and part of the transaction ids of notices (so these names never
//! change: a renamed purpose would post a notice a second time after an upgrade).

use std::fmt;

/// Why a post is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Purpose {
    /// The agent's answer, posted whole.
    Answer,
    /// The last edit of a streamed answer.
    AnswerFinal,
    /// The first post of a streamed answer.
    AnswerLive,
    /// An edit of a streamed answer while it grows.
    AnswerProgress,
    /// A file the agent sent.
    File,
    /// Why a file the agent named could not be sent.
    FileFailed,
    /// A file dropped into the outbox folder.
    Outbox,
    /// An approval prompt.
    Approval,
    /// The reactions seeded on an approval prompt.
    ApprovalReaction,
    /// What an approval prompt's answer was.
    ApprovalOutcome,
    /// An approval answered from an unverified session (`SURFACE_APPROVALS=verified`).
    ApprovalUnverified,
    /// A question from the agent.
    Question,
    /// A prompt nobody answered in time.
    Timeout,
    /// A tool call shown in the room (`SURFACE_SHOW_TOOL_CALLS`).
    Tool,
    /// A notice the agent asked for.
    AgentNotice,
    /// The agent cannot be reached; the message is kept.
    AgentUnreachable,
    /// A turn the agent ended as failed.
    TurnFailed,
    /// A turn the agent lost (it restarted without it).
    TurnLost,
    /// A turn stopped on request before it said anything.
    TurnStopped,
    /// A turn that stopped hearing from the agent.
    TurnTimeout,
    /// The homeserver refused a post for good: the notice saying so.
    RefusalNotice,
    /// The same, as a reaction on the message concerned.
    RefusalReaction,
    /// Messages queue up behind a long turn.
    Backlog,
    /// Another bot's answers in a row reached the limit.
    BotLoop,
    /// What `!mode` changed (or who may change it).
    Mode,
    /// The answer to `!stop` when it stops nothing (or the sender may not stop it).
    Stop,
    /// The answer to `!help`.
    Help,
    /// The introduction in a room the bot joined.
    Intro,
    /// The answer to `!settings`, `!set` or `!reset`.
    Settings,
    /// The homeserver's "I was interrupted" notice, edited once the bot is back.
    Interrupted,
    /// The offer to stop a turn whose message was edited, so the edit is answered now.
    EditOffer,
    /// Content the bot cannot read yet (a sticker, a location, a poll).
    Unsupported,
    /// An unencrypted event in an encrypted room.
    Plaintext,
    /// Messages missed while the surface was offline.
    Offline,
    /// A message whose room key never came.
    Undecryptable,
    /// A file someone sent that could not be downloaded.
    DownloadFailed,
    /// A journal row this build cannot read back.
    UnreadableRow,
    /// A message posted for an MCP client.
    Mcp,
    /// A file posted for an MCP client.
    McpFile,
}

impl Purpose {
    /// Its name, in logs, the journal and notice transaction ids.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Answer => "answer",
            Self::AnswerFinal => "answer-final",
            Self::AnswerLive => "answer-live",
            Self::AnswerProgress => "answer-progress",
            Self::File => "file",
            Self::FileFailed => "file-failed",
            Self::Outbox => "outbox",
            Self::Approval => "approval",
            Self::ApprovalReaction => "approval-reaction",
            Self::ApprovalOutcome => "approval-outcome",
            Self::ApprovalUnverified => "approval-unverified",
            Self::Question => "question",
            Self::Timeout => "timeout",
            Self::Tool => "tool",
            Self::AgentNotice => "agent-notice",
            Self::AgentUnreachable => "agent-unreachable",
            Self::TurnFailed => "turn-failed",
            Self::TurnLost => "turn-lost",
            Self::TurnStopped => "turn-stopped",
            Self::TurnTimeout => "turn-timeout",
            Self::RefusalNotice => "refusal-notice",
            Self::RefusalReaction => "refusal-reaction",
            Self::Backlog => "backlog",
            Self::BotLoop => "bot-loop",
            Self::Mode => "mode",
            Self::Stop => "stop",
            Self::Help => "help",
            Self::Intro => "intro",
            Self::Settings => "settings",
            Self::Interrupted => "interrupted",
            Self::EditOffer => "edit-offer",
            Self::Unsupported => "unsupported",
            Self::Plaintext => "plaintext",
            Self::Offline => "offline",
            Self::Undecryptable => "undecryptable",
            Self::DownloadFailed => "download-failed",
            Self::UnreadableRow => "unreadable-row",
            Self::Mcp => "mcp",
            Self::McpFile => "mcp-file",
        }
    }

    /// What a refusal notice calls the refused post.
    pub const fn what(self) -> &'static str {
        match self {
            Self::Answer => "answer",
            Self::File | Self::Outbox => "file",
            Self::Approval => "approval request",
            Self::Question => "question",
            _ => "message",
        }
    }
}

impl AsRef<str> for Purpose {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Display for Purpose {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
