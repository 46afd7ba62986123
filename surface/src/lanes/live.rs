//! An answer shown while the agent is still writing it: one message, posted once the answer
//! has been streaming for a while and then edited at a bounded rate (never faster than the
//! configured interval, slower when the homeserver asks), and finally edited to exactly the
//! answer. Quick answers are never edited: they are posted once, complete. A long answer is
//! edited ever more slowly (the pace grows with its length) and at most [`MAX_EDITS`] times:
//! past that it goes on without edits and is shown whole by the final edit, so no message
//! collects the thousand edits that stop a room loading in clients. Pure: [`next`] decides,
//! the lane executes (`lanes::effects`). While it is written, the message and its edits carry
//! the live marker of MSC4357 ([`Marked`]); the final edit does not, so clients that know the
//! proposal show it as live and notify once.

use matrix_sdk::ruma::events::room::message::RoomMessageEventContent;
use matrix_sdk::ruma::events::{MessageLikeEventContent, MessageLikeEventType};
use serde::{Serialize, Serializer};
use tokio::time::{Duration, Instant};

/// MSC4357's unstable key: in a message's content (and in the `m.new_content` of an edit of
/// it) while the message is still being written.
pub const LIVE_MARKER: &str = "org.matrix.msc4357.live";

/// A message, or an edit of one, marked as still being written ([`LIVE_MARKER`], an empty
/// object, at the top and in `m.new_content`).
#[derive(Debug, Clone)]
pub struct Marked(pub RoomMessageEventContent);

impl Serialize for Marked {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut v = serde_json::to_value(&self.0).map_err(serde::ser::Error::custom)?;
        if let Some(content) = v.as_object_mut() {
            if let Some(new) = content
                .get_mut("m.new_content")
                .and_then(serde_json::Value::as_object_mut)
            {
                new.insert(LIVE_MARKER.into(), serde_json::json!({}));
            }
            content.insert(LIVE_MARKER.into(), serde_json::json!({}));
        }
        v.serialize(s)
    }
}

impl MessageLikeEventContent for Marked {
    fn event_type(&self) -> MessageLikeEventType {
        MessageLikeEventType::RoomMessage
    }
}

/// Where the shown answer stands for the current block of text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Live {
    /// When the block's first text arrived.
    pub started: Option<Instant>,
    /// The message showing it, once posted.
    pub event_id: Option<String>,
    /// Characters of the answer the message shows.
    pub shown_chars: usize,
    /// Not before this may the message change again.
    pub not_before: Option<Instant>,
    /// Edits made to the message while the answer was written (the final edit not counted).
    pub edits: u32,
}

/// At most this many edits while an answer is written (a room with messages of ~1,000 edits
/// stops loading in clients; the final edit, to exactly the answer, always comes).
pub const MAX_EDITS: u32 = 50;

/// Every this many characters of answer add one more interval between edits.
const PACE_CHARS: usize = 4_000;

/// The wait between edits for an answer `chars` long: `interval` up to [`PACE_CHARS`], then one
/// `interval` more for each further [`PACE_CHARS`] (pure).
pub fn pace(interval: Duration, chars: usize) -> Duration {
    let steps = u32::try_from(1 + chars / PACE_CHARS).unwrap_or(u32::MAX);
    interval.saturating_mul(steps)
}

/// What to do about the shown answer now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LiveStep {
    /// Nothing (too early, nothing new, or streaming is off).
    Wait,
    /// Post the answer so far as a new message.
    Post,
    /// Edit the message to the answer so far.
    Edit,
}

/// The marker after an answer that is still being written.
pub const WRITING: &str = " …";

/// What to do when the answer so far is `chars` characters long at `now`; `interval` is the
/// configured pace (`None`: streaming off).
pub fn next(live: &Live, now: Instant, chars: usize, interval: Option<Duration>) -> LiveStep {
    let Some(interval) = interval else {
        return LiveStep::Wait;
    };
    if chars == 0 || live.not_before.is_some_and(|t| now < t) {
        return LiveStep::Wait;
    }
    match (&live.event_id, live.started) {
        (None, Some(started)) if now >= started + interval => LiveStep::Post,
        (Some(_), _) if chars != live.shown_chars && live.edits < MAX_EDITS => LiveStep::Edit,
        _ => LiveStep::Wait,
    }
}

impl Live {
    /// Text arrived at `now`.
    pub fn text_at(&mut self, now: Instant) {
        self.started.get_or_insert(now);
    }

    /// The message now shows `chars` characters; the next change waits for the [`pace`] of
    /// `interval` at that length, or for as long as the homeserver asked (`retry_after`, a
    /// 429), whichever is longer.
    pub fn shown(
        &mut self,
        now: Instant,
        chars: usize,
        interval: Duration,
        retry_after: Option<Duration>,
    ) {
        self.shown_chars = chars;
        let wait = pace(interval, chars).max(retry_after.unwrap_or_default());
        self.not_before = Some(now + wait);
    }

    /// The message was edited once more.
    pub fn edited(&mut self) {
        self.edits = self.edits.saturating_add(1);
    }

    /// The block is over (posted in full): the next text starts a new one.
    pub fn reset(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use matrix_sdk::ruma::events::room::message::{
        ReplacementMetadata, RoomMessageEventContentWithoutRelation,
    };
    use matrix_sdk::ruma::owned_event_id;

    use super::*;

    #[test]
    fn the_live_marker_is_on_the_message_and_in_its_edits() {
        let post =
            serde_json::to_value(Marked(RoomMessageEventContent::text_plain("Once …"))).unwrap();
        assert_eq!(post[LIVE_MARKER], serde_json::json!({}), "{post}");
        assert_eq!(post["body"], "Once …");
        let edit = RoomMessageEventContentWithoutRelation::text_plain("Once upon …")
            .make_replacement(ReplacementMetadata::new(owned_event_id!("$live:hs"), None));
        let edit = serde_json::to_value(Marked(edit)).unwrap();
        assert_eq!(edit[LIVE_MARKER], serde_json::json!({}), "{edit}");
        assert_eq!(edit["m.new_content"][LIVE_MARKER], serde_json::json!({}));
        assert_eq!(edit["m.new_content"]["body"], "Once upon …");
        assert_eq!(edit["m.relates_to"]["rel_type"], "m.replace");
    }

    #[test]
    fn table() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let on = Some(s(2));
        let started = |at| Live {
            started: Some(at),
            ..Live::default()
        };
        let posted = |chars, not_before| Live {
            started: Some(t0),
            event_id: Some("$e".into()),
            shown_chars: chars,
            not_before: Some(not_before),
            edits: 0,
        };
        let capped = Live {
            edits: MAX_EDITS,
            ..posted(10, t0 + s(4))
        };
        let almost = Live {
            edits: MAX_EDITS - 1,
            ..posted(10, t0 + s(4))
        };
        /// Name, state, now, characters so far, pace, expected step.
        type Case = (
            &'static str,
            Live,
            Instant,
            usize,
            Option<Duration>,
            LiveStep,
        );
        let cases: &[Case] = &[
            (
                "streaming off",
                started(t0),
                t0 + s(60),
                10,
                None,
                LiveStep::Wait,
            ),
            ("nothing yet", Live::default(), t0, 0, on, LiveStep::Wait),
            (
                "a quick answer is not shown early",
                started(t0),
                t0 + s(1),
                10,
                on,
                LiveStep::Wait,
            ),
            (
                "streaming for a while: post",
                started(t0),
                t0 + s(2),
                10,
                on,
                LiveStep::Post,
            ),
            (
                "posted, too soon to edit",
                posted(10, t0 + s(4)),
                t0 + s(3),
                20,
                on,
                LiveStep::Wait,
            ),
            (
                "posted, time to edit",
                posted(10, t0 + s(4)),
                t0 + s(4),
                20,
                on,
                LiveStep::Edit,
            ),
            (
                "posted, nothing new",
                posted(20, t0 + s(4)),
                t0 + s(9),
                20,
                on,
                LiveStep::Wait,
            ),
            (
                "the last edit allowed",
                almost,
                t0 + s(4),
                20,
                on,
                LiveStep::Edit,
            ),
            (
                "edits used up: the final edit shows the rest",
                capped,
                t0 + s(60),
                20,
                on,
                LiveStep::Wait,
            ),
        ];
        for (name, live, now, chars, interval, want) in cases {
            assert_eq!(next(live, *now, *chars, *interval), *want, "{name}");
        }
    }

    #[test]
    fn a_long_answer_is_edited_more_slowly() {
        let two = Duration::from_secs(2);
        let cases = [(0, 2), (3_999, 2), (4_000, 4), (12_000, 8), (40_000, 22)];
        for (chars, secs) in cases {
            assert_eq!(pace(two, chars), Duration::from_secs(secs), "{chars}");
        }
        let t0 = Instant::now();
        let mut live = Live::default();
        live.shown(t0, 8_000, two, None);
        assert_eq!(live.not_before, Some(t0 + Duration::from_secs(6)));
        live.shown(t0, 8_000, two, Some(Duration::from_secs(10)));
        assert_eq!(
            live.not_before,
            Some(t0 + Duration::from_secs(10)),
            "a 429 still wins"
        );
    }

    #[test]
    fn a_rate_limit_stretches_the_wait() {
        let t0 = Instant::now();
        let mut live = Live::default();
        live.text_at(t0);
        live.text_at(t0 + Duration::from_secs(1));
        assert_eq!(
            live.started,
            Some(t0),
            "the block started with its first text"
        );
        live.event_id = Some("$e".into());
        live.shown(t0, 5, Duration::from_secs(2), Some(Duration::from_secs(10)));
        let on = Some(Duration::from_secs(2));
        assert_eq!(
            next(&live, t0 + Duration::from_secs(9), 9, on),
            LiveStep::Wait
        );
        assert_eq!(
            next(&live, t0 + Duration::from_secs(10), 9, on),
            LiveStep::Edit
        );
        live.reset();
        assert_eq!(live, Live::default());
    }
}
