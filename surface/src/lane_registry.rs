//! Which chats have a running lane, the handle that wakes each, the turn each is running and
//! a way to stop it. Below the lanes themselves, so the shared context can hold it without
//! importing them. [`pick`] decides which running turn a `!stop`, a ⏹️ reaction or a
//! redaction means (pure, table-tested).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use protocol::ChatId;
use tokio::sync::Notify;

/// A turn a lane is running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    /// Its chat.
    pub chat: ChatId,
    /// Its room.
    pub room_id: String,
    /// The turn: the event id of the message being answered (also the root of the answer's
    /// thread).
    pub turn: String,
    /// Who sent that message.
    pub requester: String,
    /// The thread that message is in, if any.
    pub thread_root: Option<String>,
    /// The message showing the answer while it is written, once posted.
    pub live: Option<String>,
    /// Notices offering to answer an edit of that message instead: a ⏹️ or 🔁 on one stops
    /// the turn.
    pub offers: Vec<String>,
}

impl Running {
    /// The thread the answer is posted in.
    pub fn answer_thread(&self) -> &str {
        self.thread_root.as_deref().unwrap_or(&self.turn)
    }
}

/// What wakes one lane, whether its current backlog was announced, the turn it runs and a
/// request to stop that turn.
#[derive(Debug, Default)]
pub struct LaneHandle {
    /// Notified when the chat has new work in the journal.
    pub notify: Notify,
    backlog_noticed: AtomicBool,
    running: Mutex<Option<Running>>,
    /// Who asked to stop the running turn (taken by the lane).
    stop: Mutex<Option<String>>,
    stop_notify: Notify,
}

impl LaneHandle {
    /// The lane starts running `turn` (an earlier stop request is void).
    pub fn start(&self, turn: Running) {
        *lock(&self.stop) = None;
        *lock(&self.running) = Some(turn);
    }

    /// The running turn's answer is shown in message `event_id`.
    pub fn live_posted(&self, event_id: &str) {
        if let Some(r) = lock(&self.running).as_mut() {
            r.live = Some(event_id.to_owned());
        }
    }

    /// A notice `event_id` offers to answer an edit of `turn`'s message instead (a stop on it
    /// stops the turn).
    pub fn offered(&self, turn: &str, event_id: &str) {
        if let Some(r) = lock(&self.running).as_mut().filter(|r| r.turn == turn) {
            r.offers.push(event_id.to_owned());
        }
    }

    /// The running turn is over.
    pub fn over(&self) {
        *lock(&self.running) = None;
        *lock(&self.stop) = None;
    }

    /// The turn this lane runs, if any.
    pub fn running(&self) -> Option<Running> {
        lock(&self.running).clone()
    }

    /// Asks the lane to stop `turn` on behalf of `by`; false when it is not running it (any
    /// more).
    pub fn request_stop(&self, turn: &str, by: &str) -> bool {
        let running = lock(&self.running);
        if running.as_ref().is_none_or(|r| r.turn != turn) {
            return false;
        }
        *lock(&self.stop) = Some(by.to_owned());
        drop(running);
        self.stop_notify.notify_one();
        true
    }

    /// Waits for a request to stop the running turn; returns who made it.
    pub async fn stop_requested(&self) -> String {
        loop {
            if let Some(by) = lock(&self.stop).take() {
                return by;
            }
            self.stop_notify.notified().await;
        }
    }

    /// Marks the backlog announced; true the first time for this backlog.
    pub fn first_backlog_notice(&self) -> bool {
        !self.backlog_noticed.swap(true, Ordering::SeqCst)
    }

    /// The backlog is gone: the next one is announced again.
    pub fn backlog_drained(&self) {
        self.backlog_noticed.store(false, Ordering::SeqCst);
    }
}

/// The running lanes, by chat.
#[derive(Debug, Default)]
pub struct Lanes {
    map: Mutex<HashMap<ChatId, Arc<LaneHandle>>>,
}

impl Lanes {
    /// The turns running in `room_id`, each with its lane's handle.
    pub fn running_in(&self, room_id: &str) -> Vec<(Running, Arc<LaneHandle>)> {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.values()
            .filter_map(|h| Some((h.running()?, h.clone())))
            .filter(|(r, _)| r.room_id == room_id)
            .collect()
    }

    /// The running turn of `room_id` that `event_id` is the message, the answer or an offer of.
    pub fn running_for(&self, room_id: &str, event_id: &str) -> Option<(Running, Arc<LaneHandle>)> {
        let running = self.running_in(room_id);
        let turns: Vec<Running> = running.iter().map(|(r, _)| r.clone()).collect();
        let Pick::One(turn) = pick(&turns, StopAt::Event(event_id)) else {
            return None;
        };
        running.into_iter().find(|(r, _)| r.turn == turn.turn)
    }

    /// The handle of `chat`'s lane, and whether it is new (then the caller starts the lane).
    pub fn handle(&self, chat: &ChatId) -> (Arc<LaneHandle>, bool) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        match map.get(chat) {
            Some(h) => (h.clone(), false),
            None => {
                let h = Arc::new(LaneHandle::default());
                map.insert(chat.clone(), h.clone());
                (h, true)
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a request to stop points at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopAt<'a> {
    /// `!stop` sent in conversation `chat` (in the thread `thread_root`, if any).
    Command {
        /// The conversation it was sent in.
        chat: &'a ChatId,
        /// The thread it was sent in.
        thread_root: Option<&'a str>,
    },
    /// A reaction on, or a redaction of, this event.
    Event(&'a str),
}

/// Which running turn a stop request means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick<'a> {
    /// This one.
    One(&'a Running),
    /// None is running there.
    Nothing,
    /// Several could be meant (answers are written in several threads, and `!stop` was sent
    /// outside all of them).
    Several,
}

/// The turn among `running` (the room's) that `at` means: the one answering the message a
/// reaction or redaction is on (or whose answer it is on); for `!stop`, the turn of its own
/// conversation, else the one whose answer's thread it was sent in, else the room's only one
/// (pure).
pub fn pick<'a>(running: &'a [Running], at: StopAt<'_>) -> Pick<'a> {
    let one = |r: Option<&'a Running>| r.map_or(Pick::Nothing, Pick::One);
    match at {
        StopAt::Event(id) => one(running.iter().find(|r| {
            r.turn == id || r.live.as_deref() == Some(id) || r.offers.iter().any(|o| o == id)
        })),
        StopAt::Command { chat, thread_root } => {
            if let Some(r) = running.iter().find(|r| &r.chat == chat) {
                return Pick::One(r);
            }
            if let Some(root) = thread_root {
                return one(running.iter().find(|r| r.turn == root));
            }
            match running {
                [] => Pick::Nothing,
                [r] => Pick::One(r),
                _ => Pick::Several,
            }
        }
    }
}

/// The power level that may stop anyone's answer (moderator).
pub const STOP_ANY_POWER_LEVEL: i64 = 50;

/// Whether `sender`, at power level `level`, may stop the answer to `requester` (pure).
pub fn may_stop(requester: &str, sender: &str, level: i64) -> bool {
    requester == sender || level >= STOP_ANY_POWER_LEVEL
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(chat: &str, turn: &str, live: Option<&str>) -> Running {
        Running {
            chat: ChatId::new(chat).unwrap(),
            room_id: "!r:hs".into(),
            turn: turn.into(),
            requester: "@a:hs".into(),
            thread_root: None,
            live: live.map(Into::into),
            offers: Vec::new(),
        }
    }

    #[test]
    fn which_turn_a_stop_means() {
        let room = ChatId::new("room").unwrap();
        let thread = ChatId::new("thread").unwrap();
        let main = running("room", "$m", Some("$live"));
        let in_thread = running("thread", "$t", None);
        let both = [main.clone(), in_thread.clone()];
        let two_threads = [in_thread.clone(), running("t2", "$u", None)];
        let mut with_offer = running("room", "$o", None);
        with_offer.offers.push("$offer".into());
        let offered = [with_offer];
        let cases: Vec<(&str, &[Running], StopAt<'_>, Pick<'_>)> = vec![
            (
                "a reaction on the message being answered",
                &both,
                StopAt::Event("$t"),
                Pick::One(&both[1]),
            ),
            (
                "a reaction on the answer being written",
                &both,
                StopAt::Event("$live"),
                Pick::One(&both[0]),
            ),
            (
                "a reaction on anything else",
                &both,
                StopAt::Event("$x"),
                Pick::Nothing,
            ),
            (
                "a reaction on an offer to answer an edit",
                &offered,
                StopAt::Event("$offer"),
                Pick::One(&offered[0]),
            ),
            (
                "!stop in its own conversation",
                &both,
                StopAt::Command {
                    chat: &thread,
                    thread_root: Some("$root"),
                },
                Pick::One(&both[1]),
            ),
            (
                "!stop in the answer's thread",
                std::slice::from_ref(&main),
                StopAt::Command {
                    chat: &thread,
                    thread_root: Some("$m"),
                },
                Pick::One(&main),
            ),
            (
                "!stop in another thread",
                std::slice::from_ref(&main),
                StopAt::Command {
                    chat: &thread,
                    thread_root: Some("$x"),
                },
                Pick::Nothing,
            ),
            (
                "!stop in the room with one answer running",
                std::slice::from_ref(&in_thread),
                StopAt::Command {
                    chat: &room,
                    thread_root: None,
                },
                Pick::One(&in_thread),
            ),
            (
                "!stop in the room with two elsewhere",
                &two_threads,
                StopAt::Command {
                    chat: &room,
                    thread_root: None,
                },
                Pick::Several,
            ),
            (
                "!stop with nothing running",
                &[],
                StopAt::Command {
                    chat: &room,
                    thread_root: None,
                },
                Pick::Nothing,
            ),
        ];
        for (name, running, at, expected) in cases {
            let got = pick(running, at);
            match (got, expected) {
                (Pick::One(a), Pick::One(b)) => assert_eq!(a.turn, b.turn, "{name}"),
                _ => assert_eq!(got, expected, "{name}"),
            }
        }
    }

    #[test]
    fn who_may_stop() {
        assert!(may_stop("@a:hs", "@a:hs", 0), "the requester");
        assert!(may_stop("@a:hs", "@mod:hs", 50), "a moderator");
        assert!(!may_stop("@a:hs", "@b:hs", 0), "anyone else");
    }

    #[tokio::test]
    async fn a_stop_reaches_only_the_turn_it_names() {
        let h = LaneHandle::default();
        assert!(!h.request_stop("$m", "@a:hs"), "nothing runs");
        h.start(running("room", "$m", None));
        assert!(!h.request_stop("$other", "@a:hs"), "another turn");
        assert!(h.request_stop("$m", "@a:hs"));
        assert_eq!(h.stop_requested().await, "@a:hs");
        h.live_posted("$live");
        assert_eq!(h.running().unwrap().live.as_deref(), Some("$live"));
        assert!(h.request_stop("$m", "@b:hs"));
        h.start(running("room", "$n", None));
        h.over();
        assert!(h.running().is_none());
        let lanes = Lanes::default();
        let (h, _) = lanes.handle(&ChatId::new("c").unwrap());
        h.start(running("c", "$q", None));
        assert_eq!(lanes.running_in("!r:hs").len(), 1);
        assert!(lanes.running_in("!other:hs").is_empty());
    }

    #[test]
    fn one_handle_per_chat_and_one_notice_per_backlog() {
        let lanes = Lanes::default();
        let chat = ChatId::new("c1").unwrap();
        let (a, fresh) = lanes.handle(&chat);
        assert!(fresh);
        let (b, fresh) = lanes.handle(&chat);
        assert!(!fresh);
        assert!(Arc::ptr_eq(&a, &b));
        assert!(a.first_backlog_notice());
        assert!(!b.first_backlog_notice());
        a.backlog_drained();
        assert!(b.first_backlog_notice());
    }
}
