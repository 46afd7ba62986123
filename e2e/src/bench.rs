//! The benchmark (`bench` binary, `scripts/bench.sh`): every figure next to a comparator
//! measured in the same run — the machine's hashing and disk, big files in and out next to
//! curl, the surface's own latency, reply latency and throughput next to an echo bot — over
//! several runs, printed as a table and written as JSON. Targets are printed as PASS/MISS and
//! never fail the process; only a measurement that cannot be taken does.

mod acp;
mod conversation;
mod cpu;
mod curl;
pub mod echo;
mod figures;
mod hints;
mod legs;
mod machine;
mod media;
pub mod perceive;
mod quota;
mod report;
mod rss;
mod setup;
mod state;
mod stats;
mod transfer;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde::Serialize;

pub use report::Report;

use crate::Homeserver;
use figures::{Fig, Leg, RunFigures, Sample, Stat};

/// Command line of the `bench` binary.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "bench",
    about = "Benchmark the bridge against a real Synapse (E2E_HOMESERVER_URL etc., as set by \
             `scripts/synapse.sh start`), each figure next to a comparator from the same run."
)]
pub struct Args {
    /// Tiny sizes and one run, to check the instrument works (CI). Explicit flags still win.
    #[arg(long)]
    pub smoke: bool,
    /// Runs; each figure is reported as min/median/max over them [default: 3].
    #[arg(long, env = "BENCH_RUNS")]
    pub runs: Option<usize>,
    /// Size of the big file sent each way, MiB [default: 1024].
    #[arg(long)]
    pub size_mib: Option<u64>,
    /// Messages per throughput burst [default: 100].
    #[arg(long)]
    pub messages: Option<usize>,
    /// Rooms the second burst is spread over [default: 20].
    #[arg(long)]
    pub rooms: Option<usize>,
    /// Replies per reply-latency series [default: 10].
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Where the JSON report goes.
    #[arg(long, default_value = "bench.json")]
    pub out: PathBuf,
    /// Measure only these phases (repeat the flag, or separate with commas) [default: all].
    /// For a focused experiment: the figures of the other phases are missing from the report.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Phase>,
    /// (internal) Prepare this picture as the agent does for a vision model, and exit: the
    /// `perceive` phase measures it in a process of its own.
    #[arg(long, hide = true, requires = "prepared_out")]
    pub prepare_image: Option<PathBuf>,
    /// (internal) Where `--prepare-image` writes the prepared picture.
    #[arg(long, hide = true)]
    pub prepared_out: Option<PathBuf>,
}

/// A part of one run, for `--only`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Reply latency next to the echo bot, and the surface's own legs.
    Latency,
    /// Messages per second in one room and over `--rooms` rooms.
    Throughput,
    /// The big file into the bot's inbox, plain and encrypted.
    Inbound,
    /// The big file out of the agent's folder, plain and encrypted.
    Outbound,
    /// Preparing a 12-megapixel photo for a vision model, next to ImageMagick.
    Perceive,
    /// Voice messages to their transcript: the bridge's own time.
    Hear,
    /// The agent's state in PostgreSQL next to the file store: admission to `ack`, turns per
    /// second with one and three agents (needs `MXBRIDGE_TEST_DATABASE_URL`).
    State,
    /// The ACP brain's own latency into and out of an ACP agent, next to the builtin brain.
    Acp,
}

/// What one benchmark measures, after `--smoke` and the defaults.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sizes {
    /// Runs.
    pub runs: usize,
    /// Big file, MiB.
    pub size_mib: u64,
    /// Messages per burst.
    pub messages: usize,
    /// Rooms of the spread burst.
    pub rooms: usize,
    /// Replies per latency series.
    pub rounds: usize,
    /// The pause before each paced message, ms.
    pub pause_ms: u64,
    /// SHA-256 buffer, MiB.
    pub sha_mib: usize,
    /// Sequential write, MiB.
    pub seq_write_mib: usize,
    /// 4 KiB write + fsync rounds.
    pub fsyncs: usize,
    /// Whether `--smoke` chose the defaults.
    pub smoke: bool,
    /// The phases measured (all unless `--only` chose).
    pub phases: Vec<Phase>,
    /// The pause as a duration (`pause_ms` in the JSON).
    #[serde(skip)]
    pub pause: Duration,
}

impl Sizes {
    /// The sizes `args` ask for: explicit flags, else the smoke or full defaults.
    pub fn resolve(args: &Args) -> Self {
        let smoke = args.smoke;
        let pick = |flag: Option<usize>, full: usize, tiny: usize| {
            flag.unwrap_or(if smoke { tiny } else { full }).max(1)
        };
        let pause = Duration::from_secs(1);
        Self {
            runs: pick(args.runs, 3, 1),
            size_mib: args.size_mib.unwrap_or(if smoke { 2 } else { 1024 }).max(1),
            messages: pick(args.messages, 100, 10),
            rooms: pick(args.rooms, 20, 2),
            rounds: pick(args.rounds, 25, 3),
            pause_ms: pause.as_millis() as u64,
            sha_mib: if smoke { 32 } else { 256 },
            seq_write_mib: if smoke { 16 } else { 256 },
            fsyncs: 200,
            smoke,
            phases: if args.only.is_empty() {
                vec![
                    Phase::Latency,
                    Phase::Throughput,
                    Phase::Inbound,
                    Phase::Outbound,
                    Phase::Perceive,
                    Phase::Hear,
                    Phase::State,
                    Phase::Acp,
                ]
            } else {
                args.only.clone()
            },
            pause,
        }
    }
}

#[cfg(test)]
impl Args {
    /// No flags at all.
    pub(crate) fn default_for_tests() -> Self {
        Self {
            smoke: false,
            runs: None,
            size_mib: None,
            messages: None,
            rooms: None,
            rounds: None,
            out: "bench.json".into(),
            only: Vec::new(),
            prepare_image: None,
            prepared_out: None,
        }
    }
}

/// Prints a progress line to stderr (stdout is the table).
pub(crate) fn note(what: &str) {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = START.get_or_init(Instant::now);
    eprintln!("[bench {:>6.1}s] {what}", start.elapsed().as_secs_f64());
}

pub(crate) use crate::poll;

/// Runs the benchmark against the homeserver of the environment.
pub async fn run(args: &Args) -> Result<Report> {
    let started = Instant::now();
    let sizes = Sizes::resolve(args);
    for var in [
        "E2E_HOMESERVER_URL",
        "E2E_SERVER_NAME",
        "E2E_REGISTRATION_SECRET",
    ] {
        if std::env::var_os(var).is_none() {
            bail!(
                "{var} is not set: start Synapse with `scripts/synapse.sh start DIR PORT` and source its output, or use scripts/bench.sh"
            );
        }
    }
    let hs = Homeserver::from_env();
    note(&format!("sizes: {sizes:?}"));
    let mut runs = Vec::with_capacity(sizes.runs);
    for i in 0..sizes.runs {
        note(&format!("run {} of {}", i + 1, sizes.runs));
        runs.push(run_once(&hs, &sizes, i as u64 + 1).await?);
    }
    Ok(Report {
        machine: machine::MachineInfo::read(),
        figures: report::rows(&runs, &sizes),
        elapsed_s: started.elapsed().as_secs_f64(),
        sizes,
    })
}

/// One run on a fresh stack.
async fn run_once(hs: &Homeserver, sizes: &Sizes, seed: u64) -> Result<RunFigures> {
    let mut out = RunFigures::new();
    note("machine: SHA-256, fsync, sequential write");
    out.extend(
        machine::measure(machine::MachineSizes {
            sha_mib: sizes.sha_mib,
            seq_mib: sizes.seq_write_mib,
            fsyncs: sizes.fsyncs,
        })
        .await?,
    );
    let wants = |p: Phase| sizes.phases.contains(&p);
    if wants(Phase::Perceive) {
        // 12 megapixels, as a phone camera takes them (a tenth of that in the smoke run).
        let (w, h) = if sizes.smoke {
            (1200, 900)
        } else {
            (4000, 3000)
        };
        note(&format!(
            "preparing a {w}x{h} photo for a vision model, and ImageMagick"
        ));
        out.extend(perceive::measure(w, h)?);
    }
    if wants(Phase::State) {
        match std::env::var("MXBRIDGE_TEST_DATABASE_URL") {
            Ok(_) => {
                let (chats, per_chat) = if sizes.smoke { (4, 10) } else { (12, 400) };
                note(&format!(
                    "agent state: {chats} chats x {per_chat} turns on the file store, \
                     PostgreSQL with 1 agent and with 3"
                ));
                out.extend(state::measure(chats, per_chat).await?);
            }
            Err(_) => note("agent state: skipped, MXBRIDGE_TEST_DATABASE_URL is not set"),
        }
    }
    if wants(Phase::Acp) {
        let turns = if sizes.smoke { 10 } else { 200 };
        note(&format!(
            "ACP brain: {turns} turns through an ACP agent and through the builtin brain"
        ));
        out.extend(acp::measure(turns).await?);
    }
    if sizes
        .phases
        .iter()
        .all(|p| matches!(p, Phase::Perceive | Phase::State | Phase::Acp))
    {
        return Ok(out);
    }
    note("starting agent, surface, users, echo bot");
    let s = setup::Setup::start(hs, sizes).await?;
    let media = media::Media::new(&hs.url, &s.user)?;
    if let Some(limit) = media.upload_limit().await?
        && limit < sizes.size_mib * 1024 * 1024 + (1 << 20)
    {
        bail!(
            "the homeserver takes uploads up to {} MiB, less than --size-mib {} (scripts/bench.sh \
             raises Synapse's max_upload_size)",
            limit >> 20,
            sizes.size_mib
        );
    }
    if wants(Phase::Latency) {
        note("reply latency");
        // The surface's legs are taken from this phase only: later phases queue messages on
        // purpose (a burst waits for the turns before it), which is not the surface's own time.
        let before = s.stack.surface.log().len();
        out.extend(conversation::reply_latency(&s, sizes).await?);
        let legs_log = s
            .stack
            .surface
            .log()
            .get(before..)
            .unwrap_or_default()
            .to_owned();
        out.extend(surface_legs(&legs_log));
    }
    if wants(Phase::Hear) {
        note("voice messages to their transcript");
        out.extend(perceive::hear(&s, sizes.rounds.min(20)).await?);
    }
    if wants(Phase::Throughput) {
        note("throughput");
        out.extend(conversation::throughput(&s, sizes).await?);
    }
    if wants(Phase::Inbound) || wants(Phase::Outbound) {
        let transfers = transfer::Transfers::new(&s, sizes.size_mib)?;
        out.extend(
            transfers
                .measure(seed, wants(Phase::Inbound), wants(Phase::Outbound))
                .await?,
        );
    }
    for user in [&s.bot, &s.user.user_id] {
        if let Err(e) = media.delete_all(user).await {
            note(&format!("could not delete the media of {user}: {e:#}"));
        }
    }
    Ok(out)
}

/// The surface's own latency per leg from its log; nothing when it logs none.
fn surface_legs(log: &str) -> RunFigures {
    let samples = legs::samples(log);
    let mut out = RunFigures::new();
    for leg in Leg::ALL {
        let Some(ms) = samples.get(leg.as_str()) else {
            continue;
        };
        let ms = stats::sorted(ms.clone());
        for stat in [Stat::P50, Stat::P99, Stat::Max] {
            if let Some(v) = stats::percentile(&ms, stat.p()) {
                out.insert(Fig::Surface(leg, stat), Sample::alone(v));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn smoke_is_tiny_and_explicit_flags_win() {
        let full = Sizes::resolve(&Args::parse_from(["bench"]));
        assert_eq!(
            (
                full.runs,
                full.size_mib,
                full.messages,
                full.rooms,
                full.smoke
            ),
            (3, 1024, 100, 20, false)
        );
        let smoke = Sizes::resolve(&Args::parse_from(["bench", "--smoke"]));
        assert_eq!((smoke.runs, smoke.size_mib, smoke.rooms), (1, 2, 2));
        let mixed = Sizes::resolve(&Args::parse_from([
            "bench",
            "--smoke",
            "--size-mib",
            "64",
            "--runs",
            "2",
            "--out",
            "x.json",
        ]));
        assert_eq!((mixed.runs, mixed.size_mib, mixed.messages), (2, 64, 10));
        let zero = Sizes::resolve(&Args::parse_from(["bench", "--rooms", "0"]));
        assert_eq!(zero.rooms, 1, "at least one of everything");
        assert_eq!(zero.phases.len(), 8, "every phase by default");
        let only = Sizes::resolve(&Args::parse_from([
            "bench",
            "--only",
            "latency,inbound",
            "--only",
            "outbound",
        ]));
        assert_eq!(
            only.phases,
            vec![Phase::Latency, Phase::Inbound, Phase::Outbound]
        );
    }

    #[test]
    fn legs_become_percentiles() {
        let log = (1..=100)
            .map(|i| format!("DEBUG mxbridge_latency: leg=sync_to_agent us={}\n", i * 100))
            .collect::<String>();
        let figs = surface_legs(&log);
        let get = |stat| figs[&Fig::Surface(Leg::SyncToAgent, stat)].this;
        assert_eq!(get(Stat::P50), Some(5.1));
        assert_eq!(get(Stat::P99), Some(9.9));
        assert_eq!(get(Stat::Max), Some(10.0));
        assert!(!figs.contains_key(&Fig::Surface(Leg::AgentToSend, Stat::P50)));
        assert!(surface_legs("").is_empty());
    }
}
