//! The `surface` binary: the command line and configuration (flags, environment, `--config`
//! file), logs, signals; the program lives in the library (`surface::run`).

use std::process::ExitCode;

use surface::config::{Config, VARS};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

const ABOUT: &str = "The Matrix side of mxbridge: syncs the bot's rooms, journals every \
                     message, hands turns to the agent and posts its answers and files.";

#[tokio::main]
async fn main() -> ExitCode {
    let cmd = settings::command("surface", env!("CARGO_PKG_VERSION"), ABOUT, VARS, &[]);
    let env = |k: &str| std::env::var(k).ok();
    let lookup = match settings::parse(cmd, VARS, std::env::args_os(), env) {
        Ok(settings::Invocation::Run(l) | settings::Invocation::Sub(_, l)) => l,
        Err(settings::CliError::Clap(e)) => e.exit(),
        Err(e) => return settings::refuse("surface", &e),
    };
    surface::logging::init(surface::logging::wants_json(
        lookup.get("LOG_FORMAT").as_deref(),
    ));
    // PATH is not a setting, but where ffmpeg is looked for.
    let config =
        match Config::from_lookup(|k| lookup.get(k).or_else(|| env(k).filter(|_| k == "PATH"))) {
            Ok(c) => c,
            Err(e) => return settings::refuse("surface", &e),
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
