//! The pure rules for where walking back through a room's history stops: which past events
//! (read as [`Inbound`]) are still work.

use matrix_sdk::ruma::UserId;

use crate::inbound::Inbound;

/// Where walking back through a room's history stops (the landmark itself is not work).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Landmark {
    /// Already journaled: everything newer is what was missed.
    Journaled,
    /// The bot joining a room it knew before (it left and came back).
    Rejoin,
    /// First sight: the bot's invite. Element sends a new DM's first message before the
    /// invited bot joins, and people write while the bot is down: all of it is work.
    Invite,
    /// First sight: something the bot posted. An earlier state directory served the room up
    /// to here (the state volume was lost or replaced).
    OwnPost,
}

/// Whether `e` is where the walk back stops (pure). `room_known`: the journal has seen the
/// room before; `journaled`: `e` is in the journal.
pub fn landmark(e: &Inbound, own: &UserId, room_known: bool, journaled: bool) -> Option<Landmark> {
    if journaled {
        Some(Landmark::Journaled)
    } else if room_known {
        e.is_join_of(own).then_some(Landmark::Rejoin)
    } else if e.is_invite_of(own) {
        Some(Landmark::Invite)
    } else if e.sender == own && !e.is_membership() {
        Some(Landmark::OwnPost)
    } else {
        None
    }
}

/// A room's first sight when the walk back found no landmark (the history ran out or was too
/// long): the events after the bot's own join count, or, when the join is out of reach too,
/// those newer than this process. Returns how many of `events` (oldest first) to drop (pure).
pub fn unanchored_first_sight(events: &[Inbound], own: &UserId, started_ms: u64) -> usize {
    match events.iter().rposition(|e| e.is_join_of(own)) {
        Some(join) => join + 1,
        None => events
            .iter()
            .position(|e| e.origin_ts >= started_ms)
            .unwrap_or(events.len()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::inbound::samples::{member, raw};

    fn message(id: &str, sender: &str, ts: u64) -> Inbound {
        raw(json!({
            "event_id": id, "sender": sender, "origin_server_ts": ts, "type": "m.room.message",
            "content": {"msgtype": "m.text", "body": "hi"}
        }))
    }

    #[test]
    fn landmarks() {
        let own = matrix_sdk::ruma::user_id!("@bot:hs");
        let invite = member("$i", "@alice:hs", own.as_str(), "invite", "leave");
        let join = member("$j", own.as_str(), own.as_str(), "join", "invite");
        let other_join = member("$o", "@alice:hs", "@alice:hs", "join", "invite");
        let post = message("$p", own.as_str(), 5);
        let user_msg = message("$m", "@alice:hs", 5);
        let table: &[(&str, &Inbound, bool, bool, Option<Landmark>)] = &[
            (
                "journaled",
                &user_msg,
                true,
                true,
                Some(Landmark::Journaled),
            ),
            (
                "journaled first sight",
                &user_msg,
                false,
                true,
                Some(Landmark::Journaled),
            ),
            ("message", &user_msg, true, false, None),
            (
                "rejoin of a known room",
                &join,
                true,
                false,
                Some(Landmark::Rejoin),
            ),
            ("first sight walks past the join", &join, false, false, None),
            (
                "first sight stops at the invite",
                &invite,
                false,
                false,
                Some(Landmark::Invite),
            ),
            ("invite in a known room", &invite, true, false, None),
            (
                "first sight stops at own post",
                &post,
                false,
                false,
                Some(Landmark::OwnPost),
            ),
            ("someone else joining", &other_join, false, false, None),
        ];
        for (name, e, known, journaled, expected) in table {
            assert_eq!(landmark(e, own, *known, *journaled), *expected, "{name}");
        }
    }

    #[test]
    fn first_sight_without_a_landmark() {
        let own = matrix_sdk::ruma::user_id!("@bot:hs");
        let join = member("$j", own.as_str(), own.as_str(), "join", "invite");
        let early = message("$a", "@alice:hs", 10);
        let late = message("$b", "@alice:hs", 30);
        let table: Vec<(&str, Vec<Inbound>, u64, usize)> = vec![
            ("nothing", vec![], 20, 0),
            (
                "after the join",
                vec![early.clone(), join.clone(), late.clone()],
                99,
                2,
            ),
            ("join last", vec![early.clone(), join.clone()], 0, 2),
            (
                "no join: newer than the process",
                vec![early.clone(), late.clone()],
                20,
                1,
            ),
            ("no join, all old", vec![early.clone(), late.clone()], 99, 2),
        ];
        for (name, events, started, drop) in table {
            assert_eq!(
                unanchored_first_sight(&events, own, started),
                drop,
                "{name}"
            );
        }
    }
}
