//! Questions and approval prompts waiting for a user's answer: the registry the sync ingest
//! consults before a message reaches a lane (the lane is busy with the very turn that waits).
//! A wait is keyed by room and user (the next message of that user answers it) and, once its
//! prompt is posted, by the prompt's event id (so a reaction or reply to the prompt finds it).

use std::collections::HashMap;
use std::sync::Mutex;

use protocol::{Answer, ApprovalDecision, Decision as ApprovalChoice, ToAgent};

use crate::agent_link::LinkHandle;
use crate::decide::Waiting;

/// A question or approval prompt waiting for one user's next message in one room.
#[derive(Debug, Clone)]
pub struct Wait {
    /// The room.
    pub room_id: String,
    /// The user whose answer counts.
    pub user_id: String,
    /// The turn that asked.
    pub turn: String,
    /// Question id, or the first approval request id.
    pub id: String,
    /// Coalesced approval requests for the same (tool, resource) in the same turn.
    pub extra_request_ids: Vec<String>,
    /// Tool and resource, for approvals.
    pub approval: Option<(String, String)>,
    /// Where the answer goes.
    pub link: LinkHandle,
    /// The event of the posted prompt, once it is posted.
    pub prompt_event: Option<String>,
}

impl Wait {
    fn waiting(&self) -> Waiting {
        match self.approval {
            Some(_) => Waiting::Approval {
                request_id: self.id.clone(),
            },
            None => Waiting::Question {
                question_id: self.id.clone(),
            },
        }
    }
}

/// The registry of [`Wait`]s, consulted by the sync ingest before a message reaches a lane
/// (the lane is busy with the very turn that waits).
#[derive(Debug, Default)]
pub struct Waits {
    inner: Mutex<WaitsInner>,
}

#[derive(Debug, Default)]
struct WaitsInner {
    waits: Vec<Wait>,
    /// Approval decisions per (turn, tool, resource), to coalesce repeated requests.
    decided: HashMap<(String, String, String), ApprovalChoice>,
}

impl Waits {
    fn lock(&self) -> std::sync::MutexGuard<'_, WaitsInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the bot waits for from `user_id` in `room_id` (the oldest wait).
    pub fn lookup(&self, room_id: &str, user_id: &str) -> Option<Waiting> {
        self.lock()
            .waits
            .iter()
            .find(|w| w.room_id == room_id && w.user_id == user_id)
            .map(Wait::waiting)
    }

    /// The wait whose prompt is event `prompt_event`, if it asks `user_id` (a reaction from
    /// anyone else decides nothing).
    pub fn by_prompt_from(&self, prompt_event: &str, user_id: &str) -> Option<Waiting> {
        self.lock()
            .waits
            .iter()
            .find(|w| w.prompt_event.as_deref() == Some(prompt_event) && w.user_id == user_id)
            .map(Wait::waiting)
    }

    /// An approval a moderator may decide for its requester (the room's `approvers:
    /// moderators`): the one whose prompt is `prompt_event` (a reaction on it), or the one of the
    /// turn answering `thread_root` in `room_id` (a reply in its thread).
    pub fn approval_for_moderator(
        &self,
        room_id: &str,
        prompt_event: Option<&str>,
        thread_root: Option<&str>,
    ) -> Option<Waiting> {
        self.lock()
            .waits
            .iter()
            .filter(|w| w.room_id == room_id && w.approval.is_some())
            .find(|w| match prompt_event {
                Some(p) => w.prompt_event.as_deref() == Some(p),
                None => thread_root == Some(w.turn.as_str()),
            })
            .map(Wait::waiting)
    }

    /// Records the event id of the posted prompt of wait `id`.
    pub fn set_prompt_event(&self, id: &str, prompt_event: &str) {
        if let Some(w) = self.lock().waits.iter_mut().find(|w| w.id == id) {
            w.prompt_event = Some(prompt_event.to_owned());
        }
    }

    pub(crate) fn add(&self, w: Wait) {
        self.lock().waits.push(w);
    }

    /// Adds `request_id` to a pending prompt for the same (turn, tool, resource), if any.
    pub(crate) fn coalesce(
        &self,
        turn: &str,
        tool: &str,
        resource: &str,
        request_id: &str,
    ) -> bool {
        let mut inner = self.lock();
        let key = (tool.to_owned(), resource.to_owned());
        match inner
            .waits
            .iter_mut()
            .find(|w| w.turn == turn && w.approval.as_ref() == Some(&key))
        {
            Some(w) => {
                w.extra_request_ids.push(request_id.to_owned());
                true
            }
            None => false,
        }
    }

    pub(crate) fn decided(&self, turn: &str, tool: &str, resource: &str) -> Option<ApprovalChoice> {
        self.lock()
            .decided
            .get(&(turn.to_owned(), tool.to_owned(), resource.to_owned()))
            .copied()
    }

    /// Removes and returns the wait with id `id`.
    pub fn take(&self, id: &str) -> Option<Wait> {
        let mut inner = self.lock();
        let pos = inner.waits.iter().position(|w| w.id == id)?;
        let w = inner.waits.remove(pos);
        Some(w)
    }

    /// Forgets everything about a finished turn.
    pub(crate) fn turn_over(&self, turn: &str) {
        let mut inner = self.lock();
        inner.waits.retain(|w| w.turn != turn);
        inner.decided.retain(|k, _| k.0 != turn);
    }

    /// Delivers the answer to question `question_id`. Returns false if nobody waits any more.
    pub fn answer(&self, question_id: &str, text: &str, by: &str) -> bool {
        let Some(w) = self.take(question_id) else {
            return false;
        };
        w.link.send(ToAgent::Answer(Answer {
            question_id: question_id.to_owned(),
            text: text.to_owned(),
            by: by.to_owned(),
        }));
        true
    }

    /// Delivers an approval decision (to every coalesced request). Returns the wait it
    /// answered (its prompt shows the outcome), `None` if nobody waits any more.
    pub fn decide(&self, request_id: &str, choice: ApprovalChoice, by: &str) -> Option<Wait> {
        let w = self.take(request_id)?;
        if let Some((tool, resource)) = &w.approval {
            self.lock()
                .decided
                .insert((w.turn.clone(), tool.clone(), resource.clone()), choice);
        }
        for id in std::iter::once(&w.id).chain(&w.extra_request_ids) {
            w.link.send(ToAgent::ApprovalDecision(ApprovalDecision {
                request_id: id.clone(),
                decision: choice,
                by: by.to_owned(),
            }));
        }
        Some(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent_link::{drain, test_handle};

    fn wait(link: &LinkHandle, id: &str, approval: Option<(&str, &str)>) -> Wait {
        Wait {
            room_id: "!r:hs".into(),
            user_id: "@alice:hs".into(),
            turn: "$turn".into(),
            id: id.into(),
            extra_request_ids: Vec::new(),
            approval: approval.map(|(t, r)| (t.into(), r.into())),
            link: link.clone(),
            prompt_event: None,
        }
    }

    #[test]
    fn questions_are_answered_once_by_the_asked_user() {
        let (link, mut rx) = test_handle();
        let waits = Waits::default();
        waits.add(wait(&link, "q1", None));
        assert_eq!(
            waits.lookup("!r:hs", "@bob:hs"),
            None,
            "others are not asked"
        );
        assert_eq!(waits.lookup("!other:hs", "@alice:hs"), None);
        assert_eq!(
            waits.lookup("!r:hs", "@alice:hs"),
            Some(Waiting::Question {
                question_id: "q1".into()
            })
        );
        assert_eq!(waits.by_prompt_from("$prompt", "@alice:hs"), None);
        waits.set_prompt_event("q1", "$prompt");
        assert_eq!(
            waits.by_prompt_from("$prompt", "@alice:hs"),
            Some(Waiting::Question {
                question_id: "q1".into()
            }),
            "the prompt's event finds its wait"
        );
        assert!(waits.answer("q1", "blue", "@alice:hs"));
        assert!(!waits.answer("q1", "again", "@alice:hs"), "answered once");
        assert_eq!(waits.lookup("!r:hs", "@alice:hs"), None);
        assert_eq!(
            drain(&mut rx),
            vec![ToAgent::Answer(Answer {
                question_id: "q1".into(),
                text: "blue".into(),
                by: "@alice:hs".into()
            })]
        );
    }

    #[test]
    fn repeated_approvals_are_coalesced_and_remembered_for_the_turn() {
        let (link, mut rx) = test_handle();
        let waits = Waits::default();
        waits.add(wait(&link, "r1", Some(("write_file", "a.txt"))));
        assert!(waits.coalesce("$turn", "write_file", "a.txt", "r2"));
        assert!(!waits.coalesce("$turn", "write_file", "b.txt", "r3"));
        assert!(!waits.coalesce("$other", "write_file", "a.txt", "r4"));
        assert_eq!(
            waits.lookup("!r:hs", "@alice:hs"),
            Some(Waiting::Approval {
                request_id: "r1".into()
            })
        );
        waits.set_prompt_event("r1", "$prompt");
        assert_eq!(
            waits.by_prompt_from("$prompt", "@bob:hs"),
            None,
            "only the asked user"
        );
        assert!(waits.by_prompt_from("$prompt", "@alice:hs").is_some());
        let decided = waits.decide("r1", ApprovalChoice::AllowOnce, "@alice:hs");
        assert_eq!(
            decided.and_then(|w| w.prompt_event).as_deref(),
            Some("$prompt")
        );
        let ids: Vec<String> = drain(&mut rx)
            .into_iter()
            .map(|m| match m {
                ToAgent::ApprovalDecision(d) => {
                    assert_eq!(d.decision, ApprovalChoice::AllowOnce);
                    d.request_id
                }
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(ids, vec!["r1", "r2"]);
        assert_eq!(
            waits.decided("$turn", "write_file", "a.txt"),
            Some(ApprovalChoice::AllowOnce)
        );
        waits.turn_over("$turn");
        assert_eq!(waits.decided("$turn", "write_file", "a.txt"), None);
        assert!(
            waits
                .decide("r1", ApprovalChoice::Deny, "@alice:hs")
                .is_none()
        );
    }
}
