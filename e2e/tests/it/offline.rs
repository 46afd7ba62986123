//! After downtime the room is told that missed messages are being answered now, once, before
//! the answers.

use std::collections::BTreeMap;
use std::time::Duration;

use e2e::StackOptions;
use e2e::matrix::in_thread;

use crate::{Dm, body};

#[tokio::test(flavor = "multi_thread")]
async fn messages_missed_while_offline_are_announced_then_answered() {
    let mut dm = Dm::start(StackOptions {
        surface_env: BTreeMap::from([("SURFACE_OFFLINE_NOTICE".into(), "3s".into())]),
        ..StackOptions::default()
    })
    .await;
    // Warm up: the bot knows the room.
    dm.ask("before the outage").await;

    dm.stack.surface.stop().await;
    let a = dm.user.send_text(&dm.room, "missed one").await.unwrap();
    let b = dm.user.send_text(&dm.room, "missed two").await.unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    dm.stack.surface.start().unwrap();
    dm.stack.wait_surface_healthy().await;
    dm.wait_thread(&a, 1, "the first missed message's reply")
        .await;
    dm.wait_thread(&b, 1, "the second missed message's reply")
        .await;

    let all = dm
        .user
        .messages_from(&dm.room, &dm.stack.bot.user_id)
        .await
        .unwrap();
    let notices: Vec<usize> = all
        .iter()
        .enumerate()
        .filter(|(_, e)| body(e).contains("I was offline"))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(notices.len(), 1, "one catch-up notice: {all:#?}");
    let notice = &all[notices[0]];
    assert_eq!(notice["content"]["msgtype"], "m.notice");
    assert!(body(notice).contains("missed 2 messages"), "{notice}");
    let first_reply = all.iter().position(|e| in_thread(e, &a)).unwrap();
    assert!(
        notices[0] < first_reply,
        "the notice comes before the answers"
    );
    println!(
        "offline_notice: missed=2 notice_at={} first_reply_at={first_reply}",
        notices[0]
    );
}
