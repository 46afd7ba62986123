//! The agent binary: the command line and configuration (flags, environment, `--config` file),
//! logging, bind, run until SIGINT/SIGTERM; or `agent doctor`, the operator's checks.

use std::io::Write;
use std::process::ExitCode;

use agent::config::VARS;
use anyhow::Context;

const ABOUT: &str = "The agent side of mxbridge: one conversation per chat, tools confined to \
                     the workspace, a builtin or OpenAI-compatible brain.";

const SUBCOMMANDS: &[(&str, &str)] = &[
    (
        "doctor",
        "Checks the configuration, workspace, state and model server, one line per finding; \
         exit 0 when all are ok",
    ),
    (
        "import-state",
        "Moves AGENT_STATE_DIR's chats and memory into AGENT_DATABASE_URL; skips what is already \
         there, never overwrites newer data (exit 1 when something was refused)",
    ),
];

fn main() -> ExitCode {
    // The PDF helper: a child of the agent itself, limited, no runtime, no logging.
    if std::env::args_os().nth(1).as_deref() == Some(agent::perceive::pdf::HELPER_ARG.as_ref()) {
        return agent::perceive::pdf::helper_main();
    }
    // Our tools for an ACP agent: an MCP server on stdio that it starts (brain/acp/relay.rs).
    if std::env::args_os().nth(1).as_deref() == Some(agent::brain::acp::relay::RELAY_ARG.as_ref()) {
        return agent::brain::acp::relay::relay_main();
    }
    match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime.block_on(run()),
        Err(e) => {
            eprintln!("agent: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> ExitCode {
    let cmd = settings::command("agent", env!("CARGO_PKG_VERSION"), ABOUT, VARS, SUBCOMMANDS);
    let lookup = match settings::parse(cmd, VARS, std::env::args_os(), |k| std::env::var(k).ok()) {
        Ok(settings::Invocation::Run(l)) => l,
        Ok(settings::Invocation::Sub(name, l)) if name == "import-state" => {
            return import_state(|k| l.get(k)).await;
        }
        // `doctor`: its report is its output, so no logging is set up.
        Ok(settings::Invocation::Sub(_, l)) => {
            let report = agent::doctor::doctor(|k| l.get(k)).await;
            let mut stdout = std::io::stdout().lock();
            for finding in &report.findings {
                let _ = writeln!(stdout, "{finding}");
            }
            return ExitCode::from(report.exit_code);
        }
        Err(settings::CliError::Clap(e)) => e.exit(),
        Err(e) => return settings::refuse("agent", &e),
    };
    // `LOG_FORMAT=json`: one JSON object per line, for log collectors.
    agent::logging::init(agent::logging::wants_json(
        lookup.get("LOG_FORMAT").as_deref(),
    ));
    let config = match agent::Config::from_lookup(|k| lookup.get(k)) {
        Ok(c) => c,
        Err(e) => return settings::refuse("agent", &e),
    };
    if let Err(e) = serve(config).await {
        // One line naming the bad setting; no backtrace noise.
        eprintln!("agent: {}", one_line(&e));
        return exit_code(&e);
    }
    ExitCode::SUCCESS
}

/// `agent import-state`: the report on stdout, one line per refusal and the totals.
async fn import_state(get: impl Fn(&str) -> Option<String>) -> ExitCode {
    match agent::import::run(get).await {
        Ok(report) => {
            let mut stdout = std::io::stdout().lock();
            for line in report.lines() {
                let _ = writeln!(stdout, "{line}");
            }
            if report.refusals.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("agent import-state: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `e` and its causes on one line, each said once (a message that quotes its cause already is
/// not followed by it again).
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// 2 when the state cannot be used at start (the database cannot be reached or refuses this
/// agent, as for a bad setting); 1 for anything else.
fn exit_code(e: &anyhow::Error) -> ExitCode {
    use agent::server::RunError;
    use agent::state::StateError;
    match e.downcast_ref::<RunError>() {
        Some(RunError::State(StateError::Database(_))) => ExitCode::from(2),
        _ => ExitCode::FAILURE,
    }
}

async fn serve(config: agent::Config) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(config.bind)
        .await
        .with_context(|| format!("AGENT_BIND: cannot listen on {}", config.bind))?;

    let shutdown = daemon::on_signals().context("cannot watch SIGTERM and SIGINT")?;
    agent::run(listener, config, shutdown).await?;
    Ok(())
}
