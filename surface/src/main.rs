//! The `surface` binary: the command line and configuration (flags, environment, `--config`
//! file), logs, signals; the program lives in the library (`surface::run`).

use std::process::ExitCode;

use settings::clap::{Arg, Command};
use surface::config::{Config, VARS};
use tokio_util::sync::CancellationToken;

const ABOUT: &str = "The Matrix side of mxbridge: syncs the bot's rooms, journals every \
                     message, hands turns to the agent and posts its answers and files.";

#[tokio::main]
async fn main() -> ExitCode {
    let cmd = settings::command("surface", env!("CARGO_PKG_VERSION"), ABOUT, VARS, &[])
        .subcommand(doctor_command());
    let env = |k: &str| std::env::var(k).ok();
    let (doctor, lookup) = match settings::parse(cmd, VARS, std::env::args_os(), env) {
        Ok(settings::Invocation::Run(l)) => (false, l),
        Ok(settings::Invocation::Sub(_, l)) => (true, l),
        Err(settings::CliError::Clap(e)) => e.exit(),
        Err(e) => return settings::refuse("surface", &e),
    };
    // PATH is not a setting, but where ffmpeg is looked for.
    let config = Config::from_lookup(|k| lookup.get(k).or_else(|| env(k).filter(|_| k == "PATH")));
    if doctor {
        return run_doctor(config, lookup.arg("room"), lookup.arg("sender")).await;
    }
    surface::logging::init(surface::logging::wants_json(
        lookup.get("LOG_FORMAT").as_deref(),
    ));
    let config = match config {
        Ok(c) => c,
        Err(e) => return settings::refuse("surface", &e),
    };
    // Without signals the surface still runs; it just cannot be stopped gracefully.
    let shutdown = daemon::on_signals().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "cannot watch SIGTERM and SIGINT");
        CancellationToken::new()
    });
    match surface::run(config, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "surface failed");
            ExitCode::FAILURE
        }
    }
}

fn doctor_command() -> Command {
    Command::new("doctor")
        .about(
            "Checks the configuration, homeserver, login, rooms, encryption, agent link, \
             workspace and journal, one line per finding, and with --room says whether a \
             message there would be answered; exit 0 when nothing fails, 1 otherwise",
        )
        .arg(
            Arg::new("room")
                .long("room")
                .value_name("ROOM_ID")
                .help("A room to explain: joined? allowed? encrypted? queued or parked messages?"),
        )
        .arg(
            Arg::new("sender")
                .long("sender")
                .value_name("USER_ID")
                .help("With --room: whose message to judge (default: the first other member)"),
        )
}

/// `surface doctor`: findings on stdout, one per line.
async fn run_doctor(
    config: Result<Config, settings::Problems<surface::config::ConfigError>>,
    room: Option<&str>,
    sender: Option<&str>,
) -> ExitCode {
    use std::io::Write;
    // The report is the program's output (stdout), not a log.
    let mut out = std::io::stdout();
    let config = match config {
        Ok(c) => c,
        Err(problems) => {
            for p in problems.list() {
                let _ = writeln!(out, "FAIL  config: {p}");
            }
            return ExitCode::from(settings::CONFIG_EXIT);
        }
    };
    let findings = surface::doctor::examine(&config, room, sender).await;
    for f in &findings {
        let _ = writeln!(out, "{f}");
    }
    ExitCode::from(surface::doctor::exit_code(&findings))
}
