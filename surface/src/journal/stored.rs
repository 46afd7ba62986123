//! What a journal row holds: [`Stored`], written as a `kind` column and the kind's JSON in
//! `content`, and read back typed. A row of a kind this build does not know (a newer
//! surface's journal) or whose JSON does not decode loads as [`Stored::Unknown`], which the
//! lanes answer with an error in the log and a notice in the room, never a silent skip.

use matrix_sdk::ruma::events::room::message::MessageType;
use protocol::WorkspacePath;
use serde::{Deserialize, Serialize};

/// A journal row's content.
#[derive(Debug, Clone)]
pub enum Stored {
    /// A room message as its sender sent it (`kind` `message`).
    Message(MessageType),
    /// An edit of a message whose turn already ran: a follow-up (`kind` `edit`).
    Edited {
        /// The message's text before.
        old: String,
        /// Its new content.
        new: MessageType,
    },
    /// The sender deleted a message whose files left the inbox (`kind` `redaction`).
    Removed {
        /// The removed files.
        files: Vec<WorkspacePath>,
    },
    /// Not decryptable yet: the whole encrypted event, to try again (`kind` `encrypted`).
    Encrypted {
        /// The event's JSON.
        json: String,
    },
    /// Read back only: a kind this build does not know, or content that does not decode.
    Unknown {
        /// The row's `kind`.
        kind: String,
        /// Why it cannot be read.
        why: String,
    },
}

/// The same row: the same kind and the same JSON (ruma's message types have no `PartialEq`).
impl PartialEq for Stored {
    fn eq(&self, other: &Self) -> bool {
        self.kind() == other.kind() && self.to_json().ok() == other.to_json().ok()
    }
}

#[derive(Serialize, Deserialize)]
struct EditedJson {
    old: String,
    new: MessageType,
}

#[derive(Serialize, Deserialize)]
struct RemovedJson {
    files: Vec<WorkspacePath>,
}

impl Stored {
    /// The `kind` column.
    pub fn kind(&self) -> &str {
        match self {
            Self::Message(_) => "message",
            Self::Edited { .. } => "edit",
            Self::Removed { .. } => "redaction",
            Self::Encrypted { .. } => "encrypted",
            Self::Unknown { kind, .. } => kind,
        }
    }

    /// The `content` column.
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        match self {
            Self::Message(m) => serde_json::to_string(m),
            Self::Edited { old, new } => serde_json::to_string(&EditedJson {
                old: old.clone(),
                new: new.clone(),
            }),
            Self::Removed { files } => serde_json::to_string(&RemovedJson {
                files: files.clone(),
            }),
            Self::Encrypted { json } => Ok(json.clone()),
            // Never written: it exists only as what a row could not be read as.
            Self::Unknown { why, .. } => Ok(serde_json::json!({ "unreadable": why }).to_string()),
        }
    }

    /// Reads a row's `kind` and `content` back (`None`: a row kept without content).
    pub fn load(kind: Option<&str>, content: Option<String>) -> Option<Self> {
        let content = content?;
        let kind = kind.unwrap_or("message");
        let unknown = |why: String| Self::Unknown {
            kind: kind.to_owned(),
            why,
        };
        let decoded = match kind {
            "message" => serde_json::from_str(&content).map(Self::Message),
            "edit" => serde_json::from_str::<EditedJson>(&content).map(|e| Self::Edited {
                old: e.old,
                new: e.new,
            }),
            "redaction" => serde_json::from_str::<RemovedJson>(&content)
                .map(|r| Self::Removed { files: r.files }),
            "encrypted" => Ok(Self::Encrypted { json: content }),
            other => return Some(unknown(format!("unknown row kind {other:?}"))),
        };
        Some(decoded.unwrap_or_else(|e| unknown(format!("content does not decode: {e}"))))
    }

    /// What the sender says with a row that is not a message as sent: the follow-up an edit
    /// of an answered message is, and the note that a deleted message's files are gone.
    pub fn as_words(&self) -> Option<String> {
        match self {
            Self::Edited { old, new } => {
                Some(format!("I edited my message \"{old}\" to: {}", new.body()))
            }
            Self::Removed { files } => {
                let names: Vec<&str> = files
                    .iter()
                    .map(|p| protocol::original_name(p.file_name()))
                    .collect();
                Some(format!(
                    "(I deleted a message I sent; its file {} was removed from the inbox.)",
                    names.join(", ")
                ))
            }
            _ => None,
        }
    }

    /// The text a person wrote, as far as this row says (for an edit's "before").
    pub fn text(&self) -> &str {
        match self {
            Self::Message(m) | Self::Edited { new: m, .. } => m.body(),
            _ => "",
        }
    }
}

#[cfg(test)]
mod tests {
    use matrix_sdk::ruma::events::room::message::TextMessageEventContent;

    use super::*;

    fn text(s: &str) -> MessageType {
        MessageType::Text(TextMessageEventContent::plain(s))
    }

    #[test]
    fn every_kind_reads_back_as_written() {
        let rows = [
            Stored::Message(text("hi")),
            Stored::Edited {
                old: "hi".into(),
                new: text("hello"),
            },
            Stored::Removed {
                files: vec![WorkspacePath::new("surfaces/matrix/u/r/inbox/a.txt").unwrap()],
            },
            Stored::Encrypted {
                json: r#"{"type":"m.room.encrypted"}"#.into(),
            },
        ];
        for row in rows {
            let json = row.to_json().unwrap();
            assert_eq!(Stored::load(Some(row.kind()), Some(json)), Some(row));
        }
    }

    #[test]
    fn what_cannot_be_read_says_why() {
        let cases = [
            (
                Some("poll"),
                r#"{"question":"?"}"#,
                "unknown row kind \"poll\"",
            ),
            (Some("message"), "{not json", "content does not decode"),
            (Some("edit"), r#"{"old":"x"}"#, "content does not decode"),
        ];
        for (kind, content, why) in cases {
            match Stored::load(kind, Some(content.into())) {
                Some(Stored::Unknown { why: got, .. }) => assert!(got.starts_with(why), "{got}"),
                other => panic!("{kind:?} {content}: {other:?}"),
            }
        }
        assert_eq!(Stored::load(Some("message"), None), None);
        // A row of a journal from before kinds existed is a message.
        assert_eq!(
            Stored::load(None, Some(r#"{"msgtype":"m.text","body":"hi"}"#.into())),
            Some(Stored::Message(text("hi")))
        );
    }
}
