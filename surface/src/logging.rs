//! Log set-up for the binary: `RUST_LOG` (or a quiet default for the SDK), no colour codes
//! off a terminal, a few library lines that are noise for an operator dropped ([`is_noise`]:
//! matrix-sdk's ERROR for every 404, a WARN per retry of a message whose room key is late, the
//! "own device deleted" WARN of a fresh login), and library events that carry a credential
//! dropped at every level ([`redact`]: the rule and writing layer both binaries share, from
//! the `daemon` crate).

pub use daemon::{redact, wants_json};

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

/// The filter when `RUST_LOG` is not set.
pub const DEFAULT_FILTER: &str = "info,matrix_sdk=warn,matrix_sdk_base=warn,matrix_sdk_crypto=warn,\
                                  matrix_sdk_crypto::backups=error";

/// Our crates: their events are exempt from [`redact`] (they keep secrets in `Secret`).
const OWN_CRATES: &[&str] = &["surface", "confine", "protocol"];

/// The credential filter the surface runs, whatever `RUST_LOG` says.
pub fn redaction() -> redact::Redact {
    redact::Redact::new(OWN_CRATES)
}

/// Installs the global subscriber: text, or one JSON object per line when `json`
/// ([`wants_json`] of `LOG_FORMAT`). `RUST_LOG` filters what is written; when it asks for the
/// benchmark's latency lines, [`crate::latency::SyncClock`] also watches matrix-sdk's HTTP
/// client (its own filter: nothing more is written).
pub fn init(json: bool) {
    let rust_log = std::env::var("RUST_LOG").ok();
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let clock = crate::latency::wanted(rust_log.as_deref());
    let ansi = !json && std::io::stdout().is_terminal();
    subscriber(filter, json, ansi, std::io::stdout, clock).init();
}

/// What [`init`] installs, writing to `writer`: one writing layer filtered by `filter`, whose
/// event format leaves out what the credential rule and [`is_noise`] drop (as a format, not a
/// filter that says no: see [`redact`] for the lines that cost).
pub fn subscriber<W>(
    filter: EnvFilter,
    json: bool,
    ansi: bool,
    writer: W,
    clock: bool,
) -> impl Subscriber + Send + Sync + 'static
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let redact = redaction();
    let keep = move |e: &Event<'_>| redact.allows(e) && Quiet::allows(e);
    let write = redact::writing_layer(json, ansi, writer, keep);
    let clock = clock.then(|| {
        crate::latency::SyncClock.with_filter(tracing_subscriber::filter::filter_fn(
            crate::latency::SyncClock::interested,
        ))
    });
    tracing_subscriber::registry()
        .with(write.with_filter(filter))
        .with(clock)
}

/// The library lines that are noise for an operator ([`is_noise`]).
#[derive(Debug, Clone, Copy)]
pub struct Quiet;

/// Set while this device is new: from a start with an empty crypto store to the first good
/// sync (see [`is_noise`]).
static NEW_DEVICE: AtomicBool = AtomicBool::new(false);

/// Says whether the bot's device is new (its keys not on the homeserver yet); the sync loop
/// clears it after the first good sync.
pub fn set_new_device(new: bool) {
    NEW_DEVICE.store(new, Ordering::Relaxed);
}

impl Quiet {
    /// Whether `event` may be written.
    pub fn allows(event: &Event<'_>) -> bool {
        let meta = event.metadata();
        if *meta.level() > Level::WARN || !meta.target().starts_with("matrix_sdk") {
            return true;
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        !is_noise(
            *meta.level(),
            meta.target(),
            &message.0,
            NEW_DEVICE.load(Ordering::Relaxed),
        )
    }
}

/// Whether a library line is noise (pure):
/// * matrix-sdk's ERROR for a request answered 404: it is logged before its caller decides that
///   "not found" is an expected answer (account data never written, an event the homeserver
///   does not hand out). Other failures keep their line.
/// * matrix-sdk-crypto's WARN "Failed to decrypt a room event": the surface tries a message
///   whose room key is late again every 2 s, and logs itself when the message starts waiting
///   (WARN), when it is decrypted (INFO) and when the wait is given up (WARN); one line per try
///   was 170 lines in 5.5 minutes for one message.
/// * matrix-sdk-crypto's WARN "Our own device might have been deleted" while the device is new
///   (`new_device`): the first key query of a fresh login can come back before this device's
///   keys are uploaded, and the SDK reads its absence as a deletion. Later, when it would mean
///   that someone deleted the bot's device, it is kept.
pub fn is_noise(level: Level, target: &str, message: &str, new_device: bool) -> bool {
    match level {
        Level::ERROR => {
            target.starts_with("matrix_sdk::http_client") && message.contains("status_code: 404")
        }
        Level::WARN if target.starts_with("matrix_sdk_crypto") => {
            message.starts_with("Failed to decrypt a room event")
                || (new_device && message.starts_with("Our own device might have been deleted"))
        }
        _ => false,
    }
}

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use daemon::Captured as Capture;

    /// What the surface writes under the default filter for `script`, each line without its
    /// timestamp.
    fn written(script: impl FnOnce()) -> Vec<String> {
        let out = Capture::default();
        let writer = out.clone();
        let filter = EnvFilter::new(DEFAULT_FILTER);
        let subscriber = subscriber(filter, false, false, move || writer.clone(), false);
        tracing::subscriber::with_default(subscriber, script);
        let text = out.text();
        text.lines()
            .map(|l| {
                l.split_once(' ')
                    .map_or(l, |(_, rest)| rest.trim_start())
                    .to_owned()
            })
            .collect()
    }

    #[test]
    fn every_line_of_ours_is_written_between_dropped_library_events() {
        let secret = "syt_c2VjcmV0_abcdef";
        let lines = written(|| {
            // Filtered out by level and carrying a credential: the pair that used to swallow
            // the next line of ours.
            tracing::debug!(target: "matrix_sdk::http_client", "sending request authorization: Bearer {secret}");
            tracing::warn!(target: "surface::ingest", sender = "@other-bot:hs", "bot loop: not answering another bot");
            tracing::trace!(target: "hyper::proto::h1", headers = ?[("Authorization", secret)], "encode");
            tracing::info!(target: "surface::lanes::effects", decision = "approve", "approval answered");
            // Kept by level, dropped for the credential.
            tracing::warn!(target: "matrix_sdk::client", "retrying with access_token={secret}");
            tracing::info!(target: "surface::agent_link", seq = 3, "answer received");
            // An SDK 404: dropped by its own rule.
            tracing::error!(target: "matrix_sdk::http_client", "Error while sending request: Api(Server(ClientApi(Error {{ status_code: 404, body: Standard {{ kind: NotFound }} }})))");
            tracing::info!(target: "surface::ingest", "edit applied to a waiting message");
            tracing::debug!(target: "matrix_sdk_crypto::machine", "access_token refreshed");
            tracing::info!(target: "surface::ingest", "redaction removed an inbox file");
            tracing::debug!(target: "matrix_sdk::sync", "quiet");
            // Once per retry of a message whose key is late: the surface says it once itself.
            tracing::warn!(target: "matrix_sdk_crypto::machine", "Failed to decrypt a room event: Missing room key");
            tracing::warn!(target: "surface::undecrypted", event_id = "$e", "content the bot cannot read");
            // A library line with nothing secret, at a level the filter keeps.
            tracing::warn!(target: "matrix_sdk::encryption", "key backup is disabled");
            tracing::debug!(target: "surface::lanes", "below the default level");
        });
        assert_eq!(
            lines,
            [
                "WARN surface::ingest: bot loop: not answering another bot sender=\"@other-bot:hs\"",
                "INFO surface::lanes::effects: approval answered decision=\"approve\"",
                "INFO surface::agent_link: answer received seq=3",
                "INFO surface::ingest: edit applied to a waiting message",
                "INFO surface::ingest: redaction removed an inbox file",
                "WARN surface::undecrypted: content the bot cannot read event_id=\"$e\"",
                "WARN matrix_sdk::encryption: key backup is disabled",
            ]
        );
    }

    #[test]
    fn noise_table() {
        use Level as L;
        let crypto = "matrix_sdk_crypto::machine";
        let identities = "matrix_sdk_crypto::identities::manager";
        let http = "matrix_sdk::http_client";
        let deleted = "Our own device might have been deleted";
        let cases: &[(Level, &str, &str, bool, bool)] = &[
            (
                L::ERROR,
                http,
                "Error: Api(... status_code: 404 ...)",
                false,
                true,
            ),
            (
                L::ERROR,
                http,
                "Error: Api(... status_code: 500 ...)",
                false,
                false,
            ),
            (L::WARN, http, "slow: status_code: 404", false, false),
            (
                L::ERROR,
                "surface::send",
                "refused: status_code: 404",
                false,
                false,
            ),
            (
                L::WARN,
                crypto,
                "Failed to decrypt a room event: Missing room key",
                false,
                true,
            ),
            (
                L::ERROR,
                crypto,
                "Failed to decrypt a room event: broken",
                false,
                false,
            ),
            (L::WARN, identities, deleted, true, true),
            (L::WARN, identities, deleted, false, false),
            (
                L::WARN,
                crypto,
                "Received a room key with an unsupported algorithm",
                true,
                false,
            ),
        ];
        for &(level, target, message, new_device, noise) in cases {
            assert_eq!(
                is_noise(level, target, message, new_device),
                noise,
                "{level} {target} {message:?} new_device={new_device}"
            );
        }
    }

    #[test]
    fn sdk_404s_are_dropped_and_other_errors_kept() {
        let e404 = "Api(Server(ClientApi(Error { status_code: 404, body: Standard { kind: NotFound, message: \"Account data not found\" } })))";
        let e500 = "Api(Server(ClientApi(Error { status_code: 500, body: Standard { kind: Unknown, message: \"Internal error\" } })))";
        let text = written(|| {
            tracing::error!(target: "matrix_sdk::http_client", "Error while sending request: {e404}");
            tracing::error!(target: "matrix_sdk::http_client", "Error while sending request: {e500}");
            tracing::error!(target: "surface::send", "post refused: {e404}");
            tracing::warn!(target: "matrix_sdk::http_client", "slow: {e404}");
        })
        .join("\n");
        let sdk_404 = text
            .lines()
            .any(|l| l.contains("ERROR matrix_sdk::http_client") && l.contains("404"));
        assert!(!sdk_404, "{text}");
        assert!(text.contains("Internal error"), "{text}");
        assert!(text.contains("post refused"), "{text}");
        assert!(text.contains("slow"), "{text}");
    }
}
