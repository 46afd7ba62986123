//! What an edit (`m.replace`) finds when it looks up the message it edits, and the one change
//! it may make: a message not processed yet takes the new content.

use rusqlite::{OptionalExtension, params};

use super::{Journal, Result, Stored};

/// Where an edited message stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EditTarget {
    /// Journaled and not processed yet: the edit replaces its content.
    Queued,
    /// Already a turn (running or done): the edit is a follow-up. Its old text.
    Ran(String),
    /// Not known, not the editor's message, or nothing an edit changes (context, answers).
    Other,
}

impl Journal {
    /// Where message `event_id` stands, for an edit by `sender` (only its author may edit it).
    pub fn edit_target(&self, event_id: &str, sender: &str) -> Result<EditTarget> {
        let conn = self.conn();
        type Row = (String, String, String, Option<String>, Option<String>);
        let row: Option<Row> = conn
            .query_row(
                "SELECT sender, disposition, state, content, kind FROM events WHERE event_id = ?1",
                params![event_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
            )
            .optional()?;
        let Some((author, disposition, state, content, kind)) = row else {
            return Ok(EditTarget::Other);
        };
        if author != sender {
            return Ok(EditTarget::Other);
        }
        Ok(match (disposition.as_str(), state.as_str()) {
            ("trigger" | "context", "pending") => EditTarget::Queued,
            ("trigger", "sent" | "handled") => {
                let stored = Stored::load(kind.as_deref(), content);
                EditTarget::Ran(
                    stored
                        .as_ref()
                        .map(Stored::text)
                        .unwrap_or_default()
                        .to_owned(),
                )
            }
            _ => EditTarget::Other,
        })
    }

    /// Gives message `event_id` new `content` if it is still waiting to be processed. Returns
    /// whether it did.
    pub fn replace_queued_content(&self, event_id: &str, content: &Stored) -> Result<bool> {
        let n = self.conn().execute(
            "UPDATE events SET content = ?2, kind = ?3 WHERE event_id = ?1 AND state = 'pending'",
            params![event_id, content.to_json()?, content.kind()],
        )?;
        Ok(n == 1)
    }
}

#[cfg(test)]
mod tests {
    use matrix_sdk::ruma::events::room::message::MessageType;
    use protocol::ChatId;

    use super::*;
    use crate::journal::Disposition;
    use crate::journal::tests::ev;

    #[test]
    fn where_an_edited_message_stands() {
        let j = Journal::in_memory().unwrap();
        let chat = ChatId::for_conversation("!r:hs", None);
        j.record(
            "!r:hs",
            &[
                ev("$t", &chat, Disposition::Trigger),
                ev("$c", &chat, Disposition::Context),
                ev("$s", &chat, Disposition::Skip),
            ],
        )
        .unwrap();
        assert_eq!(
            j.edit_target("$t", "@alice:hs").unwrap(),
            EditTarget::Queued
        );
        assert_eq!(
            j.edit_target("$t", "@b:hs").unwrap(),
            EditTarget::Other,
            "not the author"
        );
        assert_eq!(j.edit_target("$s", "@alice:hs").unwrap(), EditTarget::Other);
        assert_eq!(
            j.edit_target("$nope", "@alice:hs").unwrap(),
            EditTarget::Other
        );
        assert!(
            j.replace_queued_content("$t", &Stored::Message(MessageType::text_plain("hello")))
                .unwrap()
        );
        j.mark_handled("$t").unwrap();
        assert_eq!(
            j.edit_target("$t", "@alice:hs").unwrap(),
            EditTarget::Ran("hello".into())
        );
        assert!(
            !j.replace_queued_content("$t", &Stored::Message(MessageType::text_plain("")))
                .unwrap(),
            "too late to replace"
        );
    }
}
