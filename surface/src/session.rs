//! Logging in once and staying the same device: the `MatrixSession` is persisted (JSON,
//! atomic write, mode 0600) next to matrix-sdk's sqlite store, and restored on every start.
//!
//! A password login asks for a refresh token, and the client renews an expired access token
//! by itself (matrix-sdk's refresh handling). A refresh token is single-use, so every rotated
//! pair is written to the session file inside matrix-sdk's refresh, before anything uses it
//! (its synchronous save-session callback): a surface killed right after a rotation restarts
//! with the new pair, never the spent one.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use matrix_sdk::authentication::matrix::MatrixSession;
use matrix_sdk::store::RoomLoadSettings;
use matrix_sdk::{Client, SessionMeta, SessionTokens};
use tracing::info;

use crate::config::{Auth, Config};

/// Why logging in failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The state directory or the session file could not be used.
    #[error("state directory {}: {source}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The persisted session does not decode.
    #[error("session file {} is corrupt: {source}", path.display())]
    Corrupt {
        /// The path.
        path: PathBuf,
        /// The error.
        source: serde_json::Error,
    },
    /// The persisted session belongs to another user than `MATRIX_USER_ID`.
    #[error(
        "session file is for {found}, but MATRIX_USER_ID is {expected}; move the state directory aside"
    )]
    WrongUser {
        /// From the config.
        expected: String,
        /// From the file.
        found: String,
    },
    /// The homeserver refused the login or the token.
    #[error("matrix login failed: {0}")]
    Matrix(Box<matrix_sdk::Error>),
    /// Building the client failed.
    #[error("matrix client: {0}")]
    Build(Box<matrix_sdk::ClientBuildError>),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SessionError + '_ {
    move |source| SessionError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The path of the persisted session.
pub fn session_path(state_dir: &Path) -> PathBuf {
    state_dir.join("session.json")
}

/// Writes `session` to `path` atomically (temp file + fsync + rename), readable only by us.
pub fn save_session(path: &Path, session: &MatrixSession) -> Result<(), SessionError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(".session.json.tmp");
    let json = serde_json::to_vec_pretty(session).map_err(|source| SessionError::Corrupt {
        path: path.to_owned(),
        source,
    })?;
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io_err(&tmp))?;
    f.write_all(&json).map_err(io_err(&tmp))?;
    f.sync_all().map_err(io_err(&tmp))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(io_err(path))?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Reads the persisted session, if any.
pub fn load_session(path: &Path) -> Result<Option<MatrixSession>, SessionError> {
    match std::fs::read(path) {
        Ok(bytes) => {
            serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| SessionError::Corrupt {
                    path: path.to_owned(),
                    source,
                })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(path)(e)),
    }
}

/// Builds the client on the persistent store and restores or creates the session.
pub async fn login(config: &Config) -> Result<Client, SessionError> {
    let state = &config.state_dir;
    std::fs::create_dir_all(state).map_err(io_err(state))?;
    let _ = std::fs::set_permissions(state, std::fs::Permissions::from_mode(0o700));
    let store = state.join("matrix-store");
    // An empty store: this start creates the bot's device (its keys are not uploaded yet).
    crate::logging::set_new_device(!store.exists());
    let client = Client::builder()
        .homeserver_url(config.homeserver_url.as_str())
        // Keep talking to the configured URL: a homeserver's advertised `public_baseurl` (e.g.
        // `http://localhost:8008`) is often unreachable from inside a container.
        .respect_login_well_known(false)
        .sqlite_store(&store, None)
        .with_encryption_settings(crate::trust::settings())
        .handle_refresh_tokens()
        .build()
        .await?;
    let path = session_path(state);

    let persisted = load_session(&path)?;
    if let Some(s) = &persisted
        && s.meta.user_id != config.user_id
    {
        return Err(SessionError::WrongUser {
            expected: config.user_id.to_string(),
            found: s.meta.user_id.to_string(),
        });
    }

    let session = match (&config.auth, persisted) {
        // An explicitly configured token wins over the file (the operator may have rotated it).
        (
            Auth::Token {
                access_token,
                device_id,
            },
            _,
        ) => MatrixSession {
            meta: SessionMeta {
                user_id: config.user_id.clone(),
                device_id: device_id.clone(),
            },
            tokens: SessionTokens {
                access_token: access_token.expose().to_owned(),
                refresh_token: None,
            },
        },
        (Auth::Password(_), Some(s)) => s,
        (Auth::Password(password), None) => {
            info!(user_id = %config.user_id, "no saved session: logging in with the password once");
            let response = client
                .matrix_auth()
                .login_username(&config.user_id, password.expose())
                .initial_device_display_name("mxbridge surface")
                .request_refresh_token()
                .send()
                .await?;
            let session = MatrixSession::from(&response);
            save_session(&path, &session)?;
            keep_rotations(&client, path)?;
            return Ok(client);
        }
    };
    client
        .matrix_auth()
        .restore_session(session.clone(), RoomLoadSettings::default())
        .await?;
    keep_rotations(&client, path.clone())?;
    // Fail now, with a clear message, if the token is not valid (an expired one is renewed
    // here, and the new pair is saved by then).
    client.whoami().await.map_err(matrix_sdk::Error::from)?;
    if let Some(current) = client.matrix_auth().session() {
        save_session(&path, &current)?;
    }
    Ok(client)
}

/// Has every token pair the client rotates to written to `path` the moment it changes, before
/// it is used (matrix-sdk calls this inside its refresh, holding the refresh lock).
fn keep_rotations(client: &Client, path: PathBuf) -> Result<(), SessionError> {
    client
        .set_session_callbacks(
            // One process owns the session: what it holds is the latest.
            Box::new(|client| {
                client
                    .session_tokens()
                    .ok_or_else(|| "no session to reload".into())
            }),
            Box::new(move |client| {
                let session = client.matrix_auth().session().ok_or("no session to save")?;
                save_session(&path, &session)?;
                crate::metrics::token_refreshed();
                info!("access token renewed; the new pair is saved");
                Ok(())
            }),
        )
        .map_err(SessionError::from)?;
    Ok(())
}

impl From<matrix_sdk::Error> for SessionError {
    fn from(e: matrix_sdk::Error) -> Self {
        Self::Matrix(Box::new(e))
    }
}

impl From<matrix_sdk::ClientBuildError> for SessionError {
    fn from(e: matrix_sdk::ClientBuildError) -> Self {
        Self::Build(Box::new(e))
    }
}

#[cfg(test)]
mod tests {
    use matrix_sdk::ruma::{device_id, user_id};

    use super::*;

    #[test]
    fn session_roundtrip_is_private_and_atomic() {
        let dir = tempfile::tempdir().unwrap();
        let path = session_path(dir.path());
        assert!(load_session(&path).unwrap().is_none());
        let s = MatrixSession {
            meta: SessionMeta {
                user_id: user_id!("@bot:hs").to_owned(),
                device_id: device_id!("DEV").to_owned(),
            },
            tokens: SessionTokens {
                access_token: "tok".into(),
                refresh_token: None,
            },
        };
        save_session(&path, &s).unwrap();
        save_session(&path, &s).unwrap();
        let back = load_session(&path).unwrap().unwrap();
        assert_eq!(back.meta, s.meta);
        assert_eq!(back.tokens.access_token, "tok");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(!format!("{back:?}").contains("tok\""));
        std::fs::write(&path, "{").unwrap();
        assert!(matches!(
            load_session(&path),
            Err(SessionError::Corrupt { .. })
        ));
    }
}
