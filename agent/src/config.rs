//! Typed configuration, loaded from environment variables and validated before anything binds.

mod acp;
mod load;
mod mcp;
mod vars;

pub use acp::AcpConfig;
pub use mcp::{MCP_SEPARATOR, McpConfig, McpServerConfig, McpTransport};
pub use vars::VARS;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// Everything the agent needs to run. Built by [`Config::from_env`] (or [`Config::from_lookup`]
/// in tests); passed explicitly, never read from globals.
#[derive(Clone)]
pub struct Config {
    /// Where the HTTP/WebSocket server listens (`AGENT_BIND`).
    pub bind: SocketAddr,
    /// Shared secret the surface presents as `Authorization: Bearer` (`AGENT_TOKEN`).
    /// Never printed: see the `Debug` impl.
    pub token: Secret,
    /// The shared workspace (`WORKSPACE_ROOT`); every file access happens beneath it.
    pub workspace_root: PathBuf,
    /// The agent's own durable state: chat histories, remembered approvals (`AGENT_STATE_DIR`);
    /// not used when [`Config::database`] is set.
    pub state_dir: PathBuf,
    /// PostgreSQL for the durable state instead of the state directory (`AGENT_DATABASE_URL`).
    pub database: Option<DatabaseConfig>,
    /// Which brain answers turns (`AGENT_BRAIN`).
    pub brain: BrainConfig,
    /// Policy per tool (`AGENT_TOOL_POLICY` over the defaults); has an entry for every built-in
    /// tool, and the entries the operator gave for MCP tools (`server__tool`) and whole MCP
    /// servers (`server__*`); an MCP tool without one is `ask`.
    pub tool_policy: BTreeMap<String, Policy>,
    /// The MCP servers whose tools are offered next to the built-in ones.
    pub mcp: McpConfig,
    /// The demo tool `dangerous_action` is offered to models: the operator named it in
    /// `AGENT_TOOL_POLICY` (allow or ask). Otherwise only the builtin brain's `approve` uses it.
    pub offer_demo_tools: bool,
    /// Voice messages and audio files transcribed through an OpenAI-compatible
    /// `/audio/transcriptions` server (`TRANSCRIBE_MODEL`; off when unset).
    pub transcribe: Option<TranscribeConfig>,
    /// Limits and timeouts.
    pub limits: Limits,
    /// The program that reads PDFs in a child process under limits: this binary, run as
    /// `agent __pdf-text` (not a setting: the running executable; tests point it at the built
    /// `agent` binary).
    pub pdf_helper: PathBuf,
    /// Commands that exist only for tests (`sendraw`, `sleep` in the builtin brain)
    /// (`AGENT_TEST_HOOKS=1`, default off). Never enable it in a deployment: `sendraw` names a
    /// path to the surface without checking it.
    pub test_hooks: bool,
}

/// Which brain to use, with its settings.
#[derive(Clone)]
pub enum BrainConfig {
    /// The offline, deterministic command interpreter.
    Builtin,
    /// An OpenAI-compatible chat-completions server.
    OpenAi(OpenAiConfig),
    /// An agent process spoken to over the Agent Client Protocol.
    Acp(AcpConfig),
}

/// Settings of the OpenAI-compatible brain.
#[derive(Clone)]
pub struct OpenAiConfig {
    /// Base URL up to and including `/v1`, e.g. `http://127.0.0.1:11434/v1` (`OPENAI_BASE_URL`).
    pub base_url: String,
    /// Model name (`OPENAI_MODEL`).
    pub model: String,
    /// The models a room may choose for its turns (`OPENAI_MODELS`; `model` among them when
    /// any is set; empty: rooms cannot choose).
    pub room_models: Vec<String>,
    /// API key (`OPENAI_API_KEY`); optional for local servers. Never printed.
    pub api_key: Option<Secret>,
    /// Timeouts, retries and loop limits.
    pub tuning: ModelTuning,
    /// Whether and how pictures are shown to the model.
    pub vision: VisionConfig,
}

/// Whether the model is sent pictures (`OPENAI_VISION`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VisionMode {
    /// Sent; if the server refuses pictures, the turn is asked again without them and the
    /// model is not sent any again (the default).
    Auto,
    /// Always sent; a refusal is a failed turn.
    On,
    /// Never sent: the model gets the files' details only.
    Off,
}

/// How pictures reach the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VisionConfig {
    /// `OPENAI_VISION`, default `auto`.
    pub mode: VisionMode,
    /// Longest side of a picture as sent, in pixels (`OPENAI_IMAGE_EDGE`, default 1536).
    pub long_edge: u32,
    /// Most pictures shown with one message (`OPENAI_MAX_IMAGES`, default 4); `view_image`
    /// shows more when the model asks.
    pub max_images: usize,
}

impl Default for VisionConfig {
    fn default() -> Self {
        Self {
            mode: VisionMode::Auto,
            long_edge: 1536,
            max_images: 4,
        }
    }
}

/// Settings of speech transcription.
#[derive(Clone)]
pub struct TranscribeConfig {
    /// Base URL up to and including `/v1` (`TRANSCRIBE_BASE_URL`, default `OPENAI_BASE_URL`).
    pub base_url: String,
    /// Model name (`TRANSCRIBE_MODEL`, e.g. `whisper-1`).
    pub model: String,
    /// API key (`TRANSCRIBE_API_KEY`, default `OPENAI_API_KEY` when the server is the model
    /// server). Never printed.
    pub api_key: Option<Secret>,
    /// Language of the speech, ISO-639-1 (`TRANSCRIBE_LANGUAGE`; the server guesses without).
    pub language: Option<String>,
    /// Text that guides the transcription: names, jargon (`TRANSCRIBE_PROMPT`).
    pub prompt: Option<String>,
    /// Longest wait for one transcription (`TRANSCRIBE_TIMEOUT`, default 120s).
    pub timeout: Duration,
    /// Tries while the server is unreachable, rate limiting or failing (`TRANSCRIBE_ATTEMPTS`,
    /// default 3).
    pub attempts: usize,
    /// Longest recording sent (`TRANSCRIBE_MAX_DURATION`, default 15m).
    pub max_duration: Duration,
    /// Largest file sent (`TRANSCRIBE_MAX_SIZE`, default 25MiB, OpenAI's limit).
    pub max_size: u64,
    /// The room is shown what was heard (`TRANSCRIBE_SHOW`, default true).
    pub show: bool,
}

impl fmt::Debug for TranscribeConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TranscribeConfig")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("api_key", &self.api_key)
            .field("language", &self.language)
            .field("prompt", &self.prompt.as_ref().map(|p| p.chars().count()))
            .field("timeout", &self.timeout)
            .field("attempts", &self.attempts)
            .field("max_duration", &self.max_duration)
            .field("max_size", &self.max_size)
            .field("show", &self.show)
            .finish()
    }
}

impl OpenAiConfig {
    /// A server at `base_url` serving `model`, with default tuning.
    pub fn new(
        base_url: impl Into<String>,
        model: impl Into<String>,
        api_key: Option<Secret>,
    ) -> Self {
        Self {
            base_url: base_url.into(),
            model: model.into(),
            room_models: Vec::new(),
            api_key,
            tuning: ModelTuning::default(),
            vision: VisionConfig::default(),
        }
    }
}

/// How patiently and how far the OpenAI-compatible brain works.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelTuning {
    /// Connecting to the server (`OPENAI_CONNECT_TIMEOUT`, default 10s).
    pub connect_timeout: Duration,
    /// From the request to the response head (`OPENAI_HEAD_TIMEOUT`, default 60s): a frozen
    /// server must not leave the room waiting in silence.
    pub head_timeout: Duration,
    /// Longest silence between two chunks of a stream (`OPENAI_IDLE_TIMEOUT`, default 120s).
    pub idle_timeout: Duration,
    /// Attempts of one request while the server is unreachable, rate limiting (429) or failing
    /// (5xx) before anything was streamed (`OPENAI_ATTEMPTS`, default 4).
    pub attempts: usize,
    /// `max_tokens` of each completion (`OPENAI_MAX_TOKENS`, default 4096).
    pub max_tokens: u32,
    /// Most model round trips in one turn (`OPENAI_MAX_ROUNDS`, default 8).
    pub max_rounds: usize,
    /// A read-only tool called again with the same arguments runs again, and counts as a
    /// repeat only when its result did not change (`OPENAI_REPEAT_CALLS=when-changed`, the
    /// default), or never runs twice (`once`). Tools with effects never run twice.
    pub rerun_when_changed: bool,
    /// Characters of earlier turns sent along, newest kept (`OPENAI_HISTORY_CHARS`,
    /// default 24000).
    pub history_chars: usize,
}

impl Default for ModelTuning {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            head_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(120),
            attempts: 4,
            max_tokens: 4096,
            max_rounds: 8,
            rerun_when_changed: true,
            history_chars: 24_000,
        }
    }
}

/// Limits and timeouts of connections, turns and files.
#[derive(Debug, Clone)]
pub struct Limits {
    /// The first frame must be `hello` within this (`AGENT_HANDSHAKE_TIMEOUT`, default 10s).
    pub handshake_timeout: Duration,
    /// How often the agent pings an idle connection (`AGENT_PING_INTERVAL`, default 20s).
    pub ping_interval: Duration,
    /// A connection silent for this long (no frame, no pong) is closed (`AGENT_IDLE_TIMEOUT`,
    /// default 60s).
    pub idle_timeout: Duration,
    /// No decision on an approval request within this means deny (`AGENT_APPROVAL_TIMEOUT`,
    /// default 5m).
    pub approval_timeout: Duration,
    /// No answer to `ask_user` within this answers "no reply" (`AGENT_ASK_TIMEOUT`, default 10m).
    pub ask_timeout: Duration,
    /// How long `send_file` waits for the surface's delivery report (`AGENT_DELIVERY_TIMEOUT`,
    /// default 10m: a large upload takes a while).
    pub delivery_timeout: Duration,
    /// Largest file a tool opens (`AGENT_MAX_FILE_SIZE`, default 100MiB).
    pub max_file_size: u64,
    /// A new connection must send its request head and, for the WebSocket route, complete the
    /// upgrade within this, or it is closed (`AGENT_HEAD_TIMEOUT`, default 5s). Upgraded
    /// sessions are not affected.
    pub head_timeout: Duration,
    /// Most connections that have not upgraded yet, from all peers together
    /// (`AGENT_MAX_PENDING`, default 128). Beyond it a newcomer displaces the oldest such
    /// connection of the peer holding the most, if that is more than its own; otherwise it is
    /// closed as soon as it is accepted.
    pub max_pending: usize,
    /// Most connections that have not upgraded yet from one peer IP address
    /// (`AGENT_MAX_PENDING_PER_IP`, default 16).
    pub max_pending_per_ip: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            handshake_timeout: Duration::from_secs(10),
            ping_interval: Duration::from_secs(20),
            idle_timeout: Duration::from_secs(60),
            approval_timeout: Duration::from_secs(300),
            ask_timeout: Duration::from_secs(600),
            delivery_timeout: Duration::from_secs(600),
            max_file_size: 100 * 1024 * 1024,
            head_timeout: Duration::from_secs(5),
            max_pending: 128,
            max_pending_per_ip: 16,
        }
    }
}

/// What happens when a brain calls a tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Run it.
    Allow,
    /// Ask the user first (`approval_request`); no decision in time means deny.
    Ask,
    /// Refuse it; the brain gets an error result.
    Deny,
}

impl Policy {
    /// The stricter of two policies (allow < ask < deny).
    pub fn stricter(self, other: Self) -> Self {
        let rank = |p: Self| match p {
            Self::Allow => 0,
            Self::Ask => 1,
            Self::Deny => 2,
        };
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }
}

impl From<protocol::ToolPolicy> for Policy {
    fn from(p: protocol::ToolPolicy) -> Self {
        match p {
            protocol::ToolPolicy::Allow => Self::Allow,
            protocol::ToolPolicy::Ask => Self::Ask,
            protocol::ToolPolicy::Deny => Self::Deny,
        }
    }
}

impl FromStr for Policy {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        match s {
            "allow" => Ok(Self::Allow),
            "ask" => Ok(Self::Ask),
            "deny" => Ok(Self::Deny),
            _ => Err(()),
        }
    }
}

/// Every tool name, as used in `AGENT_TOOL_POLICY` and by brains. The configuration names the
/// tools so it can be validated before anything starts; `tools` implements exactly these (its
/// tests check that the two agree).
pub const TOOL_NAMES: &[&str] = &[
    "list_files",
    "read_file",
    "write_file",
    "send_file",
    "ask_user",
    "dangerous_action",
    "describe_file",
    "view_image",
    "remember",
    "recall",
    "forget",
];

/// The policies used when `AGENT_TOOL_POLICY` says nothing about a tool: `ask` for
/// `dangerous_action`, `allow` for the rest (the memory tools included: they touch only the
/// agent's own memory of the user and room of the turn).
pub fn default_policies() -> BTreeMap<String, Policy> {
    TOOL_NAMES
        .iter()
        .map(|&name| {
            let policy = if name == "dangerous_action" {
                Policy::Ask
            } else {
                Policy::Allow
            };
            (name.to_owned(), policy)
        })
        .collect()
}

pub use crate::db::DatabaseConfig;
pub use protocol::Secret;

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("bind", &self.bind)
            .field("token", &self.token)
            .field("workspace_root", &self.workspace_root)
            .field("state_dir", &self.state_dir)
            .field("database", &self.database)
            .field("brain", &self.brain)
            .field("tool_policy", &self.tool_policy)
            .field("mcp", &self.mcp)
            .field("offer_demo_tools", &self.offer_demo_tools)
            .field("transcribe", &self.transcribe)
            .field("limits", &self.limits)
            .field("test_hooks", &self.test_hooks)
            .finish()
    }
}

impl BrainConfig {
    /// The models a room may choose (`OPENAI_MODELS`), offered to the surface in the welcome.
    pub fn room_models(&self) -> Vec<String> {
        match self {
            Self::OpenAi(c) => c.room_models.clone(),
            Self::Builtin | Self::Acp(_) => Vec::new(),
        }
    }
}

impl fmt::Debug for BrainConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Builtin => f.write_str("Builtin"),
            Self::OpenAi(c) => c.fmt(f),
            Self::Acp(c) => c.fmt(f),
        }
    }
}

impl fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("room_models", &self.room_models)
            .field("api_key", &self.api_key)
            .field("tuning", &self.tuning)
            .field("vision", &self.vision)
            .finish()
    }
}

/// A setting is missing or malformed. The message names the variable and never echoes secrets.
#[derive(Debug, thiserror::Error)]
#[error("{var}: {reason}")]
pub struct ConfigError {
    /// The environment variable at fault.
    pub var: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

fn err(var: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        var,
        reason: reason.into(),
    }
}

/// The running program, which is the PDF helper too (`agent` on the `PATH` if it cannot be
/// found).
pub fn own_executable() -> PathBuf {
    std::env::current_exe().unwrap_or_else(|_| PathBuf::from("agent"))
}

impl Config {
    /// A configuration for tests and embedding: builtin brain, default policies and limits.
    pub fn new(token: &str, workspace_root: PathBuf, state_dir: PathBuf) -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            token: Secret::new(token),
            workspace_root,
            state_dir,
            database: None,
            brain: BrainConfig::Builtin,
            tool_policy: default_policies(),
            mcp: McpConfig::default(),
            offer_demo_tools: false,
            transcribe: None,
            limits: Limits::default(),
            pdf_helper: own_executable(),
            test_hooks: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn load(vars: &[(&str, &str)]) -> Result<Config, settings::Problems<ConfigError>> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn the_demo_tool_is_offered_to_models_only_when_named() {
        let cases = [
            ("", false),
            ("read_file=ask", false),
            ("dangerous_action=ask", true),
            ("read_file=allow, dangerous_action = allow", true),
            ("dangerous_action=deny", false),
        ];
        for (policy, offered) in cases {
            let c = load(&[
                ("AGENT_TOKEN", "0123456789abcdef"),
                ("AGENT_TOOL_POLICY", policy),
            ])
            .unwrap();
            assert_eq!(c.offer_demo_tools, offered, "{policy:?}");
        }
    }

    #[test]
    fn every_variable_read_is_listed_in_help() {
        let read = std::sync::Mutex::new(std::collections::BTreeSet::new());
        let env = [
            ("AGENT_TOKEN", "0123456789abcdef"),
            ("AGENT_BRAIN", "openai"),
            ("OPENAI_BASE_URL", "http://127.0.0.1:1/v1"),
            ("OPENAI_MODEL", "m"),
        ];
        let lookup = |k: &str| {
            read.lock().unwrap().insert(k.to_owned());
            env.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        };
        Config::from_lookup(lookup).unwrap();
        for name in read.lock().unwrap().iter() {
            assert!(
                VARS.iter().any(|v| v.name == name),
                "{name} is not in --help"
            );
        }
    }

    const TOKEN: (&str, &str) = ("AGENT_TOKEN", "0123456789abcdef-secret");

    #[test]
    fn defaults() {
        let c = load(&[TOKEN]).unwrap();
        assert_eq!(c.bind.to_string(), "127.0.0.1:8700");
        assert!(!c.test_hooks);
        assert_eq!(c.limits.head_timeout, Duration::from_secs(5));
        assert_eq!(c.limits.max_pending, 128);
        assert_eq!(c.limits.max_pending_per_ip, 16);
        assert_eq!(c.workspace_root, PathBuf::from("/workspace"));
        assert_eq!(c.state_dir, PathBuf::from("/var/lib/agent"));
        assert!(matches!(c.brain, BrainConfig::Builtin));
        assert_eq!(c.tool_policy["dangerous_action"], Policy::Ask);
        assert_eq!(c.tool_policy["write_file"], Policy::Allow);
        for memory_tool in ["remember", "recall", "forget"] {
            assert_eq!(c.tool_policy[memory_tool], Policy::Allow, "{memory_tool}");
        }
    }

    #[test]
    fn errors_name_the_variable() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[], "AGENT_TOKEN: is required"),
            (
                &[("AGENT_TOKEN", "short")],
                "AGENT_TOKEN: must be at least 16 characters",
            ),
            (&[TOKEN, ("AGENT_BIND", "nope")], "AGENT_BIND:"),
            (
                &[TOKEN, ("WORKSPACE_ROOT", "rel/path")],
                "WORKSPACE_ROOT: must be an absolute path",
            ),
            (&[TOKEN, ("AGENT_BRAIN", "magic")], "AGENT_BRAIN:"),
            (
                &[TOKEN, ("AGENT_BRAIN", "openai"), ("OPENAI_MODEL", "m")],
                "OPENAI_BASE_URL:",
            ),
            (
                &[
                    TOKEN,
                    ("AGENT_BRAIN", "openai"),
                    ("OPENAI_BASE_URL", "http://x/v1"),
                ],
                "OPENAI_MODEL:",
            ),
            (
                &[TOKEN, ("AGENT_TOOL_POLICY", "rm_rf=allow")],
                "AGENT_TOOL_POLICY: unknown tool",
            ),
            (
                &[TOKEN, ("AGENT_TOOL_POLICY", "read_file=maybe")],
                "AGENT_TOOL_POLICY: unknown policy",
            ),
            (
                &[TOKEN, ("AGENT_TOOL_POLICY", "read_file")],
                "AGENT_TOOL_POLICY:",
            ),
            (
                &[TOKEN, ("AGENT_IDLE_TIMEOUT", "soon")],
                "AGENT_IDLE_TIMEOUT:",
            ),
            (
                &[TOKEN, ("AGENT_MAX_FILE_SIZE", "lots")],
                "AGENT_MAX_FILE_SIZE:",
            ),
            (
                &[TOKEN, ("AGENT_HEAD_TIMEOUT", "0s")],
                "AGENT_HEAD_TIMEOUT: must be greater than zero",
            ),
            (
                &[TOKEN, ("AGENT_MAX_PENDING", "0")],
                "AGENT_MAX_PENDING: must be greater than zero",
            ),
            (
                &[TOKEN, ("AGENT_MAX_PENDING_PER_IP", "many")],
                "AGENT_MAX_PENDING_PER_IP: not a whole number",
            ),
            (&[TOKEN, ("AGENT_TEST_HOOKS", "yes")], "AGENT_TEST_HOOKS:"),
            (
                &[TOKEN, ("AGENT_MCP_SERVERS", "demo")],
                "AGENT_MCP_SERVERS: an entry is not name=value",
            ),
            (
                &[TOKEN, ("AGENT_MCP_TOKENS", "demo=x")],
                "AGENT_MCP_TOKENS: \"demo\" is not a server",
            ),
            (
                &[
                    TOKEN,
                    ("AGENT_MCP_SERVERS", "demo=stdio:x"),
                    ("AGENT_MCP_CHATS", "demo=../up"),
                ],
                "AGENT_MCP_CHATS: demo: bad chat id",
            ),
            (
                &[TOKEN, ("AGENT_MCP_TIMEOUT", "0s")],
                "AGENT_MCP_TIMEOUT: must be greater than zero",
            ),
            (
                &[TOKEN, ("AGENT_TOOL_POLICY", "demo__echo=allow")],
                "AGENT_TOOL_POLICY: unknown tool",
            ),
        ];
        for (vars, expected) in cases {
            let e = load(vars).unwrap_err();
            assert_eq!(e.list().len(), 1, "{vars:?}: {e}");
            assert!(e.to_string().starts_with(expected), "{vars:?}: {e}");
        }
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        // The variables at fault, in the order they are read; each is checked on its own.
        type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str]);
        let cases: &[Case] = &[
            (
                &[
                    ("AGENT_BIND", "nope"),
                    ("AGENT_TOKEN", "short"),
                    ("AGENT_MAX_PENDING", "0"),
                ],
                &["AGENT_BIND", "AGENT_TOKEN", "AGENT_MAX_PENDING"],
            ),
            (
                &[TOKEN, ("AGENT_BRAIN", "openai"), ("OPENAI_ATTEMPTS", "x")],
                &["OPENAI_BASE_URL", "OPENAI_MODEL", "OPENAI_ATTEMPTS"],
            ),
            (
                &[
                    ("WORKSPACE_ROOT", "rel"),
                    ("AGENT_STATE_DIR", "rel"),
                    ("AGENT_TOOL_POLICY", "rm=allow"),
                    ("AGENT_TEST_HOOKS", "yes"),
                ],
                &[
                    "AGENT_TOKEN",
                    "WORKSPACE_ROOT",
                    "AGENT_STATE_DIR",
                    "AGENT_TOOL_POLICY",
                    "AGENT_TEST_HOOKS",
                ],
            ),
            // Broken MCP settings are one problem: policies of MCP tools are not checked against
            // them.
            (
                &[
                    TOKEN,
                    ("AGENT_MCP_SERVERS", "demo=ftp://x"),
                    ("AGENT_TOOL_POLICY", "demo__*=allow"),
                ],
                &["AGENT_MCP_SERVERS"],
            ),
            // A bad ping interval is one problem: the idle timeout is not compared with it.
            (
                &[
                    TOKEN,
                    ("AGENT_PING_INTERVAL", "often"),
                    ("AGENT_IDLE_TIMEOUT", "1s"),
                ],
                &["AGENT_PING_INTERVAL"],
            ),
            (
                &[
                    TOKEN,
                    ("AGENT_PING_INTERVAL", "30s"),
                    ("AGENT_IDLE_TIMEOUT", "30s"),
                ],
                &["AGENT_IDLE_TIMEOUT"],
            ),
        ];
        for (vars, expected) in cases {
            let e = load(vars).unwrap_err();
            let at_fault: Vec<&str> = e.list().iter().map(|p| p.var).collect();
            assert_eq!(&at_fault, expected, "{vars:?}: {e}");
        }
        let e = load(cases[0].0).unwrap_err().to_string();
        assert!(
            e.starts_with("3 problems: AGENT_BIND: not a socket address")
                && e.contains("; AGENT_TOKEN: must be at least 16 characters; ")
                && e.ends_with("AGENT_MAX_PENDING: must be greater than zero"),
            "{e}"
        );
    }

    #[test]
    fn mcp_servers_and_their_policies() {
        let c = load(&[
            TOKEN,
            (
                "AGENT_MCP_SERVERS",
                "demo=stdio:python3 /srv/demo.py; web=https://mcp.example/mcp",
            ),
            ("AGENT_MCP_TOKENS", "web=mcp-very-secret-token"),
            ("AGENT_MCP_CHATS", "demo=r-a-1,r-b-2"),
            ("AGENT_MCP_TIMEOUT", "5s"),
            (
                "AGENT_TOOL_POLICY",
                "demo.*=allow, demo__hang=deny, web.search=ask, write_file=ask",
            ),
        ])
        .unwrap();
        assert_eq!(c.mcp.timeout, Duration::from_secs(5));
        assert_eq!(c.mcp.servers.len(), 2);
        assert_eq!(
            c.mcp.servers["demo"].chats.as_ref().map(|c| c.len()),
            Some(2)
        );
        assert!(c.mcp.servers["web"].chats.is_none());
        assert_eq!(c.tool_policy["demo__*"], Policy::Allow);
        assert_eq!(c.tool_policy["demo__hang"], Policy::Deny);
        assert_eq!(c.tool_policy["web__search"], Policy::Ask);
        assert_eq!(c.tool_policy["write_file"], Policy::Ask);
        let debug = format!("{c:?}");
        assert!(!debug.contains("very-secret"), "{debug}");
        assert_eq!(load(&[TOKEN]).unwrap().mcp.timeout, Duration::from_secs(30));
    }

    #[test]
    fn policy_overrides_and_secrets_stay_hidden() {
        let c = load(&[
            TOKEN,
            (
                "AGENT_TOOL_POLICY",
                "write_file=ask, send_file=deny, remember=ask, forget=deny",
            ),
            ("AGENT_BRAIN", "openai"),
            ("OPENAI_BASE_URL", "http://127.0.0.1:1/v1/"),
            ("OPENAI_MODEL", "m"),
            ("OPENAI_API_KEY", "sk-very-secret-key"),
            ("AGENT_PING_INTERVAL", "5s"),
            ("AGENT_IDLE_TIMEOUT", "15s"),
            ("AGENT_MAX_FILE_SIZE", "1MiB"),
            ("AGENT_HEAD_TIMEOUT", "2s"),
            ("AGENT_MAX_PENDING_PER_IP", "4"),
            ("AGENT_TEST_HOOKS", "1"),
        ])
        .unwrap();
        assert_eq!(c.tool_policy["write_file"], Policy::Ask);
        assert_eq!(c.tool_policy["send_file"], Policy::Deny);
        assert_eq!(c.tool_policy["remember"], Policy::Ask);
        assert_eq!(c.tool_policy["forget"], Policy::Deny);
        assert_eq!(c.tool_policy["recall"], Policy::Allow);
        assert_eq!(c.limits.ping_interval, Duration::from_secs(5));
        assert_eq!(c.limits.max_file_size, 1024 * 1024);
        assert_eq!(c.limits.head_timeout, Duration::from_secs(2));
        assert_eq!(c.limits.max_pending_per_ip, 4);
        assert!(c.test_hooks);
        let BrainConfig::OpenAi(o) = &c.brain else {
            panic!("openai")
        };
        assert_eq!(o.base_url, "http://127.0.0.1:1/v1");
        let debug = format!("{c:?}");
        assert!(!debug.contains("secret"), "{debug}");
        assert!(debug.contains("[redacted]"));
    }
}
