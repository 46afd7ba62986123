//! Paths that lead outside what a chat may reach, named by a room member through the agent's
//! tools (`read`, `send`) and straight to the surface (`sendraw`, which skips the agent's own
//! check), and a file swapped between a symlink, a hard link and a plain file while the real
//! agent reads it over and over.

use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use e2e::agent_ws::AgentWs;
use e2e::canary::Canary;
use e2e::{Received, Stack};
use protocol::ChatId;

use super::{MAX_FILE, Room, Tally};
use crate::TURN;

/// What a refusal says (agent: "I could not read/send …", surface: "I could not send …").
const REFUSAL: &[&str] = &["could not", "not found", "refused", "invalid"];

/// Plants links, special files and other chats' files around the attacker's chat, and
/// returns the paths to name: each leads outside, to something that is not a plain file, or to
/// what another chat owns.
fn plant(ws: &Path, outside: &Path, attacker: &Room, other: &Room, canary: &Canary) -> Vec<String> {
    let own = protocol::chat_dir(&ChatId::for_conversation(&attacker.id, None)).to_string();
    let own_dir = ws.join(&own);
    std::fs::create_dir_all(&own_dir).unwrap();
    let at = |name: &str| own_dir.join(name);
    symlink(&canary.path, at("abs-link")).unwrap();
    symlink("../../../canary.txt", at("rel-link")).unwrap();
    symlink("chain-b", at("chain-a")).unwrap();
    symlink(&canary.path, at("chain-b")).unwrap();
    symlink(outside, at("up")).unwrap();
    std::fs::hard_link(&canary.path, at("hard")).unwrap();
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        at("fifo"),
        rustix::fs::Mode::from_raw_mode(0o644),
    )
    .unwrap();
    let _socket = std::os::unix::net::UnixListener::bind(at("sock")).unwrap();
    std::mem::forget(_socket);
    rustix::fs::mknodat(
        rustix::fs::CWD,
        at("dev"),
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::from_raw_mode(0o644),
        rustix::fs::makedev(1, 3),
    )
    .expect("mknod (the test runs as root)");
    std::fs::create_dir_all(at("folder")).unwrap();
    let big = std::fs::File::create(at("big.bin")).unwrap();
    big.set_len(MAX_FILE + 1).unwrap();
    // Another chat's file and another room's inbox file, and a link to each.
    let other_chat = protocol::chat_dir(&ChatId::for_conversation(&other.id, None)).to_string();
    std::fs::create_dir_all(ws.join(&other_chat)).unwrap();
    std::fs::write(ws.join(&other_chat).join("secret.txt"), &canary.content).unwrap();
    let other_inbox = format!("{}/inbox", other.room_dir());
    std::fs::create_dir_all(ws.join(&other_inbox)).unwrap();
    std::fs::write(ws.join(&other_inbox).join("secret.txt"), &canary.content).unwrap();
    symlink(
        ws.join(&other_chat).join("secret.txt"),
        at("other-chat-link"),
    )
    .unwrap();
    symlink(
        format!("../{}/secret.txt", other_chat.trim_start_matches("chats/")),
        at("sibling"),
    )
    .unwrap();
    // The attacker's own room: a download in progress.
    let own_inbox = format!("{}/inbox", attacker.room_dir());
    std::fs::create_dir_all(ws.join(&own_inbox)).unwrap();
    std::fs::write(ws.join(&own_inbox).join(".partial-hostile"), "partial").unwrap();

    let mut paths: Vec<String> = [
        "abs-link",
        "rel-link",
        "chain-a",
        "hard",
        "fifo",
        "sock",
        "dev",
        "folder",
        "big.bin",
        "other-chat-link",
        "sibling",
        "up/canary.txt",
    ]
    .iter()
    .map(|n| format!("{own}/{n}"))
    .collect();
    let canary_abs = canary.path.display().to_string();
    paths.extend([
        canary_abs.clone(),
        format!("/{}", canary_abs.trim_start_matches('/')),
        "/etc/passwd".into(),
        "../canary.txt".into(),
        "..".into(),
        format!("{own}/.."),
        format!("{own}/../../../canary.txt"),
        "chats/../../canary.txt".into(),
        format!("{own}/./abs-link"),
        format!("{own}//abs-link"),
        "%2e%2e/canary.txt".into(),
        format!("{own}/%2e%2e%2f%2e%2e%2f%2e%2e%2fcanary.txt"),
        format!("{own}/..%252f..%252f..%252fcanary.txt"),
        "..%2fcanary.txt".into(),
        "file:///etc/passwd".into(),
        "..\\..\\canary.txt".into(),
        format!("{own}/\u{2215}..\u{2215}..\u{2215}canary.txt"),
        format!("{own}/\u{202e}txt.yranac"),
        format!("{own}/{}", "a".repeat(3000)),
        format!("{other_chat}/secret.txt"),
        format!("{other_inbox}/secret.txt"),
        format!("{own_inbox}/.partial-hostile"),
    ]);
    paths
}

/// Every path through `read`, `send` and `sendraw`, from the attacker's encrypted room. Each
/// must be answered with a refusal, nothing may be uploaded, and the canary's content may
/// appear nowhere.
pub async fn through_the_room(
    stack: &Stack,
    attacker: &Room,
    other: &Room,
    canary: &Canary,
    tally: &mut Tally,
) {
    let outside = stack.workspace.parent().unwrap();
    let paths = plant(&stack.workspace, outside, attacker, other, canary);
    let bot = &stack.bot.user_id;
    let mut pending = Vec::new();
    for path in &paths {
        for command in ["read", "send", "sendraw"] {
            let text = format!("{command} {path}");
            let id = attacker
                .user
                .send_text(&attacker.id, &text)
                .await
                .expect("send");
            pending.push((id, text));
        }
    }
    let deadline = Instant::now() + TURN * 2;
    while !pending.is_empty() && Instant::now() < deadline {
        let all = attacker
            .user
            .messages_from(&attacker.id, bot)
            .await
            .expect("messages");
        pending.retain(|(id, text)| match verdict(&all, id, canary) {
            Some(refused) => {
                tally.record(text, refused);
                false
            }
            None => true,
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (_, text) in pending {
        tally.record(format!("{text} (no answer)"), false);
    }
    let own_inbox = stack
        .workspace
        .join(format!("{}/inbox", attacker.room_dir()));
    std::fs::remove_file(own_inbox.join(".partial-hostile")).unwrap();
}

/// `Some(true)` once the bot refused in the thread of `id`; `Some(false)` if it sent a file
/// or showed the canary; `None` while it has not answered yet.
fn verdict(all: &[Received], id: &str, canary: &Canary) -> Option<bool> {
    let answers = Room::answers(all, id);
    if answers
        .iter()
        .any(|m| m.source.is_some() || canary.is_in(&m.body))
    {
        return Some(false);
    }
    let refused = answers.iter().any(|m| {
        let body = m.body.to_lowercase();
        REFUSAL.iter().any(|r| body.contains(r))
    });
    refused.then_some(true)
}

/// A chat's file flips between a plain file, a symlink to the canary and a hard link to it
/// while a client reads it through the real agent, turn after turn; also a NUL in a path,
/// which no Matrix message can carry. Returns how many raced reads ran.
pub async fn raced_under_the_agent(stack: &Stack, canary: &Canary, tally: &mut Tally) -> u64 {
    const READS: u64 = 600;
    let room = "!hostile-race:localhost";
    let chat = ChatId::for_conversation(room, None);
    let dir = stack.workspace.join(protocol::chat_dir(&chat).as_str());
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("race.txt");
    std::fs::write(&file, "inside").unwrap();
    let base = stack.agent_http.replace("http://", "ws://");
    let mut ws = AgentWs::connect(&base, room, &stack.agent_token)
        .await
        .expect("connect to the agent");

    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (stop, file, canary) = (stop.clone(), file.clone(), canary.path.clone());
        std::thread::spawn(move || {
            let tmp = file.with_file_name(".swap");
            let mut swaps = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let _ = std::fs::remove_file(&tmp);
                match swaps % 3 {
                    0 => std::fs::write(&tmp, "inside").unwrap(),
                    1 => symlink(&canary, &tmp).unwrap(),
                    _ => std::fs::hard_link(&canary, &tmp).unwrap(),
                }
                std::fs::rename(&tmp, &file).unwrap();
                swaps += 1;
                if swaps.is_multiple_of(512) {
                    std::thread::sleep(Duration::from_millis(80));
                }
            }
        })
    };
    let (mut inside, mut canary_seen) = (0u64, 0u64);
    let read = format!("read {}/race.txt", protocol::chat_dir(&chat));
    for seq in 1..=READS {
        let out = ws
            .turn(seq, &format!("$race{seq}"), &read)
            .await
            .expect("a turn");
        if canary.is_in(&out.text) {
            canary_seen += 1;
        } else if out.text.contains("inside") {
            inside += 1;
        }
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    tally.record(
        format!("raced reads: {canary_seen} of {READS} showed the canary"),
        canary_seen == 0,
    );
    assert!(inside > 0, "no raced read ever found the plain file");

    let out = ws
        .turn(
            READS + 1,
            "$nul",
            &format!("read {}/race\u{0}.txt", protocol::chat_dir(&chat)),
        )
        .await
        .expect("a turn");
    tally.record(
        "read with a NUL in the path",
        out.text.contains("could not"),
    );
    READS
}
