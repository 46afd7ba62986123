//! The agent's Prometheus metrics: every name in one place, with its help text, and the
//! exporter (`GET /metrics`). Labels have a few fixed values each (outcomes, tool names),
//! never a chat, room or user id.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Turns finished, by `outcome` (completed, failed, cancelled).
pub const TURNS: &str = "mxbridge_agent_turns_total";
/// How long turns took, seconds.
pub const TURN_SECONDS: &str = "mxbridge_agent_turn_duration_seconds";
/// Turns running now.
pub const RUNNING: &str = "mxbridge_agent_turns_running";
/// Tool calls, by `tool` and `outcome` (ok, error, denied).
pub const TOOL_CALLS: &str = "mxbridge_agent_tool_calls_total";
/// Requests to the model server, by `outcome` (ok or the failure class).
pub const MODEL_REQUESTS: &str = "mxbridge_agent_model_requests_total";
/// Tokens the model server reported, by `direction` (in: prompt, out: completion).
pub const TOKENS: &str = "mxbridge_agent_model_tokens_total";
/// Time to the model server's answer head, seconds.
pub const MODEL_SECONDS: &str = "mxbridge_agent_model_latency_seconds";
/// Recordings sent for transcription, by outcome (`ok` or a failure class).
pub const TRANSCRIPTIONS: &str = "mxbridge_agent_transcriptions_total";
/// Pictures prepared for the model, by outcome (`ok`, `cached`, `refused`).
pub const IMAGES: &str = "mxbridge_agent_images_total";
/// Turns accepted but not started yet, all chats together.
pub const QUEUE_DEPTH: &str = "mxbridge_agent_queue_depth";
/// How long turns waited from being accepted to starting, seconds.
pub const QUEUE_WAIT_SECONDS: &str = "mxbridge_agent_queue_wait_seconds";
/// Database connections of a `pool` (durable, relaxed) by `state` (in_use, idle), at scrape.
pub const DB_CONNECTIONS: &str = "mxbridge_agent_db_connections";
/// Most connections a `pool` opens.
pub const DB_CONNECTIONS_MAX: &str = "mxbridge_agent_db_connections_max";
/// Operations waiting for a connection of a `pool`, at scrape.
pub const DB_WAITING: &str = "mxbridge_agent_db_waiting";
/// Chats' leases taken over from another agent that stopped renewing them.
pub const LEASE_TAKEOVERS: &str = "mxbridge_agent_lease_takeovers_total";
/// Turns started again after their recorded steps (interrupted earlier, here or elsewhere).
pub const TURNS_RESUMED: &str = "mxbridge_agent_turns_resumed_total";

/// Buckets for the `_seconds` histograms: milliseconds (tools, a local model's first byte) to
/// minutes (a long turn).
const BUCKETS: &[f64] = &[
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Installs the process-wide recorder once and describes every metric; several agents in one
/// process (tests) share it. `None` when another recorder was installed first.
pub fn install() -> Option<PrometheusHandle> {
    static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();
    HANDLE.get_or_init(install_recorder).clone()
}

fn install_recorder() -> Option<PrometheusHandle> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)
        .ok()?
        .install_recorder()
        .ok()?;
    describe_counter!(TURNS, "Turns finished, by outcome.");
    describe_histogram!(TURN_SECONDS, Unit::Seconds, "How long turns took.");
    describe_gauge!(RUNNING, "Turns running now.");
    describe_counter!(TOOL_CALLS, "Tool calls, by tool and outcome.");
    describe_counter!(MODEL_REQUESTS, "Requests to the model server, by outcome.");
    describe_counter!(TOKENS, "Tokens the model server reported, by direction.");
    describe_counter!(
        TRANSCRIPTIONS,
        "Recordings sent for transcription, by outcome."
    );
    describe_counter!(IMAGES, "Pictures prepared for the model, by outcome.");
    describe_histogram!(
        MODEL_SECONDS,
        Unit::Seconds,
        "Time to the model's answer head."
    );
    describe_gauge!(
        QUEUE_DEPTH,
        "Turns accepted but not started yet, all chats together."
    );
    describe_histogram!(
        QUEUE_WAIT_SECONDS,
        Unit::Seconds,
        "How long turns waited from being accepted to starting."
    );
    describe_gauge!(
        DB_CONNECTIONS,
        "Database connections by pool (durable, relaxed) and state (in_use, idle)."
    );
    describe_gauge!(DB_CONNECTIONS_MAX, "Most connections a pool opens.");
    describe_gauge!(
        DB_WAITING,
        "Operations waiting for a database connection, by pool."
    );
    describe_counter!(
        LEASE_TAKEOVERS,
        "Chats' leases taken over from an agent that stopped renewing them."
    );
    describe_counter!(
        TURNS_RESUMED,
        "Turns started again after the steps an interrupted run recorded."
    );
    Some(handle)
}

/// A turn ended.
pub fn turn(outcome: &'static str, took: Duration) {
    metrics::counter!(TURNS, "outcome" => outcome).increment(1);
    metrics::histogram!(TURN_SECONDS).record(took.as_secs_f64());
}

/// A tool call ended. `tool` comes from the typed registry (a fixed set of names).
pub fn tool_call(tool: &'static str, outcome: &'static str) {
    metrics::counter!(TOOL_CALLS, "tool" => tool, "outcome" => outcome).increment(1);
}

/// A model request ended (`outcome`: ok or a failure class), after `head` to its answer.
pub fn model_request(outcome: &'static str, head: Option<Duration>) {
    metrics::counter!(MODEL_REQUESTS, "outcome" => outcome).increment(1);
    if let Some(h) = head {
        metrics::histogram!(MODEL_SECONDS).record(h.as_secs_f64());
    }
}

/// A recording was transcribed (`ok`) or not (a failure class of `TranscribeError::label`).
pub fn transcription(outcome: &'static str) {
    metrics::counter!(TRANSCRIPTIONS, "outcome" => outcome).increment(1);
}

/// A picture was prepared for the model (`ok`), found prepared (`cached`) or not shown
/// (`refused`).
pub fn image(outcome: &'static str) {
    metrics::counter!(IMAGES, "outcome" => outcome).increment(1);
}

/// Tokens the server reported for one request.
pub fn tokens(prompt: u64, completion: u64) {
    metrics::counter!(TOKENS, "direction" => "in").increment(prompt);
    metrics::counter!(TOKENS, "direction" => "out").increment(completion);
}

/// A connection pool's use, as `pool` stands now.
pub fn pool_use(pool: &'static str, status: deadpool_postgres::Status) {
    let in_use = status.size.saturating_sub(status.available);
    metrics::gauge!(DB_CONNECTIONS, "pool" => pool, "state" => "in_use").set(in_use as f64);
    metrics::gauge!(DB_CONNECTIONS, "pool" => pool, "state" => "idle").set(status.available as f64);
    metrics::gauge!(DB_CONNECTIONS_MAX, "pool" => pool).set(status.max_size as f64);
    metrics::gauge!(DB_WAITING, "pool" => pool).set(status.waiting as f64);
}

/// A chat's lease was taken over from another agent.
pub fn lease_takeover() {
    metrics::counter!(LEASE_TAKEOVERS).increment(1);
}

/// A turn resumed after its recorded steps.
pub fn turn_resumed() {
    metrics::counter!(TURNS_RESUMED).increment(1);
}

/// The turns of every chat waiting to start: [`QUEUE_DEPTH`] follows it.
pub static QUEUE: Queue = Queue::new();

/// A count of waiting turns, kept next to the gauge so it can be read (and tested) without a
/// recorder.
#[derive(Debug)]
pub struct Queue {
    waiting: AtomicUsize,
}

impl Queue {
    /// An empty queue.
    pub const fn new() -> Self {
        Self {
            waiting: AtomicUsize::new(0),
        }
    }

    /// A turn was accepted: it counts as waiting until its ticket is used or dropped.
    pub fn enter(&'static self) -> Queued {
        self.waiting.fetch_add(1, Ordering::Relaxed);
        metrics::gauge!(QUEUE_DEPTH).increment(1.0);
        Queued {
            queue: self,
            since: Instant::now(),
        }
    }

    /// Turns waiting now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }
}

impl Default for Queue {
    fn default() -> Self {
        Self::new()
    }
}

/// One accepted turn's place in the [`Queue`]. Dropping it (the turn was replayed, cancelled,
/// or its connection ended) only leaves the queue; [`Queued::started`] also records the wait.
#[derive(Debug)]
pub struct Queued {
    queue: &'static Queue,
    since: Instant,
}

impl Queued {
    /// The turn starts now: records how long it waited, and leaves the queue.
    pub fn started(self) -> Duration {
        let waited = self.since.elapsed();
        metrics::histogram!(QUEUE_WAIT_SECONDS).record(waited.as_secs_f64());
        waited
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        self.queue.waiting.fetch_sub(1, Ordering::Relaxed);
        metrics::gauge!(QUEUE_DEPTH).decrement(1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_waits_from_enter_until_it_starts_or_is_dropped() {
        static Q: Queue = Queue::new();
        let a = Q.enter();
        let b = Q.enter();
        let c = Q.enter();
        assert_eq!(Q.waiting(), 3);
        a.started();
        assert_eq!(Q.waiting(), 2);
        drop(b);
        assert_eq!(Q.waiting(), 1, "a dropped ticket leaves the queue");
        c.started();
        assert_eq!(Q.waiting(), 0);
    }
}
