//! What of the chat's past goes to the model: earlier turns as user/assistant pairs (a turn's
//! tool calls and their results are not kept, so a pair is never split), newest first until a
//! character budget is spent, failed turns left out (an over-long message sent again would make
//! every later turn fail the same way). Pure.

use protocol::WorkspacePath;

use crate::store::{TurnRecord, TurnStatus};

/// Earlier turns sent along, at most.
pub const MAX_TURNS: usize = 20;
const _: () = assert!(MAX_TURNS <= crate::store::RECENT_TURNS);

/// The earlier turns to send, oldest first: the newest ones whose text fits `budget` characters
/// together, at most [`MAX_TURNS`], failed turns skipped. A turn that does not fit ends the walk
/// (older ones would leave a gap in the conversation).
pub fn fit(recent: &[TurnRecord], budget: usize) -> Vec<&TurnRecord> {
    let mut spent = 0usize;
    let mut kept: Vec<&TurnRecord> = recent
        .iter()
        .rev()
        .filter(|t| t.status != TurnStatus::Failed)
        .take(MAX_TURNS)
        .take_while(|t| {
            spent += cost(t);
            spent <= budget
        })
        .collect();
    kept.reverse();
    kept
}

/// Characters a turn adds to the request.
fn cost(turn: &TurnRecord) -> usize {
    user_content(turn, &|p| earlier_note(turn, p))
        .chars()
        .count()
        + turn.output.chars().count()
}

/// Whether an attachment is a picture, by what the surface found while downloading it (or its
/// name, for a file without download facts).
pub fn is_picture(turn: &TurnRecord, path: &WorkspacePath) -> bool {
    match turn.attachment_info.get(path) {
        Some(info) => info.mime.starts_with("image/"),
        None => mime_guess::from_path(path.file_name())
            .first()
            .is_some_and(|m| m.type_() == mime_guess::mime::IMAGE),
    }
}

/// Whether an attachment is a PDF, by its download facts or its name.
pub fn is_pdf(turn: &TurnRecord, path: &WorkspacePath) -> bool {
    match turn.attachment_info.get(path) {
        Some(info) => info.mime == "application/pdf",
        None => path.file_name().to_ascii_lowercase().ends_with(".pdf"),
    }
}

/// What an earlier turn's attachment adds to its line: a picture is a short placeholder (its
/// bytes were sent with its own turn only, so a long chat costs no more per turn); a
/// recording, what was heard.
pub fn earlier_note(turn: &TurnRecord, path: &WorkspacePath) -> Option<String> {
    if let Some(note) = heard_note(turn, path) {
        return Some(note);
    }
    is_picture(turn, path)
        .then(|| "[picture, shown when it was sent; call view_image to look again]".to_owned())
}

/// What was heard in a recording, as its line in a turn.
pub fn heard_note(turn: &TurnRecord, path: &WorkspacePath) -> Option<String> {
    let perceived = turn.perceived.get(path)?;
    let info = turn.attachment_info.get(path);
    Some(crate::perceive::heard_line(
        perceived,
        info.is_some_and(|i| i.voice),
        info.and_then(|i| i.duration_ms),
    ))
}

/// A turn as the user message the model sees: context messages, the text, attachments, each
/// followed by `note(path)` when there is one.
pub fn user_content(turn: &TurnRecord, note: &dyn Fn(&WorkspacePath) -> Option<String>) -> String {
    let mut content = String::new();
    for c in &turn.context {
        content.push_str(&format!(
            "(earlier, {}): {}\n",
            crate::speaker::label(&c.sender),
            c.text
        ));
        for a in &c.attachments {
            content.push_str(&format!("  attachment: {a}\n"));
            if let Some(n) = note(a) {
                content.push_str(&format!("    {n}\n"));
            }
        }
    }
    content.push_str(&format!(
        "{}: {}",
        crate::speaker::label(&turn.sender),
        turn.text
    ));
    for a in &turn.attachments {
        content.push_str(&format!("\nattachment: {a}"));
        if let Some(info) = turn.attachment_info.get(a) {
            let note = crate::describe::media_note(info)
                .map(|n| format!(", {n}"))
                .unwrap_or_default();
            content.push_str(&format!(
                " (name {}, {}, {} bytes{note})",
                info.name, info.mime, info.size
            ));
        }
        if let Some(n) = note(a) {
            content.push_str(&format!("\n  {n}"));
        }
    }
    content
}

#[cfg(test)]
mod tests {
    use protocol::Sender;

    use super::*;

    fn turn(n: u64, text: &str, output: &str, status: TurnStatus) -> TurnRecord {
        TurnRecord {
            seq: n,
            id: format!("$t{n}"),
            sender: Sender {
                user_id: "@u:x".into(),
                display_name: None,
            },
            text: text.into(),
            attachments: vec![],
            attachment_info: Default::default(),
            context: vec![],
            timestamp_ms: 0,
            status,
            output: output.into(),
            sent_files: vec![],
            error: None,
            perceived: Default::default(),
        }
    }

    #[test]
    fn table() {
        use TurnStatus::{Completed as C, Failed as F};
        // "@u:x: " is 6 characters, so a turn "aaaa"/"bb" costs 12.
        let cases: &[(&str, Vec<TurnRecord>, usize, &[u64])] = &[
            ("nothing before", vec![], 100, &[]),
            (
                "all fit",
                vec![turn(1, "aaaa", "bb", C), turn(2, "aaaa", "bb", C)],
                100,
                &[1, 2],
            ),
            (
                "oldest dropped first",
                vec![
                    turn(1, "aaaa", "bb", C),
                    turn(2, "aaaa", "bb", C),
                    turn(3, "aaaa", "bb", C),
                ],
                24,
                &[2, 3],
            ),
            (
                "a failed turn is left out and costs nothing",
                vec![
                    turn(1, "aaaa", "bb", C),
                    turn(2, &"x".repeat(10_000), "", F),
                    turn(3, "aaaa", "bb", C),
                ],
                24,
                &[1, 3],
            ),
            (
                "an over-long turn ends the walk: no gap",
                vec![
                    turn(1, "aaaa", "bb", C),
                    turn(2, &"x".repeat(500), "", C),
                    turn(3, "aaaa", "bb", C),
                ],
                100,
                &[3],
            ),
            (
                "budget smaller than one turn",
                vec![turn(1, "aaaa", "bb", C)],
                5,
                &[],
            ),
        ];
        for (name, recent, budget, want) in cases {
            let got: Vec<u64> = fit(recent, *budget).iter().map(|t| t.seq).collect();
            assert_eq!(&got, want, "{name}");
        }
    }

    #[test]
    fn at_most_max_turns() {
        let recent: Vec<TurnRecord> = (0..(MAX_TURNS as u64 + 5))
            .map(|n| turn(n, "a", "b", TurnStatus::Completed))
            .collect();
        let got = fit(&recent, usize::MAX / 2);
        assert_eq!(got.len(), MAX_TURNS);
        assert_eq!(got.last().unwrap().seq, MAX_TURNS as u64 + 4);
    }
}
