//! The transfer comparators: `curl` downloading and uploading the same media against the same
//! Synapse with the bot's token. curl times itself (`--write-out`), so neither its own start-up
//! nor the wrapper's is counted: a download from the response's first byte to its last (the
//! surface's download is timed from its temporary file, created when the response's head has
//! arrived), an upload from start to answer. A small Python wrapper runs it, times the optional
//! fsync of the downloaded file, and reports curl's peak RSS.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// Runs `argv[2:]`, optionally fsyncs `argv[1]`, prints `{"fsync_s", "maxrss_kib", "stdout"}`.
const WRAPPER: &str = r#"
import json, os, resource, subprocess, sys, time
fsync_path, cmd = sys.argv[1], sys.argv[2:]
r = subprocess.run(cmd, stdout=subprocess.PIPE)
if r.returncode != 0:
    sys.stderr.write("%s exited with %d\n" % (cmd[0], r.returncode))
    sys.exit(1)
t = time.monotonic()
if fsync_path:
    fd = os.open(fsync_path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
f = time.monotonic() - t
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"fsync_s": f, "maxrss_kib": rss, "stdout": r.stdout.decode("utf-8", "replace")}))
"#;

/// What curl writes after the response (`--write-out`): a line of its own timings, seconds.
const WRITE_OUT: &str = "\ncurl-times %{time_starttransfer} %{time_total}\n";

/// The response body (all but the timing line) and curl's (first byte, total) times, seconds.
fn split_times(stdout: &str) -> Option<(&str, f64, f64)> {
    let at = stdout.rfind("\ncurl-times ")?;
    let mut times = stdout[at..].split_whitespace().skip(1);
    let first = times.next()?.parse().ok()?;
    let total = times.next()?.parse().ok()?;
    Some((&stdout[..at], first, total))
}

/// One timed curl run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timed {
    /// curl's transfer (a download's body, an upload's whole request), plus the fsync if asked
    /// for, seconds.
    pub secs: f64,
    /// curl's peak RSS, KiB.
    pub peak_rss_kib: u64,
}

/// curl against one homeserver with one access token (kept in a header file, not on the
/// command line).
#[derive(Debug)]
pub struct Curl {
    hs_url: String,
    header: PathBuf,
    _dir: tempfile::TempDir,
}

impl Curl {
    /// curl for `hs_url`, authenticated with `token`.
    pub fn new(hs_url: &str, token: &str) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("mxbridge-bench-curl-")
            .tempdir()?;
        let header = dir.path().join("auth-header");
        std::fs::write(&header, format!("Authorization: Bearer {token}\n"))?;
        Ok(Self {
            hs_url: hs_url.trim_end_matches('/').to_owned(),
            header,
            _dir: dir,
        })
    }

    /// Downloads `mxc` (the authenticated media endpoint) to `out`, without or with an fsync of
    /// the file afterwards.
    pub async fn download(&self, mxc: &str, out: &Path, fsync: bool) -> Result<Timed> {
        let rest = mxc.strip_prefix("mxc://").context("not an mxc uri")?;
        let url = format!("{}/_matrix/client/v1/media/download/{rest}", self.hs_url);
        let fsync_path = if fsync {
            out.display().to_string()
        } else {
            String::new()
        };
        let (run, first, total) = self
            .run(&fsync_path, &["-o", &out.display().to_string(), &url])
            .await?;
        Ok(Timed {
            secs: total - first + run.fsync_s,
            peak_rss_kib: run.peak_rss_kib,
        })
    }

    /// Uploads `file` (`POST /_matrix/media/v3/upload`, streamed) and returns the timing and
    /// the new `mxc://` URI.
    pub async fn upload(&self, file: &Path) -> Result<(Timed, String)> {
        let url = format!("{}/_matrix/media/v3/upload", self.hs_url);
        let (run, _, total) = self
            .run(
                "",
                &[
                    "-X",
                    "POST",
                    "-H",
                    "Content-Type: application/octet-stream",
                    // No `Expect: 100-continue` round trip (Synapse does not answer it, curl
                    // would wait a second).
                    "-H",
                    "Expect:",
                    "-T",
                    &file.display().to_string(),
                    &url,
                ],
            )
            .await?;
        let v: Value = serde_json::from_str(&run.stdout)
            .with_context(|| format!("curl upload answered {:?}", run.stdout))?;
        let mxc = v["content_uri"]
            .as_str()
            .with_context(|| format!("curl upload answered {v}"))?;
        let timed = Timed {
            secs: total,
            peak_rss_kib: run.peak_rss_kib,
        };
        Ok((timed, mxc.to_owned()))
    }

    /// Runs curl with `args`; returns what the wrapper saw and curl's (first byte, total) times.
    async fn run(&self, fsync_path: &str, args: &[&str]) -> Result<(Run, f64, f64)> {
        let header = format!("@{}", self.header.display());
        let out = tokio::process::Command::new("python3")
            .args(["-c", WRAPPER, fsync_path])
            .args(["curl", "-sS", "-f", "-w", WRITE_OUT, "-H", &header])
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .context("run python3 (the curl wrapper)")?;
        if !out.status.success() {
            bail!(
                "curl {}: {}",
                args.last().unwrap_or(&""),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let v: Value = serde_json::from_slice(&out.stdout).context("curl wrapper output")?;
        let stdout = v["stdout"].as_str().unwrap_or_default();
        let (body, first, total) =
            split_times(stdout).with_context(|| format!("curl printed no timings: {stdout:?}"))?;
        let run = Run {
            fsync_s: v["fsync_s"].as_f64().context("curl wrapper: fsync_s")?,
            peak_rss_kib: v["maxrss_kib"].as_u64().unwrap_or(0),
            stdout: body.to_owned(),
        };
        Ok((run, first, total))
    }
}

/// What the wrapper reports of one curl run.
#[derive(Debug)]
struct Run {
    fsync_s: f64,
    peak_rss_kib: u64,
    /// curl's output without the timing line.
    stdout: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timing_line_is_split_off_the_body() {
        let up = "{\"content_uri\": \"mxc://h/x\"}\ncurl-times 0.004512 1.250000\n";
        assert_eq!(
            split_times(up),
            Some(("{\"content_uri\": \"mxc://h/x\"}", 0.004512, 1.25))
        );
        assert_eq!(split_times("\ncurl-times 0.5 2\n"), Some(("", 0.5, 2.0)));
        assert_eq!(split_times("{}"), None);
        assert_eq!(split_times("\ncurl-times x 2\n"), None);
    }
}
