//! What seeing a picture costs the agent: `mediainfo::for_model`, as the agent prepares a
//! picture for a vision model (bounded decode, EXIF upright, 1536-pixel long edge, JPEG), on a
//! 12-megapixel JPEG, next to ImageMagick's `convert -resize 1536x1536` of the same file in the
//! same run. Each runs as a process of its own under the same wrapper: the wall time of the
//! whole process (start-up, reading, decoding, scaling, encoding, writing) and its peak RSS from
//! `getrusage`. Ours also reports its own peak growth over where it stood before the work
//! (`VmHWM` after, minus `VmRSS` before): the figure with the 64 MiB target, next to
//! ImageMagick's whole peak.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::figures::{Fig, RunFigures, Sample, Stat};
use super::setup::{Setup, TURN};
use super::stats::{percentile, sorted};

/// The long edge the agent sends by default (`OPENAI_IMAGE_EDGE`).
pub const EDGE: u32 = 1536;

/// Runs `argv[1:]`, prints `{"wall_s", "maxrss_kib", "stdout"}`.
const WRAPPER: &str = r#"
import json, resource, subprocess, sys, time
t = time.monotonic()
r = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE)
wall = time.monotonic() - t
if r.returncode != 0:
    sys.stderr.write("%s exited with %d\n" % (sys.argv[1], r.returncode))
    sys.exit(1)
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"wall_s": wall, "maxrss_kib": rss, "stdout": r.stdout.decode("utf-8", "replace")}))
"#;

/// ImageMagick's `convert` (Debian's, not a stand-in earlier on the `PATH`).
fn imagemagick() -> Result<PathBuf> {
    for candidate in ["/usr/bin/convert", "convert", "magick"] {
        let out = std::process::Command::new(candidate)
            .arg("-version")
            .output();
        if let Ok(out) = out
            && String::from_utf8_lossy(&out.stdout).contains("Version: ImageMagick")
        {
            return Ok(PathBuf::from(candidate));
        }
    }
    bail!("ImageMagick's convert is not installed (apt-get install imagemagick)")
}

fn wrapped(cmd: &[&std::ffi::OsStr]) -> Result<(f64, u64, String)> {
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(WRAPPER)
        .args(cmd)
        .output()
        .context("run python3")?;
    if !out.status.success() {
        bail!(
            "{:?} failed: {}",
            cmd.first(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let v: Value = serde_json::from_slice(&out.stdout).context("the wrapper's JSON")?;
    Ok((
        v["wall_s"].as_f64().unwrap_or(0.0),
        v["maxrss_kib"].as_u64().unwrap_or(0),
        v["stdout"].as_str().unwrap_or_default().to_owned(),
    ))
}

/// Measures both on a fresh `width`x`height` JPEG (ImageMagick's seeded plasma: smooth areas
/// and detail, as a photo has).
pub fn measure(width: u32, height: u32) -> Result<RunFigures> {
    let convert = imagemagick()?;
    let dir = tempfile::tempdir()?;
    let photo = dir.path().join("photo.jpg");
    let status = std::process::Command::new(&convert)
        .args([
            "-seed",
            "7",
            "-size",
            &format!("{width}x{height}"),
            "plasma:fractal",
        ])
        .args(["-quality", "90"])
        .arg(&photo)
        .status()
        .context("make the test photo")?;
    if !status.success() {
        bail!("ImageMagick could not make the test photo");
    }
    let ours = dir.path().join("ours.jpg");
    let theirs = dir.path().join("theirs.jpg");
    let me = std::env::current_exe().context("the bench binary")?;
    let (our_s, _, said) = wrapped(&[
        me.as_os_str(),
        "--prepare-image".as_ref(),
        photo.as_os_str(),
        "--prepared-out".as_ref(),
        ours.as_os_str(),
    ])?;
    let growth_kib = serde_json::from_str::<Value>(said.trim())
        .ok()
        .and_then(|v| v["growth_kib"].as_u64())
        .context("the preparing process's report")?;
    let resize = format!("{EDGE}x{EDGE}");
    let (their_s, their_kib, _) = wrapped(&[
        convert.as_os_str(),
        photo.as_os_str(),
        "-resize".as_ref(),
        resize.as_ref(),
        "-quality".as_ref(),
        "85".as_ref(),
        theirs.as_os_str(),
    ])?;
    let mut out = RunFigures::new();
    out.insert(
        Fig::ImagePrep,
        Sample::new(our_s * 1000.0, their_s * 1000.0),
    );
    out.insert(
        Fig::ImagePrepRss,
        Sample::new(growth_kib as f64 / 1024.0, their_kib as f64 / 1024.0),
    );
    Ok(out)
}

fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The preparing process (`bench --prepare-image FILE --prepared-out OUT`): prepares `file` as
/// the agent does, writes the result, and prints `{"growth_kib", "ms", "width", "height"}`.
pub fn prepare_child(file: &Path, out: &Path) -> Result<String> {
    let before = status_kib("VmRSS:").context("VmRSS")?;
    let started = Instant::now();
    let reader = std::io::BufReader::with_capacity(1 << 16, std::fs::File::open(file)?);
    let prepared = mediainfo::for_model(reader, &mediainfo::Limits::default(), EDGE)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    std::fs::write(out, &prepared.bytes)?;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    let peak = status_kib("VmHWM:").context("VmHWM")?;
    Ok(serde_json::json!({
        "growth_kib": peak.saturating_sub(before),
        "ms": ms,
        "width": prepared.width,
        "height": prepared.height,
    })
    .to_string())
}

/// A transcription server that answers at once (`/v1/audio/transcriptions`, after reading the
/// whole upload), for the hearing phase; returns its `/v1` URL.
pub async fn fake_transcriber() -> Result<String> {
    use axum::routing::post;
    let router = axum::Router::new().route(
        "/v1/audio/transcriptions",
        post(|body: axum::body::Bytes| async move {
            let _ = body.len();
            (
                [("content-type", "application/json")],
                r#"{"text":"please call me back tomorrow morning"}"#,
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/v1", listener.local_addr()?);
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(url)
}

/// A 3-second Ogg/Opus voice note (mediainfo's corpus).
const VOICE: &[u8] = include_bytes!("../../../mediainfo/tests/corpus/voice.ogg");

/// The bridge's own time on a voice message's way to its transcript: `rounds` voice messages
/// in the encrypted DM, one after the other, each until the room shows what was heard; per
/// message, the surface's `sync_to_agent` (from the `/sync` response to the turn at the agent,
/// the voice file's download included) plus the agent's `agent_hear` (from admitting the turn
/// to the transcript stored, minus the transcription server's exchange), next to that
/// exchange's time (`agent_hear_server`).
pub async fn hear(s: &Setup, rounds: usize) -> Result<RunFigures> {
    let surface_before = s.stack.surface.log().len();
    let agent_before = s.stack.agent.log().len();
    for i in 0..rounds {
        let id = s
            .alice
            .send_voice(
                &s.enc_dm,
                &format!("voice-{i}.ogg"),
                VOICE.to_vec(),
                std::time::Duration::from_secs(3),
            )
            .await?;
        s.wait_answer(&s.enc_dm, &s.bot, &id, TURN, |m| {
            m.msgtype == "m.notice" && m.body.starts_with('🎤')
        })
        .await?;
    }
    let tail = |log: String, from: usize| log.get(from..).unwrap_or_default().to_owned();
    let surface = super::legs::samples(&tail(s.stack.surface.log(), surface_before));
    let agent = super::legs::samples(&tail(s.stack.agent.log(), agent_before));
    let (Some(sync), Some(own), Some(server)) = (
        surface.get("sync_to_agent"),
        agent.get("agent_hear"),
        agent.get("agent_hear_server"),
    ) else {
        bail!("no latency lines for the voice messages in the surface's or the agent's log");
    };
    super::note(&format!(
        "voice legs, ms: surface sync_to_agent {sync:.1?} (the voice file's download \
         included), agent_hear {own:.1?}, transcription server {server:.1?}"
    ));
    // One voice message at a time: the n-th line of each log is the n-th message's. The
    // surface logs a line for every event it forwards; the last `rounds` are the voice notes.
    let sync = &sync[sync.len().saturating_sub(own.len())..];
    let total = sorted(sync.iter().zip(own).map(|(a, b)| a + b).collect());
    let server = sorted(server.clone());
    let mut out = RunFigures::new();
    for stat in [Stat::P50, Stat::P99] {
        if let (Some(t), Some(v)) = (percentile(&total, stat.p()), percentile(&server, stat.p())) {
            out.insert(Fig::VoiceOverhead(stat), Sample::new(t, v));
        }
    }
    Ok(out)
}
