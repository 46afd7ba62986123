//! The agent's Prometheus metrics: every name in one place, with its help text, and the
//! exporter (`GET /metrics`). Labels have a few fixed values each (outcomes, tool names),
//! never a chat, room or user id.

use std::time::Duration;

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

/// Buckets for the `_seconds` histograms: milliseconds (tools, a local model's first byte) to
/// minutes (a long turn).
const BUCKETS: &[f64] = &[
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Installs the process-wide recorder and describes every metric; `None` when one is
/// installed already (several agents in one test process share the first).
pub fn install() -> Option<PrometheusHandle> {
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
    describe_histogram!(
        MODEL_SECONDS,
        Unit::Seconds,
        "Time to the model's answer head."
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

/// Tokens the server reported for one request.
pub fn tokens(prompt: u64, completion: u64) {
    metrics::counter!(TOKENS, "direction" => "in").increment(prompt);
    metrics::counter!(TOKENS, "direction" => "out").increment(completion);
}
