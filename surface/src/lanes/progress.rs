//! The read receipt and typing notice of a turn: shown once the turn has gone quiet for a
//! while, so a user waiting on a slow agent sees the bot is at work. The clock runs only
//! while the surface posts nothing: a turn whose answer is already on its way (posting it
//! waits behind a busy homeserver) shows neither, as the answer itself says the message was
//! taken up. Each of them is a request the homeserver serves and a wake-up for every member's
//! sync, which under a burst of messages cost a fifth of the throughput. While the turn waits
//! for the user (an approval prompt or a question), the bot is not typing either. [`cue`]
//! decides; [`show`] executes on a turn's [`Progress`].

use std::future::Future;
use std::sync::Arc;

use matrix_sdk::Room;
use matrix_sdk::ruma::OwnedEventId;
use tokio::sync::watch;
use tokio::time::{Duration, Instant};
use tracing::debug;

/// Quiet this long (no post going out, nothing posted since) and the turn shows progress.
pub const QUIET_BEFORE_PROGRESS: Duration = Duration::from_millis(700);
/// How often a shown typing notice is renewed (the SDK's notice lasts 4 s).
const TYPING_RENEW: Duration = Duration::from_secs(3);

/// What the turn is doing, as far as showing progress goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    /// Nothing has gone out since this instant (the turn's start, or the end of its last post).
    QuietSince(Instant),
    /// A message or an edit is on its way to the homeserver.
    Posting,
    /// The turn waits for the user's answer to a prompt it posted.
    AwaitingUser,
    /// The turn is over (or interrupted): take a shown notice down.
    Over,
}

/// What the progress task does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cue {
    /// Nothing now; look again at this instant (`None`: only when the activity changes).
    Wait(Option<Instant>),
    /// Show the typing notice, or renew it (marking the trigger read the first time).
    Type,
    /// Take the typing notice down.
    StopTyping,
    /// Nothing more to show: the turn is over and no notice is up.
    Done,
}

/// Pure: what to do about progress when the turn is at `activity` at `now`, with the typing
/// notice last sent at `typing` (`None`: not shown).
pub fn cue(activity: Activity, now: Instant, typing: Option<Instant>) -> Cue {
    let due = |at: Instant| {
        if now >= at {
            Cue::Type
        } else {
            Cue::Wait(Some(at))
        }
    };
    match (activity, typing) {
        (Activity::Over, None) => Cue::Done,
        (Activity::Over | Activity::AwaitingUser, Some(_)) => Cue::StopTyping,
        (Activity::AwaitingUser | Activity::Posting, None) => Cue::Wait(None),
        (Activity::QuietSince(since), None) => due(since + QUIET_BEFORE_PROGRESS),
        // Once shown, the notice stays up (renewed) while the turn posts or works.
        (Activity::QuietSince(_) | Activity::Posting, Some(sent)) => due(sent + TYPING_RENEW),
    }
}

/// A running turn's side of the progress task: it tells the task when the turn posts, when it
/// waits for the user and when it is over (after which nothing changes it). Dropping it ends
/// the task too.
#[derive(Debug)]
pub struct Progress {
    activity: Arc<watch::Sender<Activity>>,
}

/// Marks a post in flight; the quiet clock restarts when it is dropped.
#[must_use = "the post counts as going out only while this lives"]
pub struct Posting(Arc<watch::Sender<Activity>>);

impl Drop for Posting {
    fn drop(&mut self) {
        set(&self.0, |_| true, Activity::QuietSince(Instant::now()));
    }
}

/// Moves the turn to `next` if it is not over and `from` accepts where it is.
fn set(activity: &watch::Sender<Activity>, from: impl Fn(Activity) -> bool, next: Activity) {
    activity.send_if_modified(|a| {
        if *a == Activity::Over || !from(*a) {
            return false;
        }
        *a = next;
        true
    });
}

impl Progress {
    /// A turn that starts now, and the receiving end for [`show`].
    pub fn start() -> (Self, watch::Receiver<Activity>) {
        let (activity, rx) = watch::channel(Activity::QuietSince(Instant::now()));
        let activity = Arc::new(activity);
        (Self { activity }, rx)
    }

    /// A post is going out until the returned guard is dropped.
    pub fn posting(&self) -> Posting {
        set(&self.activity, |_| true, Activity::Posting);
        Posting(self.activity.clone())
    }

    /// The turn posted a prompt and waits for the user's answer.
    pub fn awaiting_user(&self) {
        set(&self.activity, |_| true, Activity::AwaitingUser);
    }

    /// The agent is heard from: a turn that was waiting for the user is at work again.
    pub fn agent_heard(&self) {
        let waiting = |a| a == Activity::AwaitingUser;
        set(
            &self.activity,
            waiting,
            Activity::QuietSince(Instant::now()),
        );
    }

    /// The turn is over.
    pub fn over(&self) {
        self.activity.send_replace(Activity::Over);
    }
}

/// What showing progress does in the room (a trait, so the task runs against a fake).
pub trait Signals: Send + Sync + 'static {
    /// Marks the trigger read.
    fn mark_read(&self) -> impl Future<Output = ()> + Send;
    /// Shows (`true`) or takes down the typing notice.
    fn typing(&self, on: bool) -> impl Future<Output = ()> + Send;
}

/// [`Signals`] in a Matrix room, about the turn's trigger.
pub struct RoomSignals {
    pub room: Room,
    pub trigger: OwnedEventId,
}

impl Signals for RoomSignals {
    async fn mark_read(&self) {
        use matrix_sdk::ruma::api::client::receipt::create_receipt::v3::ReceiptType;
        use matrix_sdk::ruma::events::receipt::ReceiptThread;
        crate::metrics::progress_signal("read_receipt");
        let receipt = self.room.send_single_receipt(
            ReceiptType::Read,
            ReceiptThread::Unthreaded,
            self.trigger.clone(),
        );
        if let Err(e) = receipt.await {
            debug!(error = %e, "read receipt failed");
        }
    }

    async fn typing(&self, on: bool) {
        crate::metrics::progress_signal("typing");
        if let Err(e) = self.room.typing_notice(on).await {
            debug!(error = %e, on, "typing notice failed");
        }
    }
}

/// Runs the turn's progress until it is over: the read receipt and typing notice as [`cue`]
/// says, the notice taken down at the end.
pub async fn show<S: Signals>(signals: S, mut activity: watch::Receiver<Activity>) {
    let mut typing: Option<Instant> = None;
    let mut read = false;
    let mut gone = false;
    loop {
        let now = Instant::now();
        // The turn's side dropped without saying: as over.
        let current = if gone {
            Activity::Over
        } else {
            *activity.borrow_and_update()
        };
        match cue(current, now, typing) {
            Cue::Done => return,
            Cue::Type => {
                if !read {
                    signals.mark_read().await;
                    read = true;
                }
                signals.typing(true).await;
                typing = Some(Instant::now());
            }
            Cue::StopTyping => {
                signals.typing(false).await;
                typing = None;
            }
            Cue::Wait(wake) => {
                let sleep = async {
                    match wake {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    changed = activity.changed() => gone = changed.is_err(),
                    () = sleep => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn cue_waits_for_quiet_and_never_during_a_post_or_a_prompt() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let (quiet, renew) = (QUIET_BEFORE_PROGRESS, TYPING_RENEW);
        let cases = [
            // (activity, now, typing sent at, cue, why)
            (
                Activity::QuietSince(t0),
                t0,
                None,
                Cue::Wait(Some(t0 + quiet)),
                "a turn just begun waits",
            ),
            (
                Activity::QuietSince(t0),
                t0 + quiet - ms(1),
                None,
                Cue::Wait(Some(t0 + quiet)),
                "not yet quiet long enough",
            ),
            (
                Activity::QuietSince(t0),
                t0 + quiet,
                None,
                Cue::Type,
                "quiet long enough",
            ),
            (
                Activity::Posting,
                t0 + ms(5000),
                None,
                Cue::Wait(None),
                "a slow post is not the agent's silence",
            ),
            (
                Activity::QuietSince(t0 + ms(5000)),
                t0 + ms(5100),
                None,
                Cue::Wait(Some(t0 + ms(5000) + quiet)),
                "the clock starts over when a post is done",
            ),
            (
                Activity::QuietSince(t0),
                t0 + ms(1000),
                Some(t0 + ms(700)),
                Cue::Wait(Some(t0 + ms(700) + renew)),
                "shown: renewed in time",
            ),
            (
                Activity::Posting,
                t0 + ms(700) + renew,
                Some(t0 + ms(700)),
                Cue::Type,
                "shown: stays up while the answer posts",
            ),
            (
                Activity::AwaitingUser,
                t0 + ms(9000),
                Some(t0 + ms(8000)),
                Cue::StopTyping,
                "not typing while the user is asked",
            ),
            (
                Activity::AwaitingUser,
                t0 + ms(90_000),
                None,
                Cue::Wait(None),
                "waiting for the user shows nothing, however long",
            ),
            (
                Activity::Over,
                t0 + ms(9000),
                Some(t0 + ms(8000)),
                Cue::StopTyping,
                "over: the notice comes down",
            ),
            (Activity::Over, t0 + ms(9000), None, Cue::Done, "over: done"),
        ];
        for (activity, now, typing, want, why) in cases {
            assert_eq!(cue(activity, now, typing), want, "{why}");
        }
    }

    /// Records what was shown.
    #[derive(Clone, Default)]
    struct Fake(Arc<Mutex<Vec<&'static str>>>);

    impl Signals for Fake {
        async fn mark_read(&self) {
            self.0.lock().unwrap().push("read");
        }
        async fn typing(&self, on: bool) {
            self.0
                .lock()
                .unwrap()
                .push(if on { "typing" } else { "typing-off" });
        }
    }

    impl Fake {
        fn shown(&self) -> Vec<&'static str> {
            self.0.lock().unwrap().clone()
        }
    }

    /// A turn that posts its answer and ends shows nothing, whatever the post took: the task
    /// only ever sees a post in flight and then the end.
    #[tokio::test]
    async fn a_turn_that_ends_while_posting_shows_nothing() {
        let (progress, rx) = Progress::start();
        let fake = Fake::default();
        let posting = progress.posting();
        let task = tokio::spawn(show(fake.clone(), rx));
        tokio::task::yield_now().await;
        drop(posting);
        progress.over();
        task.await.unwrap();
        assert!(fake.shown().is_empty(), "{:?}", fake.shown());
    }

    #[tokio::test]
    async fn a_quiet_turn_marks_read_and_types_until_it_is_over() {
        let (progress, rx) = Progress::start();
        let fake = Fake::default();
        let task = tokio::spawn(show(fake.clone(), rx));
        while fake.shown().len() < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A post while typing does not take the notice down; the end does.
        drop(progress.posting());
        progress.over();
        task.await.unwrap();
        assert_eq!(fake.shown(), ["read", "typing", "typing-off"]);
    }

    #[tokio::test]
    async fn a_prompt_takes_the_notice_down_until_the_agent_is_heard_from() {
        let (progress, rx) = Progress::start();
        let fake = Fake::default();
        let task = tokio::spawn(show(fake.clone(), rx));
        let shown = |n: usize| {
            let fake = fake.clone();
            async move {
                while fake.shown().len() < n {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
        shown(2).await;
        progress.awaiting_user();
        shown(3).await;
        progress.agent_heard();
        shown(4).await;
        drop(progress);
        task.await.unwrap();
        assert_eq!(
            fake.shown(),
            ["read", "typing", "typing-off", "typing", "typing-off"]
        );
    }

    #[tokio::test]
    async fn dropping_the_turn_ends_the_task() {
        let (progress, rx) = Progress::start();
        let fake = Fake::default();
        let task = tokio::spawn(show(fake.clone(), rx));
        tokio::task::yield_now().await;
        drop(progress);
        task.await.unwrap();
        assert!(fake.shown().is_empty());
    }
}
