//! End-to-end tests against a real Synapse, the real agent and the real surface.
//!
//! Run through `scripts/test.sh`, which starts the homeserver and exports its address.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod acp;
mod agent_down;
mod auth;
mod cli;
mod conversation;
mod doctor;
mod encrypted;
mod faults;
mod files_in;
mod files_out;
mod first_sight;
mod flood;
mod group;
mod hostile;
mod invites;
mod large;
mod late_keys;
mod latency;
mod layers;
mod mcp;
mod media_look;
mod offline;
mod operations;
mod outages;
mod perceive;
mod pg_failover;
mod progress;
mod recovery;
mod room_control;
mod scale_out;
mod streaming;

use std::time::Duration;

use e2e::matrix::{Event, in_thread};
use e2e::{Homeserver, Stack, StackOptions, User, eventually};
use serde_json::json;

/// How long a single turn may take before a test gives up (generous: CI machines are slow).
pub const TURN: Duration = Duration::from_secs(120);

/// A 3x2 RGB PNG.
pub const PNG_3X2: &str = "89504e470d0a1a0a0000000d49484452000000030000000208020000001216f14d0000001049444154789c63f8cfc000410c70160041d205fb87f0b9480000000049454e44ae426082";

/// A started stack plus a user in a direct chat with its bot.
#[derive(Debug)]
pub struct Dm {
    pub hs: Homeserver,
    pub stack: Stack,
    pub user: User,
    pub room: String,
}

impl Dm {
    pub async fn start(opts: StackOptions) -> Self {
        let hs = Homeserver::from_env();
        let stack = Stack::start(&hs, opts).await.expect("stack starts");
        let user = hs
            .register(&e2e::unique("user"), true)
            .await
            .expect("register user");
        let room = e2e::open_dm(&user, &stack.bot.user_id, TURN).await;
        Self {
            hs,
            stack,
            user,
            room,
        }
    }

    /// `surfaces/matrix/<user>/<room>` of this DM.
    pub fn room_dir(&self) -> String {
        protocol::room_dir(&self.user.user_id, &self.room).to_string()
    }

    /// The bot's messages in the thread of `root`, oldest first.
    pub async fn bot_thread(&self, root: &str) -> Vec<Event> {
        self.user
            .messages_from(&self.room, &self.stack.bot.user_id)
            .await
            .expect("messages")
            .into_iter()
            .filter(|e| in_thread(e, root))
            .collect()
    }

    /// Waits for at least `n` bot messages in the thread of `root` and returns them.
    pub async fn wait_thread(&self, root: &str, n: usize, what: &str) -> Vec<Event> {
        eventually(TURN, what, || async {
            let msgs = self.bot_thread(root).await;
            (msgs.len() >= n).then_some(msgs)
        })
        .await
    }

    /// Sends `text` and waits for the first text reply in its thread.
    pub async fn ask(&self, text: &str) -> (String, Event) {
        let id = self.user.send_text(&self.room, text).await.expect("send");
        let reply = self
            .wait_thread(&id, 1, &format!("a reply to {text:?}"))
            .await;
        (id, reply[0].clone())
    }
}

/// The `body` of an event.
pub fn body(e: &Event) -> &str {
    e["content"]["body"].as_str().unwrap_or_default()
}

/// Whether `e` is a reply to or in the thread of `id`, or not related to anything.
pub fn relates_to_or_unrelated(e: &Event, id: &str) -> bool {
    let rel = &e["content"]["m.relates_to"];
    rel.is_null() || rel["event_id"] == id || rel["m.in_reply_to"]["event_id"] == id
}

/// Message content for a media event.
pub fn media_content(
    msgtype: &str,
    body: &str,
    filename: Option<&str>,
    mxc: &str,
    mime: &str,
    size: u64,
) -> serde_json::Value {
    let mut c = json!({"msgtype": msgtype, "body": body, "url": mxc, "info": {"mimetype": mime, "size": size}});
    if let Some(f) = filename {
        c["filename"] = json!(f);
    }
    c
}

#[tokio::test(flavor = "multi_thread")]
async fn text_only_message_passes_unchanged_and_reply_is_threaded() {
    let dm = Dm::start(StackOptions::default()).await;
    let text = "hello there, this is *unchanged* text 12345";
    let (id, reply) = dm.ask(text).await;
    assert!(
        body(&reply).contains(text),
        "reply quotes the exact text: {reply}"
    );
    let rel = &reply["content"]["m.relates_to"];
    assert_eq!(rel["rel_type"], "m.thread", "{reply}");
    assert_eq!(rel["event_id"], id.as_str());
    assert_eq!(
        rel["m.in_reply_to"]["event_id"],
        id.as_str(),
        "reply fallback: {reply}"
    );
    assert!(
        dm.stack
            .files_under("surfaces")
            .iter()
            .all(|f| !f.contains("/inbox/"))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_turn_in_one_chat_does_not_delay_another() {
    let dm = Dm::start(StackOptions::default()).await;
    // A second user with their own DM to the same bot.
    let other = dm
        .hs
        .register(&e2e::unique("user"), false)
        .await
        .expect("register");
    let room2 = e2e::open_dm(&other, &dm.stack.bot.user_id, TURN).await;
    let bot = dm.stack.bot.user_id.clone();

    // A 20 s turn in the first chat, then a message queued behind it and one in the other chat.
    let slow = dm.user.send_text(&dm.room, "sleep 20000").await.unwrap();
    let queued = dm
        .user
        .send_text(&dm.room, "after the sleep")
        .await
        .unwrap();
    let fast = other
        .send_text(&room2, "hello from the other room")
        .await
        .unwrap();

    // The other chat is answered while the slow turn is still running.
    eventually(TURN, "the other chat's reply", || async {
        let msgs = other.messages_from(&room2, &bot).await.ok()?;
        msgs.into_iter().find(|e| in_thread(e, &fast))
    })
    .await;
    assert!(
        dm.bot_thread(&slow).await.is_empty(),
        "the slow turn was still running"
    );

    // The queued message is answered after the slow one, in order.
    dm.wait_thread(&queued, 1, "the queued message's reply")
        .await;
    let all = dm.user.messages_from(&dm.room, &bot).await.unwrap();
    let pos = |root: &str| all.iter().position(|e| in_thread(e, root));
    let (slow_at, queued_at) = (
        pos(&slow).expect("slow reply"),
        pos(&queued).expect("queued reply"),
    );
    assert!(
        slow_at < queued_at,
        "replies in order: slow at {slow_at}, queued at {queued_at}"
    );
}
