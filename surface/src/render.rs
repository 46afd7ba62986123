//! Turning agent output into room events: threaded replies with markdown, notices, prompts,
//! long answers split into postable parts, and the transaction ids (derived from the
//! triggering event) that make sends idempotent. Sending itself is [`crate::send`].

use std::collections::VecDeque;

use matrix_sdk::ruma::events::relation::Thread;
use matrix_sdk::ruma::events::room::message::{Relation, RoomMessageEventContent};
use matrix_sdk::ruma::{EventId, OwnedEventId, OwnedTransactionId};
use protocol::{ApprovalRequest, AskUser, WorkspacePath};
use sha2::{Digest, Sha256};

/// The transaction id of output number `index` of the turn started by `trigger_event_id`.
///
/// Deterministic, so a retry after a crash reuses it and the homeserver returns the event it
/// already created instead of posting twice.
pub fn txn_id(trigger_event_id: &str, index: u32) -> OwnedTransactionId {
    hashed_txn("turn", &[trigger_event_id.as_bytes(), &index.to_be_bytes()])
}

/// The transaction id for posting the file of the agent's `send_file` request `request_id` in
/// the turn of `trigger_event_id`.
pub fn file_txn_id(trigger_event_id: &str, request_id: &str) -> OwnedTransactionId {
    hashed_txn(
        "file",
        &[trigger_event_id.as_bytes(), request_id.as_bytes()],
    )
}

/// The transaction id for posting an outbox file: its path plus its content hash, so the same
/// file is posted once and a changed file under the same name is posted again.
pub fn outbox_txn_id(path: &WorkspacePath, sha256_hex: &str) -> OwnedTransactionId {
    hashed_txn("outbox", &[path.as_str().as_bytes(), sha256_hex.as_bytes()])
}

/// The transaction id of a post an MCP client asked for in `room_id`: the same idempotency key
/// posts once; without a key every call is its own post.
pub fn mcp_txn_id(room_id: &str, key: Option<&str>) -> OwnedTransactionId {
    match key {
        Some(key) => hashed_txn("mcp", &[room_id.as_bytes(), key.as_bytes()]),
        None => OwnedTransactionId::from(format!("mxbmcp{:032x}", rand::random::<u128>())),
    }
}

/// The transaction id of a notice about event `event_id` (`kind` tells notices apart).
pub fn notice_txn_id(event_id: &str, kind: impl AsRef<str>) -> OwnedTransactionId {
    hashed_txn(kind.as_ref(), &[event_id.as_bytes()])
}

/// The transaction id of the message showing output number `index` while it is being written
/// (then edited into the answer's first part, with [`final_edit_txn_id`]).
pub fn live_txn_id(trigger_event_id: &str, index: u32) -> OwnedTransactionId {
    hashed_txn("live", &[trigger_event_id.as_bytes(), &index.to_be_bytes()])
}

/// The transaction id of the edit that makes a shown answer final.
pub fn final_edit_txn_id(trigger_event_id: &str, index: u32) -> OwnedTransactionId {
    hashed_txn(
        "final",
        &[trigger_event_id.as_bytes(), &index.to_be_bytes()],
    )
}

/// The first postable part of a markdown answer (what a message shows while it is written).
pub fn first_part(text: &str) -> String {
    split_markdown(text, PART_BYTES)
        .into_iter()
        .next()
        .unwrap_or_default()
}

fn hashed_txn(kind: &str, parts: &[&[u8]]) -> OwnedTransactionId {
    let mut h = Sha256::new();
    h.update(kind.as_bytes());
    for p in parts {
        h.update([0u8]);
        h.update((p.len() as u64).to_be_bytes());
        h.update(p);
    }
    let digest = hex::encode(h.finalize());
    OwnedTransactionId::from(format!("mxb{}", &digest[..40]))
}

/// Where replies of a turn go: a thread under the trigger, or the trigger's own thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyTarget {
    /// The triggering event.
    pub event_id: OwnedEventId,
    /// The thread the trigger is in, if any.
    pub thread_root: Option<OwnedEventId>,
}

impl ReplyTarget {
    /// The root of the thread replies go to.
    pub fn root(&self) -> &EventId {
        self.thread_root.as_deref().unwrap_or(&self.event_id)
    }

    /// Puts `content` in the thread, with an `m.in_reply_to` fallback to the trigger for
    /// clients without thread support.
    pub fn apply(&self, mut content: RoomMessageEventContent) -> RoomMessageEventContent {
        content.relates_to = Some(Relation::Thread(Thread::plain(
            self.root().to_owned(),
            self.event_id.clone(),
        )));
        content
    }

    /// A markdown reply (rendered to HTML, raw HTML shown as text: see [`safe_markdown`]).
    pub fn markdown(&self, text: &str) -> RoomMessageEventContent {
        self.apply(safe_markdown(text))
    }

    /// A markdown reply in as many events as it takes: each part's content stays well under the
    /// homeserver's event size limit (Synapse refuses events over 64 KiB), split at paragraph,
    /// then line, then character boundaries, with code fences closed and reopened across parts.
    pub fn markdown_parts(&self, text: &str) -> Vec<RoomMessageEventContent> {
        let mut queue: VecDeque<(String, usize)> = split_markdown(text, PART_BYTES)
            .into_iter()
            .map(|p| (p, PART_BYTES))
            .collect();
        let mut out = Vec::new();
        while let Some((part, budget)) = queue.pop_front() {
            let content = self.markdown(&part);
            let size = serde_json::to_vec(&content).map_or(usize::MAX, |v| v.len());
            if size <= MAX_CONTENT_BYTES || budget <= MIN_PART_BYTES {
                out.push(content);
                continue;
            }
            // Markup that renders much larger than it reads (`<` becomes `&lt;`): halve.
            let half = budget / 2;
            for p in split_markdown(&part, half).into_iter().rev() {
                queue.push_front((p, half));
            }
        }
        out
    }

    /// A compact `m.notice` reply.
    pub fn notice(&self, text: &str) -> RoomMessageEventContent {
        self.apply(match safe_markdown_html(text) {
            Some(html) => RoomMessageEventContent::notice_html(text, html),
            None => RoomMessageEventContent::notice_plain(text),
        })
    }
}

/// An `m.text` whose HTML is `text` rendered as markdown, with any raw HTML in it (from a
/// model, or a user's words quoted back) shown as text rather than interpreted.
pub fn safe_markdown(text: &str) -> RoomMessageEventContent {
    match safe_markdown_html(text) {
        Some(html) => RoomMessageEventContent::text_html(text, html),
        None => RoomMessageEventContent::text_plain(text),
    }
}

/// The HTML of markdown `text` with raw HTML escaped and links or images to other schemes than
/// `http`, `https`, `mailto`, `matrix` and `mxc` shown as the text that was written; `None`
/// when it has no formatting (pure).
pub fn safe_markdown_html(text: &str) -> Option<String> {
    use matrix_sdk::ruma::events::room::message::FormattedBody;
    use pulldown_cmark::{Event, Options, Parser, Tag};
    let options = Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH;
    let mut escaped = String::with_capacity(text.len());
    let mut copied = 0;
    for (event, range) in Parser::new_ext(text, options).into_offset_iter() {
        let unsafe_link = match &event {
            Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => {
                !is_safe_link(dest_url)
            }
            _ => false,
        };
        if unsafe_link && range.start >= copied {
            escaped.push_str(&text[copied..range.start]);
            escaped.push_str(&escape_markdown(&text[range.clone()]));
            copied = range.end;
            continue;
        }
        if matches!(event, Event::Html(_) | Event::InlineHtml(_)) && range.start >= copied {
            escaped.push_str(&text[copied..range.start]);
            let raw = &text[range.clone()];
            escaped.push_str(
                &raw.replace('&', "&amp;")
                    .replace('<', "&lt;")
                    .replace('>', "&gt;"),
            );
            copied = range.end;
        }
    }
    escaped.push_str(&text[copied..]);
    FormattedBody::markdown(&escaped).map(|f| f.body)
}

/// Whether a link's destination may become an `href`: a relative one, or one of the schemes
/// clients open safely (pure). Whitespace and control characters, which browsers drop from a
/// scheme, do not hide one.
fn is_safe_link(dest: &str) -> bool {
    let dest: String = dest
        .chars()
        .filter(|c| !c.is_whitespace() && !c.is_control())
        .collect::<String>()
        .to_ascii_lowercase();
    let Some((scheme, _)) = dest.split_once(':') else {
        return true;
    };
    if scheme.contains(['/', '?', '#']) {
        // The colon comes after the path started: a relative link.
        return true;
    }
    matches!(scheme, "http" | "https" | "mailto" | "matrix" | "mxc")
}

/// `s` with every ASCII punctuation character backslash-escaped: markdown shows it as written.
fn escape_markdown(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 2);
    for c in s.chars() {
        if c.is_ascii_punctuation() {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A Matrix user as a pill: a `matrix.to` link clients render as the user's name.
pub fn pill(user_id: &str) -> String {
    let label = user_id.replace(['[', ']'], "");
    format!("[{label}](https://matrix.to/#/{user_id})")
}

/// `s` inside a markdown code span, whatever backticks it holds.
pub fn code_span(s: &str) -> String {
    let longest = s.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest + 1);
    let pad = if s.starts_with('`') || s.ends_with('`') {
        " "
    } else {
        ""
    };
    format!("{fence}{pad}{s}{pad}{fence}")
}

/// Target size of one part of a long answer, in bytes of markdown.
const PART_BYTES: usize = 16_000;
/// Parts are not made smaller than this.
const MIN_PART_BYTES: usize = 1_000;
/// The most one part's serialized content may take (the event envelope needs the rest of the
/// homeserver's 65 536 bytes).
const MAX_CONTENT_BYTES: usize = 56_000;

/// Splits markdown `text` into parts of at most `max` bytes (pure). Prefers paragraph breaks
/// (outside code blocks) in the second half of a part, then line breaks, then whitespace, then
/// any character boundary. A code block cut in two is closed at the end of one part and
/// reopened (with its info string) at the start of the next.
pub fn split_markdown(text: &str, max: usize) -> Vec<String> {
    let text = text.trim_end();
    if text.len() <= max {
        return vec![text.to_owned()];
    }
    let max = max.max(64);
    let mut parts = Vec::new();
    let mut cur = String::new();
    // The opening line of the code block `cur` ends inside, if any.
    let mut fence: Option<String> = None;
    // Where in `cur` a paragraph break outside any code block was last seen.
    let mut para_break: Option<usize> = None;
    let mut pending: VecDeque<String> = text.split_inclusive('\n').map(str::to_owned).collect();
    while let Some(line) = pending.pop_front() {
        let closing = if fence.is_some() {
            FENCE_CLOSE.len()
        } else {
            0
        };
        if cur.len() + line.len() + closing <= max {
            update_fence(&mut fence, &line);
            cur.push_str(&line);
            if fence.is_none() && line.trim().is_empty() {
                para_break = Some(cur.len());
            }
            continue;
        }
        if let Some(at) = para_break.filter(|at| *at > max / 2 && *at < cur.len()) {
            // Cut at the paragraph break; what followed it goes back in front of the queue.
            let rest = cur.split_off(at);
            pending.push_front(line);
            for l in rest.split_inclusive('\n').rev() {
                pending.push_front(l.to_owned());
            }
            // There was no open code block at the break; replaying `rest` finds any again.
            fence = None;
            push_part(&mut parts, &mut cur, None);
            para_break = None;
            continue;
        }
        if cur.len() > reopen_len(&fence) {
            push_part(&mut parts, &mut cur, fence.as_deref());
            if let Some(open) = &fence {
                cur.push_str(open);
            }
            para_break = None;
            pending.push_front(line);
            continue;
        }
        // One line longer than a whole part: cut it.
        let room = max.saturating_sub(cur.len() + closing).max(1);
        let cut = cut_point(&line, room);
        let (head, tail) = line.split_at(cut);
        cur.push_str(head);
        pending.push_front(tail.to_owned());
        push_part(&mut parts, &mut cur, fence.as_deref());
        if let Some(open) = &fence {
            cur.push_str(open);
        }
    }
    if !cur.trim().is_empty() {
        push_part(&mut parts, &mut cur, fence.as_deref());
    }
    parts
}

const FENCE_CLOSE: &str = "\n```\n";

fn reopen_len(fence: &Option<String>) -> usize {
    fence.as_ref().map_or(0, String::len)
}

fn update_fence(fence: &mut Option<String>, line: &str) {
    let t = line.trim_start();
    let marker = if t.starts_with("```") {
        "```"
    } else if t.starts_with("~~~") {
        "~~~"
    } else {
        return;
    };
    match fence {
        None => {
            let mut open = t.trim_end().to_owned();
            open.push('\n');
            *fence = Some(open);
        }
        Some(open)
            if open.starts_with(marker) && t.trim_end().trim_start_matches(marker).is_empty() =>
        {
            *fence = None;
        }
        Some(_) => {}
    }
}

fn push_part(parts: &mut Vec<String>, cur: &mut String, fence: Option<&str>) {
    let mut part = std::mem::take(cur);
    if let Some(open) = fence {
        let marker = &open[..3];
        if !part.ends_with('\n') {
            part.push('\n');
        }
        part.push_str(marker);
    }
    let part = part.trim_end().to_owned();
    if !part.is_empty() {
        parts.push(part);
    }
}

/// A char boundary at most `room` bytes into `line`, after whitespace if there is some in the
/// second half.
fn cut_point(line: &str, room: usize) -> usize {
    let mut end = room.min(line.len());
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    if end == 0 {
        // Not even one character fits: take one anyway.
        return line.chars().next().map_or(line.len(), char::len_utf8);
    }
    match line[..end].rfind(char::is_whitespace) {
        Some(ws) if ws > end / 2 => ws + 1,
        _ => end,
    }
}

/// The prompt posted for an approval request. In an encrypted room (`encrypted`) only a reply
/// answers it: Matrix clients send reactions unencrypted, and there the bot acts only on what
/// arrives encrypted.
pub fn approval_prompt(req: &ApprovalRequest, user_id: &str, encrypted: bool) -> String {
    let how = if encrypted {
        "reply **yes** (once), **always** or **no** (reactions are not encrypted, so in this \
         encrypted room only a reply counts)"
    } else {
        "react ✅ (once), ♾️ (always) or ❌ (no), or reply **yes**, **always** or **no**"
    };
    format!(
        "**Approval needed** for {} on {}: {}\n\n{}, {how}.",
        code_span(&req.tool),
        code_span(&req.resource),
        req.summary,
        pill(user_id)
    )
}

/// The text posted for an `ask_user` question.
pub fn question_prompt(q: &AskUser, user_id: &str) -> String {
    let mut s = format!("**Question** for {}: {}", pill(user_id), q.text);
    if !q.options.is_empty() {
        s.push_str("\n\nOptions: ");
        s.push_str(&q.options.join(" / "));
    }
    s
}

/// A compact line describing a finished tool call.
pub fn tool_notice(name: &str, arguments: &str, ok: bool, output: &str) -> String {
    let args = truncate(arguments.trim(), 200);
    let out = truncate(output.trim(), 300);
    let status = if ok { "ok" } else { "failed" };
    format!("🔧 `{name}` `{args}` → {status}: {out}")
}

fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut t: String = s.chars().take(max).collect();
    t.push('…');
    t
}

#[cfg(test)]
mod tests {
    use matrix_sdk::ruma::event_id;
    use serde_json::json;

    use super::*;

    #[test]
    fn txn_ids_are_stable_and_distinct() {
        let a = txn_id("$e1", 0);
        assert_eq!(a, txn_id("$e1", 0));
        assert_ne!(a, txn_id("$e1", 1));
        assert_ne!(a, txn_id("$e2", 0));
        assert!(a.as_str().starts_with("mxb") && a.as_str().len() == 43);
        let p = WorkspacePath::new("surfaces/matrix/u/r/outbox/a.txt").unwrap();
        assert_eq!(outbox_txn_id(&p, "ab"), outbox_txn_id(&p, "ab"));
        assert_ne!(outbox_txn_id(&p, "ab"), outbox_txn_id(&p, "cd"));
        assert_ne!(notice_txn_id("$e1", "a"), notice_txn_id("$e1", "b"));
        let f = file_txn_id("$e1", "send-$e1-2");
        assert_eq!(f, file_txn_id("$e1", "send-$e1-2"), "a request run again");
        assert_ne!(f, file_txn_id("$e1", "send-$e1-3"));
        assert_ne!(f, file_txn_id("$e2", "send-$e1-2"));
    }

    #[test]
    fn replies_start_a_thread_under_the_trigger() {
        let target = ReplyTarget {
            event_id: event_id!("$trigger").to_owned(),
            thread_root: None,
        };
        let json = serde_json::to_value(target.markdown("**hi**")).unwrap();
        assert_eq!(json["body"], "**hi**");
        assert_eq!(json["format"], "org.matrix.custom.html");
        assert_eq!(json["formatted_body"], "<strong>hi</strong>");
        assert_eq!(
            json["m.relates_to"],
            json!({
                "rel_type": "m.thread",
                "event_id": "$trigger",
                "is_falling_back": true,
                "m.in_reply_to": {"event_id": "$trigger"}
            })
        );
    }

    #[test]
    fn replies_in_a_thread_stay_there() {
        let target = ReplyTarget {
            event_id: event_id!("$msg").to_owned(),
            thread_root: Some(event_id!("$root").to_owned()),
        };
        let json = serde_json::to_value(target.notice("done")).unwrap();
        assert_eq!(json["msgtype"], "m.notice");
        assert_eq!(json["m.relates_to"]["rel_type"], "m.thread");
        assert_eq!(json["m.relates_to"]["event_id"], "$root");
        assert_eq!(json["m.relates_to"]["m.in_reply_to"]["event_id"], "$msg");
    }

    /// The parts, with the fence lines the splitter added removed, give back the text.
    fn rejoin(parts: &[String]) -> String {
        parts.join("\n").replace("\n```\n```rust\n", "\n")
    }

    #[test]
    fn short_text_is_one_part() {
        assert_eq!(
            split_markdown("hello\n\nworld\n", 100),
            vec!["hello\n\nworld"]
        );
    }

    #[test]
    fn long_text_splits_at_paragraphs_within_the_limit() {
        let para = "word ".repeat(30).trim_end().to_owned(); // 149 bytes
        let text = vec![para.clone(); 20].join("\n\n");
        let parts = split_markdown(&text, 1000);
        assert!(parts.len() >= 3, "{}", parts.len());
        for p in &parts {
            assert!(p.len() <= 1000, "{}", p.len());
            assert!(p.starts_with("word") && p.ends_with("word"), "{p:?}");
        }
        let words: usize = parts.iter().map(|p| p.split_whitespace().count()).sum();
        assert_eq!(words, 20 * 30, "nothing lost or repeated");
    }

    #[test]
    fn code_blocks_are_closed_and_reopened() {
        let code: String = (0..200).map(|i| format!("let x{i} = {i};\n")).collect();
        let text = format!("Here:\n\n```rust\n{code}```\n\nDone.");
        let parts = split_markdown(&text, 800);
        assert!(parts.len() >= 4);
        for p in &parts {
            assert!(p.len() <= 800, "{}", p.len());
            assert_eq!(p.matches("```").count() % 2, 0, "balanced fences in {p:?}");
        }
        assert!(parts[1].starts_with("```rust\n"));
        assert_eq!(rejoin(&parts).matches("let x").count(), 200);
        assert!(rejoin(&parts).contains("let x199 = 199;\n```\n\nDone."));
    }

    #[test]
    fn one_huge_line_is_cut_at_char_boundaries() {
        let line = "é".repeat(5000) + " tail";
        let parts = split_markdown(&line, 999);
        for p in &parts {
            assert!(p.len() <= 999);
        }
        assert_eq!(parts.concat(), line);
        let spaced = "ab ".repeat(2000);
        let parts = split_markdown(&spaced, 500);
        assert!(
            parts.iter().all(|p| p.ends_with("ab")),
            "cut after whitespace"
        );
        assert_eq!(parts.join(" ").split_whitespace().count(), 2000);
    }

    #[test]
    fn every_part_fits_in_an_event() {
        let target = ReplyTarget {
            event_id: event_id!("$t").to_owned(),
            thread_root: None,
        };
        // `<` and `&` render several times larger than they read.
        let text = "<&> ".repeat(30_000);
        let parts = target.markdown_parts(&text);
        assert!(parts.len() > 2);
        for c in &parts {
            assert!(serde_json::to_vec(c).unwrap().len() <= MAX_CONTENT_BYTES);
        }
        assert_eq!(target.markdown_parts("hi").len(), 1);
    }

    #[test]
    fn prompts() {
        let req = ApprovalRequest {
            turn: "$t".into(),
            request_id: "r".into(),
            tool: "dangerous_action".into(),
            resource: "x".into(),
            summary: "Do x".into(),
        };
        let p = approval_prompt(&req, "@alice:hs", false);
        assert!(p.contains("yes") && p.contains("always") && p.contains("✅"));
        let e = approval_prompt(&req, "@alice:hs", true);
        assert!(e.contains("yes") && e.contains("only a reply counts") && !e.contains("✅"));
        assert!(
            p.contains("[@alice:hs](https://matrix.to/#/@alice:hs)"),
            "{p}"
        );
        assert!(tool_notice("t", &"a".repeat(500), true, "out").contains('…'));
    }

    #[test]
    fn raw_html_is_shown_not_interpreted() {
        let cases = [
            // (markdown, HTML must contain, HTML must not contain)
            ("write <text> to a file", "&lt;text&gt;", "<text>"),
            ("<img src=x onerror=alert(1)>", "&lt;img", "<img"),
            (
                "a <a href=\"https://evil\">link</a>",
                "&lt;a href",
                "<a href",
            ),
            (
                "<script>x</script>\n\n**bold**",
                "&lt;script&gt;",
                "<script>",
            ),
            ("**bold** & <b>fake</b>", "<strong>bold</strong>", "<b>"),
        ];
        for (md, has, lacks) in cases {
            let html = safe_markdown_html(md).unwrap_or_else(|| panic!("{md}: no HTML"));
            assert!(html.contains(has), "{md}: {html}");
            assert!(!html.contains(lacks), "{md}: {html}");
        }
        // Plain text stays plain; markdown still renders.
        assert_eq!(safe_markdown_html("just words"), None);
        // Links keep only safe schemes; the others are shown as written.
        let links = [
            ("[x](javascript:alert(1))", None, "[x](javascript:alert(1))"),
            ("[x](JavaScript:alert(1))", None, "JavaScript:"),
            ("<javascript:alert(1)>", None, "javascript:alert(1)"),
            ("[x](<java\tscript:alert(1)>)", None, "script:alert(1)"),
            ("![i](data:image/png;base64,AAAA)", None, "data:image"),
            ("[x][r]\n\n[r]: vbscript:msgbox", None, "[x][r]"),
            ("[x](data:text/html,<b>)", None, "data:text/html"),
            (
                "[ok](https://example.org)",
                Some("href=\"https://example.org\""),
                "ok",
            ),
            (
                "[m](mailto:a@example.org)",
                Some("href=\"mailto:a@example.org\""),
                "m",
            ),
            (
                "[r](matrix:r/room:example.org)",
                Some("href=\"matrix:r/room:example.org\""),
                "r",
            ),
            ("[rel](docs/a:b)", Some("href=\"docs/a:b\""), "rel"),
        ];
        for (md, href, shown) in links {
            let html = safe_markdown_html(md).unwrap_or_else(|| md.to_owned());
            match href {
                Some(h) => assert!(html.contains(h), "{md}: {html}"),
                None => {
                    assert!(!html.contains("href"), "{md}: {html}");
                    assert!(!html.contains("src="), "{md}: {html}");
                }
            }
            assert!(html.contains(shown), "{md}: {html}");
        }
        assert_eq!(
            safe_markdown_html("`code` and *it*").as_deref(),
            Some("<code>code</code> and <em>it</em>")
        );
        // The plain body is what was written.
        let c = safe_markdown("a <b>");
        assert_eq!(c.body(), "a <b>");
    }

    #[test]
    fn pills_and_code_spans() {
        assert_eq!(pill("@a:hs"), "[@a:hs](https://matrix.to/#/@a:hs)");
        assert_eq!(code_span("x"), "`x`");
        assert_eq!(code_span("a`b"), "``a`b``");
        assert_eq!(code_span("`a"), "`` `a ``");
        let html = safe_markdown_html(&format!("see {}", code_span("a``b"))).unwrap();
        assert!(html.contains("<code>a``b</code>"), "{html}");
    }
}
