//! The bot's encryption identity survives losing its state directory: the first start sets up
//! cross-signing and key backup and prints the recovery key once; a surface started on an empty
//! state directory with that key restores them and reads a message encrypted only for the old
//! device, answering it and nothing it had answered before.

use e2e::e2ee::E2eeUser;
use e2e::{Homeserver, Stack, StackOptions};
use serde_json::Value;

use crate::TURN;
use crate::first_sight::reply_in_thread;

const BANNER: &str = "RECOVERY KEY (shown once)";

/// The recovery key the surface printed, and how many times the banner appears.
fn printed_key(log: &str) -> (Option<String>, usize) {
    let lines: Vec<&str> = log.lines().collect();
    let at: Vec<usize> = (0..lines.len())
        .filter(|i| lines[*i].contains(BANNER))
        .collect();
    let key = at
        .first()
        .and_then(|i| lines.get(i + 1))
        .map(|l| l.trim().to_owned());
    (key, at.len())
}

/// Room-key sessions of `room` in the bot's server-side backup.
async fn backed_up_sessions(hs: &Homeserver, token: &str, room: &str) -> usize {
    let http = reqwest::Client::new();
    let get = |path: String| {
        http.get(format!("{}/_matrix/client/v3{path}", hs.url))
            .bearer_auth(token)
            .send()
    };
    let Ok(r) = get("/room_keys/version".into()).await else {
        return 0;
    };
    let Ok(v) = r.json::<Value>().await else {
        return 0;
    };
    let Some(version) = v["version"].as_str() else {
        return 0;
    };
    let Ok(r) = get(format!("/room_keys/keys/{room}?version={version}")).await else {
        return 0;
    };
    r.json::<Value>()
        .await
        .ok()
        .and_then(|v| v["sessions"].as_object().map(|s| s.len()))
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_fresh_state_dir_with_the_recovery_key_reads_old_encrypted_messages() {
    let hs = Homeserver::from_env();
    let opts = StackOptions {
        password_login: true,
        ..StackOptions::default()
    };
    let mut stack = Stack::start(&hs, opts).await.unwrap();
    let bot = stack.bot.user_id.clone();
    let alice = E2eeUser::register(&hs, "user").await.unwrap();
    let room = alice.create_encrypted_dm(&bot).await.unwrap();
    alice.wait_joined(&room, &bot, TURN).await.unwrap();
    let one = alice
        .send_text(&room, "first, before the loss")
        .await
        .unwrap();
    reply_in_thread(&alice, &room, &bot, &one).await;

    stack
        .wait_surface_log("cross-signing and key backup set up", TURN)
        .await;
    let log = stack.surface.log();
    let (key, banners) = printed_key(&log);
    let key = key.expect("recovery key printed");
    assert_eq!(banners, 1, "printed once");
    assert!(key.len() >= 40, "a recovery key: {} chars", key.len());
    let in_log_lines = log
        .lines()
        .filter(|l| {
            l.contains(&key)
                && (l.contains(" INFO ")
                    || l.contains(" WARN ")
                    || l.contains(" ERROR ")
                    || l.contains(" DEBUG "))
        })
        .count();
    assert_eq!(in_log_lines, 0, "the key is never in a log line");

    // The old device's copy of the room key reaches the backup.
    let session: Value = serde_json::from_slice(
        &std::fs::read(stack.surface_state_dir().join("session.json")).unwrap(),
    )
    .unwrap();
    let token = session["access_token"].as_str().unwrap().to_owned();
    alice
        .wait_for(TURN, "the room key in the bot's backup", || async {
            (backed_up_sessions(&hs, &token, &room).await > 0).then_some(())
        })
        .await
        .unwrap();

    // The state volume is lost while a message waits, encrypted for the old device only.
    assert_eq!(stack.surface.stop().await, Some(0));
    let two = alice
        .send_text(&room, "second, while you were gone")
        .await
        .unwrap();
    let state = stack.surface_state_dir();
    std::fs::rename(&state, state.with_extension("lost")).unwrap();
    stack.surface.set_env("MATRIX_RECOVERY_KEY", Some(&key));
    stack.surface.start().unwrap();
    stack.wait_surface_healthy().await;
    stack
        .wait_surface_log("identity and key backup restored", TURN)
        .await;

    let reply = reply_in_thread(&alice, &room, &bot, &two).await;
    assert!(
        reply.body.contains("second, while you were gone"),
        "{reply:?}"
    );
    let all = alice.messages_from(&room, &bot).await.unwrap();
    let to_one = all
        .iter()
        .filter(|m| m.thread_root.as_deref() == Some(one.as_str()))
        .count();
    assert_eq!(to_one, 1, "the old message is not answered again: {all:?}");
    let restored = stack.surface.log();
    assert_eq!(printed_key(&restored).1, 1, "no new key printed on restore");
    println!("recovery: restored=true old_message_read=true answered_again=0");
}
