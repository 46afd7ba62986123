//! The real `agent` and `surface` binaries as child processes with their own workspace, state
//! directories and logs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::{Homeserver, User, unique};

/// Where cargo put the workspace's binaries: `target/<profile>/`, the parent of a test binary's
/// `deps/`, or the folder of a binary such as `bench` itself.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let parent = exe.parent().expect("exe dir");
    let dir = if parent.file_name() == Some(std::ffi::OsStr::new("deps")) {
        parent.parent().expect("target dir")
    } else {
        parent
    };
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace first (`cargo build --workspace`)",
        path.display()
    );
    path
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// A running child process whose output goes to a log file; killed on drop.
#[derive(Debug)]
pub struct Child {
    name: String,
    program: PathBuf,
    env: BTreeMap<String, String>,
    log: PathBuf,
    child: Option<tokio::process::Child>,
}

impl Child {
    pub(crate) fn spawn(
        name: &str,
        program: PathBuf,
        env: BTreeMap<String, String>,
        log: PathBuf,
    ) -> Result<Self> {
        let mut me = Self {
            name: name.to_owned(),
            program,
            env,
            log,
            child: None,
        };
        me.start()?;
        Ok(me)
    }

    /// Starts the process again (after [`Child::kill9`] or [`Child::stop`]), appending to its log.
    pub fn start(&mut self) -> Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        let child = tokio::process::Command::new(&self.program)
            .env_clear()
            .envs(&self.env)
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("spawn {}", self.program.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// The same program with the same environment, for a one-off run (e.g. `surface doctor`).
    pub fn command(&self) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.env_clear()
            .envs(&self.env)
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .stdin(Stdio::null());
        cmd
    }

    /// Sets (`Some`) or removes (`None`) an environment variable for the next [`Child::start`].
    pub fn set_env(&mut self, key: &str, value: Option<&str>) {
        match value {
            Some(v) => self.env.insert(key.to_owned(), v.to_owned()),
            None => self.env.remove(key),
        };
    }

    /// Process id, if running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(tokio::process::Child::id)
    }

    /// Whether the process is running (started and not exited).
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// SIGKILL, no chance to clean up.
    pub async fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill().await;
        }
    }

    /// SIGTERM and wait for a clean exit; returns the exit code.
    pub async fn stop(&mut self) -> Option<i32> {
        let mut c = self.child.take()?;
        if let Some(pid) = c.id() {
            let _ = std::process::Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status();
        }
        match tokio::time::timeout(Duration::from_secs(20), c.wait()).await {
            Ok(Ok(status)) => status.code(),
            _ => {
                let _ = c.kill().await;
                None
            }
        }
    }

    /// Peak resident set size so far (`VmHWM`), in KiB.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Prints the last lines of the log to stderr (for failing tests).
    pub fn dump(&self) {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        let tail = &lines[lines.len().saturating_sub(80)..];
        eprintln!(
            "----- last log lines of {} -----\n{}\n-----",
            self.name,
            tail.join("\n")
        );
    }
}

/// Knobs for [`Stack::start`].
#[derive(Debug, Clone, Default)]
pub struct StackOptions {
    /// `SURFACE_MAX_FILE_SIZE`, e.g. `300MiB`.
    pub max_file_size: Option<String>,
    /// Extra surface environment.
    pub surface_env: BTreeMap<String, String>,
    /// Extra agent environment.
    pub agent_env: BTreeMap<String, String>,
    /// The surface logs in with the bot's password (a device of its own, as in production)
    /// instead of reusing the registration's access token and device.
    pub password_login: bool,
}

/// The started processes' log filter (unless `E2E_RUST_LOG` sets another).
const STACK_LOG: &str = "info,matrix_sdk=warn,matrix_sdk_base=warn,matrix_sdk_crypto=warn,\
                         matrix_sdk_crypto::backups=error";

/// One agent + one surface (logged in as a fresh bot account) sharing a temporary workspace.
#[derive(Debug)]
pub struct Stack {
    /// The bot account the surface runs as.
    pub bot: User,
    /// The agent process.
    pub agent: Child,
    /// The surface process.
    pub surface: Child,
    /// The shared workspace folder.
    pub workspace: PathBuf,
    /// `http://127.0.0.1:<port>` of the surface's health endpoint.
    pub surface_health: String,
    /// `http://127.0.0.1:<port>` of the agent.
    pub agent_http: String,
    /// The token the surface presents to the agent (`AGENT_TOKEN`).
    pub agent_token: String,
    _dir: tempfile::TempDir,
}

impl Stack {
    /// Starts agent and surface and waits until both report healthy.
    pub async fn start(hs: &Homeserver, opts: StackOptions) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("mxbridge-e2e-").tempdir()?;
        let workspace = dir.path().join("workspace");
        std::fs::create_dir_all(&workspace)?;
        let token = unique("agent-token-");
        let agent_port = free_port();
        let health_port = free_port();
        let base = |extra: &[(&str, String)]| {
            let mut env: BTreeMap<String, String> = extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect();
            // `E2E_RUST_LOG` overrides the processes' log filter when debugging a test.
            env.insert(
                "RUST_LOG".into(),
                std::env::var("E2E_RUST_LOG").unwrap_or_else(|_| STACK_LOG.into()),
            );
            env.insert("WORKSPACE_ROOT".into(), workspace.display().to_string());
            env
        };
        let mut agent_env = base(&[
            ("AGENT_BIND", format!("127.0.0.1:{agent_port}")),
            ("AGENT_TOKEN", token.clone()),
            ("AGENT_TEST_HOOKS", "1".into()),
            (
                "AGENT_STATE_DIR",
                dir.path().join("agent-state").display().to_string(),
            ),
        ]);
        agent_env.extend(opts.agent_env.clone());
        let agent = Child::spawn(
            "agent",
            bin("agent"),
            agent_env,
            dir.path().join("agent.log"),
        )?;
        let agent_http = format!("http://127.0.0.1:{agent_port}");
        wait_healthy(&agent, &format!("{agent_http}/healthz")).await;

        let bot = hs.register(&unique("bot"), false).await?;
        let mut env = base(&[
            ("MATRIX_HOMESERVER_URL", hs.url.clone()),
            ("MATRIX_USER_ID", bot.user_id.clone()),
            ("AGENT_URL", format!("ws://127.0.0.1:{agent_port}")),
            ("AGENT_TOKEN", token.clone()),
            (
                "SURFACE_STATE_DIR",
                dir.path().join("surface-state").display().to_string(),
            ),
            ("SURFACE_HEALTH_BIND", format!("127.0.0.1:{health_port}")),
            ("SURFACE_ALLOWED_USERS", "*".into()),
            // Tests count the bot's messages in a room; `room_control` turns the introduction on.
            ("SURFACE_JOIN_INTRO", "off".into()),
        ]);
        if opts.password_login {
            env.insert("MATRIX_PASSWORD".into(), bot.password.clone());
        } else {
            env.insert("MATRIX_ACCESS_TOKEN".into(), bot.token.clone());
            env.insert("MATRIX_DEVICE_ID".into(), bot.device_id.clone());
        }
        if let Some(size) = &opts.max_file_size {
            env.insert("SURFACE_MAX_FILE_SIZE".into(), size.clone());
        }
        env.extend(opts.surface_env.clone());
        let surface = Child::spawn(
            "surface",
            bin("surface"),
            env,
            dir.path().join("surface.log"),
        )?;
        let surface_health = format!("http://127.0.0.1:{health_port}");
        wait_healthy(&surface, &format!("{surface_health}/healthz")).await;
        Ok(Self {
            bot,
            agent,
            surface,
            workspace,
            surface_health,
            agent_http,
            agent_token: token,
            _dir: dir,
        })
    }

    /// Starts one more agent like the stack's (same token, workspace and settings; its own port,
    /// state directory and log, all named `name`) and waits until it is healthy. Returns it and
    /// its `ws://` URL.
    pub async fn start_another_agent(&self, name: &str) -> Result<(Child, String)> {
        let port = free_port();
        let mut env = self.agent.env.clone();
        env.insert("AGENT_BIND".into(), format!("127.0.0.1:{port}"));
        env.insert(
            "AGENT_STATE_DIR".into(),
            self._dir
                .path()
                .join(format!("{name}-state"))
                .display()
                .to_string(),
        );
        let log = self._dir.path().join(format!("{name}.log"));
        let child = Child::spawn(name, bin("agent"), env, log)?;
        wait_healthy(&child, &format!("http://127.0.0.1:{port}/healthz")).await;
        Ok((child, format!("ws://127.0.0.1:{port}")))
    }

    /// The `ws://` URL of the stack's agent.
    pub fn agent_ws(&self) -> String {
        self.agent_http.replacen("http://", "ws://", 1)
    }

    /// Waits until the surface's log has a line containing `needle`.
    pub async fn wait_surface_log(&self, needle: &str, timeout: Duration) {
        let deadline = std::time::Instant::now() + timeout;
        while !self.surface.log().contains(needle) {
            assert!(
                std::time::Instant::now() < deadline,
                "the surface did not log {needle:?} within {timeout:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The surface's `SURFACE_STATE_DIR` (session, matrix-sdk store, journal).
    pub fn surface_state_dir(&self) -> PathBuf {
        self._dir.path().join("surface-state")
    }

    /// Waits until the surface answers its health check with 200 again (after a restart).
    pub async fn wait_surface_healthy(&self) {
        wait_healthy(&self.surface, &format!("{}/healthz", self.surface_health)).await;
    }

    /// Waits until the agent answers its health check again (after a restart).
    pub async fn wait_agent_healthy(&self) {
        wait_healthy(&self.agent, &format!("{}/healthz", self.agent_http)).await;
    }

    /// The surface's `/metrics` (Prometheus text).
    pub async fn surface_metrics(&self) -> Result<String> {
        scrape(&format!("{}/metrics", self.surface_health)).await
    }

    /// The agent's `/metrics` (Prometheus text).
    pub async fn agent_metrics(&self) -> Result<String> {
        scrape(&format!("{}/metrics", self.agent_http)).await
    }

    /// Every regular file under `dir` (relative to the workspace), recursively, sorted.
    pub fn files_under(&self, dir: &str) -> Vec<String> {
        let mut out = Vec::new();
        walk(&self.workspace, &self.workspace.join(dir), &mut out);
        out.sort();
        out
    }

    /// The files under `dir` the surface has stored: [`Stack::files_under`] without dot-named
    /// ones (a download still under its temporary name, `.partial-*`, renamed a moment later).
    pub fn stored_files_under(&self, dir: &str) -> Vec<String> {
        let mut out = self.files_under(dir);
        out.retain(|f| {
            !f.rsplit('/')
                .next()
                .is_some_and(|name| name.starts_with('.'))
        });
        out
    }

    /// The turn the agent stored for Matrix event `event_id` (from its append-only chat logs
    /// under `AGENT_STATE_DIR/chats/`, the latest `end` line merged in): what the agent really
    /// received, and how the turn stands.
    pub fn agent_turn(&self, event_id: &str) -> Option<serde_json::Value> {
        let dir = self._dir.path().join("agent-state").join("chats");
        std::fs::read_dir(dir).ok()?.flatten().find_map(|e| {
            let log = std::fs::read_to_string(e.path()).ok()?;
            let mut turn: Option<serde_json::Value> = None;
            for line in log.lines() {
                let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                    continue;
                };
                if v["id"] != event_id {
                    continue;
                }
                match (v["type"].as_str(), turn.as_mut()) {
                    (Some("turn"), _) => turn = Some(v),
                    (Some("end"), Some(t)) => {
                        if let (Some(t), Some(end)) = (t.as_object_mut(), v.as_object()) {
                            for (k, val) in end.iter().filter(|(k, _)| *k != "type") {
                                t.insert(k.clone(), val.clone());
                            }
                        }
                    }
                    _ => {}
                }
            }
            turn
        })
    }

    /// Prints both processes' logs (call when a test fails).
    pub fn dump(&self) {
        self.agent.dump();
        self.surface.dump();
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.dump();
        }
    }
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => walk(root, &p, out),
            Ok(t) if t.is_file() => {
                out.push(
                    p.strip_prefix(root)
                        .expect("under root")
                        .display()
                        .to_string(),
                );
            }
            _ => {}
        }
    }
}

pub(crate) async fn wait_healthy(child: &Child, url: &str) {
    let http = reqwest::Client::new();
    let ok = tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            if let Ok(r) = http.get(url).send().await
                && r.status().is_success()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    if ok.is_err() {
        child.dump();
        panic!("{url} did not become healthy");
    }
}

async fn scrape(url: &str) -> Result<String> {
    let resp = reqwest::get(url).await?.error_for_status()?;
    Ok(resp.text().await?)
}

/// The value of the sample `name{labels}` in a Prometheus text exposition (exactly those
/// labels, in any order); 0 when there is none (a counter never incremented is not shown).
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut want: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    want.sort();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, got) = match series.split_once('{') {
                Some((n, rest)) => {
                    let mut got: Vec<String> = rest
                        .trim_end_matches('}')
                        .split(',')
                        .filter(|p| !p.is_empty())
                        .map(str::to_owned)
                        .collect();
                    got.sort();
                    (n, got)
                }
                None => (series, Vec::new()),
            };
            (n == name && got == want).then(|| value.parse().ok())?
        })
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::metric;

    #[test]
    fn reads_samples_by_name_and_labels() {
        let text = "# HELP x_total X.\n# TYPE x_total counter\n\
                    x_total{kind=\"media\",outcome=\"trigger\"} 3\n\
                    x_total{kind=\"message\",outcome=\"trigger\"} 5\ny 1.5\n";
        assert_eq!(
            metric(
                text,
                "x_total",
                &[("outcome", "trigger"), ("kind", "media")]
            ),
            3.0
        );
        assert_eq!(
            metric(
                text,
                "x_total",
                &[("kind", "message"), ("outcome", "trigger")]
            ),
            5.0
        );
        assert_eq!(metric(text, "y", &[]), 1.5);
        assert_eq!(metric(text, "x_total", &[("kind", "media")]), 0.0);
        assert_eq!(metric(text, "z", &[]), 0.0);
    }
}
