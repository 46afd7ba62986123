//! The workspace layout both processes agree on, and the ids that name its folders.
//!
//! ```text
//! surfaces/matrix/<user>/<room>/inbox/    files users sent (written by the surface)
//! surfaces/matrix/<user>/<room>/outbox/   files dropped here are posted to the room
//! chats/<chat_id>/                        the agent's own area for a chat
//! ```

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::WorkspacePath;

/// Folder holding everything the Matrix surface owns.
pub fn surface_root() -> WorkspacePath {
    WorkspacePath::new("surfaces/matrix").expect("constant is valid")
}

/// `surfaces/matrix/<user>/<room>`: the folder of one user's files in one room.
pub fn room_dir(user_id: &str, room_id: &str) -> WorkspacePath {
    surface_root()
        .join(&format!(
            "{}/{}",
            matrix_id_component(user_id),
            matrix_id_component(room_id)
        ))
        .expect("components are valid")
}

/// `chats/<chat_id>`: the agent's own area for a chat.
pub fn chat_dir(chat: &ChatId) -> WorkspacePath {
    WorkspacePath::new(format!("chats/{chat}")).expect("chat ids are valid components")
}

/// Longest component [`matrix_id_component`] produces before switching to a hashed tail.
const MAX_READABLE_COMPONENT: usize = 200;

/// Turns a Matrix id (user, room, event) into one path component.
///
/// Injective: ASCII letters, digits and `-_.@!+=` stay as they are, every other byte becomes
/// `%XX` (including `%` itself), and a leading `.` is escaped so the result is never hidden,
/// `.` or `..`. Results longer than 200 bytes keep a readable prefix and end in `~` plus a
/// SHA-256 of the whole id; `~` never appears otherwise, so the two forms cannot collide.
pub fn matrix_id_component(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for (i, b) in id.bytes().enumerate() {
        let keep = b.is_ascii_alphanumeric()
            || matches!(b, b'-' | b'_' | b'@' | b'!' | b'+' | b'=')
            || (b == b'.' && i > 0);
        if keep {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if out.is_empty() || out.len() > MAX_READABLE_COMPONENT {
        let digest = hex::encode(Sha256::digest(id.as_bytes()));
        out.truncate(150);
        // `%XX` escapes are 3 bytes: do not leave half of one behind.
        if let Some(pos) = out
            .get(out.len().saturating_sub(2)..)
            .and_then(|t| t.find('%'))
        {
            out.truncate(out.len() - 2 + pos);
        }
        out.push('~');
        out.push_str(&digest[..32]);
    }
    out
}

/// The name a user gave a file the surface stored in an inbox as
/// `<YYYYmmddTHHMMSSZ>-<8 unique>-<name>`: `<name>`. Any other name is returned as it is.
pub fn original_name(file_name: &str) -> &str {
    let mut parts = file_name.splitn(3, '-');
    if let (Some(ts), Some(unique), Some(rest)) = (parts.next(), parts.next(), parts.next())
        && ts.len() == 16
        && ts.ends_with('Z')
        && ts.as_bytes().get(8) == Some(&b'T')
        && ts
            .bytes()
            .enumerate()
            .all(|(i, b)| i == 8 || i == 15 || b.is_ascii_digit())
        && unique.len() == 8
        && unique.bytes().all(|b| b.is_ascii_alphanumeric())
        && !rest.is_empty()
    {
        return rest;
    }
    file_name
}

/// An opaque, URL- and filesystem-safe key for one conversation (a room, or a thread in it).
///
/// Only ASCII letters, digits, `-`, `_` and `.`; 1 to 128 bytes; never starts with `.`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ChatId(String);

/// Why a string is not a [`ChatId`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("chat id must be 1 to 128 of [A-Za-z0-9._-] and not start with `.`")]
pub struct ChatIdError;

impl ChatId {
    /// Validates `s` as a chat id.
    pub fn new(s: impl Into<String>) -> Result<Self, ChatIdError> {
        let s = s.into();
        let ok = !s.is_empty()
            && s.len() <= 128
            && !s.starts_with('.')
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if ok { Ok(Self(s)) } else { Err(ChatIdError) }
    }

    /// The chat id of a room, or of a thread in it: a readable slug of the room id plus a hash
    /// of the room id and thread root, so distinct conversations never share an id.
    pub fn for_conversation(room_id: &str, thread_root: Option<&str>) -> Self {
        let local = room_id.trim_start_matches('!');
        let local = local.split(':').next().unwrap_or_default();
        let slug: String = local
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .take(24)
            .collect();
        let mut hasher = Sha256::new();
        if room_id.contains('\0') {
            // Never a real room id, but `room ‖ NUL ‖ thread` would then be ambiguous: such
            // ids get a framing of their own, set apart by a byte UTF-8 never has. Real ids
            // keep the plain framing, so existing chat ids do not change.
            hasher.update([0xFF]);
            hasher.update((room_id.len() as u64).to_be_bytes());
        }
        hasher.update(room_id.as_bytes());
        if let Some(root) = thread_root {
            hasher.update(b"\0");
            hasher.update(root.as_bytes());
        }
        let digest = hex::encode(hasher.finalize());
        let kind = if thread_root.is_some() { "t" } else { "r" };
        let id = if slug.is_empty() {
            format!("{kind}-{}", &digest[..20])
        } else {
            format!("{slug}-{kind}-{}", &digest[..20])
        };
        Self(id)
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for ChatId {
    type Error = ChatIdError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

impl From<ChatId> for String {
    fn from(c: ChatId) -> String {
        c.0
    }
}

impl fmt::Display for ChatId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ChatId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChatId({})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn components_are_readable() {
        let cases = [
            ("@alice:example.org", "@alice%3Aexample.org"),
            ("!AbC:hs.local", "!AbC%3Ahs.local"),
            ("..", "%2E."),
            (".hidden", "%2Ehidden"),
            ("a/b", "a%2Fb"),
            ("50%", "50%25"),
            ("é", "%C3%A9"),
        ];
        for (input, expected) in cases {
            assert_eq!(matrix_id_component(input), expected, "{input:?}");
        }
    }

    #[test]
    fn long_and_empty_ids_are_hashed_and_still_valid() {
        let long = format!("@{}:example.org", "x".repeat(300));
        let c = matrix_id_component(&long);
        assert!(c.len() <= 200, "{}", c.len());
        assert!(c.contains('~'));
        WorkspacePath::new(c).unwrap();
        let escaped_long = "/".repeat(100);
        let c = matrix_id_component(&escaped_long);
        assert!(c.len() <= 200);
        assert!(
            c.split('~').next().unwrap().len().is_multiple_of(3),
            "no half escape: {c}"
        );
        assert!(!matrix_id_component("").is_empty());
    }

    #[test]
    fn room_dir_layout() {
        assert_eq!(
            room_dir("@a:b", "!r:b").as_str(),
            "surfaces/matrix/@a%3Ab/!r%3Ab"
        );
    }

    #[test]
    fn chat_ids() {
        let a = ChatId::for_conversation("!abcDEF:example.org", None);
        let t = ChatId::for_conversation("!abcDEF:example.org", Some("$root"));
        assert!(a.as_str().starts_with("abcDEF-r-"), "{a}");
        assert!(t.as_str().starts_with("abcDEF-t-"), "{t}");
        assert_ne!(a, t);
        ChatId::new(a.as_str()).unwrap();
        assert!(ChatId::new("../x").is_err());
        assert!(ChatId::new(".x").is_err());
        assert!(ChatId::new("").is_err());
        assert!(ChatId::new("a".repeat(129)).is_err());
        assert!(serde_json::from_str::<ChatId>(r#""a/b""#).is_err());
    }

    #[test]
    fn chat_ids_of_odd_rooms_do_not_collide() {
        // Found by the fuzz target: NUL inside a room id used to blur where the thread began.
        let a = ChatId::for_conversation("", Some("\0\0"));
        let b = ChatId::for_conversation("\0\0", Some(""));
        assert_ne!(a, b);
        // Real ids keep the id they always had.
        assert_eq!(
            ChatId::for_conversation("!room:example.org", None).as_str(),
            "room-r-03cbb71e7ec22cfce187"
        );
        assert_eq!(
            ChatId::for_conversation("!room:example.org", Some("$root")).as_str(),
            "room-t-86a870af0f65e3aef316"
        );
    }

    #[test]
    fn original_names() {
        let cases = [
            ("20261122T101010Z-UufhGaNJ-gradient.png", "gradient.png"),
            ("20261122T101010Z-UufhGaNJ-a-b-c.txt", "a-b-c.txt"),
            ("20261122T101010Z-UufhGaNJ-", "20261122T101010Z-UufhGaNJ-"),
            ("2026112xT101010Z-UufhGaNJ-x", "2026112xT101010Z-UufhGaNJ-x"),
            ("20261122T101010Z-Uufh-x", "20261122T101010Z-Uufh-x"),
            ("notes.txt", "notes.txt"),
        ];
        for (stored, original) in cases {
            assert_eq!(original_name(stored), original, "{stored}");
        }
    }

    proptest! {
        #[test]
        fn component_is_injective_and_safe(ids in prop::collection::vec(".{0,40}", 1..40)) {
            let mut seen: HashMap<String, String> = HashMap::new();
            for id in ids {
                let c = matrix_id_component(&id);
                prop_assert!(WorkspacePath::new(c.clone()).is_ok(), "{c:?}");
                prop_assert!(!c.contains('/'));
                if let Some(prev) = seen.insert(c.clone(), id.clone()) {
                    prop_assert_eq!(prev, id, "collision on {}", c);
                }
            }
        }

        #[test]
        fn chat_ids_are_always_valid(room in ".{0,300}", thread in proptest::option::of(".{0,50}")) {
            let id = ChatId::for_conversation(&room, thread.as_deref());
            prop_assert!(ChatId::new(id.as_str()).is_ok());
        }
    }
}
