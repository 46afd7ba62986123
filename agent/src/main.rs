//! The agent binary: configuration, logging, bind, run until SIGINT/SIGTERM.

use std::io::IsTerminal;

use anyhow::Context;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

// The surface's credential filter, the same file: the agent sees the bearer token in every
// upgrade request and sends the API key to the model server.
#[path = "../../surface/src/logging/redact.rs"]
mod redact;

/// Our crates: their events are exempt from [`redact`] (they keep secrets in `Secret`).
const OWN_CRATES: &[&str] = &["agent", "confine", "protocol"];

#[tokio::main]
async fn main() {
    // `LOG_FORMAT=json`: one JSON object per line, for log collectors.
    let json = std::env::var("LOG_FORMAT").is_ok_and(|f| f.trim().eq_ignore_ascii_case("json"));
    tracing_subscriber::registry()
        .with(redact::Redact::new(OWN_CRATES))
        .with(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .with(json.then(|| tracing_subscriber::fmt::layer().json()))
        .with(
            (!json).then(|| {
                tracing_subscriber::fmt::layer().with_ansi(std::io::stdout().is_terminal())
            }),
        )
        .init();
    if let Err(e) = serve().await {
        // One line naming the bad setting; no backtrace noise.
        eprintln!("agent: {e:#}");
        std::process::exit(1);
    }
}

async fn serve() -> anyhow::Result<()> {
    let config = agent::Config::from_env().context("invalid configuration")?;
    let listener = tokio::net::TcpListener::bind(config.bind)
        .await
        .with_context(|| format!("AGENT_BIND: cannot listen on {}", config.bind))?;

    let shutdown = CancellationToken::new();
    let mut sigterm = signal(SignalKind::terminate()).context("cannot watch SIGTERM")?;
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
                _ = sigterm.recv() => tracing::info!("SIGTERM received"),
            }
            shutdown.cancel();
        }
    });
    agent::run(listener, config, shutdown).await?;
    Ok(())
}
