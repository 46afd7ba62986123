//! A room's first sight: Element creates a DM only when its first message is sent, so that
//! message is in the room before the bot joins; and people invite the bot and write while the
//! surface is down. Both are answered, in encrypted rooms, as a matrix-sdk client sees them.

use std::time::Duration;

use e2e::e2ee::{E2eeUser, Received};
use e2e::{Homeserver, Stack, StackOptions};

use crate::TURN;
use crate::progress::{read_receipt_at, typing_shown_then_taken_down};

/// The bot's first message in the thread of `root`, waited for.
pub async fn reply_in_thread(user: &E2eeUser, room: &str, bot: &str, root: &str) -> Received {
    user.wait_for(TURN, &format!("the bot's reply to {root}"), || async {
        user.messages_from(room, bot)
            .await
            .ok()?
            .into_iter()
            .find(|m| m.thread_root.as_deref() == Some(root))
    })
    .await
    .unwrap()
}

/// Position of the bot's first message in the thread of `root` among all its messages.
pub fn position(msgs: &[Received], root: &str) -> usize {
    msgs.iter()
        .position(|m| m.thread_root.as_deref() == Some(root))
        .unwrap_or_else(|| panic!("no reply to {root}"))
}

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

#[tokio::test(flavor = "multi_thread")]
async fn elements_first_dm_message_sent_before_the_bot_joins_is_answered() {
    let hs = Homeserver::from_env();
    let stack = Stack::start(&hs, StackOptions::default()).await.unwrap();
    let bot = stack.bot.user_id.clone();
    let alice = E2eeUser::register(&hs, "user").await.unwrap();

    // The surface is frozen while the DM is created and its first message sent, so the
    // message is certainly in the room before the bot's join.
    let pid = stack.surface.pid().unwrap();
    signal(pid, "-STOP");
    let sent = alice
        .start_dm_with_first_message(&bot, "hello, are you there? 4711")
        .await;
    signal(pid, "-CONT");
    let (room, first) = sent.unwrap();
    alice.wait_joined(&room, &bot, TURN).await.unwrap();

    let reply = reply_in_thread(&alice, &room, &bot, &first).await;
    assert!(
        reply.body.contains("hello, are you there? 4711"),
        "{reply:?}"
    );
    assert!(reply.was_encrypted, "the answer is encrypted: {reply:?}");
    assert_eq!(
        alice.wire_type(&room, &first).await.unwrap(),
        "m.room.encrypted"
    );
    assert_eq!(
        alice.wire_type(&room, &reply.event_id).await.unwrap(),
        "m.room.encrypted"
    );

    // The conversation goes on normally, and the first message is answered once. The second
    // turn is slow: the room the message created shows the bot reading it and typing.
    let second = alice.send_text(&room, "sleep 1500").await.unwrap();
    reply_in_thread(&alice, &room, &bot, &second).await;
    typing_shown_then_taken_down(&alice, &room, &bot).await;
    read_receipt_at(&alice, &room, &bot, &second).await;
    let all = alice.messages_from(&room, &bot).await.unwrap();
    let firsts = all
        .iter()
        .filter(|m| m.thread_root.as_deref() == Some(first.as_str()));
    assert_eq!(firsts.count(), 1, "answered once: {all:?}");
    assert!(position(&all, &first) < position(&all, &second));
    println!("first_sight: first_dm_message answered=1 encrypted=true");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_invite_while_the_surface_is_down_is_joined_and_its_messages_answered() {
    let hs = Homeserver::from_env();
    let mut opts = StackOptions::default();
    opts.surface_env
        .insert("SURFACE_OFFLINE_NOTICE".into(), "1s".into());
    let mut stack = Stack::start(&hs, opts).await.unwrap();
    let bot = stack.bot.user_id.clone();
    let alice = E2eeUser::register(&hs, "user").await.unwrap();

    assert_eq!(stack.surface.stop().await, Some(0), "clean stop");
    let room = alice.create_encrypted_dm(&bot).await.unwrap();
    let one = alice
        .send_text(&room, "written while you were down")
        .await
        .unwrap();
    let two = alice.send_text(&room, "and another one").await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stack.surface.start().unwrap();
    stack.wait_surface_healthy().await;

    alice.wait_joined(&room, &bot, TURN).await.unwrap();
    reply_in_thread(&alice, &room, &bot, &one).await;
    reply_in_thread(&alice, &room, &bot, &two).await;
    let all = alice.messages_from(&room, &bot).await.unwrap();
    let notice = all
        .iter()
        .position(|m| m.body.contains("I was offline and missed 2 messages"))
        .unwrap_or_else(|| panic!("offline notice: {all:?}"));
    assert!(notice < position(&all, &one), "notice first: {all:?}");
    assert!(
        position(&all, &one) < position(&all, &two),
        "in order: {all:?}"
    );
    println!("first_sight: invite_while_down answered=2 offline_notice=1");
}
