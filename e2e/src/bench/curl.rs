//! The transfer comparators: `curl` downloading and uploading the same media against the same
//! Synapse with the bot's token. A small Python wrapper times curl (and an optional fsync of
//! the downloaded file) from inside, so interpreter start-up is not counted, and reports curl's
//! peak RSS.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// Runs `argv[2:]`, optionally fsyncs `argv[1]`, prints `{"s", "maxrss_kib", "stdout"}`.
const WRAPPER: &str = r#"
import json, os, resource, subprocess, sys, time
fsync_path, cmd = sys.argv[1], sys.argv[2:]
t = time.monotonic()
r = subprocess.run(cmd, stdout=subprocess.PIPE)
if r.returncode != 0:
    sys.stderr.write("%s exited with %d\n" % (cmd[0], r.returncode))
    sys.exit(1)
if fsync_path:
    fd = os.open(fsync_path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
s = time.monotonic() - t
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"s": s, "maxrss_kib": rss, "stdout": r.stdout.decode("utf-8", "replace")}))
"#;

/// One timed curl run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timed {
    /// Wall time of curl (plus the fsync, if asked for), seconds.
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
        let (timed, _) = self
            .run(&fsync_path, &["-o", &out.display().to_string(), &url])
            .await?;
        Ok(timed)
    }

    /// Uploads `file` (`POST /_matrix/media/v3/upload`, streamed) and returns the timing and
    /// the new `mxc://` URI.
    pub async fn upload(&self, file: &Path) -> Result<(Timed, String)> {
        let url = format!("{}/_matrix/media/v3/upload", self.hs_url);
        let (timed, stdout) = self
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
        let v: Value = serde_json::from_str(&stdout)
            .with_context(|| format!("curl upload answered {stdout:?}"))?;
        let mxc = v["content_uri"]
            .as_str()
            .with_context(|| format!("curl upload answered {v}"))?;
        Ok((timed, mxc.to_owned()))
    }

    async fn run(&self, fsync_path: &str, args: &[&str]) -> Result<(Timed, String)> {
        let header = format!("@{}", self.header.display());
        let out = tokio::process::Command::new("python3")
            .args(["-c", WRAPPER, fsync_path])
            .args(["curl", "-sS", "-f", "-H", &header])
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
        let timed = Timed {
            secs: v["s"].as_f64().context("curl wrapper: s")?,
            peak_rss_kib: v["maxrss_kib"].as_u64().unwrap_or(0),
        };
        Ok((timed, v["stdout"].as_str().unwrap_or_default().to_owned()))
    }
}
