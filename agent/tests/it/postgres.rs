//! Agents sharing one PostgreSQL database (`MXBRIDGE_TEST_DATABASE_URL`, started by the test
//! command; each test makes a database of its own): a chat's history, memory and approvals are
//! wherever the chat goes, one turn runs at a time across agents, a dead agent's lease expires,
//! and `agent import-state` moves a state directory written by today's file store.

use agent::Config;
use agent::db::DatabaseConfig;
use protocol::{ApprovalDecision, Decision, EndStatus, Secret, ToAgent, ToSurface};

use crate::support::*;

/// A fresh database on the test server, or `None` (said on stderr) when there is none.
pub(crate) async fn scratch() -> Option<String> {
    let Ok(admin) = std::env::var("MXBRIDGE_TEST_DATABASE_URL") else {
        eprintln!("MXBRIDGE_TEST_DATABASE_URL is not set: skipping a PostgreSQL test");
        return None;
    };
    let name = format!("it_{:016x}", rand::random::<u64>());
    Some(agent::db::create_scratch(&admin, &name).await.unwrap())
}

/// A plain client of the database `url`, for a test's own statements.
async fn sql(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// The stored status of turn `id` of the test's chat.
async fn status(client: &tokio_postgres::Client, id: &str) -> String {
    client
        .query_one(
            "SELECT status FROM turns WHERE chat_id = $1 AND id = $2",
            &[&chat().as_str(), &id],
        )
        .await
        .unwrap()
        .get(0)
}

fn on(url: &str) -> impl FnOnce(&mut Config) + '_ {
    move |c| c.database = Some(DatabaseConfig::new(Secret::new(url), 8))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_chat_finds_its_history_and_memory_on_another_agent() {
    let Some(url) = scratch().await else { return };
    let a = TestAgent::start_with(on(&url)).await;
    let b = TestAgent::start_with(on(&url)).await;
    {
        let (mut c, welcome) = a.connect(&chat()).await;
        assert_eq!(welcome.last_seq, 0);
        let t = c
            .turn(message(1, "$p1", "remember I drink green tea"))
            .await;
        assert_eq!(t.end().status, EndStatus::Completed, "{}", t.text());
        c.turn(message(2, "$p2", "hello")).await;
    }
    let (mut c, welcome) = b.connect(&chat()).await;
    assert_eq!(welcome.last_seq, 2, "B knows what A stored");
    let t = c.turn(message(3, "$p3", "history")).await;
    assert!(t.text().contains("2 earlier turn(s)"), "{}", t.text());
    let t = c.turn(message(4, "$p4", "recall")).await;
    assert!(t.text().contains("green tea"), "{}", t.text());
    // A resend of a turn A answered is acknowledged as a duplicate and not run again.
    let ack = c
        .submit(message(1, "$p1", "remember I drink green tea"))
        .await;
    assert!(ack.duplicate);
    // Nothing went to either state directory.
    for agent in [&a, &b] {
        let files: Vec<_> = walk(agent.state.path());
        assert!(files.is_empty(), "{files:?}");
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.path().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

/// A turn queued on two agents at once runs on one of them: the other waits for the chat's
/// lease and then finds it finished (its stored answer is replayed, no approval asked). Run on
/// both at once, B would ask for the approval too, and nobody answers it.
#[tokio::test(flavor = "multi_thread")]
async fn a_turn_queued_on_two_agents_runs_once() {
    let Some(url) = scratch().await else { return };
    let a = TestAgent::start_with(on(&url)).await;
    let b = TestAgent::start_with(on(&url)).await;
    let (mut ca, _) = a.connect(&chat()).await;
    ca.submit(message(1, "$s1", "approve deploy")).await;
    let asked = ca
        .until(|m| matches!(m, ToSurface::ApprovalRequest(_)))
        .await;
    let Some(ToSurface::ApprovalRequest(r)) = asked.messages.last() else {
        unreachable!()
    };
    // B connects while A's turn waits for the approval: the turn is pending, so B queues it.
    // Its acknowledgement of a second message shows B read its pending turns (first thing).
    let (mut cb, welcome) = b.connect(&chat()).await;
    assert_eq!(welcome.last_seq, 1);
    cb.submit(message(2, "$s2", "hello")).await;
    ca.send(ApprovalDecision {
        request_id: r.request_id.clone(),
        decision: Decision::AllowOnce,
        by: USER.into(),
    })
    .await;
    let on_a = ca.until_end("$s1").await;
    assert_eq!(on_a.end().status, EndStatus::Completed);
    let on_b = cb.until_end("$s2").await;
    let asked_b = on_b
        .messages
        .iter()
        .filter(|m| matches!(m, ToSurface::ApprovalRequest(_)))
        .count();
    assert_eq!(asked_b, 0, "B did not run the turn: {:?}", on_b.messages);
    assert!(
        on_b.text().contains(&on_a.text()),
        "B replayed A's answer: {}",
        on_b.text()
    );
}

/// An agent that died holding a chat's lease stops blocking it once the lease expires: the
/// next agent waits for it, then runs the chat's turn.
#[tokio::test(flavor = "multi_thread")]
async fn a_dead_agents_lease_expires_and_the_turn_runs_elsewhere() {
    let Some(url) = scratch().await else { return };
    let b = TestAgent::start_with(on(&url)).await;
    // B has created the tables once it answers a handshake.
    let (mut c, _) = b.connect(&chat()).await;
    let client = sql(&url).await;
    client
        .execute(
            "INSERT INTO chat_leases (chat_id, holder, token, expires_at) \
             VALUES ($1, 'dead-agent/1/0', 7, now() + interval '4 seconds')",
            &[&chat().as_str()],
        )
        .await
        .unwrap();
    let takeovers = |text: &str| metric(text, "mxbridge_agent_lease_takeovers_total");
    let before = takeovers(&b.metrics().await);
    let t = c.turn(message(1, "$d1", "hello")).await;
    assert_eq!(t.end().status, EndStatus::Completed);
    // Counted (the recorder is the test process's: at least this one), and the pools are shown.
    let metrics = b.metrics().await;
    assert!(takeovers(&metrics) >= before + 1.0, "{metrics}");
    assert!(
        metrics.contains("mxbridge_agent_db_connections{pool=\"durable\",state=\"in_use\"}")
            && metrics.contains("mxbridge_agent_db_connections_max{pool=\"relaxed\"}"),
        "{metrics}"
    );
    let row = client
        .query_opt(
            "SELECT holder, token FROM chat_leases WHERE chat_id = $1",
            &[&chat().as_str()],
        )
        .await
        .unwrap();
    // Given back after the turn (or, if a renewal raced, held by B with a newer token).
    if let Some(row) = row {
        assert_ne!(row.get::<_, String>(0), "dead-agent/1/0");
        assert!(row.get::<_, i64>(1) > 7);
    }
}

/// A turn whose lease another agent took meanwhile (this one could not renew it in time: paused,
/// or cut off from the database) stops unfinished and stays pending, and its connection closes:
/// only a new connection runs a pending turn again, so the surface reconnects and sends it again,
/// and it runs once the lease is free instead of the room waiting on a turn that never ends.
#[tokio::test(flavor = "multi_thread")]
async fn a_turn_whose_lease_is_taken_stops_and_its_connection_closes_to_be_sent_again() {
    let Some(url) = scratch().await else { return };
    let a = TestAgent::start_with(on(&url)).await;
    let (mut c, _) = a.connect(&chat()).await;
    c.submit(message(1, "$l1", "approve deploy")).await;
    c.until(|m| matches!(m, ToSurface::ApprovalRequest(_)))
        .await;
    let client = sql(&url).await;
    let taken = client
        .execute(
            "UPDATE chat_leases SET holder = 'other-agent/1/0', token = token + 1, \
             expires_at = now() + interval '1 hour' WHERE chat_id = $1",
            &[&chat().as_str()],
        )
        .await
        .unwrap();
    assert_eq!(taken, 1, "the agent held the chat's lease during its turn");
    // Its next renewal finds the lease another's: the turn stops, the connection closes.
    let mut after = Vec::new();
    while let Some(m) = c.recv().await {
        after.push(m);
    }
    assert!(
        !after.iter().any(|m| matches!(m, ToSurface::End(_))),
        "no end for a turn that did not finish: {after:?}"
    );
    assert_eq!(status(&client, "$l1").await, "pending");
    // The other agent gives the lease back; the surface reconnects and sends the turn again.
    client
        .execute(
            "DELETE FROM chat_leases WHERE chat_id = $1",
            &[&chat().as_str()],
        )
        .await
        .unwrap();
    let (mut c, _) = a.connect(&chat()).await;
    let ack = c.submit(message(1, "$l1", "approve deploy")).await;
    assert!(ack.duplicate, "stored once: {ack:?}");
    c.answer_approval(Decision::AllowOnce).await;
    assert_eq!(c.until_end("$l1").await.end().status, EndStatus::Completed);
}

/// A turn whose end the database refuses for a while is not reported ended until its end is
/// stored: the agent tries again, and the surface gets `end` only then (an `end` for a turn
/// still pending would make the surface forget a turn that runs again).
#[tokio::test(flavor = "multi_thread")]
async fn a_turn_ends_only_once_its_end_is_stored() {
    let Some(url) = scratch().await else { return };
    let a = TestAgent::start_with(on(&url)).await;
    let (mut c, _) = a.connect(&chat()).await;
    let client = sql(&url).await;
    // The database refuses to mark any turn completed (NOT VALID: no existing row is checked).
    client
        .batch_execute(
            "ALTER TABLE turns ADD CONSTRAINT no_end CHECK (status <> 'completed') NOT VALID",
        )
        .await
        .unwrap();
    let refusing = std::time::Duration::from_millis(1500);
    let lifted = tokio::spawn(async move {
        tokio::time::sleep(refusing).await;
        client
            .batch_execute("ALTER TABLE turns DROP CONSTRAINT no_end")
            .await
            .unwrap();
        client
    });
    let started = std::time::Instant::now();
    let t = c.turn(message(1, "$e1", "hello")).await;
    assert_eq!(t.end().status, EndStatus::Completed, "{}", t.text());
    assert!(
        started.elapsed() >= refusing,
        "`end` came before the end was stored ({:?})",
        started.elapsed()
    );
    let client = lifted.await.unwrap();
    assert_eq!(status(&client, "$e1").await, "completed");
}

/// A database that holds a statement up (here: a lock never released) fails it within the
/// statement timeout: the message is refused visibly (an `error`, then the connection closes)
/// instead of hanging, and is admitted once the database answers again.
#[tokio::test(flavor = "multi_thread")]
async fn a_statement_held_up_by_the_database_fails_within_the_timeout() {
    let Some(url) = scratch().await else { return };
    let timeout = std::time::Duration::from_secs(3);
    let a = TestAgent::start_with(|c: &mut Config| {
        let mut db = DatabaseConfig::new(Secret::new(&url), 8);
        db.statement_timeout = timeout;
        c.database = Some(db);
    })
    .await;
    let (mut c, _) = a.connect(&chat()).await;
    let mut client = sql(&url).await;
    let lock = client.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE chats IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    c.send(ToAgent::UserMessage(message(1, "$h1", "hello")))
        .await;
    // The admission waits for the lock (seen by the server); it is refused while the lock is
    // still held, so by the statement timeout and not at once.
    let watch = sql(&url).await;
    let waiting = async {
        loop {
            let n: i64 = watch
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                     AND query LIKE '%admit_turn%'",
                    &[],
                )
                .await
                .unwrap()
                .get(0);
            if n > 0 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(timeout, waiting)
        .await
        .expect("the admission waited for the lock");
    let refused = loop {
        match c.recv().await {
            Some(ToSurface::Error(e)) => break e,
            Some(ToSurface::Ack(a)) => panic!("acknowledged while the database held it: {a:?}"),
            Some(_) => continue,
            None => panic!("closed without an error"),
        }
    };
    assert!(refused.message.contains("could not store"), "{refused:?}");
    assert!(c.recv().await.is_none(), "the connection closes");
    lock.rollback().await.unwrap();
    let (mut c, _) = a.connect(&chat()).await;
    let t = c.turn(message(1, "$h1", "hello")).await;
    assert_eq!(t.end().status, EndStatus::Completed, "{}", t.text());
}

/// `agent import-state` on a state directory written by the file store of today's agent: the
/// chats and memory arrive, a second run finds them there, and a chat the database has moved
/// on with is refused, not overwritten.
#[tokio::test(flavor = "multi_thread")]
async fn import_state_moves_a_state_directory_into_the_database() {
    let Some(url) = scratch().await else { return };
    let files = TestAgent::start().await;
    {
        let (mut c, _) = files.connect(&chat()).await;
        c.turn(message(1, "$i1", "remember I drink green tea"))
            .await;
        c.turn(message(2, "$i2", "hello")).await;
    }
    let state = files.state.path().to_owned();
    let import = |url: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_agent"))
            .arg("import-state")
            .env_clear()
            .env("AGENT_STATE_DIR", &state)
            .env("AGENT_DATABASE_URL", url)
            .output()
            .unwrap()
    };
    let out = import(&url);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("chats: 1 imported (2 turns)"), "{stdout}");
    assert!(
        stdout.contains("memory: 1 scopes imported (1 facts)"),
        "{stdout}"
    );
    let again = import(&url);
    let stdout = String::from_utf8_lossy(&again.stdout);
    assert!(again.status.success(), "{stdout}");
    assert!(stdout.contains("1 already there"), "{stdout}");

    let pg = TestAgent::start_with(on(&url)).await;
    let (mut c, welcome) = pg.connect(&chat()).await;
    assert_eq!(welcome.last_seq, 2);
    let t = c.turn(message(3, "$i3", "history")).await;
    assert!(t.text().contains("2 earlier turn(s)"), "{}", t.text());
    let t = c.turn(message(4, "$i4", "recall")).await;
    assert!(t.text().contains("green tea"), "{}", t.text());

    // The database moved on: importing the old directory again changes nothing there.
    let refused = import(&url);
    let stdout = String::from_utf8_lossy(&refused.stdout);
    assert!(!refused.status.success(), "{stdout}");
    assert!(stdout.contains("not imported"), "{stdout}");
    let t = c.turn(message(5, "$i5", "history")).await;
    assert!(t.text().contains("4 earlier turn(s)"), "{}", t.text());
    // The URL's password is in no line the command printed.
    let password = url.split(':').nth(2).unwrap().split('@').next().unwrap();
    for out in [&out, &again, &refused] {
        assert!(!String::from_utf8_lossy(&out.stdout).contains(password));
        assert!(!String::from_utf8_lossy(&out.stderr).contains(password));
    }
}
