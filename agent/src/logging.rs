//! Log set-up for the binary: `RUST_LOG` (default [`DEFAULT_FILTER`]), text or JSON lines, no colour codes
//! off a terminal, and library events that carry a credential dropped at every level
//! ([`redact`]: the rule and writing layer both binaries share, from the `daemon` crate).

use tracing::Subscriber;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::{Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

// The agent sees the bearer token in every upgrade request and sends the API key to the model
// server.
pub use daemon::{redact, wants_json};

/// The filter when `RUST_LOG` is not set: `info`, but the MCP SDK (rmcp) only from `warn`,
/// since it logs every message an MCP server sends at `info` (a server would decide how much
/// the agent logs).
pub const DEFAULT_FILTER: &str = "info,rmcp=warn";

/// Our crates: their events are exempt from [`redact`] (they keep secrets in `Secret`).
const OWN_CRATES: &[&str] = &["agent", "confine", "protocol"];

/// Installs the global subscriber: text, or one JSON object per line when `json`.
pub fn init(json: bool) {
    use std::io::IsTerminal;
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let ansi = !json && std::io::stdout().is_terminal();
    subscriber(filter, json, ansi, std::io::stdout).init();
}

/// What [`init`] installs, writing to `writer`: one writing layer filtered by `filter`, whose
/// event format leaves out what the credential rule drops (a format, not a filter that says
/// no: see [`redact`] for the lines that cost).
pub fn subscriber<W>(
    filter: EnvFilter,
    json: bool,
    ansi: bool,
    writer: W,
) -> impl Subscriber + Send + Sync + 'static
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let rule = redact::Redact::new(OWN_CRATES);
    let write = redact::writing_layer(json, ansi, writer, move |e: &tracing::Event<'_>| {
        rule.allows(e)
    });
    tracing_subscriber::registry().with(write.with_filter(filter))
}

#[cfg(test)]
mod tests {
    use super::*;
    use daemon::Captured as Capture;

    #[test]
    fn every_line_of_ours_is_written_between_dropped_library_events() {
        let out = Capture::default();
        let writer = out.clone();
        let filter = EnvFilter::new(DEFAULT_FILTER);
        let subscriber = subscriber(filter, false, false, move || writer.clone());
        tracing::subscriber::with_default(subscriber, || {
            let key = "sk-abcdef123456";
            tracing::trace!(target: "tungstenite::handshake::server", "Request: authorization: Bearer {key}");
            tracing::info!(target: "agent::session", seq = 1, "turn admitted");
            tracing::debug!(target: "reqwest::connect", api_key = key, "connecting");
            tracing::info!(target: "agent::brain::openai", outcome = "ok", "model answered");
            tracing::warn!(target: "hyper_util::client", "retrying, Authorization: Bearer {key}");
            tracing::info!(target: "agent::session", seq = 1, "turn ended");
            tracing::debug!(target: "agent::tools", "below the default level");
            tracing::info!(target: "rmcp::service", "received notification");
            tracing::warn!(target: "rmcp::transport", "line too long");
        });
        let text = out.text();
        let lines: Vec<&str> = text
            .lines()
            .map(|l| l.split_once(' ').map_or(l, |(_, rest)| rest.trim_start()))
            .collect();
        assert_eq!(
            lines,
            [
                "INFO agent::session: turn admitted seq=1",
                "INFO agent::brain::openai: model answered outcome=\"ok\"",
                "INFO agent::session: turn ended seq=1",
                "WARN rmcp::transport: line too long",
            ]
        );
    }
}
