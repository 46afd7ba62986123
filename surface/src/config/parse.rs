//! Each setting's parsing and validation: one pure function per variable (or group), called by
//! [`super::Config::from_lookup`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use url::Url;

use super::{
    Auth, ConfigError, DEFAULT_AGENT_DOWN_NOTICE, DEFAULT_KEY_WAIT, DEFAULT_MAX_BOT_TURNS,
    DEFAULT_STREAM_INTERVAL, GivenToken, McpServer, Secret, invalid,
};

/// The way in: a given token (with its device and maybe its refresh token), a password, or both.
pub(super) fn auth(
    token: Option<String>,
    device: Option<String>,
    refresh: Option<String>,
    password: Option<String>,
) -> Result<Auth, ConfigError> {
    let password = password.map(Secret::new);
    let token = match (token, refresh) {
        (Some(token), refresh) => Some(GivenToken {
            access_token: Secret::new(token),
            refresh_token: refresh.map(Secret::new),
            device_id: device
                .ok_or(ConfigError::Missing("MATRIX_DEVICE_ID"))?
                .into(),
        }),
        (None, Some(_)) => {
            return Err(invalid(
                "MATRIX_REFRESH_TOKEN",
                "is given without MATRIX_ACCESS_TOKEN + MATRIX_DEVICE_ID",
            ));
        }
        (None, None) => None,
    };
    if token.is_none() && password.is_none() {
        return Err(invalid(
            "MATRIX_ACCESS_TOKEN",
            "set MATRIX_ACCESS_TOKEN + MATRIX_DEVICE_ID, or MATRIX_PASSWORD",
        ));
    }
    Ok(Auth { token, password })
}

pub(super) fn mcp_server(
    bind: Option<String>,
    token: Option<String>,
    send: Option<String>,
) -> Result<Option<McpServer>, ConfigError> {
    let send = match send.as_deref() {
        None => false,
        Some(v) => {
            parse_bool(v).ok_or_else(|| invalid("SURFACE_MCP_SEND", "expected true or false"))?
        }
    };
    let Some(bind) = bind.filter(|b| b != "off") else {
        return Ok(None);
    };
    // A bare port means loopback: the server is reachable from elsewhere only when asked.
    let bind = match bind.parse::<u16>() {
        Ok(port) => SocketAddr::from(([127, 0, 0, 1], port)),
        Err(_) => bind.parse::<SocketAddr>().map_err(|e| {
            invalid(
                "SURFACE_MCP_BIND",
                format!("expected host:port or a port ({e})"),
            )
        })?,
    };
    let token = token
        .ok_or_else(|| invalid("SURFACE_MCP_TOKEN", "required when SURFACE_MCP_BIND is set"))?;
    if token.chars().count() < 16 {
        return Err(invalid(
            "SURFACE_MCP_TOKEN",
            "must be at least 16 characters",
        ));
    }
    Ok(Some(McpServer {
        bind,
        token: Secret::new(token),
        send,
    }))
}

pub(super) fn agent_urls(raw: &str) -> Result<Vec<Url>, ConfigError> {
    let mut urls: Vec<Url> = Vec::new();
    for one in raw.split(',').map(str::trim).filter(|u| !u.is_empty()) {
        let url = Url::parse(one).map_err(|e| invalid("AGENT_URL", e.to_string()))?;
        if !matches!(url.scheme(), "ws" | "wss") || url.host().is_none() {
            return Err(invalid(
                "AGENT_URL",
                "each agent must be a ws:// or wss:// URL with a host",
            ));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(invalid(
                "AGENT_URL",
                "no credentials in the URL: the agent's token is AGENT_TOKEN",
            ));
        }
        if urls.contains(&url) {
            return Err(invalid("AGENT_URL", format!("{url} is listed twice")));
        }
        urls.push(url);
    }
    if urls.is_empty() {
        return Err(ConfigError::Missing("AGENT_URL"));
    }
    Ok(urls)
}

/// `SURFACE_ALLOWED_USERS`, or everyone on the bot's own server (`server`: `None` when
/// `MATRIX_USER_ID` is itself a problem, reported on its own).
pub(super) fn allowed_users(
    list: Option<String>,
    server: Option<&str>,
) -> Result<Vec<String>, ConfigError> {
    let Some(list) = list else {
        return Ok(server.map(|s| vec![format!("@*:{s}")]).unwrap_or_default());
    };
    let globs = glob_list(&list);
    if globs.is_empty() {
        return Err(invalid("SURFACE_ALLOWED_USERS", "no patterns given"));
    }
    if let Some(bad) = globs
        .iter()
        .find(|g| !g.starts_with('@') && !g.starts_with('*'))
    {
        return Err(invalid(
            "SURFACE_ALLOWED_USERS",
            format!("pattern {bad:?} cannot match a user id (must start with @ or *)"),
        ));
    }
    Ok(globs)
}

pub(super) fn allowed_rooms(list: Option<String>) -> Result<Vec<String>, ConfigError> {
    let Some(list) = list else {
        return Ok(vec!["*".to_owned()]);
    };
    let globs = glob_list(&list);
    if globs.is_empty() {
        return Err(invalid("SURFACE_ALLOWED_ROOMS", "no patterns given"));
    }
    if let Some(bad) = globs.iter().find(|g| !g.starts_with(['!', '#', '*'])) {
        return Err(invalid(
            "SURFACE_ALLOWED_ROOMS",
            format!("pattern {bad:?} cannot match a room (must start with !, # or *)"),
        ));
    }
    Ok(globs)
}

pub(super) fn max_file_size(v: Option<String>) -> Result<u64, ConfigError> {
    let size = match v {
        Some(v) => v
            .parse::<bytesize::ByteSize>()
            .map_err(|e| invalid("SURFACE_MAX_FILE_SIZE", e))?
            .as_u64(),
        None => 100 * 1024 * 1024,
    };
    if size == 0 {
        return Err(invalid("SURFACE_MAX_FILE_SIZE", "must be greater than 0"));
    }
    Ok(size)
}

/// `SURFACE_FFMPEG`: a path, `off`, or (unset) `ffmpeg` on `PATH` if there is one.
pub(super) fn ffmpeg(
    v: Option<String>,
    path: Option<String>,
) -> Result<Option<PathBuf>, ConfigError> {
    match v.as_deref() {
        Some("off") => Ok(None),
        Some(file) => {
            let file = PathBuf::from(file);
            if is_executable(&file) {
                Ok(Some(file))
            } else {
                Err(invalid(
                    "SURFACE_FFMPEG",
                    "not an executable file (or `off`)",
                ))
            }
        }
        None => Ok(path.and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("ffmpeg"))
                .find(|f| is_executable(f))
        })),
    }
}

pub(super) fn duration(var: &'static str, v: &str, example: &str) -> Result<Duration, ConfigError> {
    humantime::parse_duration(v).map_err(|e| invalid(var, format!("{e} (e.g. {example})")))
}

pub(super) fn glob_list(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

pub(super) fn parse_http_url(var: &'static str, raw: &str) -> Result<Url, ConfigError> {
    let url = Url::parse(raw).map_err(|e| invalid(var, e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(invalid(
            var,
            "must be an http:// or https:// URL with a host",
        ));
    }
    Ok(url)
}

pub(super) fn absolute_path(var: &'static str, raw: String) -> Result<PathBuf, ConfigError> {
    let p = PathBuf::from(raw);
    if !p.is_absolute() {
        return Err(invalid(var, "must be an absolute path"));
    }
    Ok(p)
}

/// `AGENT_TOKEN`: at least 16 characters.
pub(super) fn agent_token(t: String) -> Result<Secret, ConfigError> {
    if t.chars().count() < 16 {
        Err(invalid("AGENT_TOKEN", "must be at least 16 characters"))
    } else {
        Ok(Secret::new(t))
    }
}

/// `SURFACE_MAX_BOT_TURNS`: a whole number.
pub(super) fn max_bot_turns(v: Option<String>) -> Result<u32, ConfigError> {
    match v {
        None => Ok(DEFAULT_MAX_BOT_TURNS),
        Some(v) => v
            .parse()
            .map_err(|_| invalid("SURFACE_MAX_BOT_TURNS", "must be a whole number")),
    }
}

/// `SURFACE_SHOW_TOOL_CALLS`: true or false.
pub(super) fn show_tool_calls(v: Option<String>) -> Result<bool, ConfigError> {
    match v.as_deref() {
        None => Ok(false),
        Some(v) => parse_bool(v)
            .ok_or_else(|| invalid("SURFACE_SHOW_TOOL_CALLS", "expected true or false")),
    }
}

/// `SURFACE_JOIN_INTRO`: `on` (default) or `off`.
pub(super) fn join_intro(v: Option<String>) -> Result<bool, ConfigError> {
    match v {
        None => Ok(true),
        Some(v) => {
            parse_bool(&v).ok_or_else(|| invalid("SURFACE_JOIN_INTRO", "expected on or off"))
        }
    }
}

/// `SURFACE_HEALTH_BIND`: host:port.
pub(super) fn health_bind(v: Option<String>) -> Result<SocketAddr, ConfigError> {
    v.unwrap_or_else(|| "127.0.0.1:8701".into())
        .parse::<SocketAddr>()
        .map_err(|e| invalid("SURFACE_HEALTH_BIND", format!("expected host:port ({e})")))
}

/// `SURFACE_INBOX_RETENTION`: a duration longer than 0, or `forever` (`None`).
pub(super) fn inbox_retention(v: Option<String>) -> Result<Option<Duration>, ConfigError> {
    match v.as_deref() {
        None | Some("forever") => Ok(None),
        Some(v) => duration("SURFACE_INBOX_RETENTION", v, "30d or forever").and_then(|d| {
            if d.is_zero() {
                Err(invalid("SURFACE_INBOX_RETENTION", "must be longer than 0"))
            } else {
                Ok(Some(d))
            }
        }),
    }
}

/// `SURFACE_OFFLINE_NOTICE`: a duration, or `off`.
pub(super) fn offline_notice(v: Option<String>) -> Result<Option<Duration>, ConfigError> {
    off_or_duration(
        "SURFACE_OFFLINE_NOTICE",
        v,
        Duration::from_secs(120),
        "2m or off",
    )
}

/// `SURFACE_AGENT_DOWN_NOTICE`: a duration, or `off`.
pub(super) fn agent_down_notice(v: Option<String>) -> Result<Option<Duration>, ConfigError> {
    off_or_duration(
        "SURFACE_AGENT_DOWN_NOTICE",
        v,
        DEFAULT_AGENT_DOWN_NOTICE,
        "15s or off",
    )
}

/// `SURFACE_THREADS`: `all` (false) or `mentions` (true).
pub(super) fn threads_need_mention(v: Option<String>) -> Result<bool, ConfigError> {
    one_of("SURFACE_THREADS", v, &[("all", false), ("mentions", true)])
}

/// `SURFACE_APPROVALS`: `any` (false) or `verified` (true).
pub(super) fn approvals_need_verified(v: Option<String>) -> Result<bool, ConfigError> {
    one_of(
        "SURFACE_APPROVALS",
        v,
        &[("any", false), ("verified", true)],
    )
}

/// `SURFACE_KEY_WAIT`: a duration.
pub(super) fn key_wait(v: Option<String>) -> Result<Duration, ConfigError> {
    match v {
        None => Ok(DEFAULT_KEY_WAIT),
        Some(v) => duration("SURFACE_KEY_WAIT", &v, "60s"),
    }
}

/// A duration, or `off` (`None`); `default` when unset.
pub(super) fn off_or_duration(
    name: &'static str,
    v: Option<String>,
    default: Duration,
    example: &str,
) -> Result<Option<Duration>, ConfigError> {
    match v.as_deref() {
        Some("off") => Ok(None),
        None => Ok(Some(default)),
        Some(v) => duration(name, v, example).map(Some),
    }
}

/// `SURFACE_STREAM_EDITS`: at least 200ms, or `off`.
pub(super) fn stream_interval(v: Option<String>) -> Result<Option<Duration>, ConfigError> {
    let name = "SURFACE_STREAM_EDITS";
    match off_or_duration(name, v, DEFAULT_STREAM_INTERVAL, "2s or off")? {
        Some(d) if d < Duration::from_millis(200) => Err(invalid(name, "must be at least 200ms")),
        d => Ok(d),
    }
}

/// One of a few words (the first is the default when unset).
pub(super) fn one_of<T: Copy>(
    name: &'static str,
    v: Option<String>,
    choices: &[(&str, T)],
) -> Result<T, ConfigError> {
    let word = v.as_deref().map(str::trim).unwrap_or(choices[0].0);
    match choices.iter().find(|(w, _)| *w == word) {
        Some((_, value)) => Ok(*value),
        None => {
            let words: Vec<&str> = choices.iter().map(|(w, _)| *w).collect();
            Err(invalid(name, format!("expected {}", words.join(" or "))))
        }
    }
}

pub(super) fn parse_bool(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

/// Whether `path` is a file someone may execute.
pub(super) fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
