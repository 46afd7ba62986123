//! What one run measures against: a fresh agent + surface, a user (plain HTTP for streamed
//! uploads and the admin API, plus a matrix-sdk device of the same account that sees every
//! room through its sync), the echo bot, and the direct chats between them, warmed up.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::{Sizes, poll};
use crate::e2ee::Received;
use crate::{E2eeUser, Homeserver, Stack, StackOptions, User, unique};

/// How long one turn (a reply, a join) may take before the run fails.
pub const TURN: Duration = Duration::from_secs(120);

/// How often a wait looks at the user's client (its sync recorder is local, so this is cheap).
pub const POLL: Duration = Duration::from_millis(5);

/// The stack's usual surface log filter, plus the latency lines.
const SURFACE_LOG: &str = "info,matrix_sdk=warn,matrix_sdk_base=warn,matrix_sdk_crypto=warn,\
                           matrix_sdk_crypto::backups=error,mxbridge_latency=debug";

/// The stack's usual agent log filter, plus the latency lines.
const AGENT_LOG: &str = "info,mxbridge_latency=debug";

/// Everything a run needs, started and warmed up.
#[derive(Debug)]
pub struct Setup {
    /// The homeserver.
    pub hs: Homeserver,
    /// Agent and surface.
    pub stack: Stack,
    /// The bot's user id.
    pub bot: String,
    /// The user over plain HTTP; a homeserver admin (media listing and clean-up).
    pub user: User,
    /// The same account as a matrix-sdk device: sends encrypted, and sees every room.
    pub alice: E2eeUser,
    /// The echo bot.
    pub echo: E2eeUser,
    /// Unencrypted DM user ↔ bot.
    pub plain_dm: String,
    /// Encrypted DM alice ↔ bot.
    pub enc_dm: String,
    /// Encrypted DM alice ↔ echo bot.
    pub echo_dm: String,
}

impl Setup {
    /// Starts the stack and the users, opens the DMs and warms each up with one turn.
    pub async fn start(hs: &Homeserver, sizes: &Sizes) -> Result<Self> {
        let limit = format!("{}MiB", sizes.size_mib + 64);
        // Voice messages are transcribed by a server that answers at once (the hearing phase).
        let transcriber = super::perceive::fake_transcriber().await?;
        let opts = StackOptions {
            max_file_size: Some(limit.clone()),
            agent_env: [
                ("AGENT_MAX_FILE_SIZE".to_owned(), limit),
                ("TRANSCRIBE_MODEL".to_owned(), "bench-instant".to_owned()),
                ("TRANSCRIBE_BASE_URL".to_owned(), transcriber),
                ("RUST_LOG".to_owned(), AGENT_LOG.to_owned()),
            ]
            .into(),
            surface_env: [("RUST_LOG".to_owned(), SURFACE_LOG.to_owned())].into(),
            ..Default::default()
        };
        let stack = Stack::start(hs, opts)
            .await
            .context("start agent and surface")?;
        let bot = stack.bot.user_id.clone();
        let user = hs.register(&unique("bench"), true).await?;
        let alice = E2eeUser::login(hs, &user).await?;
        let echo = E2eeUser::register(hs, "echo").await?;
        super::echo::serve(&echo);

        let plain_dm = user.create_room(&[&bot], true).await?;
        let enc_dm = alice.create_encrypted_dm(&bot).await?;
        let echo_dm = alice.create_encrypted_dm(&echo.user_id).await?;
        wait_joined(&user, &plain_dm, &bot).await?;
        alice.wait_joined(&enc_dm, &bot, TURN).await?;
        alice.wait_joined(&echo_dm, &echo.user_id, TURN).await?;
        let me = Self {
            hs: hs.clone(),
            stack,
            bot,
            user,
            alice,
            echo,
            plain_dm,
            enc_dm,
            echo_dm,
        };
        // Warm up: Olm sessions, room keys, the chats' first turns.
        let id = me.user.send_text(&me.plain_dm, "warm up").await?;
        me.wait_answer(&me.plain_dm, &me.bot, &id, TURN, |_| true)
            .await?;
        for (room, responder) in [(&me.enc_dm, &me.bot), (&me.echo_dm, &me.echo.user_id)] {
            let id = me.alice.send_text(room, "warm up").await?;
            me.wait_answer(room, responder, &id, TURN, |_| true).await?;
        }
        Ok(me)
    }

    /// Waits until alice's client shows a message of `responder` in `room` answering `id` (a
    /// reply or in its thread) that `accept`s; returns it and when it was seen.
    pub async fn wait_answer(
        &self,
        room: &str,
        responder: &str,
        id: &str,
        timeout: Duration,
        accept: impl Fn(&Received) -> bool,
    ) -> Result<(Received, Instant)> {
        let what = format!("an answer from {responder} to {id}");
        let accept = &accept;
        poll(timeout, POLL, &what, || async move {
            let msgs = self.alice.messages_from(room, responder).await.ok()?;
            msgs.into_iter()
                .find(|m| m.answers() == Some(id) && accept(m))
                .map(|m| (m, Instant::now()))
        })
        .await
    }

    /// Opens `n` unencrypted DMs of the user with `responder`, each warmed up with one turn.
    pub async fn open_rooms(&self, responder: &str, n: usize) -> Result<Vec<String>> {
        let rooms = futures_util::future::try_join_all((0..n).map(|_| async {
            let room = self.user.create_room(&[responder], true).await?;
            wait_joined(&self.user, &room, responder).await?;
            let id = self.user.send_text(&room, "warm up").await?;
            self.wait_answer(&room, responder, &id, TURN, |_| true)
                .await?;
            anyhow::Ok(room)
        }))
        .await?;
        Ok(rooms)
    }
}

/// Waits until `member` has joined `room`, as `user` sees it.
async fn wait_joined(user: &User, room: &str, member: &str) -> Result<()> {
    crate::joined(user, room, member, TURN, Duration::from_millis(100)).await
}
