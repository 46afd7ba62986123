//! The doctor's look at `chat_leases` (PostgreSQL only): how many chats' leases are held, by how
//! many agents, and whether any lease lies about its expiry. A lease left expired by an agent
//! that stopped is normal (the next agent to run its chat takes it over); one that expires
//! further ahead than an agent ever sets ([`crate::lease::TTL`]) keeps its chat waiting until
//! then (a clock moved, or something else wrote the table).

use std::time::Duration;

use super::{Finding, Level};
use crate::lease::TTL;

/// What `chat_leases` holds now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeasesSeen {
    /// The table is not there yet (the agent creates it at start).
    NoTable,
    /// Counted.
    Counts {
        /// Leases not expired.
        held: i64,
        /// Agents holding them.
        holders: i64,
        /// Leases expired and not given back.
        expired: i64,
        /// Leases expiring later than [`TTL`] from now (with a second's slack).
        too_far: i64,
    },
    /// It could not be read (the error, never the URL).
    Unreadable(String),
}

/// Counts the leases, within ten seconds.
pub async fn observe(db: &crate::db::Database) -> LeasesSeen {
    let asked = async {
        let client = db.get().await.map_err(|e| e.to_string())?;
        let row = client
            .query_one("SELECT to_regclass('chat_leases') IS NOT NULL", &[])
            .await
            .map_err(|e| crate::db::describe(&e))?;
        if !row.get::<_, bool>(0) {
            return Ok(LeasesSeen::NoTable);
        }
        let row = client
            .query_one(
                "SELECT count(*) FILTER (WHERE expires_at >= now()), \
                 count(DISTINCT holder) FILTER (WHERE expires_at >= now()), \
                 count(*) FILTER (WHERE expires_at < now()), \
                 count(*) FILTER (WHERE expires_at > now() + make_interval(secs => $1)) \
                 FROM chat_leases",
                &[&(TTL.as_secs_f64() + 1.0)],
            )
            .await
            .map_err(|e| crate::db::describe(&e))?;
        Ok(LeasesSeen::Counts {
            held: row.get(0),
            holders: row.get(1),
            expired: row.get(2),
            too_far: row.get(3),
        })
    };
    match tokio::time::timeout(Duration::from_secs(10), asked).await {
        Ok(Ok(seen)) => seen,
        Ok(Err(e)) => LeasesSeen::Unreadable(e),
        Err(_) => LeasesSeen::Unreadable("no answer within 10 s".to_owned()),
    }
}

/// The finding on what `chat_leases` holds.
pub fn check(seen: &LeasesSeen) -> Finding {
    const CHECK: &str = "leases";
    match seen {
        LeasesSeen::NoTable => Finding::new(
            Level::Ok,
            CHECK,
            "no lease table yet; the agent creates it at start",
        ),
        LeasesSeen::Unreadable(e) => {
            Finding::new(Level::Warn, CHECK, format!("cannot read chat_leases: {e}"))
        }
        LeasesSeen::Counts { too_far, .. } if *too_far > 0 => Finding::new(
            Level::Warn,
            CHECK,
            format!(
                "{too_far} lease(s) expire more than {} s from now, longer than any agent sets: \
                 their chats wait until then (a clock that moved, or another writer of \
                 chat_leases); deleting those rows frees them",
                TTL.as_secs()
            ),
        ),
        LeasesSeen::Counts {
            held,
            holders,
            expired,
            ..
        } => {
            let mut text = format!("{held} chat(s) running on {holders} agent(s)");
            if *expired > 0 {
                text.push_str(&format!(
                    "; {expired} lease(s) left by agents that stopped, taken over at their \
                     chats' next turn"
                ));
            }
            Finding::new(Level::Ok, CHECK, text)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(held: i64, holders: i64, expired: i64, too_far: i64) -> LeasesSeen {
        LeasesSeen::Counts {
            held,
            holders,
            expired,
            too_far,
        }
    }

    #[test]
    fn leases_are_counted_and_only_a_lease_from_the_future_is_a_warning() {
        let cases = [
            (LeasesSeen::NoTable, Level::Ok, "no lease table yet"),
            (
                counts(0, 0, 0, 0),
                Level::Ok,
                "0 chat(s) running on 0 agent(s)",
            ),
            (
                counts(3, 2, 0, 0),
                Level::Ok,
                "3 chat(s) running on 2 agent(s)",
            ),
            (
                counts(3, 2, 4, 0),
                Level::Ok,
                "4 lease(s) left by agents that stopped",
            ),
            (
                counts(3, 2, 0, 1),
                Level::Warn,
                "1 lease(s) expire more than 10 s",
            ),
            (
                LeasesSeen::Unreadable("42501: permission denied".into()),
                Level::Warn,
                "cannot read chat_leases: 42501",
            ),
        ];
        for (seen, level, says) in cases {
            let finding = check(&seen);
            assert_eq!(finding.level, level, "{seen:?}");
            assert!(finding.to_string().contains(says), "{finding}");
        }
    }

    /// On a real database: a lease of a dead agent, one of a live one, one from the future.
    #[tokio::test]
    async fn the_table_is_read_as_it_stands() {
        let Some(db) = crate::db::test_database().await else {
            return;
        };
        assert_eq!(observe(&db).await, counts(0, 0, 0, 0));
        let client = db.get().await.unwrap();
        client
            .batch_execute(
                "INSERT INTO chat_leases (chat_id, holder, token, expires_at) VALUES \
                 ('a', 'dead/1/0', 1, now() - interval '1 minute'), \
                 ('b', 'live/2/0', 1, now() + interval '5 seconds'), \
                 ('c', 'live/2/0', 1, now() + interval '1 hour')",
            )
            .await
            .unwrap();
        let seen = observe(&db).await;
        assert_eq!(seen, counts(2, 1, 1, 1));
        assert_eq!(check(&seen).level, Level::Warn);
    }
}
