//! Nobody waits in silence: when a message cannot reach the agent (stopped, or refusing the
//! surface's `AGENT_TOKEN`), the encrypted DM is told once per outage after the grace
//! (`SURFACE_AGENT_DOWN_NOTICE`), a second message in the same outage adds no second notice,
//! and every message is answered when the agent is back. Meanwhile `/healthz` is 503 with the
//! reason, `/livez` stays 200, `agent_up` is 0 and the backlog counts the waiting messages.

use std::collections::BTreeMap;
use std::time::Duration;

use e2e::{E2eeUser, Homeserver, Stack, StackOptions, metric};
use serde_json::Value;

use crate::TURN;

/// The text of the surface's notice (`lanes::turn::UNREACHABLE_NOTICE`).
const NOTICE: &str = "I can't reach my agent right now; your message is saved";

async fn healthz(stack: &Stack, path: &str) -> (u16, String) {
    let r = reqwest::get(format!("{}{path}", stack.surface_health))
        .await
        .expect("the health endpoint answers");
    (r.status().as_u16(), r.text().await.unwrap_or_default())
}

/// A gauge of the surface (a scrape that fails is tried again, a few times).
async fn gauge(stack: &Stack, name: &str) -> f64 {
    let mut tries = 0;
    loop {
        match stack.surface_metrics().await {
            Ok(text) => return metric(&text, name, &[]),
            Err(e) if tries < 5 => {
                eprintln!("scraping the surface failed, trying again: {e:#}");
                tries += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("the surface's /metrics: {e:#}"),
        }
    }
}

/// Waits until the surface's metrics and `/healthz` say whether an agent link is usable.
async fn wait_agent_up(stack: &Stack, up: bool) {
    let what = format!("agent_up {} and /healthz agreeing", u8::from(up));
    e2e::eventually(TURN, &what, || async {
        let gauge = gauge(stack, "mxbridge_surface_agent_up").await;
        let (code, _) = healthz(stack, "/healthz").await;
        (gauge == f64::from(u8::from(up)) && (code == 200) == up).then_some(())
    })
    .await;
}

/// The bot's unreachable notices in `room`, and the threads they are in.
async fn notices(user: &E2eeUser, room: &str, bot: &str) -> Vec<Option<String>> {
    user.messages_from(room, bot)
        .await
        .unwrap()
        .into_iter()
        .filter(|m| m.msgtype == "m.notice" && m.body.contains(NOTICE))
        .map(|m| m.thread_root)
        .collect()
}

/// Waits for the bot's text answer in the thread of `id`.
async fn answered(user: &E2eeUser, room: &str, bot: &str, id: &str, stack: &Stack) {
    user.wait_for(TURN, &format!("the answer to {id}"), || async {
        user.messages_from(room, bot)
            .await
            .ok()?
            .into_iter()
            .find(|m| m.thread_root.as_deref() == Some(id) && m.msgtype == "m.text")
    })
    .await
    .unwrap_or_else(|e| {
        stack.dump();
        panic!("{e}")
    });
}

/// A stack whose surface tells the room after 2 s that the agent cannot be reached.
async fn stack_with_quick_notice(hs: &Homeserver) -> Stack {
    Stack::start(
        hs,
        StackOptions {
            surface_env: BTreeMap::from([("SURFACE_AGENT_DOWN_NOTICE".into(), "2s".into())]),
            ..StackOptions::default()
        },
    )
    .await
    .expect("stack starts")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_room_is_told_once_when_its_agent_cannot_be_reached_and_answered_when_it_is_back() {
    let hs = Homeserver::from_env();
    let mut stack = stack_with_quick_notice(&hs).await;
    let bot = stack.bot.user_id.clone();
    let user = E2eeUser::register(&hs, "outage").await.expect("register");
    let room = user.create_encrypted_dm(&bot).await.expect("encrypted DM");
    user.wait_joined(&room, &bot, TURN)
        .await
        .expect("the bot joins");
    let first = user.send_text(&room, "hello").await.unwrap();
    answered(&user, &room, &bot, &first, &stack).await;
    wait_agent_up(&stack, true).await;

    // The agent stops. The surface notices with no message in flight.
    stack.agent.stop().await;
    wait_agent_up(&stack, false).await;
    let (code, body) = healthz(&stack, "/healthz").await;
    assert_eq!(code, 503);
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["status"], "agent_unreachable", "{body}");
    assert_eq!(healthz(&stack, "/livez").await.0, 200, "alive all the same");

    let a = user.send_text(&room, "are you there?").await.unwrap();
    assert_eq!(user.wire_type(&room, &a).await.unwrap(), "m.room.encrypted");
    user.wait_for(TURN, "the unreachable notice", || async {
        (!notices(&user, &room, &bot).await.is_empty()).then_some(())
    })
    .await
    .unwrap_or_else(|e| {
        stack.dump();
        panic!("{e}")
    });
    assert_eq!(
        notices(&user, &room, &bot).await,
        vec![Some(a.clone())],
        "one notice, in the message's thread"
    );
    e2e::eventually(TURN, "the backlog counts the waiting message", || async {
        let waiting = gauge(&stack, "mxbridge_surface_journal_backlog").await;
        let age = gauge(
            &stack,
            "mxbridge_surface_journal_oldest_unhandled_age_seconds",
        )
        .await;
        (waiting >= 1.0 && age > 0.0).then_some(())
    })
    .await;

    // A second message in the same outage: no second notice, well past the grace.
    let b = user.send_text(&room, "still there?").await.unwrap();
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        notices(&user, &room, &bot).await.len(),
        1,
        "no second notice"
    );
    assert_eq!(gauge(&stack, "mxbridge_surface_journal_backlog").await, 2.0);

    // The agent is back: both are answered as usual, and the notice stays the only one.
    stack.agent.start().expect("restart the agent");
    answered(&user, &room, &bot, &a, &stack).await;
    answered(&user, &room, &bot, &b, &stack).await;
    wait_agent_up(&stack, true).await;
    assert_eq!(gauge(&stack, "mxbridge_surface_journal_backlog").await, 0.0);
    assert_eq!(notices(&user, &room, &bot).await.len(), 1);

    // A new outage: the agent comes back refusing the surface's token.
    stack.agent.stop().await;
    stack
        .agent
        .set_env("AGENT_TOKEN", Some("not-the-surface-token"));
    stack
        .agent
        .start()
        .expect("start the agent with another token");
    wait_agent_up(&stack, false).await;
    let c = user.send_text(&room, "and now?").await.unwrap();
    user.wait_for(TURN, "a notice for the new outage", || async {
        (notices(&user, &room, &bot).await.len() == 2).then_some(())
    })
    .await
    .unwrap_or_else(|e| {
        stack.dump();
        panic!("{e}")
    });
    assert!(
        stack
            .surface
            .log()
            .contains("the agent refused AGENT_TOKEN"),
        "the log says why"
    );
    let token = stack.agent_token.clone();
    stack.agent.stop().await;
    stack.agent.set_env("AGENT_TOKEN", Some(&token));
    stack
        .agent
        .start()
        .expect("start the agent with the right token");
    answered(&user, &room, &bot, &c, &stack).await;
    assert_eq!(
        notices(&user, &room, &bot).await,
        vec![Some(a), Some(c)],
        "one notice per outage"
    );
    // A first login's key query that comes back before the device's keys were uploaded is not
    // reported as a deleted device.
    let log = stack.surface.log();
    assert!(!log.contains("might have been deleted"), "{log}");
    let sdk_warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" WARN ") && l.contains("matrix_sdk"))
        .collect();
    assert!(sdk_warnings.is_empty(), "{sdk_warnings:#?}");
}

/// The same for a DM as Element starts it: the first message is sent before the bot joins,
/// while the agent is down. The bot joins, tells the room once, and answers when it is back.
#[tokio::test(flavor = "multi_thread")]
async fn a_first_dm_message_sent_while_the_agent_is_down_is_answered_after_one_notice() {
    let hs = Homeserver::from_env();
    let mut stack = stack_with_quick_notice(&hs).await;
    let bot = stack.bot.user_id.clone();
    stack.agent.stop().await;
    wait_agent_up(&stack, false).await;
    let user = E2eeUser::register(&hs, "firstdown")
        .await
        .expect("register");
    let (room, first) = user
        .start_dm_with_first_message(&bot, "hello before you joined")
        .await
        .expect("DM with its first message");
    user.wait_joined(&room, &bot, TURN)
        .await
        .expect("the bot joins");
    user.wait_for(TURN, "the unreachable notice", || async {
        (!notices(&user, &room, &bot).await.is_empty()).then_some(())
    })
    .await
    .unwrap_or_else(|e| {
        stack.dump();
        panic!("{e}")
    });
    assert_eq!(notices(&user, &room, &bot).await, vec![Some(first.clone())]);
    stack.agent.start().expect("restart the agent");
    answered(&user, &room, &bot, &first, &stack).await;
    assert_eq!(notices(&user, &room, &bot).await.len(), 1);
}
