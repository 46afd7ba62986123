//! Logging in once, staying the same device, and staying logged in.
//!
//! * The session is persisted ([`saved`]) next to matrix-sdk's sqlite store and restored on
//!   every start. A token the operator gives (`MATRIX_ACCESS_TOKEN`, maybe with
//!   `MATRIX_REFRESH_TOKEN`) is used until the surface rotated it: from then on the file, which
//!   descends from it, wins ([`saved::choose`]).
//! * A password login asks for a refresh token, and the client renews an expired access token
//!   by itself (matrix-sdk's refresh handling). A refresh token is single-use, so every rotated
//!   pair is written to the session file inside matrix-sdk's refresh, before anything uses it
//!   (its synchronous save-session callback): a surface killed right after a rotation restarts
//!   with the new pair, never the spent one.
//! * When the homeserver refuses the bot ([`access`]): after a soft logout with a password
//!   configured, the surface logs in again into the same device ([`again`]) and carries on;
//!   otherwise it stops syncing and says why ([`watch`] notices it while running).

pub mod access;
mod again;
pub mod saved;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use matrix_sdk::authentication::matrix::MatrixSession;
use matrix_sdk::store::RoomLoadSettings;
use matrix_sdk::{Client, SessionChange};
use tokio::sync::broadcast;
use tracing::{info, warn};

pub use self::access::LoggedOut;
use self::access::{Access, Next, Observed};
pub use self::saved::{Saved, session_path};
use crate::config::Config;

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
    /// The homeserver does not let the bot in, and nothing here can change that.
    #[error("logged out ({}): {}", .0.code(), .0.explain())]
    LoggedOut(LoggedOut),
    /// The homeserver refused the login or the token, or could not be reached.
    #[error("matrix login failed: {0}")]
    Matrix(Box<matrix_sdk::Error>),
    /// Building the client failed.
    #[error("matrix client: {0}")]
    Build(Box<matrix_sdk::ClientBuildError>),
}

impl SessionError {
    /// Whether trying again later can help (the homeserver was unreachable or in trouble).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Matrix(e) => match e.as_ref() {
                matrix_sdk::Error::Http(h) => h
                    .as_client_api_error()
                    .is_none_or(|e| e.status_code.is_server_error() || e.status_code == 429),
                _ => false,
            },
            _ => false,
        }
    }
}

/// Builds the client on the persistent store and restores or creates the session; after a
/// soft logout, logs in again into the same device when a password is configured.
pub async fn login(config: &Config) -> Result<Client, SessionError> {
    let state = &config.state_dir;
    std::fs::create_dir_all(state).map_err(|source| SessionError::Io {
        path: state.clone(),
        source,
    })?;
    let _ = std::fs::set_permissions(state, std::fs::Permissions::from_mode(0o700));
    let store = state.join("matrix-store");
    // An empty store: this start creates the bot's device (its keys are not uploaded yet).
    crate::logging::set_new_device(!store.exists());
    let path = session_path(state);
    let persisted = saved::load(&path)?;
    if let Some(s) = &persisted
        && s.session.meta.user_id != config.user_id
    {
        return Err(SessionError::WrongUser {
            expected: config.user_id.to_string(),
            found: s.session.meta.user_id.to_string(),
        });
    }
    let saved = match saved::pick(&config.user_id, config.auth.token.as_ref(), persisted) {
        Some(saved) => saved,
        None => {
            let password = config
                .auth
                .password
                .as_ref()
                .expect("the config has a token or a password");
            info!(user_id = %config.user_id, "no saved session: logging in with the password once");
            let client = build(config, &store).await?;
            let response = client
                .matrix_auth()
                .login_username(&config.user_id, password.expose())
                .initial_device_display_name("mxbridge surface")
                .request_refresh_token()
                .send()
                .await?;
            let saved = Saved {
                session: MatrixSession::from(&response),
                origin: None,
            };
            saved::save(&path, &saved)?;
            keep_rotations(&client, path, None)?;
            return Ok(client);
        }
    };
    match restore(config, &store, &path, saved.clone()).await {
        Err(SessionError::LoggedOut(out)) => {
            match access::next(out, config.auth.password.is_some()) {
                Next::Stop(out) => Err(SessionError::LoggedOut(out)),
                // A locked account: its caller tries the same session again later.
                Next::Wait => Err(SessionError::LoggedOut(out)),
                Next::LogInAgain => {
                    let password = config.auth.password.as_ref().expect("next() checked");
                    let device = saved.session.meta.device_id.clone();
                    warn!(
                        reason = out.code(),
                        device_id = %device,
                        "the homeserver ended the session; logging in again with the password into the same device"
                    );
                    let session = again::log_in(config, &device, password).await?;
                    let saved = Saved {
                        session,
                        origin: saved.origin,
                    };
                    saved::save(&path, &saved)?;
                    crate::metrics::logged_in_again();
                    info!(device_id = %device, "logged in again; the new session is saved");
                    restore(config, &store, &path, saved).await
                }
            }
        }
        other => other,
    }
}

/// A client on the persistent store, renewing expiring tokens by itself.
async fn build(config: &Config, store: &Path) -> Result<Client, SessionError> {
    Ok(Client::builder()
        .homeserver_url(config.homeserver_url.as_str())
        // Keep talking to the configured URL: a homeserver's advertised `public_baseurl` (e.g.
        // `http://localhost:8008`) is often unreachable from inside a container.
        .respect_login_well_known(false)
        .sqlite_store(store, None)
        .with_encryption_settings(crate::trust::settings())
        .handle_refresh_tokens()
        .build()
        .await?)
}

/// Restores `saved` into a new client and checks it with the homeserver (an expired access
/// token is renewed here, and the new pair saved by then).
async fn restore(
    config: &Config,
    store: &Path,
    path: &Path,
    saved: Saved,
) -> Result<Client, SessionError> {
    let client = build(config, store).await?;
    client
        .matrix_auth()
        .restore_session(saved.session, RoomLoadSettings::default())
        .await?;
    keep_rotations(&client, path.to_owned(), saved.origin.clone())?;
    let mut changes = client.subscribe_to_session_changes();
    if let Err(e) = client.whoami().await {
        return match access::judge(&Observed::of(&e)) {
            Access::Out(out) => Err(SessionError::LoggedOut(access::settle(
                first_refusal(&mut changes),
                out,
            ))),
            Access::Unsettled => Err(matrix_sdk::Error::from(e).into()),
        };
    }
    if let Some(current) = client.matrix_auth().session() {
        saved::save(
            path,
            &Saved {
                session: current,
                origin: saved.origin,
            },
        )?;
    }
    Ok(client)
}

/// `soft_logout` of the first `M_UNKNOWN_TOKEN` matrix-sdk announced, if any (it announces the
/// original refusal, before any refresh was tried).
fn first_refusal(changes: &mut broadcast::Receiver<SessionChange>) -> Option<bool> {
    while let Ok(change) = changes.try_recv() {
        if let SessionChange::UnknownToken(data) = change {
            return Some(data.soft_logout);
        }
    }
    None
}

/// Says that the bot is logged out (`/healthz`, the gauge, and the log when it is news).
pub fn report_logged_out(health: &crate::health::Health, out: LoggedOut) {
    if health.set_logged_out(out.code(), out.explain()) {
        tracing::error!(reason = out.code(), "{}", out.explain());
    }
    crate::metrics::logged_out(true);
}

/// Says that the bot may use the homeserver again, if it was logged out.
pub fn report_logged_in(health: &crate::health::Health) {
    if health.clear_logged_out() {
        info!("the homeserver lets the bot in again");
    }
    crate::metrics::logged_out(false);
}

/// Resolves once the homeserver has logged the running bot out, with why. matrix-sdk
/// announces every `M_UNKNOWN_TOKEN` it could not cure by a refresh (also one whose refresh
/// only failed for want of a network), so each is checked with a request of our own, tried
/// again while the answer is unsettled.
pub async fn watch(client: Client) -> LoggedOut {
    let mut changes = client.subscribe_to_session_changes();
    loop {
        let soft = match changes.recv().await {
            Ok(SessionChange::UnknownToken(data)) => Some(data.soft_logout),
            Ok(SessionChange::TokensRefreshed) => continue,
            Err(broadcast::error::RecvError::Lagged(_)) => None,
            Err(broadcast::error::RecvError::Closed) => return std::future::pending().await,
        };
        let mut delay = std::time::Duration::from_secs(1);
        loop {
            match client.whoami().await {
                Ok(_) => break,
                Err(e) => match access::judge(&Observed::of(&e)) {
                    Access::Out(out) => return access::settle(soft, out),
                    Access::Unsettled => {
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(std::time::Duration::from_secs(30));
                    }
                },
            }
        }
    }
}

/// Has every token pair the client rotates to written to `path` the moment it changes, before
/// it is used (matrix-sdk calls this inside its refresh, holding the refresh lock).
fn keep_rotations(
    client: &Client,
    path: PathBuf,
    origin: Option<String>,
) -> Result<(), SessionError> {
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
                saved::save(
                    &path,
                    &Saved {
                        session,
                        origin: origin.clone(),
                    },
                )?;
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
