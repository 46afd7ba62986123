//! What a redaction finds in the journal: the files the redacted message brought (to remove
//! from the inbox) and its chat (to tell the agent); a message not processed yet is dropped.

use matrix_sdk::ruma::OwnedEventId;
use protocol::{ChatId, ContextMessage, UserMessage, WorkspacePath};
use rusqlite::{OptionalExtension, params};

use super::{Journal, Result, chat_id_col, matrix_id};

/// A redacted message, as the journal knew it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Redacted {
    /// Its chat.
    pub chat_id: ChatId,
    /// Its thread root.
    pub thread_root: Option<OwnedEventId>,
    /// Files it brought into the inbox.
    pub attachments: Vec<WorkspacePath>,
}

impl Journal {
    /// Looks up message `event_id` for its redaction: its chat and the files it brought (from
    /// its turn or its context record). `None` for a message the journal does not hold for a
    /// chat.
    pub fn redaction_target(&self, event_id: &str) -> Result<Option<Redacted>> {
        let conn = self.conn();
        type Row = (Option<String>, Option<OwnedEventId>, Option<String>);
        let row: Option<Row> = conn
            .query_row(
                "SELECT chat_id, thread_root, context_json FROM events WHERE event_id = ?1",
                params![event_id],
                |r| Ok((r.get(0)?, matrix_id(r, 1)?, r.get(2)?)),
            )
            .optional()?;
        let Some((Some(chat), thread_root, context_json)) = row else {
            return Ok(None);
        };
        let Some(chat_id) = chat_id_col(Some(chat)) else {
            return Ok(None);
        };
        let mut attachments = Vec::new();
        if let Some(json) = context_json
            && let Ok(c) = serde_json::from_str::<ContextMessage>(&json)
        {
            attachments.extend(c.attachments);
        }
        let turn: Option<String> = conn
            .query_row(
                "SELECT message FROM turns WHERE event_id = ?1",
                params![event_id],
                |r| r.get(0),
            )
            .optional()?;
        if let Some(json) = turn
            && let Ok(m) = serde_json::from_str::<UserMessage>(&json)
        {
            attachments.extend(m.attachments);
        }
        Ok(Some(Redacted {
            chat_id,
            thread_root,
            attachments,
        }))
    }

    /// Marks message `event_id` handled if it was still waiting to be processed (it was
    /// redacted: it never will be). Returns whether it was waiting.
    pub fn drop_pending(&self, event_id: &str) -> Result<bool> {
        let n = self.conn().execute(
            "UPDATE events SET state = 'handled' WHERE event_id = ?1 AND state = 'pending'",
            params![event_id],
        )?;
        Ok(n == 1)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use protocol::Sender;

    use super::*;
    use crate::journal::Disposition;
    use crate::journal::tests::ev;

    #[test]
    fn redacted_messages_give_their_files_and_pending_ones_are_dropped() {
        let j = Journal::in_memory().unwrap();
        let chat = ChatId::for_conversation("!r:hs", None);
        j.record(
            "!r:hs",
            &[
                ev("$turn", &chat, Disposition::Trigger),
                ev("$queued", &chat, Disposition::Trigger),
                ev("$skip", &chat, Disposition::Skip),
            ],
        )
        .unwrap();
        let file = WorkspacePath::new("surfaces/matrix/a/r/inbox/x-cat.png").unwrap();
        let msg = UserMessage {
            seq: 0,
            id: "$turn".into(),
            room_id: "!r:hs".into(),
            thread_root: None,
            sender: Sender {
                user_id: "@a:hs".into(),
                display_name: None,
            },
            text: "look".into(),
            attachments: vec![file.clone()],
            attachment_info: BTreeMap::new(),
            context: vec![],
            timestamp_ms: 1,
            settings: None,
        };
        j.create_turn(&chat, msg, &[]).unwrap();
        let r = j.redaction_target("$turn").unwrap().unwrap();
        assert_eq!((r.chat_id, r.attachments), (chat.clone(), vec![file]));
        assert!(!j.drop_pending("$turn").unwrap(), "already a turn");
        let r = j.redaction_target("$queued").unwrap().unwrap();
        assert!(r.attachments.is_empty());
        assert!(j.drop_pending("$queued").unwrap());
        assert!(
            j.next_pending(&chat).unwrap().is_none(),
            "dropped, not processed"
        );
        assert_eq!(j.redaction_target("$skip").unwrap(), None);
        assert_eq!(j.redaction_target("$unknown").unwrap(), None);
    }
}
