//! `WorkspacePath`: a relative path inside the shared workspace that cannot name anything outside it.
//!
//! Validation is purely lexical and happens at construction (including deserialization), so a
//! value of this type is always safe to *join* onto a root. It is not a substitute for opening
//! beneath a directory handle: symlinks inside the workspace are the opener's business.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Longest accepted path, in bytes (well under Linux `PATH_MAX`).
pub const MAX_PATH_BYTES: usize = 1024;
/// Longest accepted single component, in bytes (Linux `NAME_MAX`).
pub const MAX_COMPONENT_BYTES: usize = 255;
/// Deepest accepted nesting.
pub const MAX_DEPTH: usize = 32;

/// A normalized, relative, UTF-8 path below the workspace root.
///
/// Invariants (checked by [`WorkspacePath::new`] and on deserialization):
/// not empty, no leading `/`, components separated by single `/`, no empty, `.` or `..`
/// component, no NUL, backslash or other control character, at most [`MAX_PATH_BYTES`]
/// bytes, [`MAX_COMPONENT_BYTES`] per component and [`MAX_DEPTH`] components.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct WorkspacePath(String);

/// Why a string is not a [`WorkspacePath`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkspacePathError {
    /// The string was empty.
    #[error("path is empty")]
    Empty,
    /// The path starts with `/`.
    #[error("path must be relative to the workspace, not absolute")]
    Absolute,
    /// The path is longer than [`MAX_PATH_BYTES`].
    #[error("path is longer than {MAX_PATH_BYTES} bytes")]
    TooLong,
    /// The path has more than [`MAX_DEPTH`] components.
    #[error("path is nested deeper than {MAX_DEPTH} levels")]
    TooDeep,
    /// A component is longer than [`MAX_COMPONENT_BYTES`].
    #[error("a path component is longer than {MAX_COMPONENT_BYTES} bytes")]
    ComponentTooLong,
    /// `a//b` or a trailing `/`.
    #[error("path has an empty component (`//` or a trailing `/`)")]
    EmptyComponent,
    /// A `.` component.
    #[error("path has a `.` component")]
    CurrentDir,
    /// A `..` component.
    #[error("path has a `..` component")]
    ParentDir,
    /// A backslash, which other systems treat as a separator.
    #[error("path contains a backslash")]
    Backslash,
    /// NUL, another control character, a line or paragraph separator (U+2028, U+2029: a line
    /// break to anything that shows the path), or a text-direction mark (which makes `gnp.exe`
    /// display as `exe.png`).
    #[error("path contains a NUL, control, line-separator or text-direction character")]
    ControlChar,
}

impl WorkspacePath {
    /// Validates `s` as a workspace path.
    pub fn new(s: impl Into<String>) -> Result<Self, WorkspacePathError> {
        let s = s.into();
        validate(&s)?;
        Ok(Self(s))
    }

    /// The path as it travels on the wire.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The path's components, each non-empty and neither `.` nor `..`.
    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }

    /// The last component.
    pub fn file_name(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or(&self.0)
    }

    /// The parent path, `None` for a single-component path.
    pub fn parent(&self) -> Option<WorkspacePath> {
        self.0.rsplit_once('/').map(|(p, _)| Self(p.to_owned()))
    }

    /// Appends a relative path (which may have several components), validating the result.
    pub fn join(&self, rest: &str) -> Result<WorkspacePath, WorkspacePathError> {
        Self::new(format!("{}/{}", self.0, rest))
    }

    /// Whether `self` is `prefix` or lies below it (component-wise, not string-wise).
    pub fn starts_with(&self, prefix: &WorkspacePath) -> bool {
        self.0 == prefix.0
            || (self.0.starts_with(&prefix.0)
                && self.0.as_bytes().get(prefix.0.len()) == Some(&b'/'))
    }

    /// `root` joined with this path. Lexically this can never leave `root`.
    pub fn to_path_under(&self, root: &Path) -> PathBuf {
        root.join(&self.0)
    }

    /// This path as a relative `Path` (for `cap-std` style openers).
    pub fn as_path(&self) -> &Path {
        Path::new(&self.0)
    }
}

fn validate(s: &str) -> Result<(), WorkspacePathError> {
    use WorkspacePathError as E;
    if s.is_empty() {
        return Err(E::Empty);
    }
    if s.starts_with('/') {
        return Err(E::Absolute);
    }
    if s.len() > MAX_PATH_BYTES {
        return Err(E::TooLong);
    }
    if s.contains('\\') {
        return Err(E::Backslash);
    }
    if s.chars()
        .any(|c| c.is_control() || is_line_separator(c) || is_direction_mark(c))
    {
        return Err(E::ControlChar);
    }
    let mut depth = 0;
    for component in s.split('/') {
        depth += 1;
        match component {
            "" => return Err(E::EmptyComponent),
            "." => return Err(E::CurrentDir),
            ".." => return Err(E::ParentDir),
            c if c.len() > MAX_COMPONENT_BYTES => return Err(E::ComponentTooLong),
            _ => {}
        }
    }
    if depth > MAX_DEPTH {
        return Err(E::TooDeep);
    }
    Ok(())
}

impl TryFrom<String> for WorkspacePath {
    type Error = WorkspacePathError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

impl TryFrom<&str> for WorkspacePath {
    type Error = WorkspacePathError;
    fn try_from(s: &str) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

impl std::str::FromStr for WorkspacePath {
    type Err = WorkspacePathError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl From<WorkspacePath> for String {
    fn from(p: WorkspacePath) -> String {
        p.0
    }
}

impl AsRef<str> for WorkspacePath {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for WorkspacePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for WorkspacePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WorkspacePath({:?})", self.0)
    }
}

impl schemars::JsonSchema for WorkspacePath {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "WorkspacePath".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "A path relative to the workspace root, e.g. `chats/<chat>/notes.txt`. \
                            No leading `/`, no `.` or `..` components.",
            "minLength": 1,
            "maxLength": MAX_PATH_BYTES,
        })
    }
}

/// U+2028 and U+2029: not control characters by category, but a new line to JavaScript, to
/// Element and to a model reading the path.
fn is_line_separator(c: char) -> bool {
    matches!(c, '\u{2028}' | '\u{2029}')
}

/// Marks that change how text around them is displayed (bidi embeddings, overrides, isolates).
fn is_direction_mark(c: char) -> bool {
    matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use std::path::Component;

    use proptest::prelude::*;

    use super::*;
    use WorkspacePathError as E;

    #[test]
    fn accepts_and_refuses_table() {
        let long_component = "a".repeat(256);
        let long_path = vec!["abcdefgh"; 120].join("/");
        let deep = vec!["a"; 33].join("/");
        let cases: &[(&str, Result<(), E>)] = &[
            ("a", Ok(())),
            ("chats/c1/notes.txt", Ok(())),
            ("surfaces/matrix/%40a%3Ab/r/inbox/2026-x-photo.jpg", Ok(())),
            ("..hidden/...", Ok(())),
            ("ünïcödé/名前.txt", Ok(())),
            ("", Err(E::Empty)),
            ("/etc/passwd", Err(E::Absolute)),
            ("//x", Err(E::Absolute)),
            ("a/../../etc", Err(E::ParentDir)),
            ("..", Err(E::ParentDir)),
            ("a/..", Err(E::ParentDir)),
            (".", Err(E::CurrentDir)),
            ("./a", Err(E::CurrentDir)),
            ("a//b", Err(E::EmptyComponent)),
            ("a/", Err(E::EmptyComponent)),
            ("a\\..\\b", Err(E::Backslash)),
            ("..\\etc", Err(E::Backslash)),
            ("a\0b", Err(E::ControlChar)),
            ("a\nb", Err(E::ControlChar)),
            ("a\u{7f}", Err(E::ControlChar)),
            ("chats/c/\u{202e}gnp.exe", Err(E::ControlChar)),
            ("a\u{2066}b", Err(E::ControlChar)),
            ("notes\u{2028}attachment: x", Err(E::ControlChar)),
            ("a\u{2029}b", Err(E::ControlChar)),
            ("a\u{85}b", Err(E::ControlChar)),
            (&long_component, Err(E::ComponentTooLong)),
            (&long_path, Err(E::TooLong)),
            (&deep, Err(E::TooDeep)),
        ];
        for (input, expected) in cases {
            assert_eq!(
                WorkspacePath::new(*input).map(|_| ()),
                *expected,
                "input {input:?}"
            );
        }
    }

    #[test]
    fn deserialization_refuses_with_reason() {
        let err = serde_json::from_str::<WorkspacePath>(r#""../secret""#).unwrap_err();
        assert!(err.to_string().contains("`..`"), "{err}");
        let ok: WorkspacePath = serde_json::from_str(r#""chats/x/a.txt""#).unwrap();
        assert_eq!(serde_json::to_string(&ok).unwrap(), r#""chats/x/a.txt""#);
    }

    #[test]
    fn helpers() {
        let p = WorkspacePath::new("chats/c1/out/a.txt").unwrap();
        assert_eq!(p.file_name(), "a.txt");
        assert_eq!(p.parent().unwrap().as_str(), "chats/c1/out");
        assert!(p.starts_with(&WorkspacePath::new("chats/c1").unwrap()));
        assert!(!p.starts_with(&WorkspacePath::new("chats/c").unwrap()));
        assert!(p.starts_with(&p));
        assert_eq!(WorkspacePath::new("a").unwrap().parent(), None);
        assert_eq!(p.join("b").unwrap().as_str(), "chats/c1/out/a.txt/b");
        assert_eq!(p.join("").unwrap_err(), E::EmptyComponent);
        assert_eq!(
            WorkspacePath::new("chats").unwrap().join("..").unwrap_err(),
            E::ParentDir
        );
    }

    /// Lexically resolves `p` under a fake root the way the kernel would without symlinks,
    /// returning `None` if it ever steps above the root.
    fn stays_under_root(p: &Path) -> bool {
        let mut depth: i64 = 0;
        for c in p.components() {
            match c {
                Component::Normal(_) => depth += 1,
                Component::CurDir => {}
                Component::ParentDir => {
                    depth -= 1;
                    if depth < 0 {
                        return false;
                    }
                }
                Component::RootDir | Component::Prefix(_) => return false,
            }
        }
        true
    }

    fn hostile() -> impl Strategy<Value = String> {
        let atoms = prop::sample::select(vec![
            "a", "b", ".", "..", "/", "\\", "\0", "~", ":", "C:", "%2e", "\u{202e}", "é", " ",
            "\n", "...", "//",
        ]);
        prop::collection::vec(atoms, 0..12).prop_map(|v| v.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        #[test]
        fn accepted_paths_never_leave_root(s in hostile()) {
            if let Ok(p) = WorkspacePath::new(s.clone()) {
                let rel = p.as_path();
                prop_assert!(rel.is_relative());
                prop_assert!(stays_under_root(rel), "{s:?} escapes");
                let joined = p.to_path_under(Path::new("/ws"));
                prop_assert!(joined.starts_with("/ws"));
                prop_assert!(stays_under_root(joined.strip_prefix("/ws").unwrap()));
                // Round-trips through JSON unchanged.
                let json = serde_json::to_string(&p).unwrap();
                prop_assert_eq!(serde_json::from_str::<WorkspacePath>(&json).unwrap(), p);
            }
        }

        #[test]
        fn arbitrary_strings_never_panic_and_accepted_ones_are_normal(s in any::<String>()) {
            if let Ok(p) = WorkspacePath::new(s) {
                for c in p.as_path().components() {
                    prop_assert!(matches!(c, Component::Normal(_)));
                }
            }
        }
    }
}
