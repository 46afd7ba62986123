//! What the homeserver's refusals say about the bot's access, and what to do about them
//! (pure, table-tested). The adapter from matrix-sdk's errors is [`Observed::of`].
//!
//! Synapse's words, as read in its source (1.163): an expired access token is
//! `401 M_UNKNOWN_TOKEN` with `soft_logout: true` (the device remains); a token that was logged
//! out, or whose device was deleted, is `401 M_UNKNOWN_TOKEN` without it; a refresh token that
//! is unknown is `401 M_UNKNOWN_TOKEN`, one already replaced or expired `403 M_FORBIDDEN`; a
//! locked account `401 M_USER_LOCKED` (soft), a deactivated one `403 M_USER_DEACTIVATED`.

use matrix_sdk::HttpError;
use matrix_sdk::RefreshTokenError;
use matrix_sdk::ruma::api::error::ErrorKind;

/// A failed authenticated request, reduced to what the decision needs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observed {
    /// The Matrix `errcode`, when the homeserver answered with one.
    pub errcode: Option<String>,
    /// `soft_logout` of an `M_UNKNOWN_TOKEN`.
    pub soft_logout: bool,
    /// The error came from renewing the access token with the refresh token.
    pub refreshing: bool,
}

impl Observed {
    /// Reads matrix-sdk's error (a refresh that failed wraps the refresh request's error).
    pub fn of(error: &HttpError) -> Self {
        match error {
            HttpError::RefreshToken(RefreshTokenError::MatrixAuth(inner)) => Self {
                refreshing: true,
                ..Self::of(inner)
            },
            HttpError::Cached(inner) => Self::of(inner),
            other => {
                let kind = other.client_api_error_kind();
                Self {
                    errcode: kind.map(|k| k.errcode().to_string()),
                    soft_logout: matches!(kind, Some(ErrorKind::UnknownToken(d)) if d.soft_logout),
                    refreshing: false,
                }
            }
        }
    }
}

/// Why the bot cannot use the homeserver any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoggedOut {
    /// Soft logout: the token expired or was invalidated, the device (and its keys) remain.
    Soft,
    /// The refresh token was refused (expired, unknown, or already used elsewhere).
    RefreshRefused,
    /// The token was logged out or its device deleted.
    Hard,
    /// The account is locked by an admin.
    Locked,
    /// The account is deactivated.
    Deactivated,
    /// Logging in again was refused: the password is wrong (or password login is off).
    PasswordRefused,
}

/// What one refusal means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Not about the bot's access (network, server trouble, rate limits): it passes.
    Unsettled,
    /// The homeserver no longer lets the bot in, this way.
    Out(LoggedOut),
}

/// Judges one refusal (pure).
pub fn judge(o: &Observed) -> Access {
    let out = match (o.errcode.as_deref(), o.refreshing) {
        (Some("M_USER_LOCKED"), _) => LoggedOut::Locked,
        (Some("M_USER_DEACTIVATED"), _) => LoggedOut::Deactivated,
        (Some("M_UNKNOWN_TOKEN" | "M_FORBIDDEN"), true) => LoggedOut::RefreshRefused,
        (Some("M_UNKNOWN_TOKEN"), false) if o.soft_logout => LoggedOut::Soft,
        (Some("M_UNKNOWN_TOKEN" | "M_MISSING_TOKEN"), false) => LoggedOut::Hard,
        _ => return Access::Unsettled,
    };
    Access::Out(out)
}

/// The refusal, with what the homeserver first said (`soft_logout` of the first
/// `M_UNKNOWN_TOKEN`, before any refresh): a refresh refused after a refusal that was not soft
/// is a device logged out or deleted, not a session to log into again (pure).
pub fn settle(first_soft_logout: Option<bool>, confirmed: LoggedOut) -> LoggedOut {
    match (first_soft_logout, confirmed) {
        (Some(false), LoggedOut::RefreshRefused) => LoggedOut::Hard,
        _ => confirmed,
    }
}

/// What to do once logged out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Log in again with the password, into the same device.
    LogInAgain,
    /// The account is locked: try the same session again later (an unlock lets it in).
    Wait,
    /// Stop syncing and wait for the operator.
    Stop(LoggedOut),
}

/// The way back, if there is one (pure). A deleted device is never logged into again by
/// itself: a login with its id would make a new device under the old name, without the keys
/// the bot's crypto store holds.
pub fn next(out: LoggedOut, has_password: bool) -> Next {
    match out {
        LoggedOut::Soft | LoggedOut::RefreshRefused if has_password => Next::LogInAgain,
        LoggedOut::Locked => Next::Wait,
        other => Next::Stop(other),
    }
}

impl LoggedOut {
    /// The short status word, for `/healthz` and metrics.
    pub fn code(self) -> &'static str {
        match self {
            Self::Soft => "soft_logout",
            Self::RefreshRefused => "refresh_refused",
            Self::Hard => "logged_out",
            Self::Locked => "account_locked",
            Self::Deactivated => "account_deactivated",
            Self::PasswordRefused => "password_refused",
        }
    }

    /// What happened and what the operator can do, in one sentence each (no secrets).
    pub fn explain(self) -> &'static str {
        match self {
            Self::Soft => {
                "the homeserver ended the bot's session (soft logout: the access token expired \
                 and could not be renewed; the device and its keys remain). Set MATRIX_PASSWORD \
                 so the surface logs in again by itself, or give a new MATRIX_ACCESS_TOKEN for \
                 the same MATRIX_DEVICE_ID, and restart"
            }
            Self::RefreshRefused => {
                "the homeserver refused the refresh token (expired, revoked, or used by another \
                 copy of this session). Set MATRIX_PASSWORD so the surface logs in again by \
                 itself, or give a new MATRIX_ACCESS_TOKEN (and MATRIX_REFRESH_TOKEN) for the \
                 same MATRIX_DEVICE_ID, and restart"
            }
            Self::Hard => {
                "the homeserver no longer knows the bot's token and offers no soft logout: the \
                 device was logged out or deleted. Move session.json and matrix-store out of \
                 SURFACE_STATE_DIR (keep journal.sqlite), then restart with MATRIX_PASSWORD or \
                 a new token; the bot becomes a new device, to be verified again"
            }
            Self::Locked => {
                "the homeserver's admin locked the bot's account; the surface keeps trying \
                 (every 30 s at most) and resumes by itself once the account is unlocked"
            }
            Self::Deactivated => "the bot's account is deactivated; it cannot log in again",
            Self::PasswordRefused => {
                "logging in again was refused: MATRIX_PASSWORD is wrong, or the homeserver \
                 takes no password logins (see `surface doctor`). Give the right password or \
                 a new MATRIX_ACCESS_TOKEN for the same MATRIX_DEVICE_ID, and restart"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(errcode: Option<&str>, soft_logout: bool, refreshing: bool) -> Observed {
        Observed {
            errcode: errcode.map(str::to_owned),
            soft_logout,
            refreshing,
        }
    }

    #[test]
    fn refusals_are_judged() {
        use LoggedOut::*;
        let out = Access::Out;
        let table = [
            (seen(None, false, false), Access::Unsettled),
            (seen(None, false, true), Access::Unsettled),
            (
                seen(Some("M_LIMIT_EXCEEDED"), false, false),
                Access::Unsettled,
            ),
            (seen(Some("M_UNKNOWN"), false, true), Access::Unsettled),
            (seen(Some("M_UNKNOWN_TOKEN"), true, false), out(Soft)),
            (seen(Some("M_UNKNOWN_TOKEN"), false, false), out(Hard)),
            (seen(Some("M_MISSING_TOKEN"), false, false), out(Hard)),
            (
                seen(Some("M_UNKNOWN_TOKEN"), false, true),
                out(RefreshRefused),
            ),
            (
                seen(Some("M_UNKNOWN_TOKEN"), true, true),
                out(RefreshRefused),
            ),
            (seen(Some("M_FORBIDDEN"), false, true), out(RefreshRefused)),
            // A forbidden request (a room's power levels) says nothing about the session.
            (seen(Some("M_FORBIDDEN"), false, false), Access::Unsettled),
            (seen(Some("M_USER_LOCKED"), true, false), out(Locked)),
            (
                seen(Some("M_USER_DEACTIVATED"), false, false),
                out(Deactivated),
            ),
        ];
        for (observed, expected) in table {
            assert_eq!(judge(&observed), expected, "{observed:?}");
        }
    }

    #[test]
    fn a_refused_refresh_after_a_hard_refusal_is_hard() {
        use LoggedOut::*;
        let table = [
            (Some(false), RefreshRefused, Hard),
            (Some(true), RefreshRefused, RefreshRefused),
            (None, RefreshRefused, RefreshRefused),
            (Some(true), Soft, Soft),
            (Some(false), Locked, Locked),
            (None, Hard, Hard),
        ];
        for (first, confirmed, expected) in table {
            assert_eq!(
                settle(first, confirmed),
                expected,
                "{first:?} {confirmed:?}"
            );
        }
    }

    #[test]
    fn only_a_soft_logout_with_a_password_logs_in_again() {
        use LoggedOut::*;
        let table = [
            (Soft, true, Next::LogInAgain),
            (Soft, false, Next::Stop(Soft)),
            (RefreshRefused, true, Next::LogInAgain),
            (RefreshRefused, false, Next::Stop(RefreshRefused)),
            (Hard, true, Next::Stop(Hard)),
            (Locked, true, Next::Wait),
            (Locked, false, Next::Wait),
            (Deactivated, true, Next::Stop(Deactivated)),
            (PasswordRefused, true, Next::Stop(PasswordRefused)),
        ];
        for (out, password, expected) in table {
            assert_eq!(next(out, password), expected, "{out:?} password={password}");
            assert!(!out.explain().is_empty() && !out.code().is_empty());
        }
    }

    /// matrix-sdk's error for a homeserver answer (Synapse's bodies, as its source words them).
    fn answered(status: u16, body: serde_json::Value) -> HttpError {
        use matrix_sdk::ruma::api::client::uiaa::UiaaResponse;
        use matrix_sdk::ruma::api::error::{Error, ErrorBody, FromHttpResponseError};
        let body = ErrorBody::Standard(serde_json::from_value(body).unwrap());
        let status = matrix_sdk::reqwest::StatusCode::from_u16(status).unwrap();
        let error = UiaaResponse::MatrixError(Error::new(status, body));
        HttpError::Api(Box::new(FromHttpResponseError::Server(error)))
    }

    #[test]
    fn matrix_sdk_errors_are_read() {
        use serde_json::json;
        let expired = answered(
            401,
            json!({"errcode": "M_UNKNOWN_TOKEN", "error": "Access token has expired", "soft_logout": true}),
        );
        assert_eq!(judge(&Observed::of(&expired)), Access::Out(LoggedOut::Soft));
        let gone = answered(
            401,
            json!({"errcode": "M_UNKNOWN_TOKEN", "error": "Invalid access token passed.", "soft_logout": false}),
        );
        assert_eq!(judge(&Observed::of(&gone)), Access::Out(LoggedOut::Hard));
        let spent = answered(
            403,
            json!({"errcode": "M_FORBIDDEN", "error": "refresh token isn't valid anymore"}),
        );
        let refreshing =
            HttpError::RefreshToken(RefreshTokenError::MatrixAuth(std::sync::Arc::new(spent)));
        assert_eq!(
            judge(&Observed::of(&refreshing)),
            Access::Out(LoggedOut::RefreshRefused)
        );
        let limited = answered(
            429,
            json!({"errcode": "M_LIMIT_EXCEEDED", "error": "Too Many Requests"}),
        );
        assert_eq!(judge(&Observed::of(&limited)), Access::Unsettled);
        assert_eq!(
            judge(&Observed::of(&HttpError::RefreshToken(
                RefreshTokenError::RefreshTokenRequired
            ))),
            Access::Unsettled
        );
    }
}
