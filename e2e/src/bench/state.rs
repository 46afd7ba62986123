//! The agent's durable state, embedded and in PostgreSQL (issue 38): admission-to-ack latency and
//! turns per second over the agent's WebSocket (the minimal surface of [`crate::agent_ws`]), for
//! the file store, PostgreSQL with one agent, and PostgreSQL with three, in one run. Every chat
//! sends its turns one after the other; the chats run at once, spread over the agents.
//!
//! Admission is timed twice. Back to back, every chat sends its next message as soon as the
//! previous one is answered: the machine is saturated and an `ack` waits mostly for a core (the
//! database, the agent and the load generator share two). Paced, every chat sends at a fixed
//! rate, the same for both stores: half the turns per second the slower of the two managed back
//! to back, so the machine is about half idle, as a service runs; what is timed is then what an
//! admission costs rather than the queue in front of it.
//!
//! Turns per second are compared twice too. With the agent unlimited, the database, the agent and
//! the load generator share the machine's cores, and the store that costs the machine less CPU per
//! turn wins. With the agent held to [`AGENT_CORES`] on either store, the agent's own CPU bounds
//! the load, as in a deployment whose database has a server of its own: what is compared is what
//! each store costs the agent.
//!
//! How agents scale is measured with each agent held to [`AGENT_CORES`] of CPU ([`CpuQuota`], as
//! a pod's CPU limit): then a turn load is bound by the agent's own CPU, and three agents can do
//! three times the work while the database, the load generator and the kernel have the rest of
//! the machine. Without a limit, three agents on a 2-core machine share the same two cores as one
//! agent does, and what would be measured is the machine.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use protocol::ToSurface;

use super::figures::{Fig, RunFigures, Sample, Stat};
use super::quota::CpuQuota;
use super::stats::percentile;
use crate::agent_ws::AgentWs;
use crate::procs::{Child, bin, free_port, wait_healthy};

const TOKEN: &str = "bench-state-token-0123456789";

/// The CPU each agent gets when scaling is measured: an eighth of a core, so that three of them
/// with PostgreSQL and the load generator fit in two cores.
pub const AGENT_CORES: f64 = 0.125;

/// Agents of one configuration, stopped when dropped (the processes first, then their limits).
struct Agents {
    urls: Vec<String>,
    _children: Vec<Child>,
    /// Whether every agent runs under [`AGENT_CORES`].
    limited: bool,
    _quotas: Vec<CpuQuota>,
    _dir: tempfile::TempDir,
}

impl Agents {
    /// `n` agents, on the database `url` or (`None`) each on a state directory of its own; each
    /// held to `cores` of CPU when given and the machine lets cgroups be made.
    async fn start(n: usize, url: Option<&str>, cores: Option<f64>) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let workspace = dir.path().join("workspace");
        std::fs::create_dir_all(&workspace)?;
        let (mut urls, mut children, mut quotas) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..n {
            let port = free_port();
            let mut env = BTreeMap::from([
                ("AGENT_BIND".to_owned(), format!("127.0.0.1:{port}")),
                ("AGENT_TOKEN".to_owned(), TOKEN.to_owned()),
                ("WORKSPACE_ROOT".to_owned(), workspace.display().to_string()),
                (
                    "AGENT_STATE_DIR".to_owned(),
                    dir.path().join(format!("state-{i}")).display().to_string(),
                ),
                ("RUST_LOG".to_owned(), "warn".to_owned()),
            ]);
            if let Some(url) = url {
                env.insert("AGENT_DATABASE_URL".into(), url.to_owned());
            }
            let log = dir.path().join(format!("agent-{i}.log"));
            let child = Child::spawn(&format!("bench-agent-{i}"), bin("agent"), env, log)?;
            if let (Some(cores), Some(pid)) = (cores, child.pid()) {
                quotas.extend(CpuQuota::apply(pid, cores, &format!("agent-{i}")));
            }
            wait_healthy(&child, &format!("http://127.0.0.1:{port}/healthz")).await;
            urls.push(format!("ws://127.0.0.1:{port}"));
            children.push(child);
        }
        Ok(Self {
            urls,
            limited: cores.is_some() && quotas.len() == n,
            _children: children,
            _quotas: quotas,
            _dir: dir,
        })
    }
}

/// What one series did: each admission's time to its `ack`, and the turns per second.
struct Load {
    acks_ms: Vec<f64>,
    turns_per_s: f64,
}

/// `chats` chats at once, `per_chat` turns each, chat `i` on agent `i % agents`, after one turn
/// in as many other chats (the agents' connections to the database are open, their statements
/// prepared: what is measured is the steady state, for the file store as for PostgreSQL).
/// `rate`: the turns per second all chats send together, spread evenly (`None`: back to back).
async fn load(
    agents: &Agents,
    chats: usize,
    per_chat: usize,
    rate: Option<f64>,
    tag: &str,
) -> Result<Load> {
    let warm: Vec<_> = (0..chats)
        .map(|i| {
            let base = agents.urls[i % agents.urls.len()].clone();
            let room = format!("!bench-{tag}-warm-{i}:localhost");
            tokio::spawn(async move { chat(&base, &room, 1, None).await })
        })
        .collect();
    for t in warm {
        t.await.context("warm-up task")??;
    }
    let start = Instant::now();
    // Paced: each chat sends every `chats / rate` seconds, chat `i` starting `i / rate` in.
    let every = rate.map(|r| Duration::from_secs_f64(chats as f64 / r));
    let tasks: Vec<_> = (0..chats)
        .map(|i| {
            let base = agents.urls[i % agents.urls.len()].clone();
            let room = format!("!bench-{tag}-{i}:localhost");
            let pace = every.map(|every| Pace {
                every,
                first: tokio::time::Instant::now() + every.mul_f64(i as f64 / chats as f64),
            });
            tokio::spawn(async move { chat(&base, &room, per_chat, pace).await })
        })
        .collect();
    let mut acks_ms = Vec::new();
    for t in tasks {
        acks_ms.extend(t.await.context("chat task")??);
    }
    let elapsed = start.elapsed().as_secs_f64();
    acks_ms.sort_by(f64::total_cmp);
    Ok(Load {
        turns_per_s: (chats * per_chat) as f64 / elapsed,
        acks_ms,
    })
}

/// When a paced chat sends: first at `first`, then every `every` (a turn not answered by then
/// delays the next one: the schedule is never caught up in a burst).
#[derive(Debug, Clone, Copy)]
struct Pace {
    every: Duration,
    first: tokio::time::Instant,
}

/// One chat's turns, one after the other (at `pace` when given); the time from each message to
/// its `ack`, ms.
async fn chat(base: &str, room: &str, turns: usize, pace: Option<Pace>) -> Result<Vec<f64>> {
    let mut ws = AgentWs::connect(base, room, TOKEN).await?;
    let mut acks = Vec::with_capacity(turns);
    let mut next = pace.map(|p| p.first);
    for seq in 1..=turns as u64 {
        if let (Some(at), Some(pace)) = (next, pace) {
            tokio::time::sleep_until(at).await;
            next = Some((at + pace.every).max(tokio::time::Instant::now()));
        }
        let id = format!("$bench-{seq}-{room}");
        let sent = Instant::now();
        ws.send(&crate::agent_ws::user_message(
            seq,
            &id,
            room,
            &format!("message {seq} of the state benchmark"),
        ))
        .await?;
        loop {
            match ws.next().await? {
                Some(ToSurface::Ack(a)) if a.seq == seq => {
                    acks.push(sent.elapsed().as_secs_f64() * 1000.0);
                }
                Some(ToSurface::End(e)) if e.turn == id => break,
                Some(ToSurface::Error(e)) => bail!("the agent refused {id}: {}", e.message),
                Some(_) => {}
                None => bail!("the agent closed the connection during {id}"),
            }
        }
    }
    Ok(acks)
}

/// Vacuums the database `url` and writes a checkpoint, waiting for both.
async fn settle(url: &str) -> Result<()> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .context("connect to the bench database")?;
    let driver = tokio::spawn(connection);
    // One statement each: VACUUM refuses to run in a multi-statement string.
    for sql in ["VACUUM (ANALYZE)", "CHECKPOINT"] {
        client.batch_execute(sql).await.map_err(|e| {
            anyhow::anyhow!(
                "{sql} on the bench database: {}",
                e.as_db_error()
                    .map_or_else(|| e.to_string(), |d| d.message().to_owned())
            )
        })?;
    }
    drop(client);
    let _ = driver.await;
    Ok(())
}

/// Measures every series of the module's doc with `chats` chats of `per_chat` turns each.
pub async fn measure(chats: usize, per_chat: usize) -> Result<RunFigures> {
    let scratch = || async {
        crate::postgres::scratch_database("bench")
            .await?
            .context("MXBRIDGE_TEST_DATABASE_URL is not set")
    };
    // Both stores' agents stay up for both series (an idle agent costs nothing).
    let files_agents = Agents::start(1, None, None).await?;
    let files = load(&files_agents, chats, per_chat, None, "files").await?;
    let pg1_url = scratch().await?;
    let pg1_agents = Agents::start(1, Some(&pg1_url), None).await?;
    let pg1 = load(&pg1_agents, chats, per_chat, None, "pg1").await?;
    // The paced series start from a quiet database, not under the vacuum and checkpoint that
    // thousands of turns just written would set off during them.
    settle(&pg1_url).await?;
    let rate = files.turns_per_s.min(pg1.turns_per_s) / 2.0;
    let paced_turns = (per_chat / 2).max(5);
    crate::bench::note(&format!(
        "agent state: paced admission at {rate:.0} turns/s (half the slower store's), \
         {chats} chats x {paced_turns} turns"
    ));
    let files_paced = load(&files_agents, chats, paced_turns, Some(rate), "files-paced").await?;
    let pg1_paced = load(&pg1_agents, chats, paced_turns, Some(rate), "pg1-paced").await?;
    drop((files_agents, pg1_agents));
    // The agent's own cost of each store: one agent held to the same CPU limit on either, so the
    // agent's CPU bounds the load and not the cores it shares with the database.
    let files_one = {
        let agents = Agents::start(1, None, Some(AGENT_CORES)).await?;
        load(&agents, chats, per_chat, None, "files-one").await?
    };
    // Scaling: one agent and three, each under the same CPU limit.
    let (one, limited) = {
        let agents = Agents::start(1, Some(&scratch().await?), Some(AGENT_CORES)).await?;
        (
            load(&agents, chats, per_chat, None, "one").await?,
            agents.limited,
        )
    };
    let (three, limited) = {
        let agents = Agents::start(3, Some(&scratch().await?), Some(AGENT_CORES)).await?;
        // Settle: the other two agents found the schema migrated by the first.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let three = load(&agents, chats, per_chat, None, "three").await?;
        (three, limited && agents.limited)
    };
    crate::bench::note(&if limited {
        format!("agent state: scaling measured with each agent held to {AGENT_CORES} cores")
    } else {
        "agent state: no cgroup could be made for a CPU limit; the 3-agent figure shares the \
         machine's cores with one agent's and does not show how agents scale"
            .to_owned()
    });
    let mut out = RunFigures::new();
    for (paced, pg, file) in [(false, &pg1, &files), (true, &pg1_paced, &files_paced)] {
        for (stat, p) in [(Stat::P50, 0.5), (Stat::P99, 0.99)] {
            out.insert(
                Fig::StateAdmit { paced, stat },
                Sample {
                    this: percentile(&pg.acks_ms, p),
                    other: percentile(&file.acks_ms, p),
                },
            );
        }
    }
    out.insert(
        Fig::StateTurns,
        Sample::new(pg1.turns_per_s, files.turns_per_s),
    );
    out.insert(
        Fig::StateTurnsLimited,
        Sample::new(one.turns_per_s, files_one.turns_per_s),
    );
    out.insert(
        Fig::StateTurnsThree,
        Sample::new(three.turns_per_s, one.turns_per_s),
    );
    Ok(out)
}
