//! The ACP brain's own latency (issue 39), over the agent's WebSocket (the minimal surface of
//! [`crate::agent_ws`]): from a message sent to the ACP agent's reading of `session/prompt`
//! ("in"), and from the agent's writing of its first chunk to that chunk's arrival ("out").
//! The agent (`e2e/bench_acp_agent.py`) stamps both moments into the chunk with the same clock.
//! Comparator: the builtin brain's whole path, message to its first text chunk, in the same run.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use protocol::ToSurface;

use super::figures::{Fig, RunFigures, Sample, Stat};
use super::stats::percentile;
use crate::agent_ws::AgentWs;
use crate::procs::{Child, bin, free_port, wait_healthy};

const TOKEN: &str = "bench-acp-token-0123456789abcdef";

/// An agent with `brain` settings, stopped when dropped.
struct Agent {
    url: String,
    _child: Child,
    _dir: tempfile::TempDir,
}

impl Agent {
    async fn start(brain: &[(&str, String)]) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let workspace = dir.path().join("workspace");
        std::fs::create_dir_all(&workspace)?;
        let port = free_port();
        let mut env = BTreeMap::from([
            ("AGENT_BIND".to_owned(), format!("127.0.0.1:{port}")),
            ("AGENT_TOKEN".to_owned(), TOKEN.to_owned()),
            ("WORKSPACE_ROOT".to_owned(), workspace.display().to_string()),
            (
                "AGENT_STATE_DIR".to_owned(),
                dir.path().join("state").display().to_string(),
            ),
            ("RUST_LOG".to_owned(), "warn".to_owned()),
        ]);
        env.extend(brain.iter().map(|(k, v)| ((*k).to_owned(), v.clone())));
        let child = Child::spawn(
            "bench-acp-agent",
            bin("agent"),
            env,
            dir.path().join("agent.log"),
        )?;
        wait_healthy(&child, &format!("http://127.0.0.1:{port}/healthz")).await;
        Ok(Self {
            url: format!("ws://127.0.0.1:{port}"),
            _child: child,
            _dir: dir,
        })
    }
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// One turn: when it was sent, its first text chunk, and when that arrived (ns since the epoch).
async fn first_chunk(ws: &mut AgentWs, room: &str, seq: u64) -> Result<(u128, String, u128)> {
    let id = format!("$bench-acp-{seq}");
    let sent = now_ns();
    ws.send(&crate::agent_ws::user_message(seq, &id, room, "echo hello"))
        .await?;
    let mut first = None;
    loop {
        match ws.next().await? {
            Some(ToSurface::TextChunk(c)) if first.is_none() => first = Some((c.text, now_ns())),
            Some(ToSurface::End(e)) if e.turn == id => break,
            Some(ToSurface::Error(e)) => bail!("the agent refused {id}: {}", e.message),
            Some(_) => {}
            None => bail!("the agent closed the connection during {id}"),
        }
    }
    let (text, at) = first.with_context(|| format!("no text in turn {id}"))?;
    Ok((sent, text, at))
}

fn ms(from: u128, to: u128) -> f64 {
    to.saturating_sub(from) as f64 / 1e6
}

/// `turns` turns (after one that starts the agent) through each brain.
pub async fn measure(turns: usize) -> Result<RunFigures> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench_acp_agent.py");
    let acp = Agent::start(&[
        ("AGENT_BRAIN", "acp".to_owned()),
        ("AGENT_ACP_COMMAND", format!("python3 {}", script.display())),
    ])
    .await?;
    let builtin = Agent::start(&[("AGENT_BRAIN", "builtin".to_owned())]).await?;
    let (mut into, mut out_of, mut path) = (Vec::new(), Vec::new(), Vec::new());
    let room = "!bench-acp:localhost";
    let mut ws = AgentWs::connect(&acp.url, room, TOKEN).await?;
    for seq in 0..=turns as u64 {
        let (sent, text, arrived) = first_chunk(&mut ws, room, seq + 1).await?;
        let stamps: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("not stamps: {text:?}"))?;
        let got = stamps["got"].as_u64().context("got")? as u128;
        let written = stamps["sent"].as_u64().context("sent")? as u128;
        if seq > 0 {
            into.push(ms(sent, got));
            out_of.push(ms(written, arrived));
        }
    }
    let mut ws = AgentWs::connect(&builtin.url, room, TOKEN).await?;
    for seq in 0..=turns as u64 {
        let (sent, _, arrived) = first_chunk(&mut ws, room, seq + 1).await?;
        if seq > 0 {
            path.push(ms(sent, arrived));
        }
    }
    for v in [&mut into, &mut out_of, &mut path] {
        v.sort_by(f64::total_cmp);
    }
    let mut figures = RunFigures::new();
    for (stat, p) in [(Stat::P50, 0.5), (Stat::P99, 0.99)] {
        let builtin = percentile(&path, p);
        figures.insert(
            Fig::AcpIn(stat),
            Sample {
                this: percentile(&into, p),
                other: builtin,
            },
        );
        figures.insert(
            Fig::AcpOut(stat),
            Sample {
                this: percentile(&out_of, p),
                other: builtin,
            },
        );
    }
    Ok(figures)
}
