//! Log set-up for the binary: `RUST_LOG` (or a quiet default for the SDK), no colour codes
//! off a terminal, and matrix-sdk's ERROR line for every 404 dropped: the SDK logs each failed
//! request before its caller decides that "not found" is an expected answer (account data
//! never written, an event the homeserver does not hand out), so operators read breakage
//! where there is none. Other failures keep their ERROR line. Library events that carry a
//! credential are dropped at every level ([`redact`]).

pub mod redact;

use std::io::IsTerminal;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

/// The filter when `RUST_LOG` is not set.
const DEFAULT_FILTER: &str = "info,matrix_sdk=warn,matrix_sdk_base=warn,matrix_sdk_crypto=warn,\
                              matrix_sdk_crypto::backups=error";

/// Our crates: their events are exempt from [`redact`] (they keep secrets in `Secret`).
const OWN_CRATES: &[&str] = &["surface", "confine", "protocol"];

/// The credential filter the surface runs, whatever `RUST_LOG` says.
pub fn redaction() -> redact::Redact {
    redact::Redact::new(OWN_CRATES)
}

/// Whether `LOG_FORMAT` asks for JSON lines (`json`; anything else, or nothing, is text).
pub fn wants_json(format: Option<&str>) -> bool {
    format.is_some_and(|f| f.trim().eq_ignore_ascii_case("json"))
}

/// Installs the global subscriber: text, or one JSON object per line when `json`
/// ([`wants_json`] of `LOG_FORMAT`). `RUST_LOG` filters what is written; when it asks for the
/// benchmark's latency lines, [`crate::latency::SyncClock`] also watches matrix-sdk's HTTP
/// client (its own filter: nothing more is written).
pub fn init(json: bool) {
    let rust_log = std::env::var("RUST_LOG").ok();
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let write = if json {
        tracing_subscriber::fmt::layer().json().boxed()
    } else {
        tracing_subscriber::fmt::layer()
            .with_ansi(std::io::stdout().is_terminal())
            .boxed()
    };
    let clock = crate::latency::wanted(rust_log.as_deref()).then(|| {
        crate::latency::SyncClock.with_filter(tracing_subscriber::filter::filter_fn(
            crate::latency::SyncClock::interested,
        ))
    });
    tracing_subscriber::registry()
        .with(redaction())
        .with(QuietNotFound)
        .with(write.with_filter(filter))
        .with(clock)
        .init();
}

/// Drops matrix-sdk's request-failure ERROR events that report a 404.
#[derive(Debug, Clone, Copy)]
pub struct QuietNotFound;

impl<S: Subscriber> Layer<S> for QuietNotFound {
    fn event_enabled(&self, event: &Event<'_>, _ctx: Context<'_, S>) -> bool {
        let meta = event.metadata();
        if *meta.level() != Level::ERROR || !meta.target().starts_with("matrix_sdk::http_client") {
            return true;
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        !is_not_found(&message.0)
    }
}

/// Whether the SDK's failure text is a 404 (pure).
pub fn is_not_found(text: &str) -> bool {
    text.contains("status_code: 404")
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
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Capture {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn sdk_404s_are_dropped_and_other_errors_kept() {
        let out = Capture::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::registry().with(QuietNotFound).with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(move || writer.clone()),
        );
        tracing::subscriber::with_default(subscriber, || {
            let e404 = "Api(Server(ClientApi(Error { status_code: 404, body: Standard { kind: NotFound, message: \"Account data not found\" } })))";
            let e500 = "Api(Server(ClientApi(Error { status_code: 500, body: Standard { kind: Unknown, message: \"Internal error\" } })))";
            tracing::error!(target: "matrix_sdk::http_client", "Error while sending request: {e404}");
            tracing::error!(target: "matrix_sdk::http_client", "Error while sending request: {e500}");
            tracing::error!(target: "surface::send", "post refused: {e404}");
            tracing::warn!(target: "matrix_sdk::http_client", "slow: {e404}");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let sdk_404 = text
            .lines()
            .any(|l| l.contains("ERROR matrix_sdk::http_client") && l.contains("404"));
        assert!(!sdk_404, "{text}");
        assert!(text.contains("Internal error"), "{text}");
        assert!(text.contains("post refused"), "{text}");
        assert!(text.contains("slow"), "{text}");
    }
}
