//! Pictures in chat-completions messages: the current turn's pictures as `image_url` content
//! parts (prepared and cached by `perceive::images`), a note beside each one that was not
//! shown, and the same messages without pictures for a model that refuses them.

use std::collections::BTreeMap;

use protocol::WorkspacePath;
use serde_json::{Value, json};
use tracing::warn;

use crate::config::VisionMode;
use crate::confine::ScopedWorkspace;
use crate::perceive::{Perception, data_url};

/// What a picture's line says when the model does not see pictures.
pub const CANNOT_SEE: &str = "[picture not shown: this model cannot see pictures]";
/// What a picture's line says when the operator turned pictures off.
pub const NOT_SENT: &str = "[picture not shown: pictures are not sent to this model]";

/// The pictures of one message: the parts to attach, and a note per picture for its line.
#[derive(Debug, Default)]
pub struct Shown {
    /// `image_url` content parts, in the order of the pictures.
    pub parts: Vec<Value>,
    /// A note for each picture's line ("attached below", or why it is not).
    pub notes: BTreeMap<WorkspacePath, String>,
}

impl Shown {
    /// None of `pictures` shown: the model does not see pictures.
    pub fn withheld(pictures: &[&WorkspacePath], mode: VisionMode) -> Self {
        let note = if mode == VisionMode::Off {
            NOT_SENT
        } else {
            CANNOT_SEE
        };
        Self {
            parts: Vec::new(),
            notes: pictures
                .iter()
                .map(|p| ((*p).clone(), note.to_owned()))
                .collect(),
        }
    }
}

/// Prepares up to `max` of `pictures` (in order) and attaches them; each other one gets a note
/// saying why it is not shown.
///
/// `inode` gives the surface's inode number for a file it has just sent (it then opens at once).
pub async fn show(
    pictures: &[&WorkspacePath],
    max: usize,
    perception: &Perception,
    ws: &ScopedWorkspace,
    inode: &(dyn Fn(&WorkspacePath) -> Option<u64> + Sync),
) -> Shown {
    let mut shown = Shown::default();
    for path in pictures {
        let path = (*path).clone();
        if shown.parts.len() >= max {
            let note = format!(
                "[picture not attached: at most {max} per message; call view_image to see it]"
            );
            shown.notes.insert(path, note);
            continue;
        }
        match perception.images.prepare(ws, &path, inode(&path)).await {
            Ok(picture) => {
                shown.parts.push(json!({
                    "type": "image_url",
                    "image_url": { "url": data_url(&picture) },
                }));
                let note = format!(
                    "[picture attached below, {}x{}]",
                    picture.source_width, picture.source_height
                );
                shown.notes.insert(path, note);
            }
            Err(e) => {
                warn!(%path, error = %e, "picture not shown to the model");
                shown
                    .notes
                    .insert(path, format!("[picture not shown: {}]", reason(&e)));
            }
        }
    }
    shown
}

/// Why a picture could not be shown, without its path (the line names it already).
fn reason(e: &crate::perceive::ImageError) -> String {
    match e {
        crate::perceive::ImageError::NotShown { reason, .. } => reason.to_string(),
        crate::perceive::ImageError::Confine(c) if c.is_not_found() => "it is gone".to_owned(),
        crate::perceive::ImageError::Confine(_) => "it could not be read".to_owned(),
    }
}

/// A user message: plain text, or the text followed by the pictures as content parts.
pub fn user_message(text: String, shown: &Shown) -> Value {
    if shown.parts.is_empty() {
        return json!({ "role": "user", "content": text });
    }
    let mut content = vec![json!({ "type": "text", "text": text })];
    content.extend(shown.parts.iter().cloned());
    json!({ "role": "user", "content": content })
}

/// Whether any message carries a picture.
pub fn has_images(messages: &[Value]) -> bool {
    messages.iter().any(|m| {
        m.get("content")
            .and_then(Value::as_array)
            .is_some_and(|parts| parts.iter().any(is_image_part))
    })
}

fn is_image_part(part: &Value) -> bool {
    part.get("type").and_then(Value::as_str) == Some("image_url")
}

/// The messages without pictures: each message with parts becomes its text, the pictures
/// replaced by [`CANNOT_SEE`] where their notes said they were attached.
pub fn strip_images(messages: &mut [Value]) {
    for message in messages {
        let Some(parts) = message.get("content").and_then(Value::as_array) else {
            continue;
        };
        if !parts.iter().any(is_image_part) {
            continue;
        }
        let text: Vec<String> = parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .map(blind_note)
            .collect();
        message["content"] = Value::String(text.join("\n"));
    }
}

/// A message's text with its "attached below" notes turned into [`CANNOT_SEE`].
fn blind_note(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("[picture attached below") {
        out.push_str(&rest[..at]);
        let after = &rest[at..];
        let end = after.find(']').map_or(after.len(), |e| e + 1);
        out.push_str(CANNOT_SEE);
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(p: &str) -> WorkspacePath {
        WorkspacePath::new(p).unwrap()
    }

    #[test]
    fn a_message_with_pictures_has_parts_and_one_without_is_text() {
        let plain = user_message("hi".into(), &Shown::default());
        assert_eq!(plain, json!({"role": "user", "content": "hi"}));
        let shown = Shown {
            parts: vec![
                json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}),
            ],
            notes: BTreeMap::new(),
        };
        let with = user_message("look".into(), &shown);
        assert_eq!(with["content"][0], json!({"type": "text", "text": "look"}));
        assert_eq!(with["content"][1]["type"], "image_url");
        assert!(has_images(&[plain.clone(), with.clone()]));
        assert!(!has_images(&[plain]));
    }

    #[test]
    fn stripping_keeps_the_text_and_says_the_picture_was_not_seen() {
        let shown = Shown {
            parts: vec![json!({"type": "image_url", "image_url": {"url": "data:x"}})],
            notes: BTreeMap::new(),
        };
        let mut messages = vec![
            json!({"role": "system", "content": "s"}),
            user_message(
                "@a:x: what is this?\nattachment: p.jpg\n  [picture attached below, 40x30]".into(),
                &shown,
            ),
        ];
        strip_images(&mut messages);
        assert!(!has_images(&messages));
        assert_eq!(
            messages[1]["content"],
            format!("@a:x: what is this?\nattachment: p.jpg\n  {CANNOT_SEE}")
        );
        assert_eq!(messages[0]["content"], "s");
    }

    #[test]
    fn withheld_pictures_say_why() {
        let a = path("chats/c/a.png");
        let cases = [(VisionMode::Off, NOT_SENT), (VisionMode::Auto, CANNOT_SEE)];
        for (mode, want) in cases {
            let shown = Shown::withheld(&[&a], mode);
            assert!(shown.parts.is_empty());
            assert_eq!(shown.notes[&a], want);
        }
    }
}
