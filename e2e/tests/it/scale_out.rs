//! Agents scale out: with two agent processes in `AGENT_URL`, each chat is run by one of them
//! (its owner by the chat id's hash), both get chats, and when one is killed in the middle of
//! a turn its chats move to the other: the interrupted turn is sent again there and every
//! message, before and after, is answered exactly once. Encrypted DMs of a matrix-sdk user.

use std::time::Duration;

use e2e::{E2eeUser, Stack, StackOptions, metric};
use protocol::ChatId;

use crate::TURN;

/// A DM and whether agent A (the stack's own) runs its chat.
struct Dm {
    room: String,
    on_a: bool,
}

fn ran(log: &str, chat: &ChatId) -> bool {
    let needle = format!("chat_id={chat}");
    log.lines()
        .any(|l| l.contains("turn starts") && l.contains(&needle))
}

/// Waits until `trigger` has an answer, then checks that it has exactly one.
async fn answered_once(user: &E2eeUser, room: &str, bot: &str, trigger: &str) {
    let answers = || async {
        user.messages_from(room, bot)
            .await
            .unwrap_or_default()
            .into_iter()
            .filter(|m| m.thread_root.as_deref() == Some(trigger) && m.replaces.is_none())
            .count()
    };
    user.wait_for(TURN, "an answer", || async {
        (answers().await > 0).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{trigger} in {room}: {e}"));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(answers().await, 1, "{trigger} in {room}: answered once");
}

#[tokio::test(flavor = "multi_thread")]
async fn two_agents_share_the_chats_and_a_dead_ones_chats_move_without_loss() {
    let hs = e2e::Homeserver::from_env();
    let mut stack = Stack::start(&hs, StackOptions::default())
        .await
        .expect("stack");
    let (b, b_url) = stack.start_another_agent("agent-b").await.expect("agent B");
    let a_url = stack.agent_ws();
    stack.surface.stop().await;
    stack
        .surface
        .set_env("AGENT_URL", Some(&format!("{a_url},{b_url}")));
    stack.surface.start().expect("surface with two agents");
    stack.wait_surface_healthy().await;
    let bot = stack.bot.user_id.clone();
    let user = E2eeUser::register(&hs, "scale").await.expect("user");

    // DMs until both agents run chats (each chat on exactly one of them).
    let mut dms: Vec<Dm> = Vec::new();
    while dms.len() < 4 || dms.iter().all(|d| d.on_a) || dms.iter().all(|d| !d.on_a) {
        assert!(
            dms.len() < 12,
            "12 chats, all on one agent: the hash does not spread"
        );
        let room = user.create_encrypted_dm(&bot).await.expect("DM");
        user.wait_joined(&room, &bot, TURN).await.expect("join");
        let id = user.send_text(&room, "hello").await.expect("send");
        answered_once(&user, &room, &bot, &id).await;
        let chat = ChatId::for_conversation(&room, None);
        let (on_a, on_b) = (ran(&stack.agent.log(), &chat), ran(&b.log(), &chat));
        assert!(
            on_a ^ on_b,
            "{chat}: run by exactly one agent (A {on_a}, B {on_b})"
        );
        dms.push(Dm { room, on_a });
    }
    let on_a = dms.iter().filter(|d| d.on_a).count();
    eprintln!(
        "scale-out: {} chats, {on_a} on agent A, {} on agent B",
        dms.len(),
        dms.len() - on_a
    );

    // Agent A dies in the middle of a turn in each of its chats.
    let mut triggers = Vec::new();
    for d in dms.iter().filter(|d| d.on_a) {
        let id = user.send_text(&d.room, "sleep 4000").await.expect("send");
        triggers.push((d.room.clone(), id));
    }
    let a_chats: Vec<ChatId> = dms
        .iter()
        .filter(|d| d.on_a)
        .map(|d| ChatId::for_conversation(&d.room, None))
        .collect();
    let deadline = std::time::Instant::now() + TURN;
    while !a_chats.iter().all(|c| {
        stack
            .agent
            .log()
            .lines()
            .filter(|l| l.contains("turn starts") && l.contains(&format!("chat_id={c}")))
            .count()
            >= 2
    }) {
        assert!(
            std::time::Instant::now() < deadline,
            "A started the slow turns"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stack.agent.kill9().await;

    // Every chat goes on: A's on B (the interrupted turn too), B's as before.
    for d in &dms {
        let id = user
            .send_text(&d.room, "after the agent died")
            .await
            .expect("send");
        triggers.push((d.room.clone(), id));
    }
    for (room, id) in &triggers {
        answered_once(&user, room, &bot, id).await;
    }
    let b_log = b.log();
    for c in &a_chats {
        assert!(ran(&b_log, c), "{c} moved to agent B");
    }
    let failovers = metric(
        &stack.surface_metrics().await.expect("metrics"),
        "mxbridge_surface_agent_failovers_total",
        &[],
    );
    assert!(
        failovers >= a_chats.len() as f64,
        "failovers counted: {failovers}"
    );
    eprintln!(
        "scale-out: agent A killed mid-turn; {} chats moved to B; {} messages answered once each; failovers={failovers}",
        a_chats.len(),
        triggers.len()
    );
}
