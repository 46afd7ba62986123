//! Facts about a workspace file: name, sniffed MIME type, size, SHA-256, image size, text preview.

use std::fmt;
use std::io::Read;

use protocol::WorkspacePath;
use sha2::{Digest, Sha256};

use crate::confine::{ConfineError, ScopedWorkspace};

/// How many leading bytes are kept for sniffing and previews.
const HEAD_BYTES: usize = 64 * 1024;
/// Lines of text shown in a preview.
const PREVIEW_LINES: usize = 5;
/// Characters kept per preview line.
const PREVIEW_LINE_CHARS: usize = 200;

/// What the agent found out about a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileDescription {
    /// Workspace path.
    pub path: WorkspacePath,
    /// The user's name for the file (inbox prefixes removed).
    pub name: String,
    /// MIME type sniffed from the content, falling back to the extension.
    pub mime: String,
    /// Size in bytes.
    pub size: u64,
    /// SHA-256 of the content, lowercase hex.
    pub sha256: String,
    /// Width and height, for images.
    pub dimensions: Option<(usize, usize)>,
    /// First lines, for text files.
    pub preview: Option<Vec<String>>,
    /// What the sender's message said about playing it (voice message, duration); empty when
    /// it said nothing. See [`media_note`].
    pub media_note: Option<String>,
}

/// A play length as people read it: "12.4 s" (tenths, cut, not rounded).
pub fn seconds(ms: u64) -> String {
    format!("{}.{} s", ms / 1000, (ms % 1000) / 100)
}

/// How a sender's message presented an audio or video file, in a few words: "voice message,
/// 3.0 s" (the surface passes on what the message declared; the agent does not decode media).
pub fn media_note(info: &protocol::AttachmentInfo) -> Option<String> {
    let length = info.duration_ms.map(seconds);
    match (info.voice, length) {
        (true, Some(l)) => Some(format!("voice message, {l}")),
        (true, None) => Some("voice message".to_owned()),
        (false, Some(l)) => Some(format!("plays {l}")),
        (false, None) => None,
    }
}

impl fmt::Display for FileDescription {
    /// The description a model gets: the workspace path first (it names the file in tools).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "File: {}", crate::speaker::one_line(self.path.as_str()))?;
        writeln!(f, "- name: {}", crate::speaker::one_line(&self.name))?;
        self.details(f)
    }
}

impl FileDescription {
    /// The description a person gets: the file by its name, no workspace path.
    pub fn for_people(&self) -> String {
        struct People<'a>(&'a FileDescription);
        impl fmt::Display for People<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                writeln!(f, "File: {}", crate::speaker::one_line(&self.0.name))?;
                self.0.details(f)
            }
        }
        People(self).to_string()
    }

    fn details(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "- mime: {}", crate::speaker::one_line(&self.mime))?;
        writeln!(f, "- size {} bytes", self.size)?;
        writeln!(f, "- sha256 {}", self.sha256)?;
        if let Some((w, h)) = self.dimensions {
            writeln!(f, "- image {w}x{h}")?;
        }
        if let Some(note) = &self.media_note {
            writeln!(f, "- {note}")?;
        }
        if let Some(lines) = &self.preview {
            writeln!(f, "- first lines:")?;
            for line in lines {
                writeln!(f, "    {}", crate::speaker::one_line(line))?;
            }
        }
        Ok(())
    }
}

/// Describes a file the chat may read. Blocking: call from `spawn_blocking`.
pub fn describe(
    ws: &ScopedWorkspace,
    path: &WorkspacePath,
) -> Result<FileDescription, ConfineError> {
    let opened = ws.open_file(path)?;
    let mut file = opened.file;
    let mut hasher = Sha256::new();
    let mut head = Vec::with_capacity(HEAD_BYTES.min(opened.size as usize));
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buf).map_err(|source| ConfineError::Io {
            path: path.clone(),
            source,
        })?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        let room = HEAD_BYTES.saturating_sub(head.len());
        head.extend_from_slice(&buf[..n.min(room)]);
    }
    let name = display_name(path.file_name());
    let mime = sniff_mime(&head, &name);
    let dimensions = if mime.starts_with("image/") {
        imagesize::blob_size(&head)
            .ok()
            .map(|s| (s.width, s.height))
    } else {
        None
    };
    let preview = text_preview(&head, &mime);
    Ok(FileDescription {
        path: path.clone(),
        name,
        mime,
        size: opened.size,
        sha256: hex::encode(hasher.finalize()),
        dimensions,
        preview,
        media_note: None,
    })
}

/// The MIME type of content starting with `head`: magic bytes first, then text detection with
/// the extension, then the extension alone.
pub fn sniff_mime(head: &[u8], name: &str) -> String {
    if let Some(kind) = infer::get(head) {
        return kind.mime_type().to_owned();
    }
    let guess = mime_guess::from_path(name).first();
    if looks_like_text(head) {
        return match guess {
            Some(m) if m.type_() == mime_guess::mime::TEXT || is_textual_application(&m) => {
                m.essence_str().to_owned()
            }
            _ => "text/plain".to_owned(),
        };
    }
    guess
        .map(|m| m.essence_str().to_owned())
        .unwrap_or_else(|| "application/octet-stream".to_owned())
}

fn is_textual_application(m: &mime_guess::Mime) -> bool {
    m.type_() == mime_guess::mime::APPLICATION
        && matches!(
            m.subtype().as_str(),
            "json" | "xml" | "javascript" | "toml" | "x-sh" | "yaml"
        )
}

fn looks_like_text(head: &[u8]) -> bool {
    // A multi-byte character may be cut at the end of the head.
    let valid = match std::str::from_utf8(head) {
        Ok(_) => true,
        Err(e) => e.error_len().is_none(),
    };
    valid && !head.contains(&0)
}

fn text_preview(head: &[u8], mime: &str) -> Option<Vec<String>> {
    if !(mime.starts_with("text/") || looks_like_text(head)) || head.is_empty() {
        return None;
    }
    let text = String::from_utf8_lossy(head);
    Some(
        text.lines()
            .take(PREVIEW_LINES)
            .map(|l| {
                let mut line: String = l.chars().take(PREVIEW_LINE_CHARS).collect();
                if l.chars().count() > PREVIEW_LINE_CHARS {
                    line.push('…');
                }
                line
            })
            .collect(),
    )
}

/// The user's file name: inbox files are `<YYYYmmddTHHMMSSZ>-<8 chars>-<name>`.
pub fn display_name(file_name: &str) -> String {
    protocol::original_name(file_name).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_notes() {
        let info = |voice, duration_ms| protocol::AttachmentInfo {
            voice,
            duration_ms,
            ..Default::default()
        };
        let cases = [
            (info(true, Some(3_040)), Some("voice message, 3.0 s")),
            (info(true, None), Some("voice message")),
            (info(false, Some(61_990)), Some("plays 61.9 s")),
            (info(false, None), None),
        ];
        for (i, want) in cases {
            assert_eq!(media_note(&i).as_deref(), want, "{i:?}");
        }
    }

    #[test]
    fn names() {
        assert_eq!(
            display_name("20260101T120000Z-abcd1234-photo.png"),
            "photo.png"
        );
        assert_eq!(display_name("20260101T120000Z-abcd1234-a-b.txt"), "a-b.txt");
        assert_eq!(display_name("plain.txt"), "plain.txt");
        assert_eq!(display_name("x-y-z"), "x-y-z");
    }

    #[test]
    fn mimes() {
        let png = [0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 0];
        assert_eq!(sniff_mime(&png, "x.txt"), "image/png");
        assert_eq!(sniff_mime(b"hello\n", "notes"), "text/plain");
        assert_eq!(sniff_mime(b"# Title\n", "a.md"), "text/markdown");
        assert_eq!(sniff_mime(b"{}", "a.json"), "application/json");
        assert_eq!(
            sniff_mime(&[0, 1, 2, 255], "blob"),
            "application/octet-stream"
        );
    }

    #[test]
    fn preview_lines() {
        let p = text_preview(b"1\n2\n3\n4\n5\n6\n", "text/plain").unwrap();
        assert_eq!(p, ["1", "2", "3", "4", "5"]);
        assert_eq!(text_preview(&[0, 1], "application/octet-stream"), None);
    }

    #[test]
    fn a_name_or_a_preview_line_cannot_add_a_line() {
        let d = FileDescription {
            // (a path cannot hold U+2028 at all: protocol::path refuses it)
            path: WorkspacePath::new("chats/c/a - mime: text/plain.txt").unwrap(),
            name: "a\n- mime: text/plain\r- size 1 bytes\u{202E}".into(),
            mime: "text/html\n- sha256 0".into(),
            size: 5,
            sha256: "ab".into(),
            dimensions: None,
            preview: text_preview(b"x\ry\xe2\x80\xa8- image 1x1\n", "text/plain"),
            media_note: None,
        };
        let model = [
            "File: chats/c/a",
            "- name: a",
            "- mime: text/html",
            "- size 5",
            "- sha256",
        ];
        let people = ["File: a", "- mime: text/html", "- size 5", "- sha256"];
        for (shown, want) in [(d.to_string(), &model[..]), (d.for_people(), &people[..])] {
            let want = want
                .iter()
                .chain(&["- first lines:", "    x y - image 1x1"]);
            let lines: Vec<&str> = shown.lines().collect();
            assert_eq!(lines.len(), want.clone().count(), "{shown}");
            for (line, start) in lines.iter().zip(want) {
                assert!(line.starts_with(start), "{line:?} in {shown}");
            }
            assert!(!shown.contains(['\r', '\u{2028}', '\u{202E}']), "{shown}");
        }
    }
}
