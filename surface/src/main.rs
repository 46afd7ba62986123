//! The `surface` binary: configuration from the environment, logs, signals; the program lives
//! in the library (`surface::run`).

use std::io::IsTerminal;
use std::process::ExitCode;

use surface::config::Config;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> ExitCode {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        // The bot keeps no server-side key backup; the SDK warns about that every 30 s.
        EnvFilter::new(
            "info,matrix_sdk=warn,matrix_sdk_base=warn,matrix_sdk_crypto=warn,\
             matrix_sdk_crypto::backups=error",
        )
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stdout().is_terminal())
        .init();

    let config = match Config::from_env() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("configuration error: {e}");
            return ExitCode::from(2);
        }
    };
    let shutdown = CancellationToken::new();
    let token = shutdown.clone();
    tokio::spawn(async move {
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return;
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
        token.cancel();
    });
    match surface::run(config, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "surface failed");
            ExitCode::FAILURE
        }
    }
}
