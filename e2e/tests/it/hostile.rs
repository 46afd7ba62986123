//! Hostile input from every side at once, against the real stack in encrypted rooms: a room
//! member naming paths that lead outside, racing links under the agent, sending file names
//! and sizes meant to break the inbox, filling the disk, and a stranger on the network
//! attacking both listening ports, while another user's chat is timed. Prints one line:
//! `hostile_inputs=N refused=N canary_reads=0 partial_files=0 crashes=0 other_chat_p99_ms=…`.

mod names;
mod paths;
mod probe;
mod sizes;
mod sockets;

use std::fmt::Display;
use std::path::Path;

use e2e::canary::Canary;
use e2e::{E2eeUser, Homeserver, Received, Stack, StackOptions};

use crate::TURN;

/// Limits set small so over-size files are cheap to make.
pub const MAX_FILE: u64 = 1024 * 1024;

/// What every phase adds up: inputs that had to be refused, and those that were not.
#[derive(Debug, Default)]
pub struct Tally {
    pub inputs: u64,
    pub refused: u64,
    pub not_refused: Vec<String>,
}

impl Tally {
    pub fn record(&mut self, what: impl Display, refused: bool) {
        self.inputs += 1;
        if refused {
            self.refused += 1;
        } else {
            self.not_refused.push(what.to_string());
        }
    }
}

/// A user and their encrypted DM with the bot.
pub struct Room {
    pub user: E2eeUser,
    pub id: String,
}

impl Room {
    async fn open(hs: &Homeserver, prefix: &str, bot: &str) -> Self {
        let user = E2eeUser::register(hs, prefix).await.expect("register");
        let id = user.create_encrypted_dm(bot).await.expect("create DM");
        user.wait_joined(&id, bot, TURN)
            .await
            .expect("the bot joins");
        Self { user, id }
    }

    /// `surfaces/matrix/<user>/<room>` of this DM.
    pub fn room_dir(&self) -> String {
        protocol::room_dir(&self.user.user_id, &self.id).to_string()
    }

    /// The bot's messages in the thread of `root` (or replying to it).
    pub fn answers<'a>(all: &'a [Received], root: &str) -> Vec<&'a Received> {
        all.iter()
            .filter(|m| m.thread_root.as_deref() == Some(root) || m.answers() == Some(root))
            .collect()
    }
}

/// Names of in-progress download files anywhere under `dir`.
pub fn partial_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Ok(t) = e.file_type() else { continue };
            if t.is_dir() {
                stack.push(e.path());
            } else if name.starts_with(".partial-") {
                out.push(e.path().display().to_string());
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_inputs_get_nothing() {
    let hs = Homeserver::from_env();
    let mut opts = StackOptions {
        max_file_size: Some(format!("{MAX_FILE}")),
        ..StackOptions::default()
    };
    opts.agent_env
        .insert("AGENT_MAX_FILE_SIZE".into(), format!("{MAX_FILE}"));
    // The MCP port is attacked too.
    let mcp_port = e2e::procs::free_port();
    let mcp_token = "hostile-mcp-token-0123456789abcdef";
    opts.surface_env
        .insert("SURFACE_MCP_BIND".into(), format!("127.0.0.1:{mcp_port}"));
    opts.surface_env
        .insert("SURFACE_MCP_TOKEN".into(), mcp_token.into());
    let mut stack = Stack::start(&hs, opts).await.expect("stack starts");
    let outside = stack.workspace.parent().unwrap().to_path_buf();
    let mut canary = Canary::plant(&outside).expect("canary");
    let bot = stack.bot.user_id.clone();
    let attacker = Room::open(&hs, "hostile", &bot).await;
    let other = Room::open(&hs, "other", &bot).await;
    let mut tally = Tally::default();

    // Another user's chat, timed before (after one to warm up) and during the attacks.
    probe::round_trip(&other, &bot).await;
    let baseline = probe::round_trips(&other, &bot, 8).await;

    paths::through_the_room(&stack, &attacker, &other, &canary, &mut tally).await;
    let raced = paths::raced_under_the_agent(&stack, &canary, &mut tally).await;
    let mcp = sockets::Mcp {
        addr: ([127, 0, 0, 1], mcp_port).into(),
        token: mcp_token,
    };
    let during = sockets::attack_every_port(&stack, &mcp, &other, &mut tally).await;
    let names = names::hostile_names(&stack, &attacker).await;
    sizes::lies_and_a_full_disk(&stack, &attacker, &mut tally).await;

    let canary_reads = canary.reads();
    let canary_opens = canary.opens();
    let partials = partial_files(&stack.workspace);
    let mut crashes = 0;
    for child in [&mut stack.agent, &mut stack.surface] {
        if !child.is_running() || child.log().contains("panicked") {
            child.dump();
            crashes += 1;
        }
    }
    println!(
        "hostile_inputs={} refused={} canary_reads={canary_reads} partial_files={} crashes={crashes} \
         other_chat_p99_ms={} other_chat_baseline_p99_ms={} raced_reads={raced} names={} names_safe={} \
         canary_opened_and_refused={canary_opens}",
        tally.inputs,
        tally.refused,
        partials.len(),
        probe::p99_ms(&during),
        probe::p99_ms(&baseline),
        names.sent,
        names.safe,
    );
    assert!(
        tally.not_refused.is_empty(),
        "not refused: {:#?}",
        tally.not_refused
    );
    assert_eq!(canary_reads, 0, "the canary outside the workspace was read");
    assert!(partials.is_empty(), "partial files left: {partials:?}");
    assert_eq!(crashes, 0, "a process crashed or panicked");
    assert_eq!(names.safe, names.sent, "{:#?}", names.problems);
}
