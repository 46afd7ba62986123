//! Bounded-time fuzzing (see `fuzzkit`) of what the protocol crate decides about hostile input:
//! the wire decoder, `WorkspacePath`, and the id-to-name functions the layout is built from.
//! Seeds: `tests/corpus/frames/`, `tests/corpus/paths.json`, `tests/corpus/ids.json`.

use std::collections::HashMap;
use std::path::{Component, Path};

use protocol::{
    ChatId, MAX_COMPONENT_BYTES, MAX_DEPTH, MAX_PATH_BYTES, WorkspacePath, matrix_id_component,
    room_dir, surface_root,
};

use crate::decode::decode_both;

fn corpus(rel: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/corpus")
        .join(rel)
}

/// Decoding never panics, and whatever decodes round-trips (checked in `decode_both`).
#[test]
fn fuzz_decoder() {
    let seeds = fuzzkit::seed_files(&corpus("frames"));
    fuzzkit::run("decoder", |u| {
        let bytes = fuzzkit::mutate_bytes(u, &seeds)?;
        decode_both(&bytes);
        Ok(())
    });
}

/// What `WorkspacePath` accepts can never leave the workspace: relative, no empty, `.` or `..`
/// component, no backslash, control or direction character, within the limits; under any root
/// it is made of plain components only. Decoding from JSON accepts exactly the same strings.
#[test]
fn fuzz_workspace_path() {
    let seeds = fuzzkit::seed_strings(&corpus("paths.json"));
    let root = Path::new("/workspace");
    let (mut accepted, mut refused) = (0u64, 0u64);
    fuzzkit::run("workspace_path", |u| {
        let s = fuzzkit::mutate_text(u, &seeds)?;
        let parsed = WorkspacePath::new(s.as_str());
        let decoded = serde_json::from_value::<WorkspacePath>(serde_json::Value::String(s.clone()));
        assert_eq!(parsed.is_ok(), decoded.is_ok(), "{s:?}");
        let Ok(p) = parsed else {
            refused += 1;
            return Ok(());
        };
        accepted += 1;
        assert_eq!(p.as_str(), s);
        assert!(s.len() <= MAX_PATH_BYTES && !s.starts_with('/') && !s.contains('\\'));
        assert!(!s.chars().any(char::is_control), "{s:?}");
        let components: Vec<&str> = p.components().collect();
        assert!(
            !components.is_empty() && components.len() <= MAX_DEPTH,
            "{s:?}"
        );
        for c in &components {
            assert!(!matches!(*c, "" | "." | ".."), "{s:?}");
            assert!(c.len() <= MAX_COMPONENT_BYTES, "{s:?}");
        }
        let under = p.to_path_under(root);
        assert!(under.starts_with(root), "{s:?}");
        let rest = under.strip_prefix(root).unwrap();
        assert!(
            rest.components().all(|c| matches!(c, Component::Normal(_))),
            "{s:?}"
        );
        if let Ok(child) = p.join("x") {
            assert!(child.starts_with(&p), "{s:?}");
        }
        Ok(())
    });
    assert!(
        accepted > 0 && refused > 0,
        "{accepted} accepted, {refused} refused"
    );
}

/// Ids become names without collisions: `matrix_id_component` is a valid, visible single
/// component and never gives two ids one name; `ChatId::for_conversation` is a valid chat id
/// and never gives two conversations one id; a user and room make a folder below the surface's.
#[test]
fn fuzz_ids() {
    let seeds = fuzzkit::seed_strings(&corpus("ids.json"));
    let mut names: HashMap<String, String> = HashMap::new();
    let mut chats: HashMap<ChatId, (String, Option<String>)> = HashMap::new();
    fuzzkit::run("ids", |u| {
        let id = fuzzkit::mutate_text(u, &seeds)?;
        let name = matrix_id_component(&id);
        assert_eq!(name, matrix_id_component(&id), "deterministic");
        assert!(
            !name.is_empty() && name.len() <= MAX_COMPONENT_BYTES,
            "{id:?}"
        );
        assert!(
            !name.starts_with('.') && !name.contains('/'),
            "{id:?} -> {name}"
        );
        assert!(
            WorkspacePath::new(name.as_str()).is_ok(),
            "{id:?} -> {name}"
        );
        if let Some(other) = names.insert(name.clone(), id.clone()) {
            assert_eq!(other, id, "two ids share the name {name}");
        }

        let thread = if u.arbitrary()? {
            Some(fuzzkit::mutate_text(u, &seeds)?)
        } else {
            None
        };
        let chat = ChatId::for_conversation(&id, thread.as_deref());
        assert_eq!(ChatId::new(chat.as_str()).as_ref(), Ok(&chat), "{id:?}");
        let key = (id.clone(), thread);
        if let Some(other) = chats.insert(chat.clone(), key.clone()) {
            assert_eq!(other, key, "two conversations share the chat id {chat}");
        }

        let user = fuzzkit::mutate_text(u, &seeds)?;
        let dir = room_dir(&user, &id);
        assert!(dir.starts_with(&surface_root()), "{user:?} {id:?} -> {dir}");
        assert_eq!(
            dir.components().count(),
            surface_root().components().count() + 2
        );
        Ok(())
    });
}
