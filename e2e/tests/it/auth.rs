//! A bot that stays logged in: against a Synapse of its own whose access tokens live 3 s, the
//! surface (a password login, so it holds a refresh token) renews its token every few seconds
//! through five minutes of traffic in an encrypted DM, is SIGKILLed right after a rotation and
//! again as a token expires (during or just before the refresh), and answers every message
//! once. Rotations are counted from the session file, which must hold the new pair the moment
//! it exists.

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
