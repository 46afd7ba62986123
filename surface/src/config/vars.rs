//! Every setting of the surface, as `--help` lists it (the parsing and validation are in
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

/// The surface's settings.
pub const VARS: &[Var] = &[
    var(
        "MATRIX_HOMESERVER_URL",
        "",
        "the homeserver, e.g. https://matrix.example.org (required)",
    ),
    var(
        "MATRIX_USER_ID",
        "",
        "the bot account, e.g. @bot:example.org (required)",
    ),
    secret(
        "MATRIX_PASSWORD",
        "login on first start (or an access token and device id)",
    ),
    secret(
        "MATRIX_ACCESS_TOKEN",
        "an existing session's token (with MATRIX_DEVICE_ID)",
    ),
    var("MATRIX_DEVICE_ID", "", "the device of MATRIX_ACCESS_TOKEN"),
    secret(
        "MATRIX_RECOVERY_KEY",
        "recovery key or passphrase of the bot's key backup",
    ),
    var(
        "AGENT_URL",
        "",
        "the agent, e.g. ws://agent:8700 (required)",
    ),
    secret(
        "AGENT_TOKEN",
        "shared secret for the agent (required, 16+ characters)",
    ),
    var(
        "WORKSPACE_ROOT",
        "/workspace",
        "the shared workspace folder",
    ),
    var(
        "SURFACE_STATE_DIR",
        "/var/lib/surface",
        "session, crypto store, journal",
    ),
    var(
        "SURFACE_ALLOWED_USERS",
        "@*:<bot's server>",
        "user id globs who may invite and talk",
    ),
    var(
        "SURFACE_ALLOWED_ROOMS",
        "*",
        "room id or alias globs the bot joins and answers in",
    ),
    var("SURFACE_BOT_USERS", "", "user id globs of other bots"),
    var(
        "SURFACE_MAX_BOT_TURNS",
        "3",
        "turns other bots may trigger in a row",
    ),
    var(
        "SURFACE_MAX_FILE_SIZE",
        "100MiB",
        "largest file downloaded or uploaded",
    ),
    var(
        "SURFACE_FFMPEG",
        "ffmpeg on PATH",
        "ffmpeg for video posters, or off",
    ),
    var(
        "SURFACE_SHOW_TOOL_CALLS",
        "false",
        "post compact notices for tool calls",
    ),
    var(
        "SURFACE_HEALTH_BIND",
        "127.0.0.1:8701",
        "/healthz and /metrics",
    ),
    var(
        "SURFACE_INBOX_RETENTION",
        "forever",
        "delete inbox files older than this",
    ),
    var(
        "SURFACE_OFFLINE_NOTICE",
        "2m",
        "announce missed messages after a longer downtime, or off",
    ),
    var(
        "SURFACE_KEY_WAIT",
        "60s",
        "how long a chat waits for a late room key",
    ),
    var(
        "SURFACE_STREAM_EDITS",
        "2s",
        "edit a streamed answer at most this often, or off",
    ),
    var(
        "LOG_FORMAT",
        "text",
        "text or json (one JSON object per line)",
    ),
];
