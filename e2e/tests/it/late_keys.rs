//! Messages whose room key arrives late: the sender's client talks through a proxy that holds
//! its encrypted to-device messages (the megolm keys) back. The chat waits for the key instead
//! of answering later messages first; when the key never comes in `SURFACE_KEY_WAIT`, the room
//! is told who sent what when, the chat goes on, and the message is still answered once the
//! key arrives.

use std::time::Duration;

use e2e::e2ee::E2eeUser;
use e2e::keyproxy::KeyProxy;
use e2e::{Homeserver, Stack, StackOptions, unique};

use crate::TURN;
use crate::first_sight::{position, reply_in_thread};

struct Setup {
    stack: Stack,
    proxy: KeyProxy,
    alice: E2eeUser,
    room: String,
    bot: String,
}

async fn setup(key_wait: &str) -> Setup {
    let hs = Homeserver::from_env();
    let mut opts = StackOptions::default();
    opts.surface_env
        .insert("SURFACE_KEY_WAIT".into(), key_wait.into());
    let stack = Stack::start(&hs, opts).await.unwrap();
    let bot = stack.bot.user_id.clone();
    let proxy = KeyProxy::start(&hs.url).await.unwrap();
    let user = hs.register(&unique("user"), false).await.unwrap();
    let alice = E2eeUser::login_at(&hs, proxy.url(), &user).await.unwrap();
    let room = alice.create_encrypted_dm(&bot).await.unwrap();
    alice.wait_joined(&room, &bot, TURN).await.unwrap();
    let warm = alice.send_text(&room, "warm up").await.unwrap();
    reply_in_thread(&alice, &room, &bot, &warm).await;
    Setup {
        stack,
        proxy,
        alice,
        room,
        bot,
    }
}

impl Setup {
    /// Sends `text` in a new megolm session whose key the proxy holds back.
    async fn send_with_held_key(&self, text: &str) -> String {
        self.new_session().await;
        self.proxy.hold();
        let id = self.alice.send_text(&self.room, text).await.unwrap();
        self.proxy.pass();
        assert!(self.proxy.held() >= 1, "the room key was held back");
        id
    }

    /// Sends `text` in a new megolm session whose key travels at once.
    async fn send_in_new_session(&self, text: &str) -> String {
        self.new_session().await;
        self.alice.send_text(&self.room, text).await.unwrap()
    }

    async fn new_session(&self) {
        let room = self
            .alice
            .client()
            .get_room(&matrix_sdk::ruma::RoomId::parse(&self.room).unwrap())
            .unwrap();
        room.discard_room_key().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_message_whose_key_comes_late_is_answered_in_order() {
    let s = setup("120s").await;
    let late = s.send_with_held_key("the late one").await;
    let after = s.send_in_new_session("the one after").await;

    // The second message is readable at once, yet not answered before the first.
    s.stack
        .wait_surface_log("message not decryptable yet", TURN)
        .await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let early = s.alice.messages_from(&s.room, &s.bot).await.unwrap();
    assert!(
        early
            .iter()
            .all(|m| m.thread_root.as_deref() != Some(after.as_str())),
        "the later message waited for the earlier one's key: {early:?}"
    );

    let released = s.proxy.release().await.unwrap();
    let late_reply = reply_in_thread(&s.alice, &s.room, &s.bot, &late).await;
    assert!(late_reply.body.contains("the late one"), "{late_reply:?}");
    reply_in_thread(&s.alice, &s.room, &s.bot, &after).await;
    let all = s.alice.messages_from(&s.room, &s.bot).await.unwrap();
    assert!(
        position(&all, &late) < position(&all, &after),
        "in order: {all:?}"
    );
    assert!(
        all.iter().all(|m| !m.body.contains("could not decrypt")),
        "{all:?}"
    );
    println!("late_keys: held_requests={released} answered_in_order=true");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_that_does_not_come_in_time_gets_a_notice_and_the_chat_goes_on() {
    let s = setup("3s").await;
    let lost = s.send_with_held_key("the lost one").await;
    let next = s.send_in_new_session("the next one").await;

    let notice = s
        .alice
        .wait_for(TURN, "the undecryptable-message notice", || async {
            s.alice
                .messages_from(&s.room, &s.bot)
                .await
                .ok()?
                .into_iter()
                .find(|m| m.body.contains("could not decrypt"))
        })
        .await
        .unwrap();
    assert!(
        notice.body.contains(&s.alice.user_id),
        "names the sender: {notice:?}"
    );
    assert!(notice.body.contains(" UTC"), "names the time: {notice:?}");
    assert_eq!(
        notice.thread_root.as_deref(),
        Some(lost.as_str()),
        "{notice:?}"
    );
    assert_eq!(notice.msgtype, "m.notice");
    reply_in_thread(&s.alice, &s.room, &s.bot, &next).await;
    let log = s.stack.surface.log();
    assert!(
        log.lines()
            .any(|l| l.contains("room key did not arrive in time")
                && l.contains(&lost)
                && l.contains("session_id=")),
        "the log names the event and session"
    );

    // The key still comes: the message is answered after all.
    s.proxy.release().await.unwrap();
    let answer = s
        .alice
        .wait_for(TURN, "the late answer", || async {
            s.alice
                .messages_from(&s.room, &s.bot)
                .await
                .ok()?
                .into_iter()
                .find(|m| {
                    m.thread_root.as_deref() == Some(lost.as_str())
                        && m.body.contains("the lost one")
                })
        })
        .await
        .unwrap();
    assert_eq!(answer.msgtype, "m.text");
    println!("late_keys: notice=1 chat_went_on=true answered_when_key_came=true");
}
