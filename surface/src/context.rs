//! The state every part of the running surface shares: config, Matrix client, journal, health,
//! workspace, the way to the agent, lanes, pending questions, the bot-loop breaker's memory and
//! the task tracker. Built once in [`crate::run_with`] from lower modules only (nothing here
//! imports a module that imports this one) and passed explicitly.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, RwLock};

use matrix_sdk::Client;
use matrix_sdk::ruma::events::room::message::RoomMessageEventContent;
use protocol::Sentinel;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::agent_link::{AgentEndpoint, WorkspaceProof};
use crate::config::Config;
use crate::health::Health;
use crate::journal::Journal;
use crate::lane_registry::Lanes;
use crate::media::{self, UploadCache};
use crate::waits::Waits;
use crate::workspace::Workspace;

/// Invites being joined right now (the SDK may deliver a stripped state event twice).
#[derive(Debug, Default)]
pub struct Joining(pub Mutex<HashSet<String>>);

/// Who behaves like a bot, and how many turns in a row bots have triggered per chat: what the
/// bot-loop breaker decides with (in memory: a restart gives bots a fresh allowance). Also which
/// rooms were told the bot cannot read some kind of content (told once each).
#[derive(Debug, Default)]
pub struct BotLoops {
    /// Users seen posting `m.notice` (what bots post).
    pub notice_senders: Mutex<HashSet<String>>,
    /// Turns in a row triggered by bots, per chat.
    pub streaks: Mutex<std::collections::HashMap<protocol::ChatId, u32>>,
    /// (room, kind) pairs already told that the bot cannot read a kind of content.
    pub told: Mutex<HashSet<(String, &'static str)>>,
}

impl BotLoops {
    /// Whether `room_id` has not been told about `kind` yet (and now counts as told).
    pub fn first_notice(&self, room_id: &str, kind: &'static str) -> bool {
        self.told
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((room_id.to_owned(), kind))
    }

    /// Remembers that `user_id` posts notices.
    pub fn saw_notice(&self, user_id: &str) {
        self.notice_senders
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(user_id.to_owned());
    }

    /// Whether `user_id` was seen posting notices.
    pub fn posts_notices(&self, user_id: &str) -> bool {
        self.notice_senders
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(user_id)
    }

    /// Turns in a row bots triggered in `chat`.
    pub fn streak(&self, chat: &protocol::ChatId) -> u32 {
        let streaks = self.streaks.lock().unwrap_or_else(|p| p.into_inner());
        streaks.get(chat).copied().unwrap_or(0)
    }

    /// Sets the streak of `chat`.
    pub fn set_streak(&self, chat: &protocol::ChatId, n: u32) {
        let mut streaks = self.streaks.lock().unwrap_or_else(|p| p.into_inner());
        if n == 0 {
            streaks.remove(chat);
        } else {
            streaks.insert(chat.clone(), n);
        }
    }
}

/// Shared state of the running surface.
#[derive(Debug)]
pub struct Shared {
    /// The configuration.
    pub config: Config,
    /// The logged-in Matrix client.
    pub client: Client,
    /// The delivery journal.
    pub journal: Arc<Journal>,
    /// Health state behind `/healthz`.
    pub health: Arc<Health>,
    /// The shared workspace.
    pub workspace: Workspace,
    /// How to reach the agent.
    pub endpoint: AgentEndpoint,
    /// Content-hash cache of uploads (the same bytes are uploaded once).
    pub upload_cache: UploadCache,
    /// One lane per chat.
    pub lanes: Lanes,
    /// Questions and approvals waiting for a user's answer.
    pub waits: Waits,
    /// Invites being joined.
    pub joining: Joining,
    /// The bot-loop breaker's memory.
    pub bot_loops: BotLoops,
    /// Senders' display names per room.
    pub member_names: crate::members::MemberNames,
    /// The longest delay of a delayed event the homeserver offers (MSC4140; `None`: none), asked
    /// once by [`crate::delayed`].
    pub delayed_events: tokio::sync::OnceCell<Option<std::time::Duration>>,
    /// Cancelled on SIGINT/SIGTERM.
    pub shutdown: CancellationToken,
    /// Every background task, awaited at shutdown.
    pub tracker: TaskTracker,
    /// The bot's display name (for mention detection), refreshed at start.
    pub bot_display_name: RwLock<Option<String>>,
    /// When this process started (ms since the epoch): on a room's first sight, older events
    /// are history, not work.
    pub started_ms: u64,
}

impl Shared {
    /// Uploads the workspace file `path`, as `scope` may reach it, and builds its message
    /// ([`media::prepare_file_message`] with this surface's cache, size limit and ffmpeg).
    pub async fn prepare_file(
        &self,
        path: &protocol::WorkspacePath,
        scope: &crate::workspace::ChatScope,
        posting: media::Posting<'_>,
    ) -> Result<RoomMessageEventContent, media::SendFileError> {
        media::prepare_file_message(
            &self.client,
            &self.workspace,
            path,
            scope,
            posting,
            &media::Outbound {
                cache: &self.upload_cache,
                limit: self.config.max_file_size,
                ffmpeg: self.config.ffmpeg.as_deref(),
            },
        )
        .await
    }

    /// The bot's display name, if known.
    pub fn bot_display_name(&self) -> Option<String> {
        self.bot_display_name
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// The workspace proof over the real workspace.
#[derive(Debug, Clone)]
pub struct WorkspaceSentinels(pub Workspace);

impl WorkspaceProof for WorkspaceSentinels {
    fn write_sentinel(&self) -> Result<Sentinel, String> {
        self.0.write_sentinel().map_err(|e| e.to_string())
    }

    fn check_sentinel(&self, sentinel: &Sentinel) -> Result<(), String> {
        if self.0.check_sentinel(sentinel) {
            Ok(())
        } else {
            Err(format!(
                "{} is missing or has other content under {}",
                sentinel.path,
                self.0.root().display()
            ))
        }
    }
}

/// Shorthand used across modules.
pub type Ctx = Arc<Shared>;
