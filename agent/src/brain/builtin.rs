//! The builtin brain: offline and deterministic. It describes attachments and understands the
//! small command language the end-to-end tests rely on (see `Command`). Two commands are test
//! hooks that exist only with `AGENT_TEST_HOOKS=1` and are never listed by `help`: `sendraw`
//! (names a path to the surface without checking it), `sleep` (holds a turn open) and
//! `approve3` (one action needing approval three times in a turn).

use std::time::Duration;

use futures_util::future::BoxFuture;
use protocol::WorkspacePath;
use serde_json::json;

use super::{Brain, BrainError, TurnInput, TurnRecord};
use crate::config::MCP_SEPARATOR;
use crate::describe::display_name;
use crate::memory::parse_id;
use crate::turn::TurnIo;

/// The offline brain.
#[derive(Debug, Clone, Copy, Default)]
pub struct Builtin {
    /// Whether the test hooks (`sendraw`, `sleep`) are commands or ordinary text.
    test_hooks: bool,
}

impl Builtin {
    /// The builtin brain; `test_hooks` comes from `AGENT_TEST_HOOKS`.
    pub fn new(test_hooks: bool) -> Self {
        Self { test_hooks }
    }
}

/// How much of a file `read` shows.
const READ_BYTES: u64 = 2000;

/// Longest `sleep`.
const MAX_SLEEP_MS: u64 = 60_000;

const HELP: &str = "I understand these commands:\n\
- `help`: this list\n\
- `files`: list this chat's files (name, size, age); `files paths` adds their workspace paths\n\
- `read <path>`: show the start of a text file (a bare name is looked up in this chat's files)\n\
- `send <path>`: send a file back (a bare name is looked up in this chat's files)\n\
- `voice <path>`: send OGG/Opus audio back as a voice message\n\
- `note <filename> <text>`: write <text> to a file in this chat's folder and send it\n\
- `ask <question>`: ask you a question and echo your answer\n\
- `approve <anything>`: try an action that needs your approval\n\
- `history`: how many earlier turns and attachments this chat has\n\
- `remember <fact>`: remember a fact for you (only your own turns recall it)\n\
- `remember room <fact>`: remember a fact for everyone in this room\n\
- `recall [words]`: what I remember for you and this room (only facts containing <words>)\n\
- `forget <id>`: forget a fact by the id `recall` shows\n\
- `mcp <server>.<tool> <json arguments>`: call a tool of one of the agent's MCP servers\n\
Attach files and I describe them: name, MIME type, size, sha256, image size, first lines.";

/// A parsed command (decided before anything is done).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command<'a> {
    /// `help`
    Help,
    /// `files`, or `files paths` (`true`: with the workspace paths).
    Files(bool),
    /// `read <path>`
    Read(&'a str),
    /// `send <path>`
    Send(&'a str),
    /// `voice <path>`: send OGG/Opus audio as a voice message.
    Voice(&'a str),
    /// `sendraw <path>` (test hook)
    SendRaw(&'a str),
    /// `note <filename> <text>`
    Note(&'a str, &'a str),
    /// `ask <question>`
    Ask(&'a str),
    /// `approve <anything>`
    Approve(&'a str),
    /// `history`
    History,
    /// `remember <fact>`: a fact in the sender's memory.
    Remember(&'a str),
    /// `remember room <fact>`: a fact in the room's memory.
    RememberRoom(&'a str),
    /// `recall [query]`
    Recall(Option<&'a str>),
    /// `forget <id>`
    Forget(&'a str),
    /// `mcp <server>.<tool> [json arguments]`: the tool's registry name (`server__tool`) and
    /// its arguments.
    Mcp(String, &'a str),
    /// `sleep <ms>` (test hook)
    Sleep(u64),
    /// `approve3 <anything>` (test hook): the same action needing approval, three times in one
    /// turn.
    ApproveThrice(&'a str),
    /// Anything else (the whole text, mention removed).
    Other(&'a str),
}

/// Parses the user's text into a command; without `test_hooks` the test hooks are plain text.
pub fn parse(text: &str, test_hooks: bool) -> Command<'_> {
    // The surface removed any mention of the bot; a leading `Word: ` is the user's text.
    let text = text.trim();
    let (word, rest) = match text.split_once(char::is_whitespace) {
        Some((w, r)) => (w, r.trim()),
        None => (text, ""),
    };
    match word.to_lowercase().as_str() {
        "help" => Command::Help,
        "files" if rest.is_empty() => Command::Files(false),
        "files" if matches!(rest, "paths" | "path" | "--paths" | "full") => Command::Files(true),
        "read" if !rest.is_empty() => Command::Read(rest),
        "send" if !rest.is_empty() => Command::Send(rest),
        "voice" if !rest.is_empty() => Command::Voice(rest),
        "sendraw" if test_hooks && !rest.is_empty() => Command::SendRaw(rest),
        "approve3" if test_hooks && !rest.is_empty() => Command::ApproveThrice(rest),
        "note" if !rest.is_empty() => match rest.split_once(char::is_whitespace) {
            Some((name, body)) => Command::Note(name, body.trim_start()),
            None => Command::Note(rest, ""),
        },
        "ask" if !rest.is_empty() => Command::Ask(rest),
        "approve" => Command::Approve(if rest.is_empty() {
            "the demo action"
        } else {
            rest
        }),
        "history" => Command::History,
        "remember" if !rest.is_empty() => match rest.split_once(char::is_whitespace) {
            Some((w, fact)) if w.eq_ignore_ascii_case("room") => {
                Command::RememberRoom(fact.trim_start())
            }
            _ if rest.eq_ignore_ascii_case("room") => Command::Other(text),
            _ => Command::Remember(rest),
        },
        "recall" => Command::Recall((!rest.is_empty()).then_some(rest)),
        "forget" if !rest.is_empty() => Command::Forget(rest),
        "mcp" if !rest.is_empty() => {
            let (tool, args) = match rest.split_once(char::is_whitespace) {
                Some((tool, args)) => (tool, args.trim()),
                None => (rest, ""),
            };
            // `server.tool` as people write it; `server__tool` as models do.
            let name = match tool.split_once('.') {
                Some((server, tool)) => format!("{server}{MCP_SEPARATOR}{tool}"),
                None => tool.to_owned(),
            };
            Command::Mcp(name, args)
        }
        "sleep" if test_hooks => match rest.parse::<u64>() {
            Ok(ms) => Command::Sleep(ms.min(MAX_SLEEP_MS)),
            Err(_) => Command::Other(text),
        },
        _ => Command::Other(text),
    }
}

impl Brain for Builtin {
    fn run_turn<'a>(
        &'a self,
        input: &'a TurnInput,
        io: &'a mut TurnIo,
    ) -> BoxFuture<'a, Result<(), BrainError>> {
        Box::pin(run(input, io, self.test_hooks))
    }
}

async fn run(input: &TurnInput, io: &mut TurnIo, test_hooks: bool) -> Result<(), BrainError> {
    let turn = &input.turn;
    let attachments: Vec<&WorkspacePath> = turn.all_attachments().collect();
    for path in &attachments {
        let block = attachment(turn, io, path).await;
        io.say(block).await?;
    }
    let command = parse(&turn.text, test_hooks);
    let reply = reply(command, input, io, !attachments.is_empty()).await?;
    io.say(reply).await?;
    Ok(())
}

/// What is said about one of the turn's files: its description and, for a recording, what
/// was heard in it (transcribed before the turn ran).
async fn attachment(turn: &TurnRecord, io: &mut TurnIo, path: &WorkspacePath) -> String {
    let block = match io.describe(path).await {
        Ok(mut d) => {
            if let Some(info) = turn.attachment_info.get(path) {
                d.name = info.name.clone();
                d.media_note = crate::describe::media_note(info);
            }
            d.for_people()
        }
        Err(e) => format!(
            "File: {}\n- could not read it: {e}\n",
            display_name(path.file_name())
        ),
    };
    let heard = turn.perceived.get(path).map(|p| {
        let info = turn.attachment_info.get(path);
        format!(
            "- {}\n",
            crate::perceive::heard_line(
                p,
                info.is_some_and(|i| i.voice),
                info.and_then(|i| i.duration_ms)
            )
        )
    });
    format!("{block}{}\n", heard.unwrap_or_default())
}

/// The answer to `command`; `attachments`: whether the turn brought files (which text that is
/// no command then only accompanies).
async fn reply(
    command: Command<'_>,
    input: &TurnInput,
    io: &mut TurnIo,
    attachments: bool,
) -> Result<String, BrainError> {
    Ok(match command {
        Command::Help => HELP.to_owned(),
        Command::Files(paths) => files(io, paths).await,
        Command::Read(target) => read(io, target).await,
        Command::Send(target) => {
            let path = resolve(io, target).await;
            send(io, &path, false).await
        }
        Command::Voice(target) => {
            let path = resolve(io, target).await;
            send(io, &path, true).await
        }
        Command::SendRaw(target) => send_raw(io, target).await?,
        Command::Note(name, body) => note(io, name, body).await,
        Command::Ask(question) => ask(io, question).await,
        Command::Approve(action) => approve(io, action).await,
        Command::History => history(input),
        Command::Remember(fact) => remember(io, fact, "user").await,
        Command::RememberRoom(fact) => remember(io, fact, "room").await,
        Command::Recall(query) => recall(io, query).await,
        Command::Forget(id) => forget(io, id).await,
        Command::Mcp(name, args) => mcp(io, &name, args).await,
        Command::ApproveThrice(action) => approve_thrice(io, action).await,
        Command::Sleep(ms) => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            format!("Slept {ms} ms.")
        }
        Command::Other(text) => other(text, attachments),
    })
}

/// Calls `tool` with `args`: `ok` of its output when it succeeded, `failed` of it otherwise.
async fn calling(
    io: &mut TurnIo,
    tool: &str,
    args: &str,
    ok: impl FnOnce(String) -> String,
    failed: impl FnOnce(String) -> String,
) -> String {
    let out = io.call_tool(tool, args).await;
    if out.ok {
        ok(out.output)
    } else {
        failed(out.output)
    }
}

async fn files(io: &mut TurnIo, paths: bool) -> String {
    let now = std::time::SystemTime::now();
    calling(
        io,
        "list_files",
        "{}",
        |listing| files_for_people(&listing, now, paths),
        |e| format!("I could not list the files: {e}"),
    )
    .await
}

async fn read(io: &mut TurnIo, target: &str) -> String {
    let path = resolve(io, target).await;
    let args = json!({ "path": path, "max_bytes": READ_BYTES }).to_string();
    calling(
        io,
        "read_file",
        &args,
        |text| format!("{}:\n{text}", file_label(&path)),
        |e| format!("I could not read {path}: {e}"),
    )
    .await
}

async fn send_raw(io: &mut TurnIo, target: &str) -> Result<String, BrainError> {
    Ok(match WorkspacePath::new(target) {
        Ok(path) => {
            io.send_file_unchecked(path.clone()).await?;
            format!("Sent {path} (unchecked).")
        }
        Err(e) => format!("I could not send {target}: invalid path: {e}"),
    })
}

async fn note(io: &mut TurnIo, name: &str, body: &str) -> String {
    let path = format!("{}/{name}", io.scope().own_dir());
    let args = json!({ "path": path, "content": body }).to_string();
    let wrote = io.call_tool("write_file", &args).await;
    if wrote.ok {
        let sent = send(io, &path, false).await;
        format!("Wrote {} ({} bytes). {sent}", file_label(&path), body.len())
    } else {
        format!("I could not write {path}: {}", wrote.output)
    }
}

async fn ask(io: &mut TurnIo, question: &str) -> String {
    let args = json!({ "question": question }).to_string();
    calling(
        io,
        "ask_user",
        &args,
        |answer| format!("You answered: {}", quoted(&answer)),
        |e| format!("I could not ask: {e}"),
    )
    .await
}

async fn approve(io: &mut TurnIo, action: &str) -> String {
    let args = json!({ "action": action }).to_string();
    calling(
        io,
        "dangerous_action",
        &args,
        |_| format!("Approved: {}", quoted(action)),
        |e| format!("Denied: {} ({e})", quoted(action)),
    )
    .await
}

async fn forget(io: &mut TurnIo, id: &str) -> String {
    let args = json!({ "id": id }).to_string();
    calling(
        io,
        "forget",
        &args,
        |_| format!("Forgot {}.", quoted(id)),
        |e| format!("I could not forget {}: {e}", quoted(id)),
    )
    .await
}

async fn mcp(io: &mut TurnIo, name: &str, args: &str) -> String {
    calling(
        io,
        name,
        args,
        |text| text,
        |e| format!("The MCP call failed: {e}"),
    )
    .await
}

async fn approve_thrice(io: &mut TurnIo, action: &str) -> String {
    let args = json!({ "action": action }).to_string();
    let mut outcomes = Vec::new();
    for _ in 0..3 {
        let out = io.call_tool("dangerous_action", &args).await;
        outcomes.push(if out.ok { "approved" } else { "denied" });
    }
    format!("Three times {}: {}", quoted(action), outcomes.join(", "))
}

/// The answer to text that is no command: nothing when it only accompanies files.
fn other(text: &str, attachments: bool) -> String {
    if attachments && (text.is_empty() || text.starts_with("User sent")) {
        String::new()
    } else {
        format!(
            "I received your message: {}. Say `help` for what I can do.",
            quoted(text)
        )
    }
}

/// How a file is named to people: its original name, never the workspace path.
fn file_label(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    display_name(file)
}

/// `list_files`' answer for a person: each file's own name (not the inbox's stored name), its
/// size and age, newest first; its workspace path only when `paths` (pure).
fn files_for_people(listing: &str, now: std::time::SystemTime, paths: bool) -> String {
    let mut files: Vec<(String, String, Option<std::time::SystemTime>)> = Vec::new();
    for line in listing.lines() {
        let Some((path, facts)) = line.rsplit_once(" (") else {
            // "No files yet." and anything else that is not a file line.
            return listing.to_owned();
        };
        let facts = facts.trim_end_matches(')');
        let (size, modified) = match facts.split_once(" bytes") {
            Some((size, rest)) => (
                size.parse::<u64>().ok(),
                rest.strip_prefix(", modified ")
                    .and_then(|t| humantime::parse_rfc3339(t).ok()),
            ),
            None => (None, None),
        };
        let size = size.map_or_else(
            || "size unknown".to_owned(),
            |b| bytesize::ByteSize::b(b).display().iec().to_string(),
        );
        files.push((path.to_owned(), size, modified));
    }
    files.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
    let mut out = format!("Files in this chat ({}):", files.len());
    for (path, size, modified) in &files {
        let age = modified.map_or_else(String::new, |t| format!(", {}", age(now, t)));
        out.push_str(&format!("\n- {} — {size}{age}", quoted(&file_label(path))));
        if paths {
            out.push_str(&format!(" — {}", quoted(path)));
        }
    }
    if !paths && !files.is_empty() {
        out.push_str("\n(`files paths` shows where each one is in the workspace.)");
    }
    out
}

/// How long ago `then` was, in words (pure).
fn age(now: std::time::SystemTime, then: std::time::SystemTime) -> String {
    let secs = now.duration_since(then).map_or(0, |d| d.as_secs());
    match secs {
        0..60 => "just now".to_owned(),
        60..3600 => format!("{} min ago", secs / 60),
        3600..86_400 => format!("{} h ago", secs / 3600),
        _ => format!("{} days ago", secs / 86_400),
    }
}

/// A user's words quoted back as a code span: shown exactly as written, never rendered as
/// markdown or HTML (no links, no images, no formatting the user did not see).
fn quoted(text: &str) -> String {
    let longest = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest + 1);
    let pad = if text.starts_with('`') || text.ends_with('`') {
        " "
    } else {
        ""
    };
    format!("{fence}{pad}{}{pad}{fence}", text.replace('\n', " "))
}

/// A bare name is looked up among the chat's files (its own folder first, then the newest
/// inbox file with that name); anything with a `/` is a workspace path.
async fn resolve(io: &mut TurnIo, target: &str) -> String {
    if target.contains('/') {
        return target.to_owned();
    }
    let own = format!("{}/{target}", io.scope().own_dir());
    let listed = io.call_tool("list_files", "{}").await;
    if !listed.ok {
        return own;
    }
    let paths: Vec<&str> = listed
        .output
        .lines()
        .filter_map(|l| l.rsplit_once(" (").map(|(p, _)| p))
        .collect();
    if paths.contains(&own.as_str()) {
        return own;
    }
    paths
        .iter()
        .filter(|p| {
            let file = p.rsplit('/').next().unwrap_or_default();
            file == target || display_name(file) == target
        })
        .max_by_key(|p| p.rsplit('/').next().unwrap_or_default().to_owned())
        .map(|p| (*p).to_owned())
        .unwrap_or(own)
}

async fn send(io: &mut TurnIo, path: &str, voice: bool) -> String {
    let args = json!({ "path": path, "voice": voice }).to_string();
    let out = io.call_tool("send_file", &args).await;
    if out.ok {
        format!("Sent {}.", file_label(path))
    } else {
        format!("I could not send {path}: {}", out.output)
    }
}

async fn remember(io: &mut TurnIo, fact: &str, scope: &str) -> String {
    let args = json!({ "fact": fact, "scope": scope }).to_string();
    let out = io.call_tool("remember", &args).await;
    if out.ok {
        // `Remembered as u1.`: the tool's sentence names only the id.
        out.output
    } else {
        format!("I could not remember that: {}", out.output)
    }
}

async fn recall(io: &mut TurnIo, query: Option<&str>) -> String {
    let args = json!({ "query": query }).to_string();
    let out = io.call_tool("recall", &args).await;
    if !out.ok {
        return format!("I could not recall: {}", out.output);
    }
    let facts = recalled_lines(&out.output);
    if facts.is_empty() {
        return match query {
            Some(q) => format!("I remember nothing containing {}.", quoted(q)),
            None => "I remember nothing for you or this room yet.".to_owned(),
        };
    }
    let mut reply = "What I remember:".to_owned();
    for line in facts {
        reply.push_str("\n- ");
        reply.push_str(&line);
    }
    reply
}

/// The `recall` tool's lines (`<id> (<scope>): <fact>`) for people: the facts quoted, the
/// user scope called theirs, other lines (a count of facts not shown) as they are. Empty if no
/// line is a fact (nothing remembered, or nothing matched).
fn recalled_lines(output: &str) -> Vec<String> {
    fn fact(line: &str) -> Option<(&str, &str, &str)> {
        let (head, fact) = line.split_once("): ")?;
        let (id, scope) = head.split_once(" (")?;
        parse_id(id).map(|_| (id, scope, fact))
    }
    if !output.lines().any(|l| fact(l).is_some()) {
        return Vec::new();
    }
    output
        .lines()
        .map(|line| match fact(line) {
            Some((id, scope, fact)) => {
                let whose = if scope == "room" {
                    "this room"
                } else {
                    "yours"
                };
                format!("{} ({whose}): {}", quoted(id), quoted(fact))
            }
            None => line.to_owned(),
        })
        .collect()
}

fn history(input: &TurnInput) -> String {
    let turns = input.history.earlier;
    let attachments = input.history.attachments;
    let mut out =
        format!("This chat has {turns} earlier turn(s) with {attachments} attachment(s).");
    for t in input.history.recent.iter().rev().take(5).rev() {
        let text: String = crate::speaker::one_line(&t.text).chars().take(80).collect();
        out.push_str(&format!(
            "\n- #{} {}: {text}",
            t.seq,
            crate::speaker::label(&t.sender)
        ));
        for a in t.all_attachments() {
            out.push_str(&format!("\n  - {a}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_table() {
        let cases = [
            ("help", Command::Help),
            ("HELP me", Command::Help),
            ("  files ", Command::Files(false)),
            ("files paths", Command::Files(true)),
            ("Location: Berlin", Command::Other("Location: Berlin")),
            ("send", Command::Other("send")),
            ("read notes.txt", Command::Read("notes.txt")),
            ("read", Command::Other("read")),
            ("voice memo.ogg", Command::Voice("memo.ogg")),
            ("voice", Command::Other("voice")),
            (
                "sendraw chats/x/missing.txt",
                Command::SendRaw("chats/x/missing.txt"),
            ),
            (
                "note a.txt hello world",
                Command::Note("a.txt", "hello world"),
            ),
            ("note a.txt", Command::Note("a.txt", "")),
            ("ask what: is it?", Command::Ask("what: is it?")),
            ("approve rm -rf /", Command::Approve("rm -rf /")),
            ("approve", Command::Approve("the demo action")),
            ("history", Command::History),
            ("sleep 250", Command::Sleep(250)),
            ("approve3 x", Command::ApproveThrice("x")),
            ("sleep 999999", Command::Sleep(60_000)),
            ("sleep soon", Command::Other("sleep soon")),
            ("remember I like tea", Command::Remember("I like tea")),
            (
                "Remember  roommate is Bob",
                Command::Remember("roommate is Bob"),
            ),
            (
                "remember room standup at 10",
                Command::RememberRoom("standup at 10"),
            ),
            ("remember ROOM  standup", Command::RememberRoom("standup")),
            ("remember room", Command::Other("remember room")),
            ("remember", Command::Other("remember")),
            ("recall", Command::Recall(None)),
            ("recall  green tea ", Command::Recall(Some("green tea"))),
            ("forget u3", Command::Forget("u3")),
            ("forget", Command::Other("forget")),
            (
                r#"mcp demo.echo {"text": "hi"}"#,
                Command::Mcp("demo__echo".into(), r#"{"text": "hi"}"#),
            ),
            ("mcp demo__echo", Command::Mcp("demo__echo".into(), "")),
            ("mcp", Command::Other("mcp")),
            ("hello there", Command::Other("hello there")),
        ];
        for (input, expected) in cases {
            assert_eq!(parse(input, true), expected, "{input:?}");
        }
    }

    #[test]
    fn file_lists_are_for_people() {
        let t0 = humantime::parse_rfc3339("2026-11-27T12:00:00Z").unwrap();
        let listing = "chats/c/notes.txt (12 bytes, modified 2026-11-27T11:58:00Z)\n\
            surfaces/matrix/@a%3Ahs/!r%3Ahs/inbox/20261127T090000Z-UufhGaNJ-report *draft*.pdf \
            (1572864 bytes, modified 2026-11-27T09:00:00Z)\n\
            chats/c/old.txt (0 bytes, modified 2026-11-20T12:00:00Z)\n\
            chats/c/fresh.txt (3 bytes, modified 2026-11-27T11:59:30Z)";
        assert_eq!(
            files_for_people(listing, t0, false),
            "Files in this chat (4):\n\
             - `fresh.txt` — 3 B, just now\n\
             - `notes.txt` — 12 B, 2 min ago\n\
             - `report *draft*.pdf` — 1.5 MiB, 3 h ago\n\
             - `old.txt` — 0 B, 7 days ago\n\
             (`files paths` shows where each one is in the workspace.)"
        );
        let with_paths = files_for_people(listing, t0, true);
        assert!(
            with_paths.contains("- `notes.txt` — 12 B, 2 min ago — `chats/c/notes.txt`"),
            "{with_paths}"
        );
        assert!(!with_paths.contains("files paths"), "{with_paths}");
        assert_eq!(
            files_for_people("No files yet.", t0, false),
            "No files yet."
        );
        // An older agent's listing (no times) still reads.
        assert_eq!(
            files_for_people("chats/c/a.txt (2048 bytes)", t0, false),
            "Files in this chat (1):\n- `a.txt` — 2.0 KiB\n(`files paths` shows where each one is in the workspace.)"
        );
    }

    #[test]
    fn files_are_named_not_pathed() {
        assert_eq!(
            file_label(
                "surfaces/matrix/@a%3Ahs/!r%3Ahs/inbox/20261122T101010Z-UufhGaNJ-gradient.png"
            ),
            "gradient.png"
        );
        assert_eq!(file_label("chats/c/notes.txt"), "notes.txt");
    }

    #[test]
    fn user_words_are_quoted_as_code() {
        assert_eq!(quoted("hi"), "`hi`");
        assert_eq!(quoted("<img src=x>"), "`<img src=x>`");
        assert_eq!(quoted("a `b` c"), "``a `b` c``");
        assert_eq!(quoted("`x"), "`` `x ``");
        assert_eq!(quoted("[l](http://e)\nnext"), "`[l](http://e) next`");
    }

    #[test]
    fn recalled_facts_are_quoted_for_people() {
        let cases: &[(&str, &[&str])] = &[
            (
                "u1 (user @a:x): likes *tea*\nr2 (room): standup at ten",
                &[
                    "`u1` (yours): `likes *tea*`",
                    "`r2` (this room): `standup at ten`",
                ],
            ),
            (
                "u1 (user @a:x): a): b\n(3 more; recall with a query to narrow the list)",
                &[
                    "`u1` (yours): `a): b`",
                    "(3 more; recall with a query to narrow the list)",
                ],
            ),
            ("No facts remembered.", &[]),
            ("No remembered fact contains \"x): y\".", &[]),
            ("No remembered fact contains \"a (b): c\".", &[]),
        ];
        for (output, expected) in cases {
            assert_eq!(recalled_lines(output), *expected, "{output:?}");
        }
        for command in ["remember <fact>", "remember room", "recall", "forget <id>"] {
            assert!(HELP.contains(command), "{command}");
        }
    }

    #[test]
    fn test_hooks_are_plain_text_unless_enabled() {
        let cases = [
            (
                "sendraw chats/x/a.txt",
                Command::Other("sendraw chats/x/a.txt"),
            ),
            ("sleep 250", Command::Other("sleep 250")),
            ("approve3 x", Command::Other("approve3 x")),
            ("help", Command::Help),
        ];
        for (input, expected) in cases {
            assert_eq!(parse(input, false), expected, "{input:?}");
        }
        assert!(!HELP.contains("sendraw") && !HELP.contains("sleep") && !HELP.contains("approve3"));
    }
}
