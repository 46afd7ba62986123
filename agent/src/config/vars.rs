//! Every setting of the agent, as `--help` lists it (the parsing and validation are in
//! [`super::Config::from_lookup`]; a test checks that every variable it reads is listed).

use settings::Var;

/// The agent's settings.
pub const VARS: &[Var] = &[
    Var::secret(
        "AGENT_TOKEN",
        "shared secret the surface presents (required, 16+ characters)",
    ),
    Var::new(
        "AGENT_BIND",
        "127.0.0.1:8700",
        "address to listen on (WebSocket, /healthz, /metrics)",
    ),
    Var::new(
        "WORKSPACE_ROOT",
        "/workspace",
        "the shared workspace folder",
    ),
    Var::new(
        "AGENT_STATE_DIR",
        "/var/lib/agent",
        "conversations and memory",
    ),
    Var::secret(
        "AGENT_DATABASE_URL",
        "PostgreSQL for chats, turns and memory instead of AGENT_STATE_DIR (postgres://…)",
    ),
    Var::new(
        "AGENT_DATABASE_POOL",
        "16",
        "most connections to AGENT_DATABASE_URL",
    ),
    Var::new(
        "AGENT_DATABASE_WAIT",
        "0s",
        "how long to keep trying at start while AGENT_DATABASE_URL cannot be reached (0s: exit 2 at once)",
    ),
    Var::new(
        "AGENT_BRAIN",
        "builtin",
        "builtin (offline, deterministic), openai or acp (an Agent Client Protocol agent)",
    ),
    Var::new(
        "AGENT_ACP_COMMAND",
        "",
        "AGENT_BRAIN=acp: the agent's command line, e.g. hermes-acp or gemini --experimental-acp",
    ),
    Var::new(
        "AGENT_ACP_ENV",
        "",
        "variables passed to the ACP agent besides PATH, HOME, locale and TMPDIR (never AGENT_*)",
    ),
    Var::new(
        "AGENT_ACP_SESSIONS",
        "4",
        "most ACP agent processes at once (the least recently used idle one makes room)",
    ),
    Var::new(
        "AGENT_ACP_IDLE",
        "15m",
        "an ACP session unused this long is closed (the next turn resumes it)",
    ),
    Var::new(
        "AGENT_ACP_START_TIMEOUT",
        "60s",
        "longest wait for an ACP agent to start and open or resume a session",
    ),
    Var::new(
        "AGENT_ACP_TURN_IDLE",
        "10m",
        "an ACP turn silent this long is cancelled",
    ),
    Var::new(
        "AGENT_TOOL_POLICY",
        "",
        "per-tool allow/ask/deny, e.g. dangerous_action=ask,demo__*=allow (MCP tools: ask)",
    ),
    Var::new(
        "AGENT_MCP_SERVERS",
        "",
        "MCP servers: name=stdio:<command line> or name=http(s)://…, separated by ;",
    ),
    Var::secret(
        "AGENT_MCP_TOKENS",
        "bearer tokens of HTTP MCP servers: name=token;… (never logged)",
    ),
    Var::new(
        "AGENT_MCP_CHATS",
        "",
        "MCP servers only some chats may use: name=chat_id,chat_id;…",
    ),
    Var::new(
        "AGENT_MCP_TIMEOUT",
        "30s",
        "longest wait for an MCP server to start or answer a call",
    ),
    Var::test_only(
        "AGENT_TEST_HOOKS",
        "false",
        "extra builtin commands for tests",
    ),
    Var::new(
        "AGENT_HANDSHAKE_TIMEOUT",
        "10s",
        "how long a connection may take to say hello",
    ),
    Var::new("AGENT_PING_INTERVAL", "20s", "WebSocket ping interval"),
    Var::new(
        "AGENT_IDLE_TIMEOUT",
        "60s",
        "a silent connection is closed after this",
    ),
    Var::new(
        "AGENT_HEAD_TIMEOUT",
        "5s",
        "deadline for an HTTP request head",
    ),
    Var::new(
        "AGENT_MAX_PENDING",
        "128",
        "connections being set up at once",
    ),
    Var::new(
        "AGENT_MAX_PENDING_PER_IP",
        "16",
        "of those, from one address (an IPv6 /64 counts as one)",
    ),
    Var::new(
        "AGENT_APPROVAL_TIMEOUT",
        "5m",
        "how long a tool call waits for approval",
    ),
    Var::new(
        "AGENT_ASK_TIMEOUT",
        "10m",
        "how long a question waits for the user",
    ),
    Var::new(
        "AGENT_DELIVERY_TIMEOUT",
        "10m",
        "how long send_file waits for the room to get it",
    ),
    Var::new(
        "AGENT_MAX_FILE_SIZE",
        "100MiB",
        "largest file a tool reads or writes",
    ),
    Var::new(
        "OPENAI_BASE_URL",
        "",
        "model server, up to /v1 (required with AGENT_BRAIN=openai)",
    ),
    Var::new(
        "OPENAI_MODEL",
        "",
        "model name (required with AGENT_BRAIN=openai)",
    ),
    Var::new(
        "OPENAI_MODELS",
        "",
        "models a room may choose with !set model, comma-separated (unset: none)",
    ),
    Var::secret(
        "OPENAI_API_KEY",
        "API key, if the server needs one (never logged)",
    ),
    Var::new(
        "OPENAI_CONNECT_TIMEOUT",
        "10s",
        "connecting to the model server",
    ),
    Var::new(
        "OPENAI_HEAD_TIMEOUT",
        "60s",
        "waiting for the model's answer to start",
    ),
    Var::new(
        "OPENAI_IDLE_TIMEOUT",
        "120s",
        "longest silence inside a streamed answer",
    ),
    Var::new(
        "OPENAI_ATTEMPTS",
        "4",
        "tries of a request before giving up",
    ),
    Var::new("OPENAI_MAX_TOKENS", "4096", "largest answer asked for"),
    Var::new("OPENAI_MAX_ROUNDS", "8", "model/tool rounds per turn"),
    Var::new(
        "OPENAI_REPEAT_CALLS",
        "when-changed",
        "read-only tool calls repeat: when-changed or once",
    ),
    Var::new(
        "OPENAI_HISTORY_CHARS",
        "24000",
        "earlier turns sent along, in characters",
    ),
    Var::new(
        "OPENAI_VISION",
        "auto",
        "send pictures to the model: auto (stop if refused), on or off",
    ),
    Var::new(
        "OPENAI_IMAGE_EDGE",
        "1536",
        "longest side of a picture sent to the model, in pixels",
    ),
    Var::new(
        "OPENAI_MAX_IMAGES",
        "4",
        "pictures shown with one message (view_image shows more)",
    ),
    Var::new(
        "TRANSCRIBE_MODEL",
        "",
        "speech-to-text model (e.g. whisper-1); voice messages are transcribed when set",
    ),
    Var::new(
        "TRANSCRIBE_BASE_URL",
        "",
        "transcription server, up to /v1 (default: OPENAI_BASE_URL)",
    ),
    Var::secret(
        "TRANSCRIBE_API_KEY",
        "its API key (default: OPENAI_API_KEY with the model server; never logged)",
    ),
    Var::new(
        "TRANSCRIBE_LANGUAGE",
        "",
        "language of the speech, e.g. en (default: the server guesses)",
    ),
    Var::new(
        "TRANSCRIBE_PROMPT",
        "",
        "words that guide the transcription (names, jargon)",
    ),
    Var::new(
        "TRANSCRIBE_TIMEOUT",
        "120s",
        "longest wait for one transcription",
    ),
    Var::new(
        "TRANSCRIBE_ATTEMPTS",
        "3",
        "tries of a transcription before giving up",
    ),
    Var::new(
        "TRANSCRIBE_MAX_DURATION",
        "15m",
        "longest recording transcribed",
    ),
    Var::new(
        "TRANSCRIBE_MAX_SIZE",
        "25MiB",
        "largest audio file transcribed",
    ),
    Var::new("TRANSCRIBE_SHOW", "true", "show the room what was heard"),
    Var::new(
        "LOG_FORMAT",
        "text",
        "text or json (one JSON object per line)",
    ),
];
