//! Which chats have a running lane, and the handle that wakes each. Below the lanes
//! themselves, so the shared context can hold it without importing them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use protocol::ChatId;
use tokio::sync::Notify;

/// What wakes one lane, and whether its current backlog was announced.
#[derive(Debug, Default)]
pub struct LaneHandle {
    /// Notified when the chat has new work in the journal.
    pub notify: Notify,
    backlog_noticed: AtomicBool,
}

impl LaneHandle {
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

#[cfg(test)]
mod tests {
    use super::*;

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
