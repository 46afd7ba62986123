//! Admission of a user message, decided before anything is stored: new (store and run),
//! duplicate (acknowledge only) or refused (an implausible `seq`; tell the surface, store nothing).
//!
//! Identity is the message id. The `seq` only orders the surface's resends and feeds the
//! chat's `last_seq`, which the surface trusts ("the agent has every turn up to here"), so an
//! implausible one is refused rather than allowed to move `last_seq` somewhere no real
//! message will ever reach.

use tracing::warn;

/// Largest `seq` accepted at all: the largest integer every JSON reader keeps exact
/// (JavaScript's `Number.MAX_SAFE_INTEGER`), well inside the surface journal's signed 64-bit
/// column, and so far from `u64::MAX` that `last_seq + MAX_SEQ_AHEAD` cannot overflow.
pub const MAX_SEQ: u64 = (1 << 53) - 1;

/// Largest step above the last stored `seq` that is accepted. The surface numbers a chat's
/// turns 1, 2, 3, …, so the next one is normally `last_seq + 1`; a bigger step only happens
/// when the agent lost its record and the surface resends its unfinished turns, which are at
/// most as many ahead as the chat has turns. No conversation has a million turns.
pub const MAX_SEQ_AHEAD: u64 = 1_000_000;

/// What to do with a user message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// An id not stored yet with a plausible `seq`: store it durably, acknowledge it, run it.
    New,
    /// The id is already stored: acknowledge it again, do not run it twice (a finished
    /// turn's answer is replayed instead).
    Duplicate,
    /// Not stored, not acknowledged: the surface gets an `error`. The chat is untouched, so
    /// the next plausible message is admitted as usual.
    Refused(Refusal),
}

/// Why a message's `seq` is implausible.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// `seq` 0: the surface numbers from 1, and 0 is the `last_seq` of a chat with no turns.
    #[error("seq 0 is not a valid sequence number (they start at 1)")]
    Zero,
    /// Above [`MAX_SEQ`].
    #[error("seq {seq} is above the largest accepted sequence number {MAX_SEQ}")]
    TooLarge {
        /// The refused `seq`.
        seq: u64,
    },
    /// More than [`MAX_SEQ_AHEAD`] above the last stored `seq`.
    #[error(
        "seq {seq} is more than {MAX_SEQ_AHEAD} above the last stored sequence number {last_seq}"
    )]
    TooFarAhead {
        /// The refused `seq`.
        seq: u64,
        /// The chat's last stored `seq`.
        last_seq: u64,
    },
}

/// Decides the admission of a message with sequence number `seq`, given whether its id is
/// already stored and the chat's last stored `seq`.
///
/// A stored id is a duplicate whatever its `seq` (nothing would be stored anyway). A new id
/// is admitted whatever its `seq` relative to the stored ones (lower, equal, a gap), as long
/// as it is in `1..=MAX_SEQ` and at most `last_seq + MAX_SEQ_AHEAD`.
pub fn decide(id_stored: bool, seq: u64, last_seq: u64) -> Admission {
    if id_stored {
        return Admission::Duplicate;
    }
    let refusal = if seq == 0 {
        Refusal::Zero
    } else if seq > MAX_SEQ {
        Refusal::TooLarge { seq }
    } else if seq > last_seq.saturating_add(MAX_SEQ_AHEAD) {
        Refusal::TooFarAhead { seq, last_seq }
    } else {
        return Admission::New;
    };
    Admission::Refused(refusal)
}

/// The `last_seq` a record should report: the highest plausible stored `seq` (pure). Repairs a
/// record an older agent poisoned by storing an absurd `seq`, which would otherwise tell the
/// surface that every turn up to it is stored.
pub fn plausible_last_seq(stored: impl IntoIterator<Item = u64>) -> u64 {
    stored
        .into_iter()
        .filter(|seq| (1..=MAX_SEQ).contains(seq))
        .max()
        .unwrap_or(0)
}

/// Logs a new message whose `seq` is not the next one (admitted all the same: the id is what
/// identifies a message).
pub(crate) fn warn_out_of_line(seq: u64, last_seq: u64) {
    // `checked_add`: a record from an older agent may hold `last_seq == u64::MAX`.
    if last_seq.checked_add(1) != Some(seq) {
        warn!(
            seq,
            last_seq, "sequence number out of line (a gap, or reused)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decisions() {
        use Admission::{Duplicate, New, Refused};
        let ahead = |seq, last_seq| Refused(Refusal::TooFarAhead { seq, last_seq });
        let large = |seq| Refused(Refusal::TooLarge { seq });
        #[rustfmt::skip]
        let table = [
            // (id stored, seq, last_seq, decision)
            (false, 1, 0, New),                                   // first turn
            (false, 3, 2, New),                                   // next in line
            (false, 10, 2, New),                                  // a gap
            (false, 2, 2, New),                                   // new id, reused seq
            (false, 1, 5, New),                                   // new id, lower seq
            (false, MAX_SEQ_AHEAD, 0, New),                       // resend after lost state
            (false, 7 + MAX_SEQ_AHEAD, 7, New),                   // largest step
            (false, 8 + MAX_SEQ_AHEAD, 7, ahead(8 + MAX_SEQ_AHEAD, 7)),
            (false, MAX_SEQ_AHEAD + 1, 0, ahead(MAX_SEQ_AHEAD + 1, 0)),
            (false, MAX_SEQ, MAX_SEQ - 1, New),                   // largest seq
            (false, MAX_SEQ + 1, MAX_SEQ, large(MAX_SEQ + 1)),
            (false, u64::MAX, 0, large(u64::MAX)),
            (false, u64::MAX, u64::MAX, large(u64::MAX)),         // record from an older agent
            (false, u64::MAX - 1, 3, large(u64::MAX - 1)),
            (false, 0, 0, Refused(Refusal::Zero)),
            (false, 0, 4, Refused(Refusal::Zero)),
            (true, 1, 1, Duplicate),                              // plain resend
            (true, 1, 9, Duplicate),                              // resend of an older turn
            (true, 4, 1, Duplicate),                              // same id, other seq
            (true, u64::MAX, 1, Duplicate),                       // nothing would be stored
            (true, 0, 1, Duplicate),
        ];
        for (id_stored, seq, last_seq, expected) in table {
            assert_eq!(
                decide(id_stored, seq, last_seq),
                expected,
                "id_stored={id_stored} seq={seq} last_seq={last_seq}"
            );
        }
    }

    #[test]
    fn last_seq_ignores_absurd_stored_seqs() {
        let table: [(&[u64], u64); 5] = [
            (&[], 0),
            (&[1, 2, 3], 3),
            (&[3, 1], 3),
            (&[1, u64::MAX], 1),
            (&[u64::MAX, MAX_SEQ + 1], 0),
        ];
        for (stored, expected) in table {
            assert_eq!(
                plausible_last_seq(stored.iter().copied()),
                expected,
                "{stored:?}"
            );
        }
    }

    #[test]
    fn refusals_name_the_seq() {
        let msg = Refusal::TooFarAhead {
            seq: 2_000_000,
            last_seq: 3,
        }
        .to_string();
        assert!(msg.contains("2000000") && msg.contains(" 3"), "{msg}");
        let msg = Refusal::TooLarge { seq: u64::MAX }.to_string();
        assert!(msg.contains(&u64::MAX.to_string()), "{msg}");
    }
}
