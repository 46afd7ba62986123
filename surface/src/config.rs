//! The surface's configuration: read from the environment, converted to rich types and validated
//! before anything logs in or binds.

mod parse;
mod vars;

pub use vars::VARS;

use self::parse::*;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use matrix_sdk::ruma::{OwnedDeviceId, OwnedUserId};
use settings::Problems;
use url::Url;
use wildmatch::WildMatch;

pub use protocol::Secret;

/// How the bot authenticates: a token the operator gave, a password, or both (the token is
/// used, the password logs in again after a soft logout). At least one is set.
#[derive(Debug, Clone)]
pub struct Auth {
    /// `MATRIX_ACCESS_TOKEN` + `MATRIX_DEVICE_ID` (+ `MATRIX_REFRESH_TOKEN`).
    pub token: Option<GivenToken>,
    /// `MATRIX_PASSWORD`: log in once, then reuse the persisted session; also the way back
    /// after a soft logout.
    pub password: Option<Secret>,
}

/// A session the operator made elsewhere (an existing login, or an OAuth 2.0 homeserver's
/// compatibility token).
#[derive(Debug, Clone)]
pub struct GivenToken {
    /// The access token.
    pub access_token: Secret,
    /// The refresh token issued with it, if any (single-use: the surface saves each new pair).
    pub refresh_token: Option<Secret>,
    /// The device the token belongs to.
    pub device_id: OwnedDeviceId,
}

/// Everything the surface needs to run.
#[derive(Debug, Clone)]
pub struct Config {
    /// `MATRIX_HOMESERVER_URL`.
    pub homeserver_url: Url,
    /// `MATRIX_USER_ID`: the bot's own user id.
    pub user_id: OwnedUserId,
    /// How to authenticate when no session is persisted yet.
    pub auth: Auth,
    /// `AGENT_URL`: base `ws://` / `wss://` URLs of the agents (comma-separated; each chat
    /// goes to one of them, see [`crate::route`]). Never empty.
    pub agent_urls: Vec<Url>,
    /// `AGENT_TOKEN`: bearer token for the agent's WebSocket.
    pub agent_token: Secret,
    /// `WORKSPACE_ROOT`: absolute path of the shared workspace.
    pub workspace_root: PathBuf,
    /// `SURFACE_STATE_DIR`: absolute path for the session, the SDK store and the journal.
    pub state_dir: PathBuf,
    /// `SURFACE_ALLOWED_USERS`: globs of user ids whose messages and invites are accepted.
    pub allowed_users: Vec<String>,
    /// `SURFACE_ALLOWED_ROOMS`: globs of room ids (`!…`) and aliases (`#…`) the bot joins and
    /// answers in (default: every room).
    pub allowed_rooms: Vec<String>,
    /// `SURFACE_BOT_USERS`: globs of user ids known to be bots (besides any user who posts
    /// `m.notice`s), whose messages trigger at most `max_bot_turns` turns in a row.
    pub bot_users: Vec<String>,
    /// `SURFACE_MAX_BOT_TURNS`: how many turns in a row other bots may trigger in one chat
    /// before the bot stops answering them there (a person's message resets it; default 3).
    pub max_bot_turns: u32,
    /// `SURFACE_MAX_FILE_SIZE`: largest file downloaded or uploaded, in bytes.
    pub max_file_size: u64,
    /// `SURFACE_FFMPEG`: the `ffmpeg` that makes poster thumbnails for videos the agent sends
    /// (`off`: none; unset: `ffmpeg` on `PATH`, if there is one).
    pub ffmpeg: Option<PathBuf>,
    /// `SURFACE_SHOW_TOOL_CALLS`: post compact notices for tool calls.
    pub show_tool_calls: bool,
    /// `SURFACE_JOIN_INTRO`: one short introduction in each room the bot joins.
    pub join_intro: bool,
    /// `SURFACE_HEALTH_BIND`: address of the `/healthz` endpoint. Loopback unless set: a
    /// container sets `0.0.0.0:8701` so its network's healthcheck can reach it.
    pub health_bind: SocketAddr,
    /// `SURFACE_INBOX_RETENTION`: age after which inbox files are removed (`None`: forever).
    pub inbox_retention: Option<Duration>,
    /// `SURFACE_OFFLINE_NOTICE`: when messages waited longer than this for a surface that was
    /// down, the room is told they are being answered now (`None`: never).
    pub offline_notice_after: Option<Duration>,
    /// `SURFACE_INTERRUPTED_NOTICE`: while a turn runs, the homeserver holds a notice it posts
    /// this long after the surface last said it is alive (MSC4140; `None`: off).
    pub interrupted_notice: Option<Duration>,
    /// `SURFACE_AGENT_DOWN_NOTICE`: when a turn cannot reach the agent for this long, the room
    /// is told once per outage that its message is saved (`None`: never).
    pub agent_down_notice: Option<Duration>,
    /// `SURFACE_THREADS=mentions`: in group rooms, messages in a thread the bot posts in are
    /// answered only when they mention or reply to it (`all`, the default: every one is).
    pub threads_need_mention: bool,
    /// `SURFACE_APPROVALS=verified`: an approval (✅ or a typed yes) counts only from a device
    /// its user verified; `any` (the default): from any device of the asked user.
    pub approvals_need_verified: bool,
    /// `SURFACE_KEY_WAIT`: how long a chat waits for the room key of a message that could not
    /// be decrypted before the room is told and later messages are answered.
    pub key_wait: Duration,
    /// `SURFACE_STREAM_EDITS`: while the agent is still writing an answer, show it in one
    /// message edited at most this often (`None`, `off`: post answers only when complete).
    pub stream_interval: Option<Duration>,
    /// `MATRIX_RECOVERY_KEY`: the recovery key (or passphrase) that restores the bot's
    /// cross-signing identity and key backup on a new state directory.
    pub recovery_key: Option<Secret>,
    /// `SURFACE_MCP_BIND` and friends: the MCP server for outside orchestrators (`None`: off).
    pub mcp: Option<McpServer>,
}

/// The MCP server's settings.
#[derive(Debug, Clone)]
pub struct McpServer {
    /// `SURFACE_MCP_BIND`: where it listens (path `/mcp`).
    pub bind: SocketAddr,
    /// `SURFACE_MCP_TOKEN`: the bearer token clients present.
    pub token: Secret,
    /// `SURFACE_MCP_SEND`: whether clients may post to rooms.
    pub send: bool,
}

/// How long a chat waits for a late room key by default.
pub const DEFAULT_KEY_WAIT: Duration = Duration::from_secs(60);
/// How long a turn may fail to reach the agent before the room is told (`SURFACE_AGENT_DOWN_NOTICE`).
pub const DEFAULT_AGENT_DOWN_NOTICE: Duration = Duration::from_secs(15);
/// How often a streamed answer is edited by default: about as fast as a homeserver's default
/// message rate limit lets a long answer go on.
pub const DEFAULT_STREAM_INTERVAL: Duration = Duration::from_secs(2);
/// Default of `SURFACE_MAX_BOT_TURNS`.
pub const DEFAULT_MAX_BOT_TURNS: u32 = 3;

/// A setting that is missing or malformed. The message names the variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A required variable is not set (or empty).
    #[error("{0} is required but not set")]
    Missing(&'static str),
    /// A variable is set to something unusable.
    #[error("{var} is invalid: {reason}")]
    Invalid {
        /// The variable.
        var: &'static str,
        /// What is wrong, without echoing secrets.
        reason: String,
    },
}

fn invalid(var: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        var,
        reason: reason.into(),
    }
}

impl Config {
    /// Reads the configuration from the process environment.
    pub fn from_env() -> Result<Self, Problems<ConfigError>> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads the configuration from `NAME`/value pairs (a later pair wins), as tests and tools
    /// give it.
    pub fn from_pairs(pairs: &[(&str, &str)]) -> Result<Self, Problems<ConfigError>> {
        Self::from_lookup(|k| {
            pairs
                .iter()
                .rev()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    /// Reads the configuration through `get` (testable without touching the environment).
    /// Every variable is checked on its own, so all problems are reported at once.
    pub fn from_lookup(
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, Problems<ConfigError>> {
        // Empty values count as unset: compose files often pass `VAR=`.
        let get = |name: &str| {
            get(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let required = |name: &'static str| get(name).ok_or(ConfigError::Missing(name));
        let mut p = Problems::new();

        let homeserver_url = p.take(
            required("MATRIX_HOMESERVER_URL")
                .and_then(|raw| parse_http_url("MATRIX_HOMESERVER_URL", &raw)),
        );
        let user_id: Option<OwnedUserId> = p.take(required("MATRIX_USER_ID").and_then(|v| {
            v.parse()
                .map_err(|e| invalid("MATRIX_USER_ID", format!("not a Matrix user id ({e})")))
        }));
        let auth = p.take(auth(
            get("MATRIX_ACCESS_TOKEN"),
            get("MATRIX_DEVICE_ID"),
            get("MATRIX_REFRESH_TOKEN"),
            get("MATRIX_PASSWORD"),
        ));
        let agent_urls = p.take(required("AGENT_URL").and_then(|raw| agent_urls(&raw)));
        let agent_token = p.take(required("AGENT_TOKEN").and_then(agent_token));
        let dir =
            |name, default: &str| absolute_path(name, get(name).unwrap_or_else(|| default.into()));
        let workspace_root = p.take(dir("WORKSPACE_ROOT", "/workspace"));
        let state_dir = p.take(dir("SURFACE_STATE_DIR", "/var/lib/surface"));
        let allowed_users = p.take(allowed_users(
            get("SURFACE_ALLOWED_USERS"),
            user_id.as_ref().map(|u| u.server_name().as_str()),
        ));
        let allowed_rooms = p.take(allowed_rooms(get("SURFACE_ALLOWED_ROOMS")));
        let bot_users = get("SURFACE_BOT_USERS")
            .map(|l| glob_list(&l))
            .unwrap_or_default();
        let max_bot_turns = p.take(max_bot_turns(get("SURFACE_MAX_BOT_TURNS")));
        let max_file_size = p.take(max_file_size(get("SURFACE_MAX_FILE_SIZE")));
        let ffmpeg = p.take(ffmpeg(get("SURFACE_FFMPEG"), get("PATH")));
        let show_tool_calls = p.take(show_tool_calls(get("SURFACE_SHOW_TOOL_CALLS")));
        let join_intro = p.take(join_intro(get("SURFACE_JOIN_INTRO")));
        let health_bind = p.take(health_bind(get("SURFACE_HEALTH_BIND")));
        let inbox_retention = p.take(inbox_retention(get("SURFACE_INBOX_RETENTION")));
        let offline_notice_after = p.take(offline_notice(get("SURFACE_OFFLINE_NOTICE")));
        let interrupted_notice = p.take(off_or_duration(
            "SURFACE_INTERRUPTED_NOTICE",
            get("SURFACE_INTERRUPTED_NOTICE"),
            Duration::from_secs(180),
            "3m or off",
        ));
        let agent_down_notice = p.take(agent_down_notice(get("SURFACE_AGENT_DOWN_NOTICE")));
        let threads_need_mention = p.take(threads_need_mention(get("SURFACE_THREADS")));
        let approvals_need_verified = p.take(approvals_need_verified(get("SURFACE_APPROVALS")));
        let key_wait = p.take(key_wait(get("SURFACE_KEY_WAIT")));
        let stream_interval = p.take(stream_interval(get("SURFACE_STREAM_EDITS")));
        let recovery_key = get("MATRIX_RECOVERY_KEY").map(Secret::new);
        let mcp = p.take(mcp_server(
            get("SURFACE_MCP_BIND"),
            get("SURFACE_MCP_TOKEN"),
            get("SURFACE_MCP_SEND"),
        ));

        let built = (|| {
            Some(Self {
                homeserver_url: homeserver_url?,
                user_id: user_id?,
                auth: auth?,
                agent_urls: agent_urls?,
                agent_token: agent_token?,
                workspace_root: workspace_root?,
                state_dir: state_dir?,
                allowed_users: allowed_users?,
                allowed_rooms: allowed_rooms?,
                bot_users,
                max_bot_turns: max_bot_turns?,
                max_file_size: max_file_size?,
                ffmpeg: ffmpeg?,
                show_tool_calls: show_tool_calls?,
                join_intro: join_intro?,
                health_bind: health_bind?,
                inbox_retention: inbox_retention?,
                offline_notice_after: offline_notice_after?,
                interrupted_notice: interrupted_notice?,
                agent_down_notice: agent_down_notice?,
                threads_need_mention: threads_need_mention?,
                approvals_need_verified: approvals_need_verified?,
                key_wait: key_wait?,
                stream_interval: stream_interval?,
                recovery_key,
                mcp: mcp?,
            })
        })();
        p.finish(built)
    }

    /// Whether the room `room_id`, or one of its `aliases`, matches an allowed-room glob.
    pub fn is_room_allowed<'a>(
        &self,
        room_id: &str,
        aliases: impl IntoIterator<Item = &'a str>,
    ) -> bool {
        let aliases: Vec<&str> = aliases.into_iter().collect();
        self.allowed_rooms.iter().any(|g| {
            let g = WildMatch::new(g);
            g.matches(room_id) || aliases.iter().any(|a| g.matches(a))
        })
    }

    /// Secrets still set to a public default from compose.yaml / .env.example (`dev-only-…`),
    /// by variable name: fine for a try-out on one machine, said loudly at start.
    pub fn public_defaults(&self) -> Vec<&'static str> {
        let public = Secret::is_public_default;
        let mut out = Vec::new();
        if public(&self.agent_token) {
            out.push("AGENT_TOKEN");
        }
        if let Some(p) = &self.auth.password
            && public(p)
        {
            out.push("MATRIX_PASSWORD");
        }
        out
    }

    /// Whether `user_id` is configured as a bot (`SURFACE_BOT_USERS`).
    pub fn is_known_bot(&self, user_id: &str) -> bool {
        self.bot_users
            .iter()
            .any(|g| WildMatch::new(g).matches(user_id))
    }

    /// Whether `user_id` matches one of the allowed-user globs.
    pub fn is_allowed(&self, user_id: &str) -> bool {
        self.allowed_users
            .iter()
            .any(|g| WildMatch::new(g).matches(user_id))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn base() -> HashMap<&'static str, String> {
        HashMap::from([
            ("MATRIX_HOMESERVER_URL", "http://127.0.0.1:8008".to_owned()),
            ("MATRIX_USER_ID", "@bot:example.org".to_owned()),
            ("MATRIX_PASSWORD", "hunter2hunter2".to_owned()),
            ("AGENT_URL", "ws://127.0.0.1:8700".to_owned()),
            ("AGENT_TOKEN", "0123456789abcdef".to_owned()),
        ])
    }

    fn load(env: &HashMap<&'static str, String>) -> Result<Config, Problems<ConfigError>> {
        Config::from_lookup(|k| env.get(k).cloned())
    }

    #[test]
    fn public_default_secrets_are_named() {
        let mut env = base();
        assert!(load(&env).unwrap().public_defaults().is_empty());
        env.insert("AGENT_TOKEN", "dev-only-agent-token-change-me".to_owned());
        env.insert(
            "MATRIX_PASSWORD",
            "dev-only-bot-password-change-me".to_owned(),
        );
        assert_eq!(
            load(&env).unwrap().public_defaults(),
            ["AGENT_TOKEN", "MATRIX_PASSWORD"]
        );
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let mut env = base();
        env.remove("MATRIX_HOMESERVER_URL");
        env.insert("AGENT_TOKEN", "short".to_owned());
        env.insert("SURFACE_KEY_WAIT", "soon".to_owned());
        env.insert("SURFACE_ALLOWED_ROOMS", "general".to_owned());
        let problems = load(&env).unwrap_err();
        let vars: Vec<&str> = problems
            .list()
            .iter()
            .map(|p| match p {
                ConfigError::Missing(v) | ConfigError::Invalid { var: v, .. } => *v,
            })
            .collect();
        assert_eq!(
            vars,
            [
                "MATRIX_HOMESERVER_URL",
                "AGENT_TOKEN",
                "SURFACE_ALLOWED_ROOMS",
                "SURFACE_KEY_WAIT"
            ]
        );
        let line = problems.to_string();
        assert!(
            line.starts_with("4 problems: MATRIX_HOMESERVER_URL is required"),
            "{line}"
        );
        assert!(!line.contains("short"), "no secret echoed: {line}");
    }

    #[test]
    fn every_variable_read_is_listed_in_help() {
        let read = std::sync::Mutex::new(std::collections::BTreeSet::new());
        let env = base();
        let lookup = |k: &str| {
            read.lock().unwrap().insert(k.to_owned());
            env.get(k).cloned()
        };
        Config::from_lookup(lookup).unwrap();
        for name in read.lock().unwrap().iter().filter(|n| *n != "PATH") {
            assert!(
                VARS.iter().any(|v| v.name == name),
                "{name} is not in --help"
            );
        }
    }

    #[test]
    fn defaults() {
        let c = load(&base()).unwrap();
        assert_eq!(c.workspace_root, PathBuf::from("/workspace"));
        assert_eq!(c.state_dir, PathBuf::from("/var/lib/surface"));
        assert_eq!(c.allowed_users, vec!["@*:example.org".to_owned()]);
        assert_eq!(c.max_file_size, 100 * 1024 * 1024);
        assert!(!c.show_tool_calls);
        assert!(c.join_intro);
        assert_eq!(c.health_bind, "127.0.0.1:8701".parse().unwrap());
        assert_eq!(c.inbox_retention, None);
        assert_eq!(c.offline_notice_after, Some(Duration::from_secs(120)));
        assert_eq!(c.interrupted_notice, Some(Duration::from_secs(180)));
        assert_eq!(c.agent_down_notice, Some(Duration::from_secs(15)));
        assert!(!c.threads_need_mention);
        assert!(!c.approvals_need_verified);
        assert_eq!(c.key_wait, DEFAULT_KEY_WAIT);
        assert!(c.recovery_key.is_none());
        assert!(c.is_allowed("@alice:example.org"));
        assert!(!c.is_allowed("@eve:evil.org"));
        assert!(c.auth.password.is_some() && c.auth.token.is_none());
    }

    #[test]
    fn room_allowlist_and_bots() {
        let mut env = base();
        let c = Config::from_lookup(|k| env.get(k).cloned()).unwrap();
        assert!(c.is_room_allowed("!any:hs", []), "every room by default");
        assert_eq!(c.max_bot_turns, DEFAULT_MAX_BOT_TURNS);
        env.insert(
            "SURFACE_ALLOWED_ROOMS",
            "!abc:example.org, #team-*:example.org".into(),
        );
        env.insert("SURFACE_BOT_USERS", "@*bot:example.org".into());
        env.insert("SURFACE_MAX_BOT_TURNS", "5".into());
        let c = Config::from_lookup(|k| env.get(k).cloned()).unwrap();
        let table = [
            ("!abc:example.org", vec![], true),
            ("!xyz:example.org", vec![], false),
            ("!xyz:example.org", vec!["#team-ai:example.org"], true),
            ("!xyz:example.org", vec!["#other:example.org"], false),
        ];
        for (room, aliases, allowed) in table {
            assert_eq!(
                c.is_room_allowed(room, aliases.iter().copied()),
                allowed,
                "{room} {aliases:?}"
            );
        }
        assert!(c.is_known_bot("@helperbot:example.org"));
        assert!(!c.is_known_bot("@alice:example.org"));
        assert_eq!(c.max_bot_turns, 5);
    }

    #[test]
    fn errors_name_the_variable() {
        let cases: &[(&str, Option<&str>, &str)] = &[
            (
                "MATRIX_HOMESERVER_URL",
                None,
                "MATRIX_HOMESERVER_URL is required",
            ),
            (
                "MATRIX_HOMESERVER_URL",
                Some("ftp://x"),
                "MATRIX_HOMESERVER_URL is invalid",
            ),
            ("MATRIX_USER_ID", Some("bot"), "MATRIX_USER_ID is invalid"),
            (
                "AGENT_URL",
                Some("http://agent:8700"),
                "AGENT_URL is invalid",
            ),
            ("AGENT_URL", None, "AGENT_URL is required"),
            ("AGENT_URL", Some(" , "), "AGENT_URL is required"),
            (
                "AGENT_URL",
                Some("ws://a:1,ws://a:1"),
                "AGENT_URL is invalid: ws://a:1/ is listed twice",
            ),
            (
                "AGENT_URL",
                Some("ws://a:1,http://b:1"),
                "AGENT_URL is invalid",
            ),
            (
                "AGENT_URL",
                Some("ws://user:pw@a:1"),
                "AGENT_URL is invalid: no credentials",
            ),
            ("AGENT_TOKEN", Some("short"), "AGENT_TOKEN is invalid"),
            (
                "WORKSPACE_ROOT",
                Some("relative/ws"),
                "WORKSPACE_ROOT is invalid",
            ),
            (
                "SURFACE_STATE_DIR",
                Some("state"),
                "SURFACE_STATE_DIR is invalid",
            ),
            (
                "SURFACE_MAX_FILE_SIZE",
                Some("lots"),
                "SURFACE_MAX_FILE_SIZE is invalid",
            ),
            (
                "SURFACE_SHOW_TOOL_CALLS",
                Some("maybe"),
                "SURFACE_SHOW_TOOL_CALLS is invalid",
            ),
            (
                "SURFACE_HEALTH_BIND",
                Some("8701"),
                "SURFACE_HEALTH_BIND is invalid",
            ),
            (
                "SURFACE_OFFLINE_NOTICE",
                Some("later"),
                "SURFACE_OFFLINE_NOTICE is invalid",
            ),
            (
                "SURFACE_AGENT_DOWN_NOTICE",
                Some("soon"),
                "SURFACE_AGENT_DOWN_NOTICE is invalid",
            ),
            (
                "SURFACE_THREADS",
                Some("some"),
                "SURFACE_THREADS is invalid",
            ),
            (
                "SURFACE_APPROVALS",
                Some("trusted"),
                "SURFACE_APPROVALS is invalid",
            ),
            (
                "SURFACE_KEY_WAIT",
                Some("a while"),
                "SURFACE_KEY_WAIT is invalid",
            ),
            (
                "SURFACE_INBOX_RETENTION",
                Some("soon"),
                "SURFACE_INBOX_RETENTION is invalid",
            ),
            (
                "SURFACE_ALLOWED_USERS",
                Some("alice"),
                "SURFACE_ALLOWED_USERS is invalid",
            ),
            (
                "SURFACE_ALLOWED_ROOMS",
                Some("general"),
                "SURFACE_ALLOWED_ROOMS is invalid",
            ),
            (
                "SURFACE_MAX_BOT_TURNS",
                Some("many"),
                "SURFACE_MAX_BOT_TURNS is invalid",
            ),
            ("MATRIX_PASSWORD", None, "MATRIX_ACCESS_TOKEN is invalid"),
        ];
        for (var, value, expected) in cases {
            let mut env = base();
            match value {
                Some(v) => env.insert(var, (*v).to_owned()),
                None => env.remove(var),
            };
            let err = load(&env).unwrap_err().to_string();
            assert!(err.starts_with(expected), "{var}={value:?}: {err}");
        }
    }

    #[test]
    fn token_needs_device_and_secrets_are_redacted() {
        let mut env = base();
        env.insert("MATRIX_ACCESS_TOKEN", "syt_secret_token".to_owned());
        assert_eq!(
            load(&env).unwrap_err().list(),
            [ConfigError::Missing("MATRIX_DEVICE_ID")]
        );
        env.insert("MATRIX_DEVICE_ID", "DEV1".to_owned());
        let c = load(&env).unwrap();
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("syt_secret_token"), "{dbg}");
        assert!(!dbg.contains("0123456789abcdef"), "{dbg}");
        assert!(!dbg.contains("hunter2"), "{dbg}");
        assert!(c.auth.token.is_some());
        env.insert("MATRIX_REFRESH_TOKEN", "syr_secret_refresh".to_owned());
        let c = load(&env).unwrap();
        assert!(!format!("{c:?}").contains("syr_secret_refresh"));
        assert!(c.auth.token.unwrap().refresh_token.is_some());
        env.remove("MATRIX_ACCESS_TOKEN");
        env.remove("MATRIX_PASSWORD");
        assert!(
            load(&env)
                .unwrap_err()
                .to_string()
                .starts_with("MATRIX_REFRESH_TOKEN is invalid")
        );
    }

    #[test]
    fn parses_rich_values() {
        let mut env = base();
        env.insert("SURFACE_MAX_FILE_SIZE", "2MiB".to_owned());
        env.insert("SURFACE_INBOX_RETENTION", "30d".to_owned());
        env.insert("SURFACE_OFFLINE_NOTICE", "off".to_owned());
        env.insert("SURFACE_AGENT_DOWN_NOTICE", "1m".to_owned());
        env.insert("SURFACE_THREADS", "mentions".to_owned());
        env.insert("SURFACE_APPROVALS", "verified".to_owned());
        env.insert("SURFACE_SHOW_TOOL_CALLS", "true".to_owned());
        env.insert("SURFACE_JOIN_INTRO", "off".to_owned());
        env.insert(
            "SURFACE_ALLOWED_USERS",
            "@alice:*, @bob:example.org".to_owned(),
        );
        let c = load(&env).unwrap();
        assert_eq!(c.max_file_size, 2 * 1024 * 1024);
        assert_eq!(c.inbox_retention, Some(Duration::from_secs(30 * 86400)));
        assert_eq!(c.offline_notice_after, None);
        assert_eq!(c.agent_down_notice, Some(Duration::from_secs(60)));
        assert!(c.threads_need_mention);
        assert!(c.approvals_need_verified);
        assert!(c.show_tool_calls);
        assert!(!c.join_intro);
        assert!(c.is_allowed("@alice:other.org"));
        assert!(c.is_allowed("@bob:example.org"));
        assert!(!c.is_allowed("@carol:example.org"));
    }

    #[test]
    fn ffmpeg_is_found_on_the_path_unless_off_and_must_be_executable() {
        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("ffmpeg");
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        let plain = dir.path().join("not-executable");
        std::fs::write(&plain, "").unwrap();
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let mut env = base();
        assert_eq!(load(&env).unwrap().ffmpeg, None, "no PATH, no ffmpeg");
        env.insert("PATH", format!("/nonexistent:{}", dir.path().display()));
        assert_eq!(load(&env).unwrap().ffmpeg, Some(exe.clone()));
        env.insert("SURFACE_FFMPEG", "off".to_owned());
        assert_eq!(load(&env).unwrap().ffmpeg, None);
        env.insert("SURFACE_FFMPEG", plain.display().to_string());
        assert!(load(&env).is_err());
        env.insert("SURFACE_FFMPEG", exe.display().to_string());
        assert_eq!(load(&env).unwrap().ffmpeg, Some(exe));
    }
}
