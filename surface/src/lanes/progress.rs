//! The read receipt and typing notice of a turn: shown once the turn has gone quiet for a
//! while, so a user waiting on a slow agent sees the bot is at work. The clock runs only
//! while the surface posts nothing: a turn whose answer is already on its way (posting it
//! waits behind a busy homeserver) shows neither, as the answer itself says the message was
//! taken up. Each of them is a request the homeserver serves and a wake-up for every member's
//! sync, which under a burst of messages cost a fifth of the throughput. [`cue`] decides;
//! [`show`] executes on a turn's [`Progress`].

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
    /// The turn is over (or interrupted): take a shown notice down.
    Over,
}

/// What the progress task does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cue {
    /// Nothing yet; look again at this instant (or when the activity changes).
    WaitUntil(Instant),
    /// Nothing while the post goes out; look again when it is done.
    WaitForPost,
    /// Mark the trigger read and show the typing notice.
    Show,
    /// The turn ended first: show nothing.
    Done,
}

/// Pure: what to do about progress when the turn is at `activity` at `now`.
pub fn cue(activity: Activity, now: Instant) -> Cue {
    match activity {
        Activity::Over => Cue::Done,
        Activity::Posting => Cue::WaitForPost,
        Activity::QuietSince(since) => {
            let due = since + QUIET_BEFORE_PROGRESS;
            if now >= due {
                Cue::Show
            } else {
                Cue::WaitUntil(due)
            }
        }
    }
}

/// A running turn's side of the progress task: it tells the task when the turn posts and
/// when it is over. Dropping it ends the task too.
#[derive(Debug)]
pub struct Progress {
    activity: Arc<watch::Sender<Activity>>,
}

/// Marks a post in flight; the quiet clock restarts when it is dropped.
#[must_use = "the post counts as going out only while this lives"]
pub struct Posting(Arc<watch::Sender<Activity>>);

impl Drop for Posting {
    fn drop(&mut self) {
        self.0.send_if_modified(|a| {
            if *a == Activity::Over {
                return false;
            }
            *a = Activity::QuietSince(Instant::now());
            true
        });
    }
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
        self.activity.send_replace(Activity::Posting);
        Posting(self.activity.clone())
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
        if let Err(e) = self.room.typing_notice(on).await {
            debug!(error = %e, on, "typing notice failed");
        }
    }
}

/// Waits until the turn has been quiet for [`QUIET_BEFORE_PROGRESS`], then marks the trigger
/// read and keeps the typing notice up until the turn is over; then takes it down.
pub async fn show<S: Signals>(signals: S, mut activity: watch::Receiver<Activity>) {
    loop {
        let now = Instant::now();
        let wake = match cue(*activity.borrow_and_update(), now) {
            Cue::Done => return,
            Cue::Show => break,
            Cue::WaitUntil(at) => Some(at),
            Cue::WaitForPost => None,
        };
        let sleep = async {
            match wake {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = activity.changed() => if changed.is_err() { return },
            () = sleep => {}
        }
    }
    signals.mark_read().await;
    loop {
        signals.typing(true).await;
        tokio::select! {
            () = over(&mut activity) => break,
            () = tokio::time::sleep(TYPING_RENEW) => {}
        }
    }
    signals.typing(false).await;
}

/// Returns once the turn is over (or its [`Progress`] is gone).
async fn over(activity: &mut watch::Receiver<Activity>) {
    while *activity.borrow_and_update() != Activity::Over {
        if activity.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn cue_waits_for_quiet_and_never_during_a_post() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let after = QUIET_BEFORE_PROGRESS;
        let cases = [
            // (activity, now, cue, why)
            (
                Activity::QuietSince(t0),
                t0,
                Cue::WaitUntil(t0 + after),
                "a turn just begun waits",
            ),
            (
                Activity::QuietSince(t0),
                t0 + after - ms(1),
                Cue::WaitUntil(t0 + after),
                "not yet quiet long enough",
            ),
            (
                Activity::QuietSince(t0),
                t0 + after,
                Cue::Show,
                "quiet long enough",
            ),
            (
                Activity::Posting,
                t0 + ms(5000),
                Cue::WaitForPost,
                "a slow post is not the agent's silence",
            ),
            (
                Activity::QuietSince(t0 + ms(5000)),
                t0 + ms(5100),
                Cue::WaitUntil(t0 + ms(5000) + after),
                "the clock starts over when a post is done",
            ),
            (Activity::Over, t0 + ms(9000), Cue::Done, "over: nothing"),
        ];
        for (activity, now, want, why) in cases {
            assert_eq!(cue(activity, now), want, "{why}");
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
