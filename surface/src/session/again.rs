//! Logging in again with the password into the bot's own device, after a soft logout.
//!
//! The request goes through a client of its own without a session or store: matrix-sdk's
//! `login_username` on the running client would set a second session (it panics) and, on a
//! fresh client, would make new device keys. The device id is the bot's, so the homeserver
//! keeps the device and its keys; the crypto store stays as it is.

use matrix_sdk::Client;
use matrix_sdk::authentication::matrix::MatrixSession;
use matrix_sdk::ruma::OwnedDeviceId;
use matrix_sdk::ruma::api::client::session::login::v3::{LoginInfo, Password, Request};
use matrix_sdk::ruma::api::client::uiaa::{MatrixUserIdentifier, UserIdentifier};
use protocol::Secret;

use super::{LoggedOut, SessionError};
use crate::config::Config;

/// Logs in with `password` into `device`, asking for a refresh token.
pub async fn log_in(
    config: &Config,
    device: &OwnedDeviceId,
    password: &Secret,
) -> Result<MatrixSession, SessionError> {
    let client = Client::builder()
        .homeserver_url(config.homeserver_url.as_str())
        .respect_login_well_known(false)
        .build()
        .await?;
    let mut request = Request::new(LoginInfo::Password(Password::new(
        UserIdentifier::Matrix(MatrixUserIdentifier::new(config.user_id.to_string())),
        password.expose().to_owned(),
    )));
    request.device_id = Some(device.clone());
    request.refresh_token = true;
    let response = match client.send(request).await {
        Ok(r) => r,
        Err(e) => {
            let code = e.client_api_error_kind().map(|k| k.errcode().to_string());
            return Err(match refusal(code.as_deref()) {
                Some(out) => SessionError::LoggedOut(out),
                None => matrix_sdk::Error::from(e).into(),
            });
        }
    };
    if response.device_id != *device || response.user_id != config.user_id {
        // Never expected: the homeserver answered for another device or user.
        return Err(SessionError::LoggedOut(LoggedOut::PasswordRefused));
    }
    Ok(MatrixSession::from(&response))
}

/// What a refused login means (pure); `None` when trying again later can help.
fn refusal(errcode: Option<&str>) -> Option<LoggedOut> {
    match errcode? {
        "M_USER_LOCKED" => Some(LoggedOut::Locked),
        "M_USER_DEACTIVATED" => Some(LoggedOut::Deactivated),
        "M_FORBIDDEN" | "M_UNKNOWN" | "M_UNRECOGNIZED" | "M_INVALID_PARAM" | "M_BAD_JSON" => {
            Some(LoggedOut::PasswordRefused)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_logins() {
        let table = [
            (Some("M_FORBIDDEN"), Some(LoggedOut::PasswordRefused)),
            // Synapse without password logins: 400 M_UNKNOWN "Unknown login type".
            (Some("M_UNKNOWN"), Some(LoggedOut::PasswordRefused)),
            (Some("M_USER_DEACTIVATED"), Some(LoggedOut::Deactivated)),
            (Some("M_USER_LOCKED"), Some(LoggedOut::Locked)),
            (Some("M_LIMIT_EXCEEDED"), None),
            (None, None),
        ];
        for (code, expected) in table {
            assert_eq!(refusal(code), expected, "{code:?}");
        }
    }
}
