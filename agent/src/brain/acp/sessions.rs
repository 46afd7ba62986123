//! Where the ACP brain keeps each chat's session id, so that the next turn (after a restart,
//! or on another agent) resumes the session: a file per chat in the state directory, or a row
//! in PostgreSQL (`acp_sessions`) when the agent's state is there.

use std::path::PathBuf;

use protocol::ChatId;
use sha2::{Digest, Sha256};

use crate::db::Database;

/// The session ids, by chat.
#[derive(Debug, Clone)]
pub enum SessionIds {
    /// `<state dir>/acp-sessions/<sha256 of the chat id>`.
    Files(PathBuf),
    /// Table `acp_sessions`.
    Postgres(Database),
}

impl SessionIds {
    /// The chat's session id, if one was stored.
    pub async fn get(&self, chat: &ChatId) -> Result<Option<String>, String> {
        match self {
            Self::Files(dir) => {
                let path = dir.join(file_name(chat));
                match tokio::fs::read_to_string(&path).await {
                    Ok(s) => Ok(Some(s.trim().to_owned()).filter(|s| !s.is_empty())),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(format!("{}: {e}", path.display())),
                }
            }
            Self::Postgres(db) => {
                let client = db.get().await.map_err(|e| e.to_string())?;
                let row = crate::db::query_opt(
                    &client,
                    "SELECT session_id FROM acp_sessions WHERE chat_id = $1",
                    &[&chat.as_str()],
                )
                .await
                .map_err(|e| crate::db::describe(&e))?;
                Ok(row.map(|r| r.get(0)))
            }
        }
    }

    /// Stores the chat's session id (replacing an earlier one).
    pub async fn put(&self, chat: &ChatId, session: &str) -> Result<(), String> {
        match self {
            Self::Files(dir) => {
                let (dir, name, session) = (dir.clone(), file_name(chat), session.to_owned());
                tokio::task::spawn_blocking(move || {
                    std::fs::create_dir_all(&dir)?;
                    let tmp = dir.join(format!(".{name}.tmp"));
                    std::fs::write(&tmp, session.as_bytes())?;
                    std::fs::File::open(&tmp)?.sync_all()?;
                    std::fs::rename(&tmp, dir.join(&name))
                })
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())
            }
            Self::Postgres(db) => {
                let client = db.get().await.map_err(|e| e.to_string())?;
                crate::db::execute(
                    &client,
                    "INSERT INTO acp_sessions (chat_id, session_id) VALUES ($1, $2) \
                     ON CONFLICT (chat_id) DO UPDATE SET session_id = EXCLUDED.session_id, \
                     updated_at = now()",
                    &[&chat.as_str(), &session],
                )
                .await
                .map_err(|e| crate::db::describe(&e))?;
                Ok(())
            }
        }
    }
}

fn file_name(chat: &ChatId) -> String {
    hex::encode(Sha256::digest(chat.as_str().as_bytes()))
}
