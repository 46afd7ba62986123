//! One turn at a time per chat across every agent of a deployment: before a turn runs, its agent
//! takes the chat's lease in the database and renews it while the turn runs. An agent that dies
//! stops renewing; another may take the lease once it expires ([`TTL`]), so a chat whose agent
//! was killed runs again elsewhere within `TTL` plus one [`POLL`] of the surface reconnecting.
//!
//! Each new holder gets a higher `token` (a fencing token); a renewal names it, so an agent that
//! was paused past the expiry finds its lease gone, stops the turn (it stays pending) and never
//! overwrites the new holder's. Without a database one process owns the state directory and the
//! chat's lane (`Chat::lane`) is the whole story: every lease is granted at once.

use std::time::Duration;

use protocol::ChatId;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, warn};

use crate::db::{Database, describe};

/// How long a lease lasts without renewal: the bound on a killed agent's chats waiting.
pub const TTL: Duration = Duration::from_secs(10);

/// How often a held lease is renewed (three tries before it could expire).
pub const RENEW_EVERY: Duration = Duration::from_secs(3);

/// How often a lease held by another agent is asked for again.
pub const POLL: Duration = Duration::from_millis(500);

/// Grants chats' leases to this process. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Leases {
    db: Option<Database>,
    holder: String,
}

/// A lease just taken.
struct Taken {
    /// Its fencing token.
    token: i64,
    /// Who held it before, if anyone (this process, when it renews its own).
    from: Option<String>,
}

/// A chat's lease, held until dropped (then given back).
#[derive(Debug)]
pub struct Held {
    lost: CancellationToken,
    renewal: Option<JoinHandle<()>>,
}

impl Held {
    /// Fires if the lease was lost (another agent holds it now, or it could not be renewed in
    /// time): the turn must stop.
    pub fn lost(&self) -> &CancellationToken {
        &self.lost
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(renewal) = self.renewal.take() {
            // The renewal task gives the lease back when it sees `lost` fire.
            self.lost.cancel();
            drop(renewal);
        }
    }
}

impl Leases {
    /// Leases in `db`; `None`: a single agent, every lease granted at once.
    pub fn new(db: Option<Database>) -> Self {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "agent".to_owned());
        let holder = format!(
            "{host}/{}/{:08x}",
            std::process::id(),
            rand::random::<u32>()
        );
        Self { db, holder }
    }

    /// This process's name in `chat_leases.holder`.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Waits until this process holds `chat`'s lease, to run turn `turn`; `None` if `cancel`
    /// fires first. Taking it over from an agent that stopped renewing it is logged with both.
    pub async fn acquire(
        &self,
        chat: &ChatId,
        turn: &str,
        cancel: &CancellationToken,
    ) -> Option<Held> {
        let Some(db) = &self.db else {
            return Some(Held {
                lost: CancellationToken::new(),
                renewal: None,
            });
        };
        let (mut waited, mut failing) = (false, false);
        let token = loop {
            match self.try_take(db, chat).await {
                Ok(Some(Taken { token, from })) => {
                    if let Some(from) = from.filter(|h| *h != self.holder) {
                        crate::metrics::lease_takeover();
                        warn!(chat_id = %chat, turn_id = turn, previous_holder = %from, token, "took the chat's lease over from an agent that stopped renewing it; its unfinished turns run here");
                    }
                    break token;
                }
                Ok(None) if !waited => {
                    info!(chat_id = %chat, "another agent holds the chat's lease; waiting for it");
                    waited = true;
                }
                Ok(None) => {}
                // Once per outage, not every poll (a database restart lasts seconds).
                Err(e) if !failing => {
                    warn!(chat_id = %chat, error = %e, "cannot take the chat's lease; trying again");
                    failing = true;
                }
                Err(e) => {
                    tracing::debug!(chat_id = %chat, error = %e, "still cannot take the chat's lease")
                }
            }
            tokio::select! {
                _ = cancel.cancelled() => return None,
                _ = tokio::time::sleep(POLL) => {}
            }
        };
        if waited {
            info!(chat_id = %chat, token, "took the chat's lease");
        }
        let lost = CancellationToken::new();
        let renewal = tokio::spawn(
            renew(
                db.clone(),
                chat.to_string(),
                self.holder.clone(),
                token,
                lost.clone(),
            )
            .in_current_span(),
        );
        Some(Held {
            lost,
            renewal: Some(renewal),
        })
    }

    /// Takes the lease if it is free, expired or already this process's: its new token, and
    /// who held it before (one statement: the `prior` row is read in the same snapshot).
    async fn try_take(&self, db: &Database, chat: &ChatId) -> Result<Option<Taken>, String> {
        let client = db.get_relaxed().await.map_err(|e| e.to_string())?;
        let row = crate::db::query_opt(
            &client,
            "WITH prior AS (SELECT holder FROM chat_leases WHERE chat_id = $1) \
                 INSERT INTO chat_leases AS l (chat_id, holder, token, expires_at) \
                 VALUES ($1, $2, 1, now() + make_interval(secs => $3)) \
                 ON CONFLICT (chat_id) DO UPDATE SET holder = EXCLUDED.holder, \
                 token = l.token + 1, expires_at = EXCLUDED.expires_at \
                 WHERE l.expires_at < now() OR l.holder = EXCLUDED.holder \
                 RETURNING token, (SELECT holder FROM prior) AS prior_holder",
            &[&chat.as_str(), &self.holder, &TTL.as_secs_f64()],
        )
        .await
        .map_err(|e| describe(&e))?;
        row.map(|r| {
            Ok(Taken {
                token: r.try_get(0).map_err(|e| describe(&e))?,
                from: r.try_get(1).map_err(|e| describe(&e))?,
            })
        })
        .transpose()
    }
}

/// Renews the lease every [`RENEW_EVERY`] until `lost` fires (the turn ended, or the lease was
/// lost), then gives it back. Fires `lost` when the lease is another's or will expire unrenewed.
async fn renew(db: Database, chat: String, holder: String, token: i64, lost: CancellationToken) {
    let mut renewed = tokio::time::Instant::now();
    loop {
        tokio::select! {
            _ = lost.cancelled() => break,
            _ = tokio::time::sleep(RENEW_EVERY) => {}
        }
        let result = match db.get_relaxed().await {
            Ok(client) => crate::db::execute(
                &client,
                "UPDATE chat_leases SET expires_at = now() + make_interval(secs => $4) \
                     WHERE chat_id = $1 AND holder = $2 AND token = $3",
                &[&chat, &holder, &token, &TTL.as_secs_f64()],
            )
            .await
            .map_err(|e| describe(&e)),
            Err(e) => Err(e.to_string()),
        };
        match result {
            Ok(1) => renewed = tokio::time::Instant::now(),
            Ok(_) => {
                warn!(chat_id = %chat, token, "the chat's lease was taken over; stopping its turn");
                lost.cancel();
                return;
            }
            Err(e) if renewed.elapsed() + RENEW_EVERY >= TTL => {
                warn!(chat_id = %chat, error = %e, "cannot renew the chat's lease before it expires; stopping its turn");
                lost.cancel();
                return;
            }
            Err(e) => {
                warn!(chat_id = %chat, error = %e, "cannot renew the chat's lease; trying again")
            }
        }
    }
    give_back(&db, &chat, &holder, token).await;
}

/// Gives the lease back so the next turn, here or elsewhere, need not wait for it to expire.
async fn give_back(db: &Database, chat: &str, holder: &str, token: i64) {
    let result = match db.get_relaxed().await {
        Ok(client) => crate::db::execute(
            &client,
            "DELETE FROM chat_leases WHERE chat_id = $1 AND holder = $2 AND token = $3",
            &[&chat, &holder, &token],
        )
        .await
        .map(|_| ())
        .map_err(|e| describe(&e)),
        Err(e) => Err(e.to_string()),
    };
    if let Err(e) = result {
        // It expires on its own.
        warn!(chat_id = %chat, error = %e, "cannot give the chat's lease back");
    }
}
