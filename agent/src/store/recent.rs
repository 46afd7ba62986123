//! The last turns of a chat, kept in memory while this agent runs the chat's turns one after the
//! other, so that beginning the next turn reads its own row instead of the history before it
//! (PostgreSQL; issue 38's throughput).
//!
//! Why this is safe: a turn that has ended is never run or changed again (only a pending turn
//! is begun, ended or perceived), so the turns held here stay true whoever runs the chat later.
//! What another agent or connection may do meanwhile is admit turns after them, or end a
//! pending one: either shows as a turn number that does not follow the last turn held, and the
//! history is then read from the database as before. Only ended turns are held, and at most
//! [`RECENT_TURNS`] of them; the chat's worker drops them when it stops running the chat's turns
//! ([`super::ChatRecord::idle`]), so memory is bounded by the chats running turns right now.

use std::collections::{BTreeMap, VecDeque};

use protocol::WorkspacePath;

use super::{Perceived, RECENT_TURNS, TurnEnd, TurnRecord, TurnStatus};

/// A chat's last ended turns, and the turn being run after them.
#[derive(Debug, Default)]
pub(super) struct Recent {
    /// The turns before the one being run: `(number of the last one, the last ≤ RECENT_TURNS
    /// of them)`, all ended; `None` when not known.
    window: Option<(i64, VecDeque<TurnRecord>)>,
    /// The turn being run: its number and record as begun (with what was perceived since).
    running: Option<(i64, Box<TurnRecord>)>,
}

impl Recent {
    /// The number of the last turn held, which the database is told so that it leaves out the
    /// history when the next turn follows it (-1: nothing held).
    pub fn last(&self) -> i64 {
        self.window.as_ref().map_or(-1, |(last, _)| *last)
    }

    /// The turns before turn `n`, if they are held.
    pub fn before(&self, n: i64) -> Option<Vec<TurnRecord>> {
        let (last, turns) = self.window.as_ref()?;
        (*last == n - 1).then(|| turns.iter().cloned().collect())
    }

    /// Turn `n` (`turn`) begins, after the turns held ([`Self::before`]) or after `read`, the
    /// last ≤ [`RECENT_TURNS`] turns before it as read from the database: held from now on when
    /// they have all ended.
    pub fn begin(&mut self, n: i64, turn: &TurnRecord, read: Option<&[TurnRecord]>) {
        if let Some(read) = read {
            let all_ended = read.iter().all(|t| t.status != TurnStatus::Pending);
            self.window = all_ended.then(|| (n - 1, read.iter().cloned().collect()));
        }
        self.running = Some((n, Box::new(turn.clone())));
    }

    /// What was perceived of the running turn `id`'s attachments.
    pub fn perceived(&mut self, id: &str, perceived: &BTreeMap<WorkspacePath, Perceived>) {
        if let Some((_, turn)) = self.running.as_mut().filter(|(_, t)| t.id == id) {
            turn.perceived = perceived.clone();
        }
    }

    /// Turn `end.id` ended as `end` says (stored already). The running turn joins the window
    /// when it has ended; anything else that ends makes what is held doubtful, and it is dropped.
    pub fn ended(&mut self, end: &TurnEnd) {
        let Some((n, mut turn)) = self.running.take().filter(|(_, t)| t.id == end.id) else {
            *self = Self::default();
            return;
        };
        if end.status == TurnStatus::Pending {
            *self = Self::default();
            return;
        }
        let mut end = end.clone();
        if end.perceived.is_empty() {
            end.perceived = std::mem::take(&mut turn.perceived);
        }
        turn.apply(end);
        match self.window.as_mut() {
            Some((last, turns)) if *last == n - 1 => {
                turns.push_back(*turn);
                while turns.len() > RECENT_TURNS {
                    turns.pop_front();
                }
                *last = n;
            }
            _ => self.window = None,
        }
    }

    /// Forgets everything (the chat's turns stopped running here).
    pub fn clear(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::suite::{end, message};

    fn turn(seq: u64, status: TurnStatus) -> TurnRecord {
        let mut t = TurnRecord::from_message(&message(seq, &format!("${seq}")));
        t.status = status;
        t
    }

    fn ids(turns: &[TurnRecord]) -> Vec<u64> {
        turns.iter().map(|t| t.seq).collect()
    }

    /// Runs turns 1..=n of a chat one after the other, the first one begun from a full read.
    fn run(n: u64) -> Recent {
        let mut r = Recent::default();
        for seq in 1..=n {
            let read = r.before(seq as i64).is_none().then_some(&[][..]);
            r.begin(seq as i64, &turn(seq, TurnStatus::Pending), read);
            r.ended(&end(&format!("${seq}"), &format!("answer {seq}")));
        }
        r
    }

    #[test]
    fn what_is_held_and_when() {
        struct Case {
            what: &'static str,
            setup: fn() -> Recent,
            asked: i64,
            held: Option<Vec<u64>>,
        }
        let cases = [
            Case {
                what: "nothing held at first",
                setup: Recent::default,
                asked: 1,
                held: None,
            },
            Case {
                what: "turns run one after the other",
                setup: || run(3),
                asked: 4,
                held: Some(vec![1, 2, 3]),
            },
            Case {
                what: "a turn admitted elsewhere in between",
                setup: || run(3),
                asked: 5,
                held: None,
            },
            Case {
                what: "at most RECENT_TURNS",
                setup: || run(RECENT_TURNS as u64 + 5),
                asked: RECENT_TURNS as i64 + 6,
                held: Some((6..=RECENT_TURNS as u64 + 5).collect()),
            },
            Case {
                what: "a pending turn before: not held",
                setup: || {
                    let mut r = Recent::default();
                    let before = [turn(1, TurnStatus::Completed), turn(2, TurnStatus::Pending)];
                    r.begin(3, &turn(3, TurnStatus::Pending), Some(&before));
                    r.ended(&end("$3", "x"));
                    r
                },
                asked: 4,
                held: None,
            },
            Case {
                what: "the running turn stays pending (cut off): dropped",
                setup: || {
                    let mut r = run(2);
                    r.begin(3, &turn(3, TurnStatus::Pending), None);
                    let mut e = end("$3", "");
                    e.status = TurnStatus::Pending;
                    r.ended(&e);
                    r
                },
                asked: 3,
                held: None,
            },
            Case {
                what: "another turn ended (a queued one cancelled): dropped",
                setup: || {
                    let mut r = run(2);
                    let mut e = end("$7", "");
                    e.status = TurnStatus::Cancelled;
                    r.ended(&e);
                    r
                },
                asked: 3,
                held: None,
            },
            Case {
                what: "cleared when the chat goes idle",
                setup: || {
                    let mut r = run(2);
                    r.clear();
                    r
                },
                asked: 3,
                held: None,
            },
        ];
        for c in cases {
            let r = (c.setup)();
            assert_eq!(r.before(c.asked).map(|t| ids(&t)), c.held, "{}", c.what);
        }
    }

    #[test]
    fn a_held_turn_is_as_it_ended_with_what_was_perceived() {
        let mut r = Recent::default();
        r.begin(1, &turn(1, TurnStatus::Pending), Some(&[]));
        let heard = BTreeMap::from([(
            WorkspacePath::new("chats/c1/a").unwrap(),
            Perceived::Heard { text: "hi".into() },
        )]);
        r.perceived("$1", &heard);
        r.ended(&end("$1", "answer"));
        let held = r.before(2).unwrap();
        assert_eq!(held[0].status, TurnStatus::Completed);
        assert_eq!(held[0].output, "answer");
        assert_eq!(held[0].perceived, heard);
        assert_eq!(r.last(), 1);
    }
}
