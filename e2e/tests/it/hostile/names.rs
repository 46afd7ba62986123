//! File names from the hostile corpus (`surface/tests/corpus/filenames.json`, also the seed of
//! the sanitizer's fuzz target) sent as attachments in an encrypted room: every file lands
//! once, in the sender's inbox, under a visible, unique, harmless name, with its bytes intact.

use std::collections::BTreeSet;
use std::path::Path;

use e2e::Stack;
use protocol::WorkspacePath;

use super::Room;
use crate::TURN;

/// How the corpus fared.
#[derive(Debug, Default)]
pub struct Names {
    /// Names the homeserver accepted (some refuse, e.g. a NUL).
    pub sent: u64,
    /// Names stored safely.
    pub safe: u64,
    /// What was wrong with the others.
    pub problems: Vec<String>,
}

/// Characters that must not survive into a stored name: controls, bidi marks, invisible and
/// blank-rendering characters.
fn is_hidden(c: char) -> bool {
    c.is_control()
        || matches!(c as u32,
            0x200B..=0x200F | 0x202A..=0x202E | 0x2060..=0x2064 | 0x2066..=0x2069 | 0xFEFF
                | 0x2028 | 0x2029 | 0x115F | 0x1160 | 0x3164 | 0xFFA0 | 0x2800)
}

/// What is wrong with the stored name `file` (`<stamp>-<unique>-<name>`), if anything.
fn name_problem(file: &str) -> Option<String> {
    let mut parts = file.splitn(3, '-');
    let (stamp, unique, name) = (parts.next()?, parts.next()?, parts.next()?);
    if stamp.len() != 16 || unique.len() != 8 || !unique.chars().all(|c| c.is_ascii_alphanumeric())
    {
        return Some(format!("unexpected prefix in {file:?}"));
    }
    if name.is_empty() || name.chars().all(|c| c.is_whitespace() || is_hidden(c)) {
        return Some(format!("blank name {file:?}"));
    }
    if name.contains(['/', '\\']) || name.chars().any(is_hidden) {
        return Some(format!("separator or hidden character in {file:?}"));
    }
    if name.starts_with(['.', '-', '~']) {
        return Some(format!("hidden or option-like name {file:?}"));
    }
    None
}

pub async fn hostile_names(stack: &Stack, attacker: &Room) -> Names {
    let corpus =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../surface/tests/corpus/filenames.json");
    let names: Vec<String> =
        serde_json::from_str(&std::fs::read_to_string(corpus).unwrap()).unwrap();
    let inbox = format!("{}/inbox/", attacker.room_dir());
    let before: BTreeSet<String> = stack.files_under(&inbox).into_iter().collect();
    let mut report = Names::default();
    let mut expected = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let content = format!("hostile name #{i}\n").into_bytes();
        match attacker
            .user
            .send_file(
                &attacker.id,
                name,
                "application/octet-stream",
                content.clone(),
                None,
            )
            .await
        {
            Ok(_) => {
                report.sent += 1;
                expected.push((name.clone(), content));
            }
            Err(e) => report.problems.push(format!(
                "{name:?} refused by the homeserver (not counted): {e:#}"
            )),
        }
    }
    // The new stored files holding one of these contents: a file of an earlier step of the
    // suite landing late in the same inbox is neither counted nor mistaken for one of these, and
    // a download still under its temporary name is not listed (counted, it once let the wait
    // end one file early).
    let ours = |f: &String| {
        std::fs::read(stack.workspace.join(f.as_str()))
            .is_ok_and(|bytes| expected.iter().any(|(_, content)| *content == bytes))
    };
    let stored: Vec<String> =
        e2e::eventually(TURN * 2, "every hostile name in the inbox", || async {
            let now: Vec<String> = stack
                .stored_files_under(&inbox)
                .into_iter()
                .filter(|f| !before.contains(f) && ours(f))
                .collect();
            (now.len() >= expected.len()).then_some(now)
        })
        .await;
    if stored.len() != expected.len() {
        report.problems.push(format!(
            "{} files for {} names: {stored:#?}",
            stored.len(),
            expected.len()
        ));
    }
    let unique: BTreeSet<&String> = stored.iter().collect();
    assert_eq!(unique.len(), stored.len(), "two files on one name");
    for (name, content) in &expected {
        let found: Vec<&String> = stored
            .iter()
            .filter(|f| {
                std::fs::read(stack.workspace.join(f.as_str()))
                    .ok()
                    .as_ref()
                    == Some(content)
            })
            .collect();
        let problem = match found.as_slice() {
            [one] => {
                let file = one.strip_prefix(&inbox).unwrap_or(one);
                if WorkspacePath::new(one.as_str()).is_err() || file.contains('/') {
                    Some(format!("{one:?} is not a single name in the inbox"))
                } else {
                    name_problem(file)
                }
            }
            other => Some(format!(
                "{} stored files with the bytes of {name:?}",
                other.len()
            )),
        };
        match problem {
            None => report.safe += 1,
            Some(p) => report.problems.push(format!("{name:?}: {p}")),
        }
    }
    report
}
