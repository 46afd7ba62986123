//! A bot that stays logged in, against a Synapse of its own whose refreshable access tokens
//! live 3 s:
//! * the surface (a password login, so it holds a refresh token) renews its token every few
//!   seconds through five minutes of traffic in an encrypted DM, is SIGKILLed right after a
//!   rotation and again as a token expires (during or just before the refresh), and answers
//!   every message once. Rotations are counted from the session file, which must hold the new
//!   pair the moment it exists;
//! * an operator-given token pair survives its rotation and a SIGKILL; a soft logout with a
//!   password logs in again into the same device; without one, and after the device is deleted,
//!   the surface stops clearly (`/healthz` 503 with the reason, a log line, no request loop) and
//!   a new token resumes it with nothing lost; an account an admin locks and unlocks carries on
//!   by itself.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use e2e::{DedicatedSynapse, E2eeUser, Stack, StackOptions};
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::TURN;

/// How long traffic runs (`MXBRIDGE_TOKEN_TRAFFIC_SECS` shortens it for a quick local run).
fn traffic() -> Duration {
    let secs = std::env::var("MXBRIDGE_TOKEN_TRAFFIC_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(300);
    Duration::from_secs(secs)
}

/// A digest of the access token in the session file (never the token itself).
fn token_digest(path: &Path) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let token = v["access_token"]
        .as_str()
        .or_else(|| v["tokens"]["access_token"].as_str())?;
    Some(hex::encode(Sha256::digest(token.as_bytes())))
}

/// Watches the session file: every distinct access token seen, and a signal on each change.
fn watch_rotations(
    path: PathBuf,
) -> (
    watch::Receiver<BTreeSet<String>>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = watch::channel(BTreeSet::new());
    let task = tokio::spawn(async move {
        loop {
            if let Some(d) = token_digest(&path) {
                tx.send_if_modified(|seen| seen.insert(d));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    (rx, task)
}

#[tokio::test(flavor = "multi_thread")]
async fn refresh_tokens_rotate_through_traffic_and_sigkills() {
    let synapse = DedicatedSynapse::start_with(None, Some("refreshable_access_token_lifetime: 3s"))
        .await
        .expect("synapse");
    let hs = synapse.homeserver().clone();
    let opts = StackOptions {
        password_login: true,
        ..StackOptions::default()
    };
    let mut stack = Stack::start(&hs, opts).await.expect("stack");
    let bot = stack.bot.user_id.clone();
    let user = E2eeUser::register(&hs, "rotate").await.expect("user");
    let room = user.create_encrypted_dm(&bot).await.expect("DM");
    user.wait_joined(&room, &bot, TURN).await.expect("join");
    let session = stack.surface_state_dir().join("session.json");
    let (mut rotations, watcher) = watch_rotations(session.clone());

    let length = traffic();
    let started = Instant::now();
    let mut sent: Vec<(String, String)> = Vec::new();
    let mut kills = Vec::new();
    while started.elapsed() < length {
        let text = format!("ping {}", sent.len());
        let id = user.send_text(&room, &text).await.expect("send");
        sent.push((id, text));
        let at = started.elapsed();
        let kill = match kills.len() {
            0 if at > length / 3 => Some("right after a rotation"),
            1 if at > length * 2 / 3 => Some("as the token expires"),
            _ => None,
        };
        if let Some(when) = kill {
            rotations.borrow_and_update();
            tokio::time::timeout(TURN, rotations.changed())
                .await
                .expect("a rotation")
                .unwrap();
            if kills.len() == 1 {
                // The access token lives 3 s: the next refresh comes about now.
                tokio::time::sleep(Duration::from_millis(2_980)).await;
            }
            stack.surface.kill9().await;
            kills.push(when);
            // Sent while the surface is down.
            let text = format!("ping {} (while down)", sent.len());
            sent.push((user.send_text(&room, &text).await.expect("send"), text));
            stack.surface.start().unwrap();
            stack.wait_surface_healthy().await;
        }
        tokio::time::sleep(Duration::from_secs(4)).await;
    }

    // Every message is answered once, in its thread.
    let replies = user
        .wait_for(TURN, "every message answered", || async {
            let mut per_root: BTreeMap<String, usize> = BTreeMap::new();
            for m in user.messages_from(&room, &bot).await.ok()? {
                if let Some(root) = m.thread_root {
                    *per_root.entry(root).or_default() += 1;
                }
            }
            sent.iter()
                .all(|(id, _)| per_root.contains_key(id))
                .then_some(per_root)
        })
        .await
        .unwrap_or_default();
    watcher.abort();
    let lost = sent
        .iter()
        .filter(|(id, _)| !replies.contains_key(id))
        .count();
    let duplicates: usize = sent
        .iter()
        .map(|(id, _)| replies.get(id).copied().unwrap_or(0).saturating_sub(1))
        .sum();
    let log = stack.surface.log();
    let unknown_token = log.matches("M_UNKNOWN_TOKEN").count();
    let rotated = rotations.borrow().len().saturating_sub(1);
    println!(
        "tokens: traffic_s={} messages={} rotations={rotated} kills={kills:?} lost={lost} \
         duplicate_replies={duplicates} unknown_token_errors_surfaced={unknown_token}",
        length.as_secs(),
        sent.len()
    );
    if lost + duplicates + unknown_token > 0 {
        stack.dump();
    }
    assert_eq!(lost, 0, "lost");
    assert_eq!(duplicates, 0, "duplicate replies");
    assert_eq!(
        unknown_token, 0,
        "unknown-token errors in the surface's log"
    );
    assert_eq!(kills.len(), 2, "both kills happened");
    let expected = (length.as_secs() / 10).max(1) as usize;
    assert!(
        rotated >= expected,
        "{rotated} rotations in {length:?} (tokens live 3 s)"
    );
    // The token file is private, and no token reached the log.
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&session).unwrap()).unwrap();
    let token = v["access_token"]
        .as_str()
        .or_else(|| v["tokens"]["access_token"].as_str())
        .unwrap()
        .to_owned();
    assert!(!log.contains(&token), "the access token is in the log");
    let refresh = v["refresh_token"]
        .as_str()
        .or_else(|| v["tokens"]["refresh_token"].as_str())
        .expect("a refresh token is kept");
    assert!(!log.contains(refresh), "the refresh token is in the log");
}

/// Logs the bot in with its password into `device`: the access token, and the refresh token
/// when `refresh` (the homeserver's 3 s lifetime applies to refreshable tokens only).
async fn log_into(
    hs: &e2e::Homeserver,
    bot: &e2e::User,
    device: &str,
    refresh: bool,
) -> (String, Option<String>) {
    let body = serde_json::json!({
        "type": "m.login.password",
        "identifier": {"type": "m.id.user", "user": bot.user_id},
        "password": bot.password,
        "device_id": device,
        "refresh_token": refresh,
    });
    let v: serde_json::Value = reqwest::Client::new()
        .post(format!("{}/_matrix/client/v3/login", hs.url))
        .json(&body)
        .send()
        .await
        .expect("login")
        .json()
        .await
        .expect("login body");
    assert_eq!(v["device_id"], device, "logged into the bot's device: {v}");
    (
        v["access_token"].as_str().expect("access token").to_owned(),
        v["refresh_token"].as_str().map(str::to_owned),
    )
}

/// The surface's `/healthz`: (HTTP status, `status` field).
async fn health(stack: &Stack) -> (u16, String) {
    match reqwest::get(format!("{}/healthz", stack.surface_health)).await {
        Ok(r) => {
            let code = r.status().as_u16();
            let v: serde_json::Value = r.json().await.unwrap_or_default();
            (code, v["status"].as_str().unwrap_or_default().to_owned())
        }
        Err(_) => (0, "down".into()),
    }
}

/// Waits until `/healthz` says `status`.
async fn wait_health(stack: &Stack, status: &str) -> u16 {
    let deadline = Instant::now() + TURN;
    loop {
        let (code, now) = health(stack).await;
        if now == status {
            return code;
        }
        assert!(
            Instant::now() < deadline,
            "/healthz never said {status} (last: {code} {now})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Sends `text` and waits for the bot's answer in its thread.
async fn answered(user: &E2eeUser, room: &str, bot: &str, id: &str) -> bool {
    user.wait_for(TURN, "an answer", || async {
        user.messages_from(room, bot)
            .await
            .ok()?
            .iter()
            .any(|m| m.thread_root.as_deref() == Some(id))
            .then_some(())
    })
    .await
    .is_ok()
}

/// A metric of the surface's `/metrics` (no labels).
async fn metric(stack: &Stack, name: &str) -> f64 {
    let text = reqwest::get(format!("{}/metrics", stack.surface_health))
        .await
        .expect("metrics")
        .text()
        .await
        .unwrap_or_default();
    e2e::metric(&text, name, &[])
}

#[tokio::test(flavor = "multi_thread")]
async fn given_tokens_soft_and_hard_logouts() {
    let synapse = DedicatedSynapse::start_with(None, Some("refreshable_access_token_lifetime: 3s"))
        .await
        .expect("synapse");
    let hs = synapse.homeserver().clone();
    // The bot starts on its registration's token (no expiry) and device.
    let mut stack = Stack::start(&hs, StackOptions::default())
        .await
        .expect("stack");
    let bot = stack.bot.clone();
    let device = bot.device_id.clone();
    let user = E2eeUser::register(&hs, "relogin").await.expect("user");
    let room = user.create_encrypted_dm(&bot.user_id).await.expect("DM");
    user.wait_joined(&room, &bot.user_id, TURN)
        .await
        .expect("join");
    let ask = async |text: &str| {
        let id = user.send_text(&room, text).await.expect("send");
        answered(&user, &room, &bot.user_id, &id).await
    };
    assert!(ask("hello").await, "first answer");
    let session = stack.surface_state_dir().join("session.json");
    let mut secrets = vec![bot.password.clone()];

    // 1. An operator-given access token with its refresh token: rotated, SIGKILLed right after
    //    a rotation, and started again with the same (now spent) configuration.
    stack.surface.stop().await;
    let (access, refresh) = log_into(&hs, &bot, &device, true).await;
    let refresh = refresh.expect("a refresh token");
    secrets.extend([access.clone(), refresh.clone()]);
    stack.surface.set_env("MATRIX_ACCESS_TOKEN", Some(&access));
    stack
        .surface
        .set_env("MATRIX_REFRESH_TOKEN", Some(&refresh));
    let (mut rotations, watcher) = watch_rotations(session.clone());
    stack.surface.start().unwrap();
    stack.wait_surface_healthy().await;
    for _ in 0..2 {
        rotations.borrow_and_update();
        tokio::time::timeout(TURN, rotations.changed())
            .await
            .expect("a rotation")
            .unwrap();
    }
    stack.surface.kill9().await;
    watcher.abort();
    stack.surface.start().unwrap();
    stack.wait_surface_healthy().await;
    let given_pair_survives = ask("after the given pair rotated").await;

    // 2. Soft logout with a password: the access token expires (3 s) and has no refresh
    //    token; the surface logs in again into the same device and answers.
    stack.surface.stop().await;
    let (access, _) = log_into(&hs, &bot, &device, true).await;
    secrets.push(access.clone());
    stack.surface.set_env("MATRIX_ACCESS_TOKEN", Some(&access));
    stack.surface.set_env("MATRIX_REFRESH_TOKEN", None);
    stack
        .surface
        .set_env("MATRIX_PASSWORD", Some(&bot.password));
    stack.surface.start().unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    stack.wait_surface_healthy().await;
    let after_soft_logout = ask("after a soft logout").await;
    // Logged out while running (a new session in the same process), or already at the start
    // when the start took longer than the token lives.
    let relogin_path = if stack.surface.log().contains("stopping this session") {
        "running"
    } else {
        "start"
    };
    let relogins = metric(&stack, "mxbridge_surface_logins_again_total").await;
    let saved: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&session).unwrap()).unwrap();
    assert_eq!(saved["device_id"], device.as_str(), "the same device");

    // 3. Soft logout without a password: a clear stop; a new token resumes, nothing lost.
    stack.surface.stop().await;
    let (access, _) = log_into(&hs, &bot, &device, true).await;
    secrets.push(access.clone());
    stack.surface.set_env("MATRIX_ACCESS_TOKEN", Some(&access));
    stack.surface.set_env("MATRIX_PASSWORD", None);
    stack.surface.start().unwrap();
    let soft_code = wait_health(&stack, "soft_logout").await;
    let logged_out_gauge = metric(&stack, "mxbridge_surface_logged_out").await;
    let waiting = user
        .send_text(&room, "sent while the bot is logged out")
        .await
        .expect("send");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stayed_up = stack.surface.is_running();
    let (_, doctor) = crate::doctor::doctor(&stack, &[]).await;
    let (access, _) = log_into(&hs, &bot, &device, false).await;
    secrets.push(access.clone());
    stack.surface.set_env("MATRIX_ACCESS_TOKEN", Some(&access));
    let clean_exit = stack.surface.stop().await;
    stack.surface.start().unwrap();
    stack.wait_surface_healthy().await;
    let resumed = answered(&user, &room, &bot.user_id, &waiting).await;

    // 4. Locked by an admin, then unlocked: the surface says why, then carries on by itself
    //    and answers what was sent meanwhile.
    let admin = hs
        .register(&e2e::unique("admin"), true)
        .await
        .expect("admin");
    let lock = async |locked: bool| {
        let r = reqwest::Client::new()
            .put(format!(
                "{}/_synapse/admin/v2/users/{}",
                hs.url, bot.user_id
            ))
            .bearer_auth(&admin.token)
            .json(&serde_json::json!({"locked": locked}))
            .send()
            .await
            .expect("lock");
        assert!(r.status().is_success(), "lock {locked}: {}", r.status());
    };
    lock(true).await;
    let while_locked = user
        .send_text(&room, "sent while the account is locked")
        .await
        .expect("send");
    let locked_code = wait_health(&stack, "account_locked").await;
    lock(false).await;
    let unlocked_code = wait_health(&stack, "ok").await;
    let after_unlock = answered(&user, &room, &bot.user_id, &while_locked).await;

    // 5. Hard logout: an admin deletes the bot's device.
    let deleted = reqwest::Client::new()
        .delete(format!(
            "{}/_synapse/admin/v2/users/{}/devices/{}",
            hs.url, bot.user_id, device
        ))
        .bearer_auth(&admin.token)
        .send()
        .await
        .expect("delete device");
    assert!(deleted.status().is_success(), "{}", deleted.status());
    let hard_code = wait_health(&stack, "logged_out").await;
    let before = stack.surface.log().matches("sync failed").count();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let failed_syncs = stack.surface.log().matches("sync failed").count() - before;
    let hard_stayed_up = stack.surface.is_running();
    let hard_exit = stack.surface.stop().await;

    let log = stack.surface.log();
    let stop_lines = log
        .matches("the bot is logged out and does not sync")
        .count();
    let leaked = secrets.iter().filter(|s| log.contains(s.as_str())).count();
    println!(
        "logouts: given_pair_survives={given_pair_survives} after_soft_logout={after_soft_logout} \
         relogins={relogins} relogin_path={relogin_path} soft_stop_healthz={soft_code} resumed={resumed} \
         locked_healthz={locked_code} unlocked_healthz={unlocked_code} \
         after_unlock={after_unlock} hard_stop_healthz={hard_code} syncs_after_hard_logout={failed_syncs} \
         stop_log_lines={stop_lines} secrets_in_log={leaked}"
    );
    if !(given_pair_survives && after_soft_logout && resumed) {
        stack.dump();
    }
    assert!(
        given_pair_survives,
        "answered after the given pair rotated and a SIGKILL"
    );
    assert!(after_soft_logout, "answered after logging in again");
    assert!(relogins >= 1.0, "logged in again ({relogins})");
    assert_eq!(soft_code, 503);
    assert_eq!(
        logged_out_gauge, 1.0,
        "mxbridge_surface_logged_out while logged out"
    );
    assert!(stayed_up, "the surface stays up while logged out");
    assert!(
        doctor.contains("soft_logout") && doctor.contains("MATRIX_PASSWORD"),
        "the doctor explains: {doctor}"
    );
    assert_eq!(clean_exit, Some(0), "a logged-out surface stops cleanly");
    assert!(resumed, "the message sent while logged out is answered");
    assert_eq!(
        (locked_code, unlocked_code),
        (503, 200),
        "locked, then unlocked"
    );
    assert!(
        after_unlock,
        "the message sent while locked is answered after the unlock"
    );
    assert_eq!(hard_code, 503);
    assert!(hard_stayed_up, "no crash loop after a hard logout");
    assert!(
        failed_syncs <= 1,
        "{failed_syncs} syncs tried after the hard logout"
    );
    assert_eq!(hard_exit, Some(0));
    assert!(stop_lines >= 2, "each stop is said in the log");
    assert_eq!(leaked, 0, "a token or the password is in the surface's log");
}
