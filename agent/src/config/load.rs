//! Reading and validating the settings: every variable is checked on its own and every problem
//! is collected, so an operator fixes them all in one round instead of one per restart.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use settings::Problems;

use super::acp::{self, AcpConfig};
use super::mcp::{self, MCP_SEPARATOR, McpConfig, McpServerConfig};
use super::{
    BrainConfig, Config, ConfigError, DatabaseConfig, Limits, ModelTuning, OpenAiConfig, Policy,
    Secret, TOOL_NAMES, TranscribeConfig, VisionConfig, VisionMode, default_policies, err,
};

impl Config {
    /// Loads the configuration from the process environment.
    pub fn from_env() -> Result<Self, Problems<ConfigError>> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Loads the configuration from `get` (a variable name to its value), validating
    /// everything; the error holds every problem found, in the order of the variables.
    pub fn from_lookup(
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, Problems<ConfigError>> {
        let mut r = Reader {
            get,
            problems: Problems::new(),
        };
        let bind = r.bind();
        let token = r.token();
        let workspace_root = r.absolute_path("WORKSPACE_ROOT", "/workspace");
        let state_dir = r.absolute_path("AGENT_STATE_DIR", "/var/lib/agent");
        let database = r.database();
        let mcp = r.mcp();
        let tool_policy = {
            let spec = r.get("AGENT_TOOL_POLICY").unwrap_or_default();
            // With broken MCP settings, MCP entries are not checked against them: one problem.
            let servers = mcp.as_ref().map(|m| &m.servers);
            r.check(parse_policy(&spec, servers))
        };
        let offer_demo_tools = r
            .get("AGENT_TOOL_POLICY")
            .unwrap_or_default()
            .split(',')
            .filter_map(|item| item.split_once('='))
            .any(|(tool, policy)| tool.trim() == "dangerous_action" && policy.trim() != "deny");
        let brain = r.brain();
        let transcribe = r.transcribe();
        let limits = r.limits();
        let test_hooks = match r.get("AGENT_TEST_HOOKS").as_deref().map(str::trim) {
            None | Some("0" | "false") => Some(false),
            Some("1" | "true") => Some(true),
            Some(_) => r.fail("AGENT_TEST_HOOKS", "must be 1 or 0"),
        };
        let config = (|| {
            Some(Self {
                bind: bind?,
                token: Secret::new(token?),
                workspace_root: workspace_root?,
                state_dir: state_dir?,
                database: database?,
                brain: brain?,
                tool_policy: tool_policy?,
                mcp: mcp?,
                offer_demo_tools,
                transcribe: transcribe?,
                limits: limits?,
                pdf_helper: super::own_executable(),
                test_hooks: test_hooks?,
            })
        })();
        r.problems.finish(config)
    }
}

/// Longest `AGENT_DATABASE_WAIT`.
const MAX_DATABASE_WAIT: Duration = Duration::from_secs(3600);

/// The settings being read, and the problems found so far. Each reading method returns `None`
/// exactly when it recorded a problem.
struct Reader<G> {
    get: G,
    problems: Problems<ConfigError>,
}

impl<G: Fn(&str) -> Option<String>> Reader<G> {
    /// The value of `var`; blank counts as unset.
    fn get(&self, var: &str) -> Option<String> {
        (self.get)(var).filter(|v| !v.trim().is_empty())
    }

    fn check<T>(&mut self, r: Result<T, ConfigError>) -> Option<T> {
        self.problems.take(r)
    }

    fn fail<T>(&mut self, var: &'static str, reason: impl Into<String>) -> Option<T> {
        self.problems.push(err(var, reason));
        None
    }

    fn bind(&mut self) -> Option<SocketAddr> {
        let value = self
            .get("AGENT_BIND")
            .unwrap_or_else(|| "127.0.0.1:8700".into());
        match value.parse() {
            Ok(addr) => Some(addr),
            Err(e) => self.fail("AGENT_BIND", format!("not a socket address: {e}")),
        }
    }

    fn token(&mut self) -> Option<String> {
        let Some(token) = self.get("AGENT_TOKEN") else {
            return self.fail("AGENT_TOKEN", "is required");
        };
        if token.chars().count() < 16 {
            return self.fail("AGENT_TOKEN", "must be at least 16 characters");
        }
        if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return self.fail(
                "AGENT_TOKEN",
                "must not contain whitespace or control characters",
            );
        }
        Some(token)
    }

    fn absolute_path(&mut self, var: &'static str, default: &str) -> Option<PathBuf> {
        let path = PathBuf::from(self.get(var).unwrap_or_else(|| default.into()));
        if !path.is_absolute() {
            return self.fail(var, "must be an absolute path");
        }
        Some(path)
    }

    fn duration(&mut self, var: &'static str, default: Duration) -> Option<Duration> {
        let Some(v) = self.get(var) else {
            return Some(default);
        };
        match humantime::parse_duration(v.trim()) {
            Ok(d) if d.is_zero() => self.fail(var, "must be greater than zero"),
            Ok(d) => Some(d),
            Err(e) => self.fail(var, format!("not a duration like 20s or 5m: {e}")),
        }
    }

    fn count(&mut self, var: &'static str, default: usize) -> Option<usize> {
        let Some(v) = self.get(var) else {
            return Some(default);
        };
        match v.trim().parse::<usize>() {
            Ok(0) => self.fail(var, "must be greater than zero"),
            Ok(n) => Some(n),
            Err(e) => self.fail(var, format!("not a whole number: {e}")),
        }
    }

    fn mcp(&mut self) -> Option<McpConfig> {
        let timeout = self.duration("AGENT_MCP_TIMEOUT", McpConfig::default().timeout);
        let servers = self.get("AGENT_MCP_SERVERS").unwrap_or_default();
        let mut servers = self.check(mcp::parse_servers(&servers));
        let tokens = self.get("AGENT_MCP_TOKENS").unwrap_or_default();
        let chats = self.get("AGENT_MCP_CHATS").unwrap_or_default();
        if let Some(s) = servers.as_mut() {
            let tokens = mcp::add_tokens(s, &tokens);
            let chats = mcp::add_chats(s, &chats);
            // `|`, not `||`: both are reported.
            if self.check(tokens).is_none() | self.check(chats).is_none() {
                servers = None;
            }
        }
        Some(McpConfig {
            servers: servers?,
            timeout: timeout?,
        })
    }

    fn brain(&mut self) -> Option<BrainConfig> {
        match self.get("AGENT_BRAIN").as_deref().unwrap_or("builtin") {
            "builtin" => Some(BrainConfig::Builtin),
            "openai" => self.openai().map(BrainConfig::OpenAi),
            "acp" => self.acp().map(BrainConfig::Acp),
            other => self.fail(
                "AGENT_BRAIN",
                format!("unknown brain {other:?}, expected builtin, openai or acp"),
            ),
        }
    }

    fn acp(&mut self) -> Option<AcpConfig> {
        let command = self.get("AGENT_ACP_COMMAND").unwrap_or_default();
        let command = self.check(acp::parse_command(&command));
        let pass_env = self.get("AGENT_ACP_ENV").unwrap_or_default();
        let pass_env = self.check(acp::parse_env(&pass_env));
        let d = AcpConfig::new("", Vec::new());
        let max_sessions = self.count("AGENT_ACP_SESSIONS", d.max_sessions);
        let idle = self.duration("AGENT_ACP_IDLE", d.idle);
        let start_timeout = self.duration("AGENT_ACP_START_TIMEOUT", d.start_timeout);
        let turn_idle = self.duration("AGENT_ACP_TURN_IDLE", d.turn_idle);
        let (program, args) = command?;
        Some(AcpConfig {
            program,
            args,
            pass_env: pass_env?,
            max_sessions: max_sessions?,
            idle: idle?,
            start_timeout: start_timeout?,
            turn_idle: turn_idle?,
        })
    }

    fn openai(&mut self) -> Option<OpenAiConfig> {
        let base_url = match self.get("OPENAI_BASE_URL") {
            None => self.fail("OPENAI_BASE_URL", "is required when AGENT_BRAIN=openai"),
            Some(u) if !(u.starts_with("http://") || u.starts_with("https://")) => {
                self.fail("OPENAI_BASE_URL", "must start with http:// or https://")
            }
            Some(u) => Some(u.trim_end_matches('/').to_owned()),
        };
        let model = match self.get("OPENAI_MODEL") {
            None => self.fail("OPENAI_MODEL", "is required when AGENT_BRAIN=openai"),
            model => model,
        };
        let room_models = self.room_models(model.as_deref());
        let api_key = self.get("OPENAI_API_KEY").map(Secret::new);
        let d = ModelTuning::default();
        let rerun_when_changed = match self.get("OPENAI_REPEAT_CALLS").as_deref().map(str::trim) {
            None | Some("when-changed") => Some(true),
            Some("once") => Some(false),
            Some(_) => self.fail("OPENAI_REPEAT_CALLS", "must be once or when-changed"),
        };
        let connect_timeout = self.duration("OPENAI_CONNECT_TIMEOUT", d.connect_timeout);
        let head_timeout = self.duration("OPENAI_HEAD_TIMEOUT", d.head_timeout);
        let idle_timeout = self.duration("OPENAI_IDLE_TIMEOUT", d.idle_timeout);
        let attempts = self.count("OPENAI_ATTEMPTS", d.attempts);
        let max_tokens = match self.count("OPENAI_MAX_TOKENS", d.max_tokens as usize) {
            None => None,
            Some(n) => match u32::try_from(n) {
                Ok(n) => Some(n),
                Err(_) => self.fail("OPENAI_MAX_TOKENS", "is too large"),
            },
        };
        let max_rounds = self.count("OPENAI_MAX_ROUNDS", d.max_rounds);
        let history_chars = self.count("OPENAI_HISTORY_CHARS", d.history_chars);
        let vision = self.vision();
        Some(OpenAiConfig {
            base_url: base_url?,
            model: model?,
            room_models: room_models?,
            api_key,
            tuning: ModelTuning {
                connect_timeout: connect_timeout?,
                head_timeout: head_timeout?,
                idle_timeout: idle_timeout?,
                attempts: attempts?,
                max_tokens: max_tokens?,
                max_rounds: max_rounds?,
                rerun_when_changed: rerun_when_changed?,
                history_chars: history_chars?,
            },
            vision: vision?,
        })
    }

    /// `OPENAI_MODELS`: comma-separated names a room may choose; the default `model` is always
    /// one of them.
    fn room_models(&mut self, model: Option<&str>) -> Option<Vec<String>> {
        let Some(list) = self.get("OPENAI_MODELS") else {
            return Some(Vec::new());
        };
        let mut models: Vec<String> = Vec::new();
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if name.len() > 200 || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return self.fail(
                    "OPENAI_MODELS",
                    "names a model with spaces or control characters",
                );
            }
            if !models.iter().any(|m| m == name) {
                models.push(name.to_owned());
            }
        }
        if let Some(m) = model.filter(|m| !models.iter().any(|n| n == m)) {
            models.insert(0, m.to_owned());
        }
        Some(models)
    }

    fn vision(&mut self) -> Option<VisionConfig> {
        let d = VisionConfig::default();
        let mode = match self.get("OPENAI_VISION").as_deref().map(str::trim) {
            None | Some("auto") => Some(VisionMode::Auto),
            Some("on") => Some(VisionMode::On),
            Some("off") => Some(VisionMode::Off),
            Some(_) => self.fail("OPENAI_VISION", "must be auto, on or off"),
        };
        let long_edge = match self.count("OPENAI_IMAGE_EDGE", d.long_edge as usize) {
            Some(n) if (64..=8192).contains(&n) => u32::try_from(n).ok(),
            Some(_) => self.fail("OPENAI_IMAGE_EDGE", "must be between 64 and 8192 pixels"),
            None => None,
        };
        let max_images = self.count("OPENAI_MAX_IMAGES", d.max_images);
        Some(VisionConfig {
            mode: mode?,
            long_edge: long_edge?,
            max_images: max_images?,
        })
    }

    /// PostgreSQL for the agent's state (`AGENT_DATABASE_URL`, a secret: it may hold a
    /// password); checked as a connection string, never echoed.
    fn database(&mut self) -> Option<Option<DatabaseConfig>> {
        let pool_size = self.count("AGENT_DATABASE_POOL", 16);
        let wait = match self.get("AGENT_DATABASE_WAIT") {
            None => Some(Duration::ZERO),
            Some(v) => match humantime::parse_duration(v.trim()) {
                Ok(d) if d <= MAX_DATABASE_WAIT => Some(d),
                Ok(_) => self.fail("AGENT_DATABASE_WAIT", "must be at most 1h"),
                Err(e) => self.fail(
                    "AGENT_DATABASE_WAIT",
                    format!("not a duration like 0s, 30s or 5m: {e}"),
                ),
            },
        };
        let Some(url) = self.get("AGENT_DATABASE_URL") else {
            return pool_size.and(wait).map(|_| None);
        };
        let url = url.trim().to_owned();
        if url.parse::<tokio_postgres::Config>().is_err() {
            return self.fail(
                "AGENT_DATABASE_URL",
                "not a PostgreSQL connection URL (postgres://user@host/dbname?sslmode=require)",
            );
        }
        let mut config = DatabaseConfig::new(Secret::new(url), pool_size?);
        config.wait = wait?;
        Some(Some(config))
    }

    /// Transcription settings; every one is checked even while `TRANSCRIBE_MODEL` is unset
    /// (transcription off), so a typo shows before it is turned on.
    fn transcribe(&mut self) -> Option<Option<TranscribeConfig>> {
        let base_url = match self.get("TRANSCRIBE_BASE_URL") {
            Some(u) if !(u.starts_with("http://") || u.starts_with("https://")) => {
                self.fail("TRANSCRIBE_BASE_URL", "must start with http:// or https://")
            }
            Some(u) => Some(Some(u.trim_end_matches('/').to_owned())),
            None => Some(None),
        };
        let model = self.get("TRANSCRIBE_MODEL").map(|m| m.trim().to_owned());
        let own_key = self.get("TRANSCRIBE_API_KEY").map(Secret::new);
        let language = match self.get("TRANSCRIBE_LANGUAGE").map(|l| l.trim().to_owned()) {
            Some(l)
                if !(2..=3).contains(&l.len()) || !l.bytes().all(|b| b.is_ascii_lowercase()) =>
            {
                self.fail(
                    "TRANSCRIBE_LANGUAGE",
                    "must be an ISO-639-1 code such as en or de",
                )
            }
            l => Some(l),
        };
        let prompt = self.get("TRANSCRIBE_PROMPT");
        let timeout = self.duration("TRANSCRIBE_TIMEOUT", Duration::from_secs(120));
        let attempts = self.count("TRANSCRIBE_ATTEMPTS", 3);
        let max_duration = self.duration("TRANSCRIBE_MAX_DURATION", Duration::from_secs(15 * 60));
        let max_size = match self.get("TRANSCRIBE_MAX_SIZE") {
            None => Some(25 * 1024 * 1024),
            Some(v) => match v.trim().parse::<bytesize::ByteSize>() {
                Ok(size) if size.as_u64() > 0 => Some(size.as_u64()),
                Ok(_) => self.fail("TRANSCRIBE_MAX_SIZE", "must be greater than zero"),
                Err(e) => self.fail("TRANSCRIBE_MAX_SIZE", format!("not a size like 25MiB: {e}")),
            },
        };
        let show = match self.get("TRANSCRIBE_SHOW").as_deref().map(str::trim) {
            None | Some("1" | "true") => Some(true),
            Some("0" | "false") => Some(false),
            Some(_) => self.fail("TRANSCRIBE_SHOW", "must be true or false"),
        };
        let (base_url, language, timeout, attempts, max_duration, max_size, show) = (
            base_url?,
            language?,
            timeout?,
            attempts?,
            max_duration?,
            max_size?,
            show?,
        );
        let Some(model) = model else {
            return Some(None);
        };
        // Without a URL of its own, the model server transcribes, with its key.
        let (base_url, api_key) = match base_url {
            Some(url) => (url, own_key),
            None => match self.get("OPENAI_BASE_URL") {
                Some(url) => (
                    url.trim_end_matches('/').to_owned(),
                    own_key.or_else(|| self.get("OPENAI_API_KEY").map(Secret::new)),
                ),
                None => {
                    return self.fail(
                        "TRANSCRIBE_BASE_URL",
                        "is required with TRANSCRIBE_MODEL when OPENAI_BASE_URL is not set",
                    );
                }
            },
        };
        Some(Some(TranscribeConfig {
            base_url,
            model,
            api_key,
            language,
            prompt,
            timeout,
            attempts,
            max_duration,
            max_size,
            show,
        }))
    }

    fn limits(&mut self) -> Option<Limits> {
        let d = Limits::default();
        let handshake_timeout = self.duration("AGENT_HANDSHAKE_TIMEOUT", d.handshake_timeout);
        let ping_interval = self.duration("AGENT_PING_INTERVAL", d.ping_interval);
        let idle_timeout = self.duration("AGENT_IDLE_TIMEOUT", d.idle_timeout);
        let approval_timeout = self.duration("AGENT_APPROVAL_TIMEOUT", d.approval_timeout);
        let ask_timeout = self.duration("AGENT_ASK_TIMEOUT", d.ask_timeout);
        let delivery_timeout = self.duration("AGENT_DELIVERY_TIMEOUT", d.delivery_timeout);
        let max_file_size = match self.get("AGENT_MAX_FILE_SIZE") {
            None => Some(d.max_file_size),
            Some(v) => match v.trim().parse::<bytesize::ByteSize>() {
                Ok(size) => Some(size.as_u64()),
                Err(e) => self.fail(
                    "AGENT_MAX_FILE_SIZE",
                    format!("not a size like 100MiB: {e}"),
                ),
            },
        };
        let head_timeout = self.duration("AGENT_HEAD_TIMEOUT", d.head_timeout);
        let max_pending = self.count("AGENT_MAX_PENDING", d.max_pending);
        let max_pending_per_ip = self.count("AGENT_MAX_PENDING_PER_IP", d.max_pending_per_ip);
        // Compared only when both are valid: a bad ping interval is one problem, not two.
        if let (Some(idle), Some(ping)) = (idle_timeout, ping_interval)
            && idle <= ping
        {
            return self.fail(
                "AGENT_IDLE_TIMEOUT",
                "must be longer than AGENT_PING_INTERVAL",
            );
        }
        Some(Limits {
            handshake_timeout: handshake_timeout?,
            ping_interval: ping_interval?,
            idle_timeout: idle_timeout?,
            approval_timeout: approval_timeout?,
            ask_timeout: ask_timeout?,
            delivery_timeout: delivery_timeout?,
            max_file_size: max_file_size?,
            head_timeout: head_timeout?,
            max_pending: max_pending?,
            max_pending_per_ip: max_pending_per_ip?,
        })
    }
}

/// Parses `tool=policy,tool=policy` over the default policies. Besides the built-in tools it
/// takes MCP tools (`server__tool` or `server.tool`) and whole MCP servers (`server__*` or
/// `server.*`) of the configured `servers` (any server when those are unknown: broken).
fn parse_policy(
    spec: &str,
    servers: Option<&BTreeMap<String, McpServerConfig>>,
) -> Result<BTreeMap<String, Policy>, ConfigError> {
    const VAR: &str = "AGENT_TOOL_POLICY";
    let mut policies = default_policies();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (tool, policy) = item
            .split_once('=')
            .ok_or_else(|| err(VAR, format!("{item:?} is not tool=policy")))?;
        let (tool, policy) = (tool.trim(), policy.trim());
        let policy = policy.parse().map_err(|_| {
            err(
                VAR,
                format!("unknown policy {policy:?} for {tool}; expected allow, ask or deny"),
            )
        })?;
        if let Some(slot) = policies.get_mut(tool) {
            *slot = policy;
            continue;
        }
        let mcp_tool = mcp_policy_key(tool).filter(|(server, tool)| {
            // An ACP agent's tools, by kind (AGENT_BRAIN=acp).
            (server == "acp" && (tool == "*" || ACP_TOOL_KINDS.contains(&tool.as_str())))
                || servers.is_none_or(|s| s.contains_key(server.as_str()))
        });
        let Some((server, tool)) = mcp_tool else {
            return Err(err(
                VAR,
                format!(
                    "unknown tool {tool:?}; known tools: {}, server__tool or server__* \
                     of the servers in AGENT_MCP_SERVERS, and acp__<kind> or acp__* for an \
                     ACP agent's tools",
                    TOOL_NAMES.join(", ")
                ),
            ));
        };
        policies.insert(format!("{server}{MCP_SEPARATOR}{tool}"), policy);
    }
    Ok(policies)
}

/// The kinds of an ACP agent's tool calls (`acp__<kind>` in `AGENT_TOOL_POLICY`).
const ACP_TOOL_KINDS: &[&str] = &[
    "read",
    "edit",
    "delete",
    "move",
    "search",
    "execute",
    "think",
    "fetch",
    "switch_mode",
    "other",
];

/// `server__tool`, `server.tool`, `server__*` or `server.*` as (server, tool or `*`).
fn mcp_policy_key(key: &str) -> Option<(String, String)> {
    let (server, tool) = key
        .split_once(MCP_SEPARATOR)
        .or_else(|| key.split_once('.'))?;
    let valid_tool = tool == "*"
        || (!tool.is_empty()
            && tool
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'));
    (!server.is_empty() && valid_tool).then(|| (server.to_owned(), tool.to_owned()))
}
