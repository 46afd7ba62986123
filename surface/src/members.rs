//! Senders' display names, remembered per room between syncs. Looking one up in matrix-sdk's
//! state store costs several SQLite reads, each a hop to a blocking thread, on the way of every
//! message to the agent (a quarter of the surface's own time until its journal's commit, in the
//! benchmark: p50 1.6 ms before this cache, 1.2 ms with it); the same few people write in a room
//! again and again. A room's names are forgotten whenever a sync
//! brings it any membership change (a new name comes as an `m.room.member` event), so a name is
//! never older than the SDK's own.

use std::collections::HashMap;
use std::sync::Mutex;

use matrix_sdk::Room;
use matrix_sdk::ruma::UserId;

/// Names kept at most; past that, all are forgotten (they come back one lookup each).
const MAX_NAMES: usize = 4096;

/// The cache: (room id, user id) → display name (`None`: the member has none, or is unknown).
#[derive(Debug, Default)]
pub struct MemberNames {
    names: Mutex<HashMap<(String, String), Option<String>>>,
}

impl MemberNames {
    /// The display name of `user` in `room`, from the cache or the SDK's store. A failed lookup
    /// is not remembered.
    pub async fn display_name(&self, room: &Room, user: &UserId) -> Option<String> {
        let key = (room.room_id().to_string(), user.to_string());
        if let Some(known) = self.lock().get(&key) {
            return known.clone();
        }
        let name = match room.get_member_no_sync(user).await {
            Ok(Some(m)) => m.display_name().map(str::to_owned),
            Ok(None) => None,
            Err(e) => {
                tracing::debug!(room_id = %key.0, user_id = %key.1, error = %e, "member lookup failed");
                return None;
            }
        };
        tracing::debug!(room_id = %key.0, user_id = %key.1, name = ?name, "member name looked up");
        let mut names = self.lock();
        if names.len() >= MAX_NAMES {
            names.clear();
        }
        names.insert(key, name.clone());
        name
    }

    /// Forgets every name of `room_id` (its membership changed).
    pub fn forget_room(&self, room_id: &str) {
        tracing::debug!(room_id = %room_id, "member names forgotten");
        self.lock().retain(|(room, _), _| room != room_id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Option<String>>> {
        self.names.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whether a sync's update of a room may change its members' names: a membership event among
/// its state or timeline events (by their `type`).
pub fn membership_changed<S: AsRef<str>>(types: impl IntoIterator<Item = Option<S>>) -> bool {
    // An event whose type cannot be read counts as a change: forgetting costs one lookup.
    types
        .into_iter()
        .any(|t| t.is_none_or(|t| t.as_ref() == "m.room.member"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_membership_events_change_names() {
        let cases: &[(&[Option<&str>], bool)] = &[
            (&[], false),
            (&[Some("m.room.message")], false),
            (&[Some("m.room.message"), Some("m.room.encrypted")], false),
            (&[Some("m.room.message"), Some("m.room.member")], true),
            (&[Some("m.room.name")], false),
            (&[None], true),
        ];
        for (types, want) in cases {
            assert_eq!(
                membership_changed(types.iter().copied()),
                *want,
                "{types:?}"
            );
        }
    }

    #[test]
    fn a_room_is_forgotten_alone() {
        let names = MemberNames::default();
        names
            .lock()
            .insert(("!a:hs".into(), "@u:hs".into()), Some("U".into()));
        names.lock().insert(("!b:hs".into(), "@u:hs".into()), None);
        names.forget_room("!a:hs");
        let left: Vec<_> = names.lock().keys().cloned().collect();
        assert_eq!(left, vec![("!b:hs".to_owned(), "@u:hs".to_owned())]);
    }
}
