//! Every setting of the surface, as `--help` lists it (the parsing and validation are in
//! [`super::Config::from_lookup`]; a test checks that every variable it reads is listed).

use settings::Var;

/// The surface's settings.
pub const VARS: &[Var] = &[
    Var::new(
        "MATRIX_HOMESERVER_URL",
        "",
        "the homeserver, e.g. https://matrix.example.org (required)",
    ),
    Var::new(
        "MATRIX_USER_ID",
        "",
        "the bot account, e.g. @bot:example.org (required)",
    ),
    Var::secret(
        "MATRIX_PASSWORD",
        "login on first start, and again after a soft logout",
    ),
    Var::secret(
        "MATRIX_ACCESS_TOKEN",
        "an existing session's token (with MATRIX_DEVICE_ID)",
    ),
    Var::new("MATRIX_DEVICE_ID", "", "the device of MATRIX_ACCESS_TOKEN"),
    Var::secret(
        "MATRIX_REFRESH_TOKEN",
        "the refresh token issued with MATRIX_ACCESS_TOKEN, if any",
    ),
    Var::secret(
        "MATRIX_RECOVERY_KEY",
        "recovery key or passphrase of the bot's key backup",
    ),
    Var::new(
        "AGENT_URL",
        "",
        "the agent, e.g. ws://agent:8700, or several, comma-separated (required)",
    ),
    Var::secret(
        "AGENT_TOKEN",
        "shared secret for the agent (required, 16+ characters)",
    ),
    Var::new(
        "WORKSPACE_ROOT",
        "/workspace",
        "the shared workspace folder",
    ),
    Var::new(
        "SURFACE_STATE_DIR",
        "/var/lib/surface",
        "session, crypto store, journal",
    ),
    Var::new(
        "SURFACE_ALLOWED_USERS",
        "@*:<bot's server>",
        "user id globs who may invite and talk",
    ),
    Var::new(
        "SURFACE_ALLOWED_ROOMS",
        "*",
        "room id or alias globs the bot joins and answers in",
    ),
    Var::new("SURFACE_BOT_USERS", "", "user id globs of other bots"),
    Var::new(
        "SURFACE_MAX_BOT_TURNS",
        "3",
        "turns other bots may trigger in a row",
    ),
    Var::new(
        "SURFACE_MAX_FILE_SIZE",
        "100MiB",
        "largest file downloaded or uploaded",
    ),
    Var::new(
        "SURFACE_FFMPEG",
        "ffmpeg on PATH",
        "ffmpeg for video posters, or off",
    ),
    Var::new(
        "SURFACE_SHOW_TOOL_CALLS",
        "false",
        "post compact notices for tool calls",
    ),
    Var::new(
        "SURFACE_JOIN_INTRO",
        "on",
        "one short introduction in each room joined: on or off",
    ),
    Var::new(
        "SURFACE_HEALTH_BIND",
        "127.0.0.1:8701",
        "/healthz and /metrics",
    ),
    Var::new(
        "SURFACE_INBOX_RETENTION",
        "forever",
        "delete inbox files older than this",
    ),
    Var::new(
        "SURFACE_INTERRUPTED_NOTICE",
        "3m",
        "the homeserver tells the room if the surface dies mid-answer (MSC4140), after this, or off",
    ),
    Var::new(
        "SURFACE_OFFLINE_NOTICE",
        "2m",
        "announce missed messages after a longer downtime, or off",
    ),
    Var::new(
        "SURFACE_THREADS",
        "all",
        "group rooms: answer every message in a thread the bot posts in (all), or only mentions",
    ),
    Var::new(
        "SURFACE_APPROVALS",
        "any",
        "whose approvals count: any device of the asked user, or only verified ones (verified)",
    ),
    Var::new(
        "SURFACE_AGENT_DOWN_NOTICE",
        "15s",
        "tell the room once when its message cannot reach the agent for this long, or off",
    ),
    Var::new(
        "SURFACE_KEY_WAIT",
        "60s",
        "how long a chat waits for a late room key",
    ),
    Var::new(
        "SURFACE_STREAM_EDITS",
        "2s",
        "edit a streamed answer at most this often, or off",
    ),
    Var::new(
        "SURFACE_MCP_BIND",
        "off",
        "serve rooms to MCP clients at host:port/mcp (loopback unless you say)",
    ),
    Var::secret(
        "SURFACE_MCP_TOKEN",
        "bearer token MCP clients present (required with SURFACE_MCP_BIND, 16+)",
    ),
    Var::new(
        "SURFACE_MCP_SEND",
        "false",
        "let MCP clients post (matrix.send, matrix.send_file)",
    ),
    Var::new(
        "LOG_FORMAT",
        "text",
        "text or json (one JSON object per line)",
    ),
];
