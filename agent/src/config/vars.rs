//! Every setting of the agent, as `--help` lists it (the parsing and validation are in
//! [`super::Config::from_lookup`]; a test checks that every variable it reads is listed).

use settings::Var;

const fn var(name: &'static str, default: &'static str, help: &'static str) -> Var {
    Var {
        name,
        default,
        help,
        secret: false,
    }
}

const fn secret(name: &'static str, help: &'static str) -> Var {
    Var {
        name,
        default: "",
        help,
        secret: true,
    }
}

/// The agent's settings.
pub const VARS: &[Var] = &[
    secret(
        "AGENT_TOKEN",
        "shared secret the surface presents (required, 16+ characters)",
    ),
    var(
        "AGENT_BIND",
        "127.0.0.1:8700",
        "address to listen on (WebSocket, /healthz, /metrics)",
    ),
    var(
        "WORKSPACE_ROOT",
        "/workspace",
        "the shared workspace folder",
    ),
    var(
        "AGENT_STATE_DIR",
        "/var/lib/agent",
        "conversations and memory",
    ),
    var(
        "AGENT_BRAIN",
        "builtin",
        "builtin (offline, deterministic) or openai",
    ),
    var(
        "AGENT_TOOL_POLICY",
        "",
        "per-tool allow/ask/deny, e.g. dangerous_action=ask",
    ),
    var(
        "AGENT_TEST_HOOKS",
        "false",
        "extra builtin commands for tests",
    ),
    var(
        "AGENT_HANDSHAKE_TIMEOUT",
        "10s",
        "how long a connection may take to say hello",
    ),
    var("AGENT_PING_INTERVAL", "20s", "WebSocket ping interval"),
    var(
        "AGENT_IDLE_TIMEOUT",
        "60s",
        "a silent connection is closed after this",
    ),
    var(
        "AGENT_HEAD_TIMEOUT",
        "5s",
        "deadline for an HTTP request head",
    ),
    var(
        "AGENT_MAX_PENDING",
        "128",
        "connections being set up at once",
    ),
    var(
        "AGENT_MAX_PENDING_PER_IP",
        "16",
        "of those, from one address",
    ),
    var(
        "AGENT_APPROVAL_TIMEOUT",
        "5m",
        "how long a tool call waits for approval",
    ),
    var(
        "AGENT_ASK_TIMEOUT",
        "10m",
        "how long a question waits for the user",
    ),
    var(
        "AGENT_DELIVERY_TIMEOUT",
        "10m",
        "how long send_file waits for the room to get it",
    ),
    var(
        "AGENT_MAX_FILE_SIZE",
        "100MiB",
        "largest file a tool reads or writes",
    ),
    var(
        "OPENAI_BASE_URL",
        "",
        "model server, up to /v1 (required with AGENT_BRAIN=openai)",
    ),
    var(
        "OPENAI_MODEL",
        "",
        "model name (required with AGENT_BRAIN=openai)",
    ),
    secret(
        "OPENAI_API_KEY",
        "API key, if the server needs one (never logged)",
    ),
    var(
        "OPENAI_CONNECT_TIMEOUT",
        "10s",
        "connecting to the model server",
    ),
    var(
        "OPENAI_HEAD_TIMEOUT",
        "60s",
        "waiting for the model's answer to start",
    ),
    var(
        "OPENAI_IDLE_TIMEOUT",
        "120s",
        "longest silence inside a streamed answer",
    ),
    var(
        "OPENAI_ATTEMPTS",
        "4",
        "tries of a request before giving up",
    ),
    var("OPENAI_MAX_TOKENS", "4096", "largest answer asked for"),
    var("OPENAI_MAX_ROUNDS", "8", "model/tool rounds per turn"),
    var(
        "OPENAI_REPEAT_CALLS",
        "when-changed",
        "read-only tool calls repeat: when-changed or once",
    ),
    var(
        "OPENAI_HISTORY_CHARS",
        "24000",
        "earlier turns sent along, in characters",
    ),
    var(
        "LOG_FORMAT",
        "text",
        "text or json (one JSON object per line)",
    ),
];
