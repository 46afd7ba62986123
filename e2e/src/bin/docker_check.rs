//! The person's side of the Docker Compose check (`scripts/docker-e2e.sh`), as an Element user
//! is: a matrix-sdk client (the test suite's `E2eeUser`) in an **encrypted** DM with the bot.
//! Its device (crypto store and session) lives in the `--state` folder, so the shell script can
//! interleave Matrix actions with `docker compose exec/stop/start`.
//!
//! ```text
//! docker_check --state DIR setup                  log in, check the bot exists, open an encrypted
//!                                                 DM with it, wait until it joined
//! docker_check --state DIR send-file PATH         send PATH as m.file (encrypted), wait for the
//!                                                 reply quoting its sha256; prints JSON with the
//!                                                 workspace path
//! docker_check --state DIR send TEXT              send a message; prints its event id
//! docker_check --state DIR wait-text EVENT SUBSTR wait for a bot message after EVENT containing
//!                                                 SUBSTR; prints its body
//! docker_check --state DIR wait-file EVENT NAME OUT
//!                                                 wait for a bot file named NAME after EVENT,
//!                                                 download and decrypt it to OUT
//! ```
//! Environment: `E2E_HOMESERVER` (`http://127.0.0.1:PORT`), `E2E_USER`, `E2E_PASSWORD`,
//! `E2E_BOT`, `E2E_TIMEOUT` (seconds per wait, default 120). Every message is checked to be
//! `m.room.encrypted` as the homeserver stores it.

#![allow(clippy::print_stdout)] // printing results for the shell script is this tool's job

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use e2e::e2ee::{E2eeUser, Received};
use e2e::{Homeserver, sha256_hex};
use serde_json::{Value, json};

struct Env {
    hs: Homeserver,
    user: String,
    password: String,
    bot: String,
    timeout: Duration,
}

impl Env {
    fn read() -> Result<Self> {
        let get = |k: &str| std::env::var(k).with_context(|| format!("{k} is not set"));
        let url = get("E2E_HOMESERVER")?;
        let timeout = std::env::var("E2E_TIMEOUT")
            .ok()
            .and_then(|t| t.parse().ok())
            .unwrap_or(120);
        Ok(Self {
            // Registration is the compose setup's job: no shared secret here.
            hs: Homeserver::new(
                url.trim_end_matches('/').to_owned(),
                String::new(),
                String::new(),
            ),
            user: get("E2E_USER")?,
            password: get("E2E_PASSWORD")?,
            bot: get("E2E_BOT")?,
            timeout: Duration::from_secs(timeout),
        })
    }
}

fn log(msg: &str) {
    eprintln!("[docker_check] {msg}");
}

/// The DM's room id, kept next to the device.
fn room_file(state: &Path) -> PathBuf {
    state.join("room.json")
}

async fn user(env: &Env, state: &Path) -> Result<E2eeUser> {
    E2eeUser::persistent(&env.hs, &env.user, &env.password, state).await
}

fn room_of(state: &Path) -> Result<String> {
    let v: Value = serde_json::from_slice(&std::fs::read(room_file(state))?)?;
    Ok(v["room_id"].as_str().context("room_id")?.to_owned())
}

async fn setup(env: &Env, state: &Path) -> Result<()> {
    let me = user(env, state).await?;
    log(&format!(
        "logged in as {} (device {})",
        me.user_id, me.device_id
    ));
    let bot_id = matrix_sdk::ruma::UserId::parse(&env.bot)?;
    me.client()
        .account()
        .fetch_user_profile_of(&bot_id)
        .await
        .with_context(|| {
            format!(
                "bot account {} does not exist: did the register step run?",
                env.bot
            )
        })?;
    let room = me.create_encrypted_dm(&env.bot).await?;
    log(&format!(
        "created encrypted DM {room}, waiting for {} to join",
        env.bot
    ));
    me.wait_joined(&room, &env.bot, env.timeout).await?;
    log(&format!("{} joined", env.bot));
    std::fs::write(
        room_file(state),
        serde_json::to_vec(&json!({"room_id": room}))?,
    )?;
    Ok(())
}

/// Sends `text`, checks it is encrypted on the wire, prints its event id.
async fn send(env: &Env, state: &Path, text: &str) -> Result<()> {
    let me = user(env, state).await?;
    let room = room_of(state)?;
    let id = me.send_text(&room, text).await?;
    expect_encrypted(&me, &room, &id).await?;
    log(&format!(
        "sent {text:?} as {id} (m.room.encrypted on the wire)"
    ));
    println!("{id}");
    Ok(())
}

async fn expect_encrypted(me: &E2eeUser, room: &str, event_id: &str) -> Result<()> {
    let wire = me.wire_type(room, event_id).await?;
    if wire != "m.room.encrypted" {
        bail!("{event_id} is stored as {wire}, not m.room.encrypted: the DM is not encrypted");
    }
    Ok(())
}

/// Waits for a bot message after `event_id` that `pred` accepts (decrypted, from history, so
/// also one that arrived before this process started).
async fn wait_for(
    env: &Env,
    me: &E2eeUser,
    room: &str,
    event_id: &str,
    what: &str,
    pred: impl Fn(&Received) -> bool,
) -> Result<Received> {
    let start = Instant::now();
    let mut shown = 0;
    loop {
        let history = me.history(room).await?;
        let after: Vec<Received> = match history.iter().position(|m| m.event_id == event_id) {
            Some(i) => history[i + 1..]
                .iter()
                .filter(|m| m.sender == env.bot)
                .cloned()
                .collect(),
            None => Vec::new(),
        };
        for m in &after[shown.min(after.len())..] {
            log(&format!(
                "bot: {} {:?}",
                m.msgtype,
                m.body.chars().take(300).collect::<String>()
            ));
        }
        shown = after.len();
        if let Some(m) = after.into_iter().find(|m| pred(m)) {
            expect_encrypted(me, room, &m.event_id).await?;
            log(&format!(
                "matched after {:.1}s (m.room.encrypted on the wire)",
                start.elapsed().as_secs_f64()
            ));
            return Ok(m);
        }
        if start.elapsed() > env.timeout {
            bail!("timed out after {:?} waiting for {what}", env.timeout);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn send_file(env: &Env, state: &Path, file: &Path) -> Result<()> {
    let me = user(env, state).await?;
    let room = room_of(state)?;
    let bytes = std::fs::read(file)?;
    let digest = sha256_hex(&bytes);
    let name = file
        .file_name()
        .and_then(|n| n.to_str())
        .context("file name")?
        .to_owned();
    let size = bytes.len();
    let id = me
        .send_file(&room, &name, "text/plain", bytes, None)
        .await?;
    expect_encrypted(&me, &room, &id).await?;
    log(&format!(
        "sent {name} ({size} bytes, sha256 {digest}) as {id}, encrypted"
    ));
    let reply = wait_for(
        env,
        &me,
        &room,
        &id,
        &format!("a reply quoting sha256 {digest}"),
        |m| m.body.contains(&digest),
    )
    .await?;
    // Replies name files for people; the workspace path is in the `files paths` listing.
    let _ = reply;
    let files = me.send_text(&room, "files paths").await?;
    let listing = wait_for(env, &me, &room, &files, "the files listing", |m| {
        m.body.contains("surfaces/matrix/") && m.body.contains(&name)
    })
    .await?;
    let path = listing
        .body
        .lines()
        .filter(|l| l.contains(&format!("-{name}")))
        .find_map(workspace_path)
        .context("the listing names no workspace path for the file")?;
    println!(
        "{}",
        json!({"event_id": id, "sha256": digest, "path": path})
    );
    Ok(())
}

/// The first `surfaces/matrix/...` path in `text`.
fn workspace_path(text: &str) -> Option<String> {
    let start = text.find("surfaces/matrix/")?;
    let path: String = text[start..]
        .chars()
        .take_while(|c| !c.is_whitespace() && !"`'\"<>()[]".contains(*c))
        .collect();
    Some(path.trim_end_matches(['.', ',', ';', ':']).to_owned())
}

async fn wait_text(env: &Env, state: &Path, event_id: &str, substr: &str) -> Result<()> {
    let me = user(env, state).await?;
    let room = room_of(state)?;
    let m = wait_for(
        env,
        &me,
        &room,
        event_id,
        &format!("a reply containing {substr:?}"),
        |m| m.body.contains(substr),
    )
    .await?;
    println!("{}", m.body);
    Ok(())
}

async fn wait_file(env: &Env, state: &Path, event_id: &str, name: &str, out: &Path) -> Result<()> {
    let me = user(env, state).await?;
    let room = room_of(state)?;
    let m = wait_for(
        env,
        &me,
        &room,
        event_id,
        &format!("a file named {name:?}"),
        |m| m.source.is_some() && m.file_name().contains(name),
    )
    .await?;
    let source = m.source.as_ref().context("media source")?;
    let bytes = me.download(source).await?;
    std::fs::write(out, &bytes)?;
    let encrypted = matches!(
        source,
        matrix_sdk::ruma::events::room::MediaSource::Encrypted(_)
    );
    println!(
        "{}",
        json!({"event_id": m.event_id, "size": bytes.len(), "sha256": sha256_hex(&bytes),
               "encrypted_media": encrypted})
    );
    Ok(())
}

const USAGE: &str = "usage: docker_check --state DIR (setup | send-file PATH | send TEXT | \
                     wait-text EVENT SUBSTR | wait-file EVENT NAME OUT)";

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [flag, state, cmd, rest @ ..] = args.as_slice() else {
        bail!(USAGE);
    };
    if flag != "--state" {
        bail!(USAGE);
    }
    let env = Env::read()?;
    let state = Path::new(state);
    match (cmd.as_str(), rest) {
        ("setup", []) => setup(&env, state).await,
        ("send", [text]) => send(&env, state, text).await,
        ("send-file", [path]) => send_file(&env, state, Path::new(path)).await,
        ("wait-text", [event, substr]) => wait_text(&env, state, event, substr).await,
        ("wait-file", [event, name, out]) => {
            wait_file(&env, state, event, name, Path::new(out)).await
        }
        _ => bail!(USAGE),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workspace_path_is_read_from_a_reply() {
        let table = [
            (
                "File: `surfaces/matrix/a/b/inbox/x.txt` (12 bytes)",
                Some("surfaces/matrix/a/b/inbox/x.txt"),
            ),
            (
                "saved surfaces/matrix/u/r/inbox/r.txt.",
                Some("surfaces/matrix/u/r/inbox/r.txt"),
            ),
            ("nothing here", None),
        ];
        for (text, want) in table {
            assert_eq!(workspace_path(text).as_deref(), want, "{text}");
        }
    }
}
