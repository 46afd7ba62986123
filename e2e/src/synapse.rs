//! A Synapse owned by one test, started by `scripts/synapse.sh` in its own directory and port,
//! so the test may pause, stop and restart it without disturbing the tests that share the suite's
//! homeserver.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, Result, bail};

use crate::Homeserver;
use crate::procs::free_port;

/// `scripts/synapse.sh` of this checkout.
fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("scripts")
        .join("synapse.sh")
}

/// A Synapse of one test. Its data survives [`DedicatedSynapse::stop`] and
/// [`DedicatedSynapse::start_again`]; dropping it (also when the test panics) continues a paused
/// server, stops it and deletes its directory. The script reuses the cached virtualenv under
/// `MXBRIDGE_CACHE`, inherited from the environment.
#[derive(Debug)]
pub struct DedicatedSynapse {
    dir: tempfile::TempDir,
    port: u16,
    /// `rc_message` of the config (`SYNAPSE_RC_MESSAGE`), again on every start.
    rc_message: Option<String>,
    /// More config lines (`SYNAPSE_EXTRA_CONFIG`), again on every start.
    extra: Option<String>,
    hs: Homeserver,
    running: bool,
    paused: bool,
}

impl DedicatedSynapse {
    /// Starts a fresh Synapse on a free port and waits until it is healthy. `rc_message`
    /// replaces the fast default message rate limit, e.g. `{per_second: 0.5, burst_count: 3}`.
    pub async fn start(rc_message: Option<&str>) -> Result<Self> {
        Self::start_with(rc_message, None).await
    }

    /// As [`DedicatedSynapse::start`], with `extra` YAML lines appended to the config (e.g.
    /// `refreshable_access_token_lifetime: 5s`).
    pub async fn start_with(rc_message: Option<&str>, extra: Option<&str>) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("mxbridge-synapse-")
            .tempdir()?;
        let port = free_port();
        let exports = run_start(dir.path(), port, rc_message, extra).await?;
        let get = |k: &str| {
            exports
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
                .with_context(|| format!("synapse.sh start printed no {k}"))
        };
        let hs = Homeserver::new(
            get("E2E_HOMESERVER_URL")?,
            get("E2E_SERVER_NAME")?,
            get("E2E_REGISTRATION_SECRET")?,
        );
        Ok(Self {
            dir,
            port,
            rc_message: rc_message.map(str::to_owned),
            extra: extra.map(str::to_owned),
            hs,
            running: true,
            paused: false,
        })
    }

    /// The homeserver, for registering users and starting a stack.
    pub fn homeserver(&self) -> &Homeserver {
        &self.hs
    }

    /// Shuts Synapse down for real (`synapse.sh stop`: SIGTERM, then SIGKILL after 10 s) and
    /// waits until the process is gone. Its data stays for [`DedicatedSynapse::start_again`].
    pub async fn stop(&mut self) -> Result<()> {
        self.resume();
        let out = tokio::process::Command::new(script())
            .arg("stop")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .output()
            .await
            .context("run synapse.sh stop")?;
        if !out.status.success() {
            bail!(
                "synapse.sh stop failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        self.running = false;
        // A killed server leaves its pid file behind; that pid may be reused by anything.
        let _ = std::fs::remove_file(self.dir.path().join("homeserver.pid"));
        Ok(())
    }

    /// Starts the stopped server again on the same port with the same data and secret, and
    /// waits until it is healthy.
    pub async fn start_again(&mut self) -> Result<()> {
        run_start(
            self.dir.path(),
            self.port,
            self.rc_message.as_deref(),
            self.extra.as_deref(),
        )
        .await?;
        self.running = true;
        Ok(())
    }

    /// [`DedicatedSynapse::stop`], then [`DedicatedSynapse::start_again`].
    pub async fn restart(&mut self) -> Result<()> {
        self.stop().await?;
        self.start_again().await
    }

    /// Freezes the server with SIGSTOP: connections are accepted by the kernel but nothing
    /// answers, like a homeserver stuck in a long pause.
    pub fn pause(&mut self) {
        let pid = self.pid().expect("pause: Synapse is not running");
        assert!(signal("STOP", pid), "kill -STOP {pid}");
        self.paused = true;
    }

    /// Continues a paused server (SIGCONT); does nothing when it is not paused.
    pub fn resume(&mut self) {
        if !self.paused {
            return;
        }
        if let Some(pid) = self.pid() {
            signal("CONT", pid);
        }
        self.paused = false;
    }

    /// The process id from `homeserver.pid`, while running.
    pub fn pid(&self) -> Option<u32> {
        if !self.running {
            return None;
        }
        std::fs::read_to_string(self.dir.path().join("homeserver.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Synapse's log file (warnings and errors).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("homeserver.log")
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Prints the last lines of the log to stderr (for failing tests).
    pub fn dump(&self) {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        let tail = &lines[lines.len().saturating_sub(60)..];
        eprintln!(
            "----- last log lines of synapse ({}) -----\n{}\n-----",
            self.hs.url,
            tail.join("\n")
        );
    }
}

impl Drop for DedicatedSynapse {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump();
        }
        let Some(pid) = self.pid() else {
            return;
        };
        // Always continue first: a stopped process cannot act on SIGTERM.
        signal("CONT", pid);
        let _ = std::process::Command::new(script())
            .arg("stop")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        // The TempDir field removes the directory after this.
    }
}

/// Runs `synapse.sh start DIR PORT` and returns the `export KEY=VALUE` pairs it printed.
async fn run_start(
    dir: &Path,
    port: u16,
    rc_message: Option<&str>,
    extra: Option<&str>,
) -> Result<Vec<(String, String)>> {
    let mut cmd = tokio::process::Command::new(script());
    cmd.arg("start")
        .arg(dir)
        .arg(port.to_string())
        .stdin(Stdio::null());
    match rc_message {
        Some(rc) => cmd.env("SYNAPSE_RC_MESSAGE", rc),
        None => cmd.env_remove("SYNAPSE_RC_MESSAGE"),
    };
    match extra {
        Some(extra) => cmd.env("SYNAPSE_EXTRA_CONFIG", extra),
        None => cmd.env_remove("SYNAPSE_EXTRA_CONFIG"),
    };
    let out = cmd.output().await.context("run synapse.sh start")?;
    if !out.status.success() {
        bail!(
            "synapse.sh start {} {port} failed ({}):\n{}",
            dir.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect())
}

/// Sends `sig` to `pid`; whether that worked.
fn signal(sig: &str, pid: u32) -> bool {
    std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .is_ok_and(|s| s.success())
}
