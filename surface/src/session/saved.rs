//! The persisted session: matrix-sdk's `MatrixSession` (JSON, atomic write, mode 0600) plus
//! where it came from, and which session a start uses (pure, table-tested).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use matrix_sdk::authentication::matrix::MatrixSession;
use matrix_sdk::ruma::UserId;
use matrix_sdk::{SessionMeta, SessionTokens};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::SessionError;
use crate::config::GivenToken;

/// What `session.json` holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Saved {
    /// The session matrix-sdk restores.
    #[serde(flatten)]
    pub session: MatrixSession,
    /// [`origin`] of the operator-given access token this session descends from (by refreshes
    /// and logins again), if it does. A different token configured later wins over the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
}

/// A digest naming an operator-given access token without holding it.
pub fn origin(given: &GivenToken) -> String {
    let mut h = Sha256::new();
    h.update(b"mxbridge session origin\0");
    h.update(given.access_token.expose().as_bytes());
    hex::encode(h.finalize())
}

/// Which session a start uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// The saved one (rotated since, or logged in with the password).
    Saved,
    /// The operator-given token (new, or the file descends from another one).
    Given,
    /// Neither: log in with the password.
    Password,
}

/// Picks the session to start with (pure). A given token whose refresh token the surface
/// already spent must not be used again, so the file wins while it descends from the very
/// token configured; a token the operator changed wins over the file.
pub fn choose(given: Option<&GivenToken>, saved: Option<&Saved>) -> Choice {
    match (given, saved) {
        (Some(g), Some(s))
            if s.origin.as_deref() == Some(origin(g).as_str())
                && s.session.meta.device_id == g.device_id =>
        {
            Choice::Saved
        }
        (Some(_), _) => Choice::Given,
        (None, Some(_)) => Choice::Saved,
        (None, None) => Choice::Password,
    }
}

/// The session a start uses (pure): the saved one, or one made of the given token (its origin
/// recorded); `None` when the password must log in first.
pub fn pick(user_id: &UserId, given: Option<&GivenToken>, saved: Option<Saved>) -> Option<Saved> {
    match (choose(given, saved.as_ref()), saved, given) {
        (Choice::Saved, Some(s), _) => Some(s),
        (Choice::Given | Choice::Saved, _, Some(g)) => Some(Saved {
            session: MatrixSession {
                meta: SessionMeta {
                    user_id: user_id.to_owned(),
                    device_id: g.device_id.clone(),
                },
                tokens: SessionTokens {
                    access_token: g.access_token.expose().to_owned(),
                    refresh_token: g.refresh_token.as_ref().map(|r| r.expose().to_owned()),
                },
            },
            origin: Some(origin(g)),
        }),
        _ => None,
    }
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

/// Writes `saved` to `path` atomically (temp file + fsync + rename), readable only by us.
pub fn save(path: &Path, saved: &Saved) -> Result<(), SessionError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(".session.json.tmp");
    let json = serde_json::to_vec_pretty(saved).map_err(|source| SessionError::Corrupt {
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

/// Reads the persisted session, if any (a file from before origins were kept has none).
pub fn load(path: &Path) -> Result<Option<Saved>, SessionError> {
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

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use matrix_sdk::ruma::{device_id, user_id};
    use protocol::Secret;

    use super::*;

    fn session(device: &str, token: &str) -> MatrixSession {
        MatrixSession {
            meta: SessionMeta {
                user_id: user_id!("@bot:hs").to_owned(),
                device_id: device.into(),
            },
            tokens: SessionTokens {
                access_token: token.into(),
                refresh_token: Some(format!("{token}-refresh")),
            },
        }
    }

    fn given(token: &str, device: &str) -> GivenToken {
        GivenToken {
            access_token: Secret::new(token.to_owned()),
            refresh_token: None,
            device_id: device.into(),
        }
    }

    #[test]
    fn roundtrip_is_private_atomic_and_reads_old_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = session_path(dir.path());
        assert!(load(&path).unwrap().is_none());
        let s = Saved {
            session: session("DEV", "tok"),
            origin: Some("abc".into()),
        };
        save(&path, &s).unwrap();
        save(&path, &s).unwrap();
        let back = load(&path).unwrap().unwrap();
        assert_eq!(back.session.meta, s.session.meta);
        assert_eq!(back.session.tokens.access_token, "tok");
        assert_eq!(back.origin.as_deref(), Some("abc"));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(!format!("{back:?}").contains("tok\""));
        // A file written by an earlier version: matrix-sdk's session alone.
        std::fs::write(&path, serde_json::to_vec(&session("DEV", "old")).unwrap()).unwrap();
        let old = load(&path).unwrap().unwrap();
        assert_eq!(old.origin, None);
        assert_eq!(old.session.tokens.access_token, "old");
        std::fs::write(&path, "{").unwrap();
        assert!(matches!(load(&path), Err(SessionError::Corrupt { .. })));
        let _ = device_id!("DEV");
    }

    #[test]
    fn the_start_picks_the_descendant_of_the_configured_token() {
        let a = given("token-a", "DEV");
        let from = |g: &GivenToken, device: &str| Saved {
            session: session(device, "rotated"),
            origin: Some(origin(g)),
        };
        let password_login = Saved {
            session: session("DEV", "pw"),
            origin: None,
        };
        let table = [
            (None, None, Choice::Password),
            (None, Some(password_login.clone()), Choice::Saved),
            (Some(a.clone()), None, Choice::Given),
            // Rotated from the configured token: its refresh token is spent, the file wins.
            (Some(a.clone()), Some(from(&a, "DEV")), Choice::Saved),
            // The operator configured another token since.
            (
                Some(given("token-b", "DEV")),
                Some(from(&a, "DEV")),
                Choice::Given,
            ),
            // Same token text for another device: not the same session.
            (
                Some(given("token-a", "OTHER")),
                Some(from(&a, "DEV")),
                Choice::Given,
            ),
            // A token configured over a password login's file.
            (Some(a.clone()), Some(password_login), Choice::Given),
        ];
        for (i, (g, s, expected)) in table.into_iter().enumerate() {
            assert_eq!(choose(g.as_ref(), s.as_ref()), expected, "row {i}");
        }
        assert_ne!(origin(&a), origin(&given("token-b", "DEV")));
        // The session picked: the given token's, with its origin; the saved one; none.
        let bot = user_id!("@bot:hs");
        let made = pick(bot, Some(&a), None).unwrap();
        assert_eq!(made.session.tokens.access_token, "token-a");
        assert_eq!(made.origin, Some(origin(&a)));
        let kept = pick(bot, Some(&a), Some(from(&a, "DEV"))).unwrap();
        assert_eq!(kept.session.tokens.access_token, "rotated");
        assert!(pick(bot, None, None).is_none());
        assert!(!origin(&a).contains("token-a"));
    }
}
