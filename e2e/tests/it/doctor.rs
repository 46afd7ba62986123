//! `surface doctor` against the real Synapse and agent answers "why no reply?": for a healthy
//! encrypted DM (a matrix-sdk user) every check is ok and a message would be answered; for a
//! room the bot is not in, a sender the allowlist does not cover, and an agent that is down,
//! it names the problem on a `FAIL` line and exits 1.

use e2e::{E2eeUser, Stack, StackOptions};

use crate::TURN;

/// Runs `surface doctor` with the stack's surface configuration; (exit code, stdout).
pub(crate) async fn doctor(stack: &Stack, args: &[&str]) -> (i32, String) {
    let out = stack
        .surface
        .command()
        .arg("doctor")
        .args(args)
        .output()
        .await
        .expect("run surface doctor");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.stderr.is_empty() || !String::from_utf8_lossy(&out.stderr).contains("panicked"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), stdout)
}

fn has_line(report: &str, prefix: &str, needle: &str) -> bool {
    report
        .lines()
        .any(|l| l.starts_with(prefix) && l.contains(needle))
}

#[tokio::test(flavor = "multi_thread")]
async fn doctor_explains_healthy_and_silent_rooms() {
    let hs = e2e::Homeserver::from_env();
    // Everyone on this homeserver may talk to the bot (the stack's default is everyone at all).
    let mut opts = StackOptions::default();
    opts.surface_env.insert(
        "SURFACE_ALLOWED_USERS".into(),
        format!("@*:{}", hs.server_name),
    );
    let mut stack = Stack::start(&hs, opts).await.expect("stack");
    let bot = stack.bot.user_id.clone();
    let user = E2eeUser::register(&hs, "doc").await.expect("user");
    let dm = user.create_encrypted_dm(&bot).await.expect("dm");
    user.wait_joined(&dm, &bot, TURN).await.expect("join");
    user.send_text(&dm, "help").await.expect("send");
    user.wait_messages_from(&dm, &bot, 1, TURN)
        .await
        .expect("the bot answers");
    let me = user.user_id.clone();

    // Healthy.
    let (code, report) = doctor(&stack, &["--room", &dm]).await;
    println!("surface doctor --room (healthy):\n{report}");
    assert_eq!(code, 0, "{report}");
    for check in [
        "config",
        "homeserver",
        "login",
        "ways in",
        "rooms",
        "agent",
        "workspace",
        "surface",
    ] {
        assert!(
            has_line(&report, "ok", &format!("{check}:")),
            "{check}: {report}"
        );
    }
    assert!(
        has_line(&report, "ok", "joined, 2 members, encrypted"),
        "{report}"
    );
    assert!(
        has_line(
            &report,
            "ok",
            &format!("a message from {me} would be answered")
        ),
        "{report}"
    );
    assert!(!report.contains("FAIL"), "{report}");

    // A room the bot is not in.
    let other = hs
        .register(&e2e::unique("lonely"), false)
        .await
        .expect("user");
    let lonely = other.create_room(&[], false).await.expect("room");
    let (code, report) = doctor(&stack, &["--room", &lonely]).await;
    assert_eq!(code, 1, "{report}");
    assert!(has_line(&report, "FAIL", "the bot is not in"), "{report}");

    // A sender the allowlist does not cover (the default allows the bot's own server).
    let (code, report) = doctor(
        &stack,
        &["--room", &dm, "--sender", "@stranger:elsewhere.example"],
    )
    .await;
    assert_eq!(code, 1, "{report}");
    assert!(
        has_line(&report, "FAIL", "not allowed by SURFACE_ALLOWED_USERS"),
        "{report}"
    );
    assert!(has_line(&report, "warn", "is not a member"), "{report}");

    // The agent is down.
    stack.agent.stop().await;
    let (code, report) = doctor(&stack, &["--room", &dm]).await;
    println!("surface doctor --room (agent down):\n{report}");
    assert_eq!(code, 1, "{report}");
    assert!(has_line(&report, "FAIL", "agent:"), "{report}");
    assert!(
        has_line(&report, "FAIL", "answered only once the agent is reachable"),
        "{report}"
    );
    assert!(
        !report.contains(&stack.agent_token),
        "no secret in the report: {report}"
    );
}
