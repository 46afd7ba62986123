//! The doctor's login findings (pure, table-tested): whose token it is, what a refusal means
//! and what to do, and which ways into the homeserver exist (password, OAuth 2.0 only).

use settings::{Finding, Level};

use crate::config::Config;
use crate::session::LoggedOut;

/// Who the bot is logged in as, per the homeserver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Login {
    /// `whoami` answered.
    As {
        /// The user.
        user_id: String,
        /// The device.
        device_id: Option<String>,
    },
    /// No access token configured and no session saved yet (first start logs in).
    NoSession,
    /// The homeserver no longer accepts the token.
    Out {
        /// Why, as the surface judges it.
        out: LoggedOut,
        /// The saved session holds a refresh token (an expired access token is renewed).
        refreshable: bool,
    },
    /// The homeserver refused the token otherwise.
    Refused(String),
    /// Not asked: the homeserver is unreachable.
    Unknown,
}

/// How the homeserver lets a client log in: `GET /login`'s flows and its OAuth 2.0 server
/// metadata (`/_matrix/client/v1/auth_metadata`, or MSC2965's unstable path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaysIn {
    /// `m.login.password` is offered.
    pub password: bool,
    /// OAuth 2.0 server metadata is published (e.g. the Matrix Authentication Service).
    pub oauth: bool,
}

/// What to run on an OAuth 2.0 homeserver to let the bot in.
pub const COMPAT_TOKEN_HOWTO: &str = "ask the homeserver's admin for a compatibility token \
    (`mas-cli manage issue-compatibility-token <bot localpart> [<device id>]`) and set \
    MATRIX_ACCESS_TOKEN and MATRIX_DEVICE_ID to it (MATRIX_REFRESH_TOKEN too, if one came with it)";

/// The `login` line.
pub fn login(config: &Config, login: &Login) -> Finding {
    use Level::{Fail, Ok, Warn};
    let password = config.auth.password.is_some();
    match login {
        Login::As { user_id, device_id } if *user_id == config.user_id.as_str() => Finding::new(
            Ok,
            "login",
            format!(
                "logged in as {user_id} (device {})",
                device_id.as_deref().unwrap_or("?")
            ),
        ),
        Login::As { user_id, .. } => Finding::new(
            Fail,
            "login",
            format!(
                "the token belongs to {user_id}, not MATRIX_USER_ID {}",
                config.user_id
            ),
        ),
        Login::NoSession => Finding::new(
            Warn,
            "login",
            "no saved session yet: the surface logs in with MATRIX_PASSWORD on its first start",
        ),
        Login::Out {
            out: LoggedOut::Soft,
            refreshable: true,
        } => Finding::new(
            Warn,
            "login",
            "the saved access token has expired; the surface renews it with its refresh token \
             when it next talks to the homeserver (the doctor never does: a refresh token is \
             single-use)",
        ),
        Login::Out {
            out: LoggedOut::Soft,
            refreshable: false,
        } if password => Finding::new(
            Warn,
            "login",
            "soft logout: the homeserver ended the session; the surface logs in again with \
             MATRIX_PASSWORD into the same device",
        ),
        Login::Out { out, .. } => {
            Finding::new(Fail, "login", format!("{}: {}", out.code(), out.explain()))
        }
        Login::Refused(e) => Finding::new(
            Fail,
            "login",
            format!("the homeserver refused the bot's token ({e}): log in again"),
        ),
        Login::Unknown => Finding::new(Warn, "login", "not checked (homeserver unreachable)"),
    }
}

/// The `ways in` line: whether the configured way in is one the homeserver offers.
pub fn ways_in(config: &Config, ways: Option<WaysIn>) -> Option<Finding> {
    use Level::{Fail, Ok, Warn};
    let ways = ways?;
    let token = config.auth.token.is_some();
    let password = config.auth.password.is_some();
    Some(match (ways.oauth, ways.password) {
        (true, false) if token => Finding::new(
            Ok,
            "ways in",
            "OAuth 2.0 only (no password login): the bot uses the operator-given token, e.g. a \
             compatibility token; when it ends, give a new one",
        ),
        (true, false) => Finding::new(
            Fail,
            "ways in",
            format!(
                "this homeserver takes only OAuth 2.0 logins (no m.login.password): \
                 MATRIX_PASSWORD cannot log in, nor in again after a soft logout; \
                 {COMPAT_TOKEN_HOWTO}"
            ),
        ),
        (oauth, true) => Finding::new(
            Ok,
            "ways in",
            if oauth {
                "password and OAuth 2.0 logins offered"
            } else {
                "password login offered"
            },
        ),
        (false, false) if password && !token => Finding::new(
            Fail,
            "ways in",
            "this homeserver offers no password login: MATRIX_PASSWORD cannot log in; give \
             MATRIX_ACCESS_TOKEN and MATRIX_DEVICE_ID instead",
        ),
        (false, false) => Finding::new(
            Warn,
            "ways in",
            "no password login offered: when the homeserver ends the session, the bot needs a \
             new MATRIX_ACCESS_TOKEN",
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &[(&str, &str)]) -> Config {
        let mut env: Vec<(&str, &str)> = vec![
            ("MATRIX_HOMESERVER_URL", "http://127.0.0.1:8008"),
            ("MATRIX_USER_ID", "@bot:hs"),
            ("AGENT_URL", "ws://127.0.0.1:8700"),
            ("AGENT_TOKEN", "0123456789abcdef"),
        ];
        env.extend_from_slice(extra);
        Config::from_pairs(&env).unwrap()
    }

    type Env = &'static [(&'static str, &'static str)];

    const PASSWORD: Env = &[("MATRIX_PASSWORD", "pw")];
    const TOKEN: Env = &[
        ("MATRIX_ACCESS_TOKEN", "mct_token"),
        ("MATRIX_DEVICE_ID", "DEV"),
    ];

    #[test]
    fn logins_are_explained() {
        use Level::{Fail, Warn};
        let out = |out, refreshable| Login::Out { out, refreshable };
        let table: &[(Env, Login, Level, &str)] = &[
            (PASSWORD, out(LoggedOut::Soft, true), Warn, "renews it"),
            (PASSWORD, out(LoggedOut::Soft, false), Warn, "logs in again"),
            (
                TOKEN,
                out(LoggedOut::Soft, false),
                Fail,
                "Set MATRIX_PASSWORD",
            ),
            (
                PASSWORD,
                out(LoggedOut::Hard, false),
                Fail,
                "device was logged out or deleted",
            ),
            (TOKEN, out(LoggedOut::Locked, false), Fail, "locked"),
            (
                PASSWORD,
                Login::Refused("HTTP 403 M_FORBIDDEN".into()),
                Fail,
                "M_FORBIDDEN",
            ),
        ];
        for (env, seen, level, words) in table {
            let f = login(&config(env), seen);
            assert_eq!(f.level, *level, "{seen:?}: {}", f.text);
            assert!(f.text.contains(words), "{seen:?}: {}", f.text);
        }
    }

    #[test]
    fn an_oauth_only_homeserver_needs_a_compatibility_token() {
        use Level::{Fail, Ok, Warn};
        let w = |oauth, password| Some(WaysIn { oauth, password });
        type Expected = Option<(Level, &'static str)>;
        let table: &[(Env, Option<WaysIn>, Expected)] = &[
            (PASSWORD, None, None),
            (
                PASSWORD,
                w(true, false),
                Some((Fail, "issue-compatibility-token")),
            ),
            (TOKEN, w(true, false), Some((Ok, "operator-given token"))),
            (
                PASSWORD,
                w(true, true),
                Some((Ok, "password and OAuth 2.0")),
            ),
            (
                PASSWORD,
                w(false, true),
                Some((Ok, "password login offered")),
            ),
            (PASSWORD, w(false, false), Some((Fail, "no password login"))),
            (
                TOKEN,
                w(false, false),
                Some((Warn, "new MATRIX_ACCESS_TOKEN")),
            ),
        ];
        for (env, ways, expected) in table {
            let got = ways_in(&config(env), *ways).map(|f| (f.level, f.text));
            match (got, expected) {
                (None, None) => {}
                (Some((level, text)), Some((l, words))) => {
                    assert_eq!(level, *l, "{ways:?}: {text}");
                    assert!(text.contains(words), "{ways:?}: {text}");
                }
                (got, _) => panic!("{ways:?}: {got:?}"),
            }
        }
    }
}
