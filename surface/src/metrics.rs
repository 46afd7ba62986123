//! The surface's Prometheus metrics: every name in one place, with its help text, and the
//! exporter (`/metrics` on the health port renders it). Labels have a few fixed values each,
//! never a room, user or event id: an operator's Prometheus must not grow with the rooms.

use std::time::Duration;

use metrics::{Unit, describe_counter, describe_gauge};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Timeline events journaled, by `kind` (message, media, edit, reaction, encrypted, other)
/// and `outcome` (what `decide` made of it: trigger, context, wait_for_key, ignore...).
pub const EVENTS: &str = "mxbridge_surface_events_total";
/// Access tokens renewed with the refresh token.
pub const TOKEN_REFRESHES: &str = "mxbridge_surface_token_refreshes_total";
/// Logins again with the password after a soft logout, into the same device.
pub const RELOGINS: &str = "mxbridge_surface_logins_again_total";
/// 1 while the bot is logged out and waits for its operator (`/healthz` says why), else 0.
pub const LOGGED_OUT: &str = "mxbridge_surface_logged_out";
/// Turns over, by `outcome` (`ended`, `stopped`, `timeout`, `lost`, `dropped`).
pub const TURNS: &str = "mxbridge_surface_turns_total";
/// Syncs that came back `limited` (a gap the surface back-filled).
pub const LIMITED_SYNCS: &str = "mxbridge_surface_limited_syncs_total";
/// Events fetched from `/messages` to fill gaps.
pub const BACKFILLED: &str = "mxbridge_surface_backfilled_events_total";
/// Undecryptable events that were decrypted later (their key arrived).
pub const RECOVERED: &str = "mxbridge_surface_undecryptable_recovered_total";
/// Media bytes moved, by `direction` (in, out).
pub const MEDIA_BYTES: &str = "mxbridge_surface_media_bytes_total";
/// Media transfers that failed, by `direction`.
pub const MEDIA_FAILURES: &str = "mxbridge_surface_media_failures_total";
/// Posts tried again, by `reason` (rate_limited, server_error, network, other).
pub const SEND_RETRIES: &str = "mxbridge_surface_send_retries_total";
/// Read receipts and typing notices sent for turns, by `kind` (read_receipt, typing): the
/// requests a turn costs the homeserver besides its answer.
pub const PROGRESS_SIGNALS: &str = "mxbridge_surface_progress_signals_total";
/// Chats connected to another agent than their own, which could not be reached.
pub const AGENT_FAILOVERS: &str = "mxbridge_surface_agent_failovers_total";
/// Seconds since the last successful sync (set when scraped).
pub const SYNC_AGE: &str = "mxbridge_surface_sync_last_success_age_seconds";
/// Messages not answered and not in the agent's hands: journaled events no lane has handled
/// yet, and turns the agent has not accepted (set when scraped).
pub const BACKLOG: &str = "mxbridge_surface_journal_backlog";
/// Age of the oldest of them, seconds (0 without a backlog; set when scraped).
pub const BACKLOG_AGE: &str = "mxbridge_surface_journal_oldest_unhandled_age_seconds";
/// Events waiting for their room key (set when scraped).
pub const UNDECRYPTABLE_WAITING: &str = "mxbridge_surface_undecryptable_waiting";
/// Posts the homeserver refused for good (set when scraped).
pub const PARKED_SENDS: &str = "mxbridge_surface_parked_sends";
/// 1 while an agent link is usable now (handshake good: version, token, shared workspace),
/// else 0.
pub const AGENT_UP: &str = "mxbridge_surface_agent_up";
/// 1 while the agent's workspace sentinel matches ours, 0 on a mismatch.
pub const WORKSPACE_OK: &str = "mxbridge_surface_workspace_ok";

/// Installs the process-wide recorder and describes every metric; `None` when one is
/// installed already (several surfaces in one test process share the first).
pub fn install() -> Option<PrometheusHandle> {
    let handle = PrometheusBuilder::new().install_recorder().ok()?;
    describe();
    Some(handle)
}

fn describe() {
    describe_counter!(EVENTS, "Timeline events journaled, by kind and outcome.");
    describe_counter!(LIMITED_SYNCS, "Syncs that came back limited (gaps).");
    describe_counter!(BACKFILLED, "Events fetched from /messages to fill gaps.");
    describe_counter!(
        AGENT_FAILOVERS,
        "Chats connected to another agent because their own could not be reached."
    );
    describe_counter!(RECOVERED, "Undecryptable events decrypted later.");
    describe_counter!(MEDIA_BYTES, Unit::Bytes, "Media bytes moved, by direction.");
    describe_counter!(MEDIA_FAILURES, "Media transfers that failed, by direction.");
    describe_counter!(SEND_RETRIES, "Posts tried again, by reason.");
    describe_counter!(
        PROGRESS_SIGNALS,
        "Read receipts and typing notices sent for turns, by kind."
    );
    describe_gauge!(SYNC_AGE, Unit::Seconds, "Seconds since the last good sync.");
    describe_gauge!(
        BACKLOG,
        "Messages waiting: journaled events not handled yet and turns the agent has not accepted."
    );
    describe_gauge!(
        BACKLOG_AGE,
        Unit::Seconds,
        "Age of the oldest unhandled event."
    );
    describe_counter!(TURNS, "Turns over, by outcome.");
    describe_counter!(
        TOKEN_REFRESHES,
        "Access tokens renewed with the refresh token (each new pair saved before use)."
    );
    describe_counter!(
        RELOGINS,
        "Logins again with the password after a soft logout, into the same device."
    );
    describe_gauge!(
        LOGGED_OUT,
        "1 while the bot is logged out and waits for its operator."
    );
    describe_gauge!(UNDECRYPTABLE_WAITING, "Events waiting for their room key.");
    describe_gauge!(PARKED_SENDS, "Posts the homeserver refused for good.");
    describe_gauge!(AGENT_UP, "1 while an agent link is usable now.");
    describe_gauge!(WORKSPACE_OK, "0 while the agent sees another workspace.");
}

/// Records one event's fate.
pub fn event(kind: &'static str, outcome: &'static str) {
    metrics::counter!(EVENTS, "kind" => kind, "outcome" => outcome).increment(1);
}

/// Records an access token renewed with the refresh token (the pair saved).
pub fn token_refreshed() {
    metrics::counter!(TOKEN_REFRESHES).increment(1);
}

/// Records a login again after a soft logout.
pub fn logged_in_again() {
    metrics::counter!(RELOGINS).increment(1);
}

/// Records whether the bot is logged out and waiting for its operator.
pub fn logged_out(out: bool) {
    metrics::gauge!(LOGGED_OUT).set(if out { 1.0 } else { 0.0 });
}

/// Records a turn over, by how it ended.
pub fn turn(outcome: &'static str) {
    metrics::counter!(TURNS, "outcome" => outcome).increment(1);
}

/// Records media bytes moved (`direction` is `in` or `out`).
pub fn media_bytes(direction: &'static str, bytes: u64) {
    metrics::counter!(MEDIA_BYTES, "direction" => direction).increment(bytes);
}

/// Records a failed media transfer.
pub fn media_failure(direction: &'static str) {
    metrics::counter!(MEDIA_FAILURES, "direction" => direction).increment(1);
}

/// Records a post tried again, by why.
pub fn send_retry(reason: &'static str) {
    metrics::counter!(SEND_RETRIES, "reason" => reason).increment(1);
}

/// Records a read receipt or typing notice sent for a turn.
pub fn progress_signal(kind: &'static str) {
    metrics::counter!(PROGRESS_SIGNALS, "kind" => kind).increment(1);
}

/// Records a chat connected to another agent than its own.
pub fn agent_failover() {
    metrics::counter!(AGENT_FAILOVERS).increment(1);
}

/// What the scrape-time gauges show.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct State {
    /// Since the last good sync (`None`: none yet).
    pub since_sync: Option<Duration>,
    /// Unhandled events, and the age of the oldest.
    pub backlog: (u64, Duration),
    /// Events waiting for keys.
    pub undecryptable: u64,
    /// Parked posts.
    pub parked: u64,
    /// The agent handshake is good.
    pub agent_up: bool,
    /// No workspace mismatch.
    pub workspace_ok: bool,
}

/// Sets the scrape-time gauges and renders everything in the text exposition format.
pub fn render(handle: &PrometheusHandle, s: &State) -> String {
    // Never synced: as old as it gets, so "sync age > 5m" alerts fire on a surface that never
    // got going.
    let age = s.since_sync.map_or(f64::MAX, |d| d.as_secs_f64());
    metrics::gauge!(SYNC_AGE).set(age);
    metrics::gauge!(BACKLOG).set(s.backlog.0 as f64);
    metrics::gauge!(BACKLOG_AGE).set(s.backlog.1.as_secs_f64());
    metrics::gauge!(UNDECRYPTABLE_WAITING).set(s.undecryptable as f64);
    metrics::gauge!(PARKED_SENDS).set(s.parked as f64);
    metrics::gauge!(AGENT_UP).set(f64::from(u8::from(s.agent_up)));
    metrics::gauge!(WORKSPACE_OK).set(f64::from(u8::from(s.workspace_ok)));
    handle.render()
}
