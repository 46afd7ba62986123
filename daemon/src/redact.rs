//! Keeps credentials out of the log at every level, whatever `RUST_LOG` says: library events
//! that carry one are never written.
//!
//! At TRACE, tungstenite logs the whole WebSocket upgrade request, `Authorization: Bearer …`
//! included, and other HTTP libraries may print headers, URLs with `access_token=` or request
//! bodies in the same way. We cannot rewrite those lines (a `Layer` may only drop an event), and
//! we cannot know every library's format, so any event from outside our own crates whose field
//! names or values mention a credential is dropped. Because this is a decision on the event and
//! not a level, no `RUST_LOG` brings those events back.
//!
//! It is applied where the line is written ([`Screened`], the writing layer's event format),
//! not as an `event_enabled` filter: in tracing-subscriber 0.3, an `event_enabled` that says no
//! (a global layer's, or a per-layer filter's) leaves that thread's per-layer filter state
//! set when no layer takes the event, and the next event from a callsite that is always
//! enabled is skipped (tokio-rs/tracing#2519's class of bug: our own lines vanished after a
//! dropped library event). Our own crates are exempt: they hold secrets
//! in `protocol::Secret`, whose `Debug` is `[redacted]`, and a config dump that merely names an
//! `access_token` field must not vanish.
//!
//! Both binaries run this rule (`Redact::new` with their own crates' names) in the one layer
//! that writes their log ([`writing_layer`]).

use std::fmt::Write as _;

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, MakeWriter};
use tracing_subscriber::layer::Layer;
use tracing_subscriber::registry::LookupSpan;

/// Lower-case fragments that mark a credential in a field name or value.
const MARKERS: &[&str] = &[
    "authorization",
    "bearer ",
    "access_token",
    "access-token",
    "api_key",
    "api-key",
    "password",
];

/// Drops every event from outside `own` crates that mentions a credential.
#[derive(Debug, Clone, Copy)]
pub struct Redact {
    own: &'static [&'static str],
}

impl Redact {
    /// Exempts events whose target is one of the `own` crates (or a module in one).
    pub const fn new(own: &'static [&'static str]) -> Self {
        Self { own }
    }

    fn is_own(&self, target: &str) -> bool {
        self.own.iter().any(|c| {
            target
                .strip_prefix(c)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with("::"))
        })
    }

    /// Whether `event` may be written.
    pub fn allows(&self, event: &Event<'_>) -> bool {
        // Events bridged from the `log` crate have the target "log" here (the real one is a
        // field), so they are never mistaken for our own.
        if self.is_own(event.metadata().target()) {
            return true;
        }
        let mut scan = Scan::default();
        event.record(&mut scan);
        !scan.found
    }
}

/// An event format that writes only the events `keep` lets through, formatted by `inner`; the
/// others leave no line (see the module documentation for why not a filter).
#[derive(Debug, Clone)]
pub struct Screened<F, K> {
    inner: F,
    keep: K,
}

impl<F, K> Screened<F, K> {
    /// `inner`, screened by `keep`.
    pub const fn new(inner: F, keep: K) -> Self {
        Self { inner, keep }
    }
}

impl<S, N, F, K> FormatEvent<S, N> for Screened<F, K>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
    K: Fn(&Event<'_>) -> bool,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        if (self.keep)(event) {
            self.inner.format_event(ctx, writer, event)
        } else {
            Ok(())
        }
    }
}

/// The writing layer both binaries use: text (colours when `ansi`) or one JSON object per line
/// (`json`) to `writer`, leaving out every event `keep` refuses ([`Screened`]).
pub fn writing_layer<S, W, K>(
    json: bool,
    ansi: bool,
    writer: W,
    keep: K,
) -> Box<dyn Layer<S> + Send + Sync>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
    K: Fn(&Event<'_>) -> bool + Send + Sync + 'static,
{
    if json {
        tracing_subscriber::fmt::layer()
            .json()
            .event_format(Screened::new(
                tracing_subscriber::fmt::format().json(),
                keep,
            ))
            .with_writer(writer)
            .boxed()
    } else {
        tracing_subscriber::fmt::layer()
            .with_ansi(ansi)
            .event_format(Screened::new(tracing_subscriber::fmt::format(), keep))
            .with_writer(writer)
            .boxed()
    }
}

/// Whether `text` mentions a credential (pure): a marker, or a URL with a password in it
/// (`scheme://user:password@host`, as database URLs carry them).
pub fn mentions_credential(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    MARKERS.iter().any(|m| lower.contains(m)) || has_url_password(text)
}

/// Whether some `://` in `text` is followed by `user:password@` before the host ends.
fn has_url_password(text: &str) -> bool {
    text.match_indices("://").any(|(at, _)| {
        let rest = &text[at + 3..];
        let authority = rest
            .split(|c: char| c == '/' || c == '?' || c == '#' || c.is_whitespace())
            .next()
            .unwrap_or_default();
        authority
            .rsplit_once('@')
            .is_some_and(|(userinfo, _)| userinfo.contains(':'))
    })
}

#[derive(Default)]
struct Scan {
    found: bool,
    buf: String,
}

impl Visit for Scan {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.found |= mentions_credential(field.name()) || mentions_credential(value);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if self.found {
            return;
        }
        self.buf.clear();
        let _ = write!(self.buf, "{value:?}");
        self.found = mentions_credential(field.name()) || mentions_credential(&self.buf);
    }
}

#[cfg(test)]
mod tests {
    use tracing_subscriber::layer::{Layer, SubscriberExt};

    use super::*;
    use crate::Captured as Capture;

    #[test]
    fn library_credentials_never_reach_the_output_even_at_trace() {
        let out = Capture::default();
        let writer = out.clone();
        let redact = Redact::new(&["own_crate"]);
        let subscriber = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .event_format(Screened::new(
                    tracing_subscriber::fmt::format(),
                    move |e: &Event<'_>| redact.allows(e),
                ))
                .with_writer(move || writer.clone())
                // What an operator might set: everything.
                .with_filter(tracing_subscriber::EnvFilter::new("trace")),
        );
        tracing::subscriber::with_default(subscriber, || {
            let request =
                "GET /chat HTTP/1.1\r\nhost: agent\r\nauthorization: Bearer secret123\r\n\r\n";
            tracing::trace!(target: "tungstenite::handshake::client", "Request: {request:?}");
            tracing::trace!(target: "hyper::proto::h1", headers = ?[("Authorization", "Basic secret123")], "encode");
            tracing::debug!(target: "reqwest::connect", authorization = "secret123");
            tracing::trace!(target: "matrix_sdk::http_client", uri = "https://hs/_matrix?access_token=secret123");
            tracing::error!(target: "matrix_sdk::client", "login failed: Password {{ password: \"secret123\" }}");
            tracing::trace!(target: "tungstenite::handshake::client", "Client handshake initiated.");
            tracing::info!(target: "own_crate::config", config = "Token { access_token: [redacted] }", "starting");
        });
        let text = out.text();
        assert!(!text.contains("secret123"), "{text}");
        assert!(text.contains("Client handshake initiated."), "{text}");
        assert!(text.contains("starting"), "own events are kept: {text}");
    }

    #[test]
    fn urls_with_a_password_count_as_credentials() {
        let cases = [
            ("postgres://mxbridge:s3cret@db:5432/x", true),
            (
                "connecting to postgresql://u:p@h/db?sslmode=require now",
                true,
            ),
            ("postgres://mxbridge@db/x", false),
            ("https://example.org:8448/path", false),
            ("http://[::1]:8080/", false),
            ("mail me: a@b.c", false),
        ];
        for (text, want) in cases {
            assert_eq!(mentions_credential(text), want, "{text}");
        }
    }

    #[test]
    fn markers_are_case_insensitive() {
        assert!(mentions_credential("AUTHORIZATION: x"));
        assert!(mentions_credential("bearer abc"));
        assert!(mentions_credential("X-Api-Key: k"));
        assert!(!mentions_credential("Client handshake done."));
        assert!(!mentions_credential("unauthorized"));
    }
}
