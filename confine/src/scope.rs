//! The rule of which workspace paths one chat may reach. Pure: it looks at names only; the
//! opener still refuses symlinks, special files and hard links on the way.

use protocol::{ChatId, WorkspacePath, chat_dir, matrix_id_component, surface_root};

/// Prefix of the temporary files downloads are written to before they are complete. A path
/// with such a component is never reachable, so no chat sees a partial file.
pub const PARTIAL_PREFIX: &str = ".partial-";

/// Whether any component of `path` is an in-progress download name (`.partial-*`).
pub fn is_partial(path: &WorkspacePath) -> bool {
    path.components().any(|c| c.starts_with(PARTIAL_PREFIX))
}

/// The part of the workspace one chat may reach: files below its own `chats/<chat_id>/`
/// (read and write) and below `surfaces/matrix/<any user>/<its room>/{inbox,outbox}/` (read).
/// Anything else, and any `.partial-*` name, is out of reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatScope {
    chat: ChatId,
    own: WorkspacePath,
    room_id: Option<String>,
    room_component: Option<String>,
}

/// The Matrix room id a [`ChatScope`] is made with, if known: converted from a `&str`, a
/// `String` or an `Option` of either, so the surface (which always knows the room) and the
/// agent (which learns it with the chat's first turn) build scopes the same way.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScopeRoom(Option<String>);

impl From<&str> for ScopeRoom {
    fn from(room_id: &str) -> Self {
        Self(Some(room_id.to_owned()))
    }
}

impl From<String> for ScopeRoom {
    fn from(room_id: String) -> Self {
        Self(Some(room_id))
    }
}

impl From<Option<&str>> for ScopeRoom {
    fn from(room_id: Option<&str>) -> Self {
        Self(room_id.map(str::to_owned))
    }
}

impl From<Option<String>> for ScopeRoom {
    fn from(room_id: Option<String>) -> Self {
        Self(room_id)
    }
}

impl ChatScope {
    /// The scope of `chat`, whose Matrix room is `room_id`. Without a room (the agent before
    /// the chat's first turn) only the chat's own folder is reachable.
    pub fn new(chat: ChatId, room_id: impl Into<ScopeRoom>) -> Self {
        let ScopeRoom(room_id) = room_id.into();
        Self {
            own: chat_dir(&chat),
            room_component: room_id.as_deref().map(matrix_id_component),
            room_id,
            chat,
        }
    }

    /// The chat.
    pub fn chat(&self) -> &ChatId {
        &self.chat
    }

    /// The chat's Matrix room id, if known.
    pub fn room_id(&self) -> Option<&str> {
        self.room_id.as_deref()
    }

    /// `chats/<chat_id>`: the chat's own folder.
    pub fn own_dir(&self) -> &WorkspacePath {
        &self.own
    }

    /// The folder component of the chat's room (`protocol::matrix_id_component`), if known.
    pub fn room_component(&self) -> Option<&str> {
        self.room_component.as_deref()
    }

    /// Whether the chat may read (or send) `path`.
    pub fn may_read(&self, path: &WorkspacePath) -> bool {
        !is_partial(path) && (self.is_own(path) || self.is_in_room_box(path))
    }

    /// Whether the chat may write `path`: only below its own folder.
    pub fn may_write(&self, path: &WorkspacePath) -> bool {
        !is_partial(path) && self.is_own(path)
    }

    /// Strictly below `chats/<chat_id>/` (the folder itself is not a file).
    fn is_own(&self, path: &WorkspacePath) -> bool {
        path.starts_with(&self.own) && path != &self.own
    }

    /// Below `surfaces/matrix/<user>/<room>/inbox/` or `.../outbox/` of this chat's room, for
    /// any user (each sender has a folder per room).
    fn is_in_room_box(&self, path: &WorkspacePath) -> bool {
        let Some(room) = self.room_component.as_deref() else {
            return false;
        };
        let root = surface_root();
        if !path.starts_with(&root) {
            return false;
        }
        let rest: Vec<&str> = path.components().skip(root.components().count()).collect();
        matches!(rest.as_slice(), [_user, r, "inbox" | "outbox", _, ..] if *r == room)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use protocol::room_dir;

    use super::*;

    const USER: &str = "@alice:example.org";
    const ROOM: &str = "!room:example.org";
    const OTHER_ROOM: &str = "!other:example.org";

    fn p(s: &str) -> WorkspacePath {
        WorkspacePath::new(s).unwrap()
    }

    fn scope() -> ChatScope {
        ChatScope::new(ChatId::for_conversation(ROOM, None), ROOM)
    }

    #[test]
    fn reach_table() {
        let s = scope();
        let own = chat_dir(s.chat()).to_string();
        let other_chat = chat_dir(&ChatId::for_conversation(OTHER_ROOM, None)).to_string();
        let room = room_dir(USER, ROOM).to_string();
        let bobs_room = room_dir("@bob:example.org", ROOM).to_string();
        let other_room = room_dir(USER, OTHER_ROOM).to_string();
        let root = surface_root().to_string();
        // (path, may read, may write)
        let cases = [
            (format!("{own}/a.txt"), true, true),
            (format!("{own}/sub/a.txt"), true, true),
            (format!("{room}/inbox/f.png"), true, false),
            (format!("{room}/inbox/sub/f.png"), true, false),
            (format!("{bobs_room}/outbox/f.png"), true, false),
            (format!("{room}/outbox/.sent/f.png"), true, false),
            // Folders themselves are not files.
            (own.clone(), false, false),
            (format!("{room}/inbox"), false, false),
            // A longer chat id that starts with this one's.
            (format!("{own}d/a.txt"), false, false),
            (format!("{other_chat}/a.txt"), false, false),
            (format!("{room}/secret.txt"), false, false),
            (format!("{room}/other/f"), false, false),
            (format!("{other_room}/inbox/f.png"), false, false),
            (format!("{root}/.sentinel/x"), false, false),
            ("chats/.sentinel/x".to_owned(), false, false),
            ("secret.txt".to_owned(), false, false),
            ("etc/passwd".to_owned(), false, false),
            // In-progress downloads are out of reach wherever they are.
            (format!("{room}/inbox/.partial-abcdef"), false, false),
            (format!("{own}/.partial-x"), false, false),
            (format!("{own}/.partial-x/a.txt"), false, false),
            // Other dotfiles are the chat's to use.
            (format!("{own}/.notes"), true, true),
        ];
        for (path, read, write) in cases {
            assert_eq!(s.may_read(&p(&path)), read, "read {path}");
            assert_eq!(s.may_write(&p(&path)), write, "write {path}");
        }
    }

    #[test]
    fn without_a_room_only_the_own_folder_is_reachable() {
        let s = ChatScope::new(ChatId::new("c").unwrap(), ScopeRoom::default());
        assert_eq!((s.room_id(), s.room_component()), (None, None));
        assert!(s.may_read(&p("chats/c/a.txt")));
        let inbox = room_dir(USER, ROOM).join("inbox/f").unwrap();
        assert!(!s.may_read(&inbox));
    }

    #[test]
    fn constructors_agree() {
        let chat = ChatId::for_conversation(ROOM, None);
        let from_string = ChatScope::new(chat.clone(), ROOM.to_owned());
        assert_eq!(from_string, ChatScope::new(chat.clone(), ROOM));
        assert_eq!(from_string, ChatScope::new(chat.clone(), Some(ROOM)));
        assert_eq!(
            from_string,
            ChatScope::new(chat.clone(), Some(ROOM.to_owned()))
        );
        assert_eq!(
            ChatScope::new(chat.clone(), ScopeRoom::default()),
            ChatScope::new(chat, None::<&str>)
        );
        assert_eq!(from_string.room_id(), Some(ROOM));
        assert_eq!(
            from_string.room_component(),
            Some(matrix_id_component(ROOM).as_str())
        );
    }

    fn hostile_path() -> impl Strategy<Value = String> {
        let atoms = prop::sample::select(vec![
            "chats".to_owned(),
            "surfaces".to_owned(),
            "matrix".to_owned(),
            "inbox".to_owned(),
            "outbox".to_owned(),
            "x.txt".to_owned(),
            ".partial-1".to_owned(),
            ".sent".to_owned(),
            ".sentinel".to_owned(),
            matrix_id_component(USER),
            matrix_id_component(ROOM),
            matrix_id_component(OTHER_ROOM),
            ChatId::for_conversation(ROOM, None).to_string(),
            ChatId::for_conversation(OTHER_ROOM, None).to_string(),
        ]);
        prop::collection::vec(atoms, 1..8).prop_map(|v| v.join("/"))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        #[test]
        fn reachable_paths_belong_to_the_chat(s in hostile_path()) {
            let scope = scope();
            let path = WorkspacePath::new(s).unwrap();
            let parts: Vec<&str> = path.components().collect();
            let own_chat = parts.len() >= 3
                && parts[0] == "chats"
                && parts[1] == scope.chat().as_str();
            let own_room = parts.len() >= 6
                && parts[..2] == ["surfaces", "matrix"]
                && parts[3] == matrix_id_component(ROOM)
                && matches!(parts[4], "inbox" | "outbox");
            let partial = parts.iter().any(|p| p.starts_with(PARTIAL_PREFIX));
            prop_assert_eq!(scope.may_read(&path), (own_chat || own_room) && !partial, "{}", path);
            prop_assert_eq!(scope.may_write(&path), own_chat && !partial, "{}", path);
        }
    }
}
