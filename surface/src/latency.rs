//! Where the surface's own time goes, for the benchmark (`scripts/bench.sh`): from the `/sync`
//! response in matrix-sdk's hands to the turn's frame at the agent (`sync_to_agent`), the part of
//! it spent inside matrix-sdk before our code sees the events (`sdk_sync`: parsing, decryption, its
//! stores; of it, `sdk_crypto` in the crypto machine's per-sync work and `sdk_state` saving the
//! state store, each a store transaction whose commit is an fsync) and the rest, the surface's
//! own (`surface_sync`; of it, `surface_journal` until the journal's commit and `surface_lane`
//! from there to the frame), and from an agent message to the post it causes (`agent_to_send`).
//! Logged at DEBUG on the target `mxbridge_latency` with the fields `leg` and `us`; nothing is
//! recorded unless that target is enabled.
//!
//! Only in builds with the `latency` feature (the test command's and the benchmark's): without
//! it every tap below is an empty function the compiler removes, so the image's release build
//! takes no lock on the hot path.
//!
//! The moment a `/sync` response arrived is taken from matrix-sdk's own tracing ([`SyncClock`]):
//! its HTTP client's `Got response` event inside the `send` span of a request whose `uri` ends in
//! `/sync`. Should a matrix-sdk release rename either, `sdk_sync` lines stop and `sync_to_agent`
//! falls back to starting when `sync_once` returns; the benchmark reports the missing leg.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

/// The log target of the measurements.
pub const TARGET: &str = "mxbridge_latency";
/// Arrivals remembered at most (events never sent as turns are dropped with the rest).
const MAX_ARRIVALS: usize = 4096;
/// Where matrix-sdk's HTTP client logs.
const SDK_HTTP: &str = "matrix_sdk::http_client";
/// A span of matrix-sdk's, clocked whenever it runs: its time within the latest sync becomes a
/// leg of its own.
#[derive(Debug, Clone, Copy)]
struct Clocked {
    /// The module the span is instrumented in (its tracing target).
    target: &'static str,
    /// The span's name.
    span: &'static str,
    /// The leg it is logged as.
    leg: &'static str,
}

/// The parts of `sdk_sync` clocked on their own (matrix-sdk 0.18's names).
const CLOCKED: [Clocked; 2] = [
    // The crypto machine's share of every sync: to-device events, one-time key counts and
    // device lists, and two crypto store transactions.
    Clocked {
        target: "matrix_sdk_crypto::machine",
        span: "receive_sync_changes",
        leg: "sdk_crypto",
    },
    // The state store's transaction: the sync token, room state and infos.
    Clocked {
        target: "matrix_sdk_base::response_processors::changes",
        span: "save_and_apply",
        leg: "sdk_state",
    },
];

/// How long each [`CLOCKED`] span took over the latest sync (`None`: it did not run, or its
/// time was taken already).
pub type SdkParts = [Option<Duration>; CLOCKED.len()];

/// When an event came: the `/sync` response in the SDK's hands, and the SDK handing it to us.
#[derive(Debug, Clone, Copy)]
struct Arrival {
    response: Instant,
    handed: Instant,
    /// Time spent in the SDK's clocked parts of that sync.
    parts: SdkParts,
    /// When the surface's journal had committed the event.
    journaled: Option<Instant>,
}

static ARRIVALS: Mutex<Option<HashMap<String, Arrival>>> = Mutex::new(None);
/// The last `/sync` response the SDK received and nobody took yet.
static SYNC_RESPONSE: Mutex<Option<Instant>> = Mutex::new(None);
/// How long the clocked spans took over the last sync response, not taken yet.
static SDK_PARTS: Mutex<SdkParts> = Mutex::new([None; CLOCKED.len()]);

fn enabled() -> bool {
    cfg!(feature = "latency") && tracing::enabled!(target: TARGET, tracing::Level::DEBUG)
}

/// Whether a `RUST_LOG` value turns the measurements on (then [`SyncClock`] is installed);
/// never without the `latency` feature.
pub fn wanted(rust_log: Option<&str>) -> bool {
    cfg!(feature = "latency") && asks_for_latency(rust_log)
}

/// Whether a `RUST_LOG` value asks for the measurements' target at DEBUG.
fn asks_for_latency(rust_log: Option<&str>) -> bool {
    let verbose = |l: &str| l.eq_ignore_ascii_case("debug") || l.eq_ignore_ascii_case("trace");
    rust_log.is_some_and(|v| {
        v.split(',')
            .map(str::trim)
            .any(|d| match d.strip_prefix(TARGET) {
                Some(rest) => rest.is_empty() || rest.strip_prefix('=').is_some_and(verbose),
                None => verbose(d),
            })
    })
}

/// When the latest `/sync` response arrived, once (the next call says `None` until another
/// arrives).
pub fn take_sync_response() -> Option<Instant> {
    if !cfg!(feature = "latency") {
        return None;
    }
    SYNC_RESPONSE
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
}

/// How long the SDK's clocked parts took over the latest sync response, once.
pub fn take_sdk_parts() -> SdkParts {
    if !cfg!(feature = "latency") {
        return SdkParts::default();
    }
    std::mem::take(&mut *SDK_PARTS.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Events `event_ids` came with a sync response that arrived at `response` and that the SDK
/// handed over at `handed`.
pub fn arrived<'a>(
    event_ids: impl IntoIterator<Item = &'a str>,
    response: Instant,
    handed: Instant,
    parts: SdkParts,
) {
    if !enabled() {
        return;
    }
    let mut map = ARRIVALS.lock().unwrap_or_else(|p| p.into_inner());
    let map = map.get_or_insert_with(HashMap::new);
    if map.len() >= MAX_ARRIVALS {
        map.clear();
    }
    for id in event_ids {
        map.insert(
            id.to_owned(),
            Arrival {
                response,
                handed,
                parts,
                journaled: None,
            },
        );
    }
}

/// Events `event_ids` are committed to the journal (the end of `surface_journal`).
pub fn journaled<'a>(event_ids: impl IntoIterator<Item = &'a str>) {
    if !enabled() {
        return;
    }
    let now = Instant::now();
    let mut map = ARRIVALS.lock().unwrap_or_else(|p| p.into_inner());
    let Some(map) = map.as_mut() else { return };
    for id in event_ids {
        if let Some(a) = map.get_mut(id) {
            a.journaled.get_or_insert(now);
        }
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
    if let Some(a) = at {
        let sdk = a.handed.saturating_duration_since(a.response);
        tracing::debug!(target: TARGET, leg = "sdk_sync", us = sdk.as_micros() as u64);
        for (clocked, took) in CLOCKED.iter().zip(a.parts) {
            if let Some(took) = took {
                tracing::debug!(target: TARGET, leg = clocked.leg, us = took.as_micros() as u64);
            }
        }
        let now = Instant::now();
        let own = now.saturating_duration_since(a.handed);
        tracing::debug!(target: TARGET, leg = "surface_sync", us = own.as_micros() as u64);
        if let Some(journaled) = a.journaled {
            let journal = journaled.saturating_duration_since(a.handed);
            tracing::debug!(target: TARGET, leg = "surface_journal", us = journal.as_micros() as u64);
            let lane = now.saturating_duration_since(journaled);
            tracing::debug!(target: TARGET, leg = "surface_lane", us = lane.as_micros() as u64);
        }
        let all = now.saturating_duration_since(a.response);
        tracing::debug!(target: TARGET, leg = "sync_to_agent", us = all.as_micros() as u64);
    }
}

/// A post caused by an agent message received at `since` is about to be sent.
pub fn agent_to_send(since: Instant) {
    if !cfg!(feature = "latency") {
        return;
    }
    tracing::debug!(target: TARGET, leg = "agent_to_send", us = since.elapsed().as_micros() as u64);
}

/// A tracing layer that notes when matrix-sdk's HTTP client has a `/sync` response in hand, and
/// how long the crypto machine's share of processing it took (from its `receive_sync_changes`
/// span opening to its closing). Install it with a filter that lets matrix-sdk's HTTP client
/// and crypto machine through at every level ([`SyncClock::interested`]), and only when
/// measuring.
#[derive(Debug, Clone, Copy, Default)]
pub struct SyncClock;

/// Marks a `send` span of the SDK's HTTP client that carries a `/sync` request.
struct IsSync;

/// When a [`CLOCKED`] span (by its index) opened.
struct ClockedSince(usize, Instant);

impl SyncClock {
    /// The callsites the layer needs: matrix-sdk's HTTP client, at every level.
    pub fn interested(meta: &Metadata<'_>) -> bool {
        meta.target().starts_with(SDK_HTTP) || Self::clocked(meta).is_some()
    }

    /// Which of [`CLOCKED`] a span is.
    fn clocked(meta: &Metadata<'_>) -> Option<usize> {
        CLOCKED
            .iter()
            .position(|c| meta.name() == c.span && meta.target() == c.target)
    }

    fn mark<S>(id: &Id, values: &dyn Fn(&mut UriIsSync), ctx: &Context<'_, S>)
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        let Some(span) = ctx.span(id) else { return };
        if span.name() != "send" || !Self::interested(span.metadata()) {
            return;
        }
        let mut v = UriIsSync(None);
        values(&mut v);
        if v.0 == Some(true) {
            span.extensions_mut().insert(IsSync);
        }
    }
}

impl<S> Layer<S> for SyncClock
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if let Some(i) = Self::clocked(attrs.metadata()) {
            if let Some(span) = ctx.span(id) {
                span.extensions_mut()
                    .insert(ClockedSince(i, Instant::now()));
            }
            return;
        }
        Self::mark(id, &|v| attrs.record(v), &ctx);
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        if let Some(ClockedSince(i, since)) = span.extensions().get::<ClockedSince>() {
            SDK_PARTS.lock().unwrap_or_else(|p| p.into_inner())[*i] = Some(since.elapsed());
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        Self::mark(id, &|v| values.record(v), &ctx);
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        if !Self::interested(event.metadata()) {
            return;
        }
        let in_sync = ctx
            .event_span(event)
            .is_some_and(|s| s.extensions().get::<IsSync>().is_some());
        if !in_sync {
            return;
        }
        let mut message = IsGotResponse(false);
        event.record(&mut message);
        if message.0 {
            *SYNC_RESPONSE.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        }
    }
}

/// Whether a span's `uri` field names the `/sync` endpoint (`None`: no `uri` recorded here).
struct UriIsSync(Option<bool>);

impl Visit for UriIsSync {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "uri" {
            self.0 = Some(value.trim_end_matches('/').ends_with("/sync"));
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "uri" {
            self.record_str(field, format!("{value:?}").trim_matches('"'));
        }
    }
}

/// Whether an event's message is the SDK's `Got response`.
struct IsGotResponse(bool);

impl Visit for IsGotResponse {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}") == "Got response";
        }
    }
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    #[test]
    fn the_rust_log_decides_whether_to_measure() {
        let cases = [
            (None, false),
            (Some("info"), false),
            (Some("info,mxbridge_latency=debug"), true),
            (Some("mxbridge_latency"), true),
            (Some("warn, mxbridge_latency=trace"), true),
            (Some("mxbridge_latency=info"), false),
            (Some("mxbridge_latency_other=debug"), false),
            (Some("surface=debug"), false),
            (Some("debug"), true),
        ];
        for (value, want) in cases {
            assert_eq!(asks_for_latency(value), want, "{value:?}");
            assert_eq!(
                wanted(value),
                want && cfg!(feature = "latency"),
                "{value:?}"
            );
        }
    }

    /// The shape of matrix-sdk 0.18's `HttpClient::send`: an INFO span `send` with `uri`
    /// recorded after creation, and a DEBUG `Got response` inside it.
    fn sdk_request(uri: &str) {
        let span = tracing::info_span!(target: "matrix_sdk::http_client", "send", uri = tracing::field::Empty);
        let _entered = span.enter();
        span.record("uri", uri);
        tracing::debug!(target: "matrix_sdk::http_client", "Got response");
    }

    /// The shapes of matrix-sdk 0.18's `OlmMachine::receive_sync_changes` and the base client's
    /// `save_and_apply`: INFO spans of those names (`#[instrument(skip_all)]`) in their modules.
    #[test]
    fn the_sdks_crypto_and_state_store_parts_of_a_sync_are_clocked() {
        let subscriber = tracing_subscriber::registry().with(SyncClock);
        tracing::subscriber::with_default(subscriber, || {
            take_sdk_parts();
            // Other spans, and a clocked name in another module, are not clocked.
            drop(tracing::info_span!(target: "matrix_sdk_crypto::machine", "decrypt_room_event"));
            drop(tracing::info_span!(target: "matrix_sdk_base::client", "save_and_apply"));
            assert_eq!(take_sdk_parts(), [None, None]);
            let before = Instant::now();
            drop(tracing::info_span!(target: "matrix_sdk_crypto::machine", "receive_sync_changes"));
            let parts = take_sdk_parts();
            let took = parts[0].expect("crypto clocked");
            assert!(took <= before.elapsed(), "{took:?}");
            assert!(parts[1].is_none(), "{parts:?}");
            assert_eq!(take_sdk_parts(), [None, None], "taken once");
            drop(tracing::info_span!(
                target: "matrix_sdk_base::response_processors::changes",
                "save_and_apply"
            ));
            let parts = take_sdk_parts();
            assert!(parts[0].is_none() && parts[1].is_some(), "{parts:?}");
        });
    }

    /// The `(leg, us)` of every measurement logged while it is installed.
    #[derive(Clone, Default)]
    struct Legs(std::sync::Arc<Mutex<Vec<(String, u64)>>>);

    impl<S: Subscriber> Layer<S> for Legs {
        fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
            #[derive(Default)]
            struct Fields(String, u64);
            impl Visit for Fields {
                fn record_str(&mut self, field: &Field, value: &str) {
                    if field.name() == "leg" {
                        value.clone_into(&mut self.0);
                    }
                }
                fn record_u64(&mut self, field: &Field, value: u64) {
                    if field.name() == "us" {
                        self.1 = value;
                    }
                }
                fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
            }
            if event.metadata().target() == TARGET {
                let mut f = Fields::default();
                event.record(&mut f);
                self.0.lock().unwrap().push((f.0, f.1));
            }
        }
    }

    #[test]
    fn a_turns_sync_leg_is_split_between_the_sdk_and_the_surface() {
        let legs = Legs::default();
        let subscriber = tracing_subscriber::registry().with(legs.clone());
        tracing::subscriber::with_default(subscriber, || {
            let response = Instant::now();
            std::thread::sleep(Duration::from_millis(3));
            let handed = Instant::now();
            let id = "$split:example.org";
            arrived(
                [id],
                response,
                handed,
                [
                    Some(Duration::from_micros(700)),
                    Some(Duration::from_micros(400)),
                ],
            );
            std::thread::sleep(Duration::from_millis(2));
            journaled([id, "$never-arrived:example.org"]);
            std::thread::sleep(Duration::from_millis(1));
            sent_to_agent(id);
            sent_to_agent(id);
        });
        let got: HashMap<String, u64> = legs.0.lock().unwrap().iter().cloned().collect();
        assert_eq!(
            got.len(),
            7,
            "each leg once, the second send ignored: {got:?}"
        );
        assert_eq!(got["sdk_crypto"], 700);
        assert_eq!(got["sdk_state"], 400);
        assert!(got["sdk_sync"] >= 3000, "{got:?}");
        assert!(got["surface_sync"] >= 3000, "{got:?}");
        assert!(got["surface_journal"] >= 2000, "{got:?}");
        assert!(got["surface_lane"] >= 1000, "{got:?}");
        let own = got["surface_journal"] + got["surface_lane"];
        assert!(
            (own..=own + 1).contains(&got["surface_sync"]),
            "the surface's two parts make its whole: {got:?}"
        );
        // Each part is truncated to whole microseconds on its own.
        let parts = got["sdk_sync"] + got["surface_sync"];
        assert!(
            (parts..=parts + 1).contains(&got["sync_to_agent"]),
            "the two parts make the whole: {got:?}"
        );
    }

    #[test]
    fn a_sync_response_is_clocked_and_other_requests_are_not() {
        let subscriber = tracing_subscriber::registry().with(SyncClock);
        tracing::subscriber::with_default(subscriber, || {
            take_sync_response();
            sdk_request("http://127.0.0.1:8008/_matrix/client/v3/keys/query");
            sdk_request("http://127.0.0.1:8008/_matrix/client/v3/rooms/!r/send/m.room.message/t1");
            assert!(take_sync_response().is_none());
            let before = Instant::now();
            sdk_request("http://127.0.0.1:8008/_matrix/client/v3/sync");
            let got = take_sync_response().expect("clocked");
            assert!(got >= before);
            assert!(take_sync_response().is_none(), "taken once");
            // The same message outside a sync request's span, or another message inside one.
            tracing::debug!(target: "matrix_sdk::http_client", "Got response");
            let span = tracing::info_span!(target: "matrix_sdk::http_client", "send", uri = "http://h/_matrix/client/v3/sync");
            span.in_scope(|| tracing::debug!(target: "matrix_sdk::http_client", "Sending request"));
            assert!(take_sync_response().is_none());
        });
    }
}
