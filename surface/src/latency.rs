//! Where the surface's own time goes, for the benchmark (`scripts/bench.sh`): from a sync
//! response to the turn's frame at the agent (`sync_to_agent`), and from an agent message to
//! the post it causes (`agent_to_send`). Logged at DEBUG on the target `mxbridge_latency` with
//! the fields `leg` and `us`; nothing is recorded unless that target is enabled.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

/// The log target of the measurements.
pub const TARGET: &str = "mxbridge_latency";
/// Arrivals remembered at most (events never sent as turns are dropped with the rest).
const MAX_ARRIVALS: usize = 4096;

static ARRIVALS: Mutex<Option<HashMap<String, Instant>>> = Mutex::new(None);

fn enabled() -> bool {
    tracing::enabled!(target: TARGET, tracing::Level::DEBUG)
}

/// Events `event_ids` came with a sync response at `at`.
pub fn arrived<'a>(event_ids: impl IntoIterator<Item = &'a str>, at: Instant) {
    if !enabled() {
        return;
    }
    let mut map = ARRIVALS.lock().unwrap_or_else(|p| p.into_inner());
    let map = map.get_or_insert_with(HashMap::new);
    if map.len() >= MAX_ARRIVALS {
        map.clear();
    }
    for id in event_ids {
        map.insert(id.to_owned(), at);
    }
}

/// The turn of event `event_id` was just written to the agent's socket.
pub fn sent_to_agent(event_id: &str) {
    if !enabled() {
        return;
    }
    let at = ARRIVALS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_mut()
        .and_then(|m| m.remove(event_id));
    if let Some(at) = at {
        tracing::debug!(target: TARGET, leg = "sync_to_agent", us = at.elapsed().as_micros() as u64);
    }
}

/// A post caused by an agent message received at `since` is about to be sent.
pub fn agent_to_send(since: Instant) {
    tracing::debug!(target: TARGET, leg = "agent_to_send", us = since.elapsed().as_micros() as u64);
}
