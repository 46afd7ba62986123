//! The agent's own measurements, read from `/metrics` as Prometheus would: the queue of turns
//! waiting to start.

use protocol::{Cancel, EndStatus};

use crate::support::*;

#[tokio::test]
async fn turns_waiting_behind_a_running_one_are_counted_and_their_wait_measured() {
    let agent = TestAgent::start().await;
    let before = metric(
        &agent.metrics().await,
        "mxbridge_agent_queue_wait_seconds_count",
    );
    let (mut c, _) = agent.connect(&chat()).await;
    c.submit(message(1, "$slow", "sleep 60000")).await;
    c.submit(message(2, "$next", "history")).await;
    // `$next` waits behind `$slow` until it is cancelled: at least one turn is queued.
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let text = agent.metrics().await;
        if metric(&text, "mxbridge_agent_queue_depth") >= 1.0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no queued turn: {text}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    c.send(Cancel {
        turn: "$slow".into(),
    })
    .await;
    assert_eq!(
        c.until_end("$slow").await.end().status,
        EndStatus::Cancelled
    );
    assert_eq!(
        c.until_end("$next").await.end().status,
        EndStatus::Completed
    );
    let after = agent.metrics().await;
    assert!(
        metric(&after, "mxbridge_agent_queue_wait_seconds_count") >= before + 2.0,
        "both turns' waits are recorded: {after}"
    );
    assert!(
        after.contains("# HELP mxbridge_agent_queue_depth "),
        "{after}"
    );
}
