//! An ACP agent nobody here wrote, in an encrypted DM: the agent runs `AGENT_BRAIN=acp` with
//! Hermes (`hermes-acp`, PyPI `hermes-agent`, installed by scripts/test.sh into a venv named by
//! `MXBRIDGE_HERMES_ACP`), whose model is a scripted OpenAI-compatible server started here.
//! The matrix-sdk test user sees the answer streamed, approves a file write by replying (an
//! encrypted room takes no unencrypted reaction as a decision), finds the written file, gets
//! an answer that needs the first turn's context, and the turn survives a SIGKILL of the ACP
//! process and a restart of the agent worker (the session resumes with `session/load`).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use axum::routing::{get, post};
use e2e::{E2eeUser, Homeserver, Received, Stack, StackOptions};
use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::TURN;

/// Hermes' cold start and first session take ~7 s; a turn through it a few more.
const ACP_TURN: Duration = Duration::from_secs(180);

fn hermes() -> PathBuf {
    PathBuf::from(std::env::var_os("MXBRIDGE_HERMES_ACP").expect(
        "MXBRIDGE_HERMES_ACP: the hermes-acp of a venv with hermes-agent[acp] (scripts/test.sh installs it)",
    ))
}

/// What the scripted model saw: every streamed request's messages.
#[derive(Clone, Default)]
struct Model {
    requests: Arc<Mutex<Vec<Value>>>,
}

/// The text of a chat-completions message (a string or a list of parts).
fn text_of(message: &Value) -> String {
    match &message["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    }
}

/// The user's messages of a request, oldest first (the agent's own context notes left out).
fn user_texts(request: &Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "user")
        .map(text_of)
        .collect()
}

/// The reply to a streamed request, decided by what it asks: `(pause before each chunk,
/// chunks)`, each chunk an SSE `data` payload.
fn reply(request: &Value) -> (Duration, Vec<Value>) {
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let last = messages.last().cloned().unwrap_or_default();
    let asked = user_texts(request).last().cloned().unwrap_or_default();
    if last["role"] == "tool" && asked.contains("write the notes") {
        return (
            Duration::from_millis(20),
            words("I wrote notes.txt for you.", "stop"),
        );
    }
    if asked.contains("write the notes") {
        let args = json!({"path": "notes.txt", "content": "hello from hermes\n"});
        return (
            Duration::from_millis(20),
            vec![
                json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0,
                "id": "call_w1", "type": "function", "function": {"name": "write_file",
                "arguments": args.to_string()}}]}, "finish_reason": "tool_calls"}]}),
            ],
        );
    }
    if asked.contains("send me the notes") {
        if last["role"] == "tool" {
            return (Duration::from_millis(20), words("Sent.", "stop"));
        }
        // Our MCP server's send_file, under the name Hermes gives it.
        let tool = request["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["function"]["name"].as_str())
            .find(|n| n.contains("mxbridge") && n.ends_with("send_file"))
            .unwrap_or("mxbridge_send_file_missing")
            .to_owned();
        let args = json!({"path": "notes.txt", "caption": "your notes"});
        return (
            Duration::from_millis(20),
            vec![
                json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0,
                "id": "call_s1", "type": "function", "function": {"name": tool,
                "arguments": args.to_string()}}]}, "finish_reason": "tool_calls"}]}),
            ],
        );
    }
    if asked.contains("first message") {
        let first = user_texts(request)
            .into_iter()
            .find(|t| t.contains("hello there"))
            .map_or("(not in my context)", |_| "hello there");
        return (
            Duration::from_millis(20),
            words(&format!("Your first message was: {first}"), "stop"),
        );
    }
    if asked.contains("slow story") {
        return (
            Duration::from_millis(400),
            words(
                "Once upon a time a bridge carried every message across, one by one, and lost none.",
                "stop",
            ),
        );
    }
    (
        Duration::from_millis(20),
        words("Hello! I am Hermes, here to help.", "stop"),
    )
}

/// `text` streamed word by word, the last chunk carrying `finish`.
fn words(text: &str, finish: &str) -> Vec<Value> {
    let parts: Vec<String> = text.split_inclusive(' ').map(str::to_owned).collect();
    let last = parts.len() - 1;
    parts
        .into_iter()
        .enumerate()
        .map(|(i, w)| {
            json!({"choices": [{"index": 0, "delta": {"content": w},
                "finish_reason": (i == last).then_some(finish)}]})
        })
        .collect()
}

async fn complete(State(m): State<Model>, body: axum::Json<Value>) -> Response {
    let request = body.0;
    if request["stream"] != true {
        // Hermes' side calls (a title for the session) are not streamed.
        let answer = json!({"id": "t", "object": "chat.completion", "model": "fake-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "A chat"},
            "finish_reason": "stop"}]});
        return Response::builder()
            .header("content-type", "application/json")
            .body(Body::from(answer.to_string()))
            .unwrap();
    }
    m.requests.lock().unwrap().push(request.clone());
    let (pause, chunks) = reply(&request);
    let roles: Vec<&str> = request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["role"].as_str())
        .collect();
    eprintln!(
        "model: request roles={roles:?} last_user={:?} replies={}",
        user_texts(&request).last(),
        chunks.first().map(|c| c.to_string()).unwrap_or_default()
    );
    let stream = futures_util::stream::iter(chunks.into_iter().map(Some).chain([None])).then(
        move |c| async move {
            match c {
                Some(payload) => {
                    tokio::time::sleep(pause).await;
                    Ok::<_, std::io::Error>(format!("data: {payload}\n\n"))
                }
                None => Ok("data: [DONE]\n\n".to_owned()),
            }
        },
    );
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}

async fn models() -> axum::Json<Value> {
    axum::Json(json!({"object": "list", "data": [{"id": "fake-model", "object": "model"}]}))
}

async fn start_model(model: Model) -> String {
    let router = axum::Router::new()
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(complete))
        .with_state(model);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    base
}

/// Hermes' home: its settings (our model, approvals asked, nothing fetched at run time).
fn hermes_home(dir: &Path, base: &str) -> PathBuf {
    let home = dir.join("hermes-home");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join("config.yaml"),
        format!(
            "model:\n  provider: custom\n  base_url: {base}\n  default: fake-model\n  api_key: sk-test\n  context_length: 131072\n\
             approvals:\n  mode: manual\nsecurity:\n  tirith_enabled: false\n  allow_lazy_installs: false\n\
             lsp:\n  enabled: false\n"
        ),
    )
    .unwrap();
    home
}

/// What the bot says in `root`'s thread as it reads now: each of its messages there (the last
/// edit of each), one per line.
async fn answer_to(user: &E2eeUser, room: &str, bot: &str, root: &str) -> Option<String> {
    let messages = user.messages_from(room, bot).await.ok()?;
    let current = |m: &Received| {
        messages
            .iter()
            .filter(|e| e.replaces.as_deref() == Some(m.event_id.as_str()))
            .filter_map(|e| e.new_body.clone())
            .next_back()
            .unwrap_or_else(|| m.body.clone())
    };
    let said: Vec<String> = messages
        .iter()
        .filter(|m| m.thread_root.as_deref() == Some(root) && m.replaces.is_none())
        .map(current)
        .collect();
    (!said.is_empty()).then(|| said.join("\n"))
}

async fn wait_answer(
    stack: &Stack,
    user: &E2eeUser,
    room: &str,
    root: &str,
    what: &str,
    want: &str,
) -> String {
    let bot = stack.bot.user_id.clone();
    user.wait_for(ACP_TURN, what, || async {
        answer_to(user, room, &bot, root)
            .await
            .filter(|a| a.contains(want))
    })
    .await
    .unwrap_or_else(|e| {
        stack.dump();
        panic!("{e}")
    })
}

/// The bot's first message in the room that contains `words`.
async fn bot_says(stack: &Stack, user: &E2eeUser, room: &str, what: &str, words: &str) -> Received {
    let bot = stack.bot.user_id.clone();
    user.wait_for(ACP_TURN, what, || async {
        user.messages_from(room, &bot)
            .await
            .ok()?
            .into_iter()
            .find(|m| m.body.contains(words))
    })
    .await
    .unwrap_or_else(|e| {
        stack.dump();
        panic!("{e}")
    })
}

/// Process ids whose command line mentions `needle`.
fn processes_with(needle: &str) -> Vec<u32> {
    processes()
        .filter(|(_, cmdline, _)| cmdline.contains(needle))
        .map(|(pid, _, _)| pid)
        .collect()
}

/// Zombie children of `parent` (exited, never reaped).
fn zombies_of(parent: u32) -> Vec<u32> {
    processes()
        .filter(|(_, _, stat)| {
            let fields: Vec<&str> = stat
                .rsplit(')')
                .next()
                .unwrap_or_default()
                .split_whitespace()
                .collect();
            fields.first() == Some(&"Z") && fields.get(1) == Some(&parent.to_string().as_str())
        })
        .map(|(pid, _, _)| pid)
        .collect()
}

/// Every process: pid, command line, `/proc/<pid>/stat`.
fn processes() -> impl Iterator<Item = (u32, String, String)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            Some((pid, String::from_utf8_lossy(&cmdline).into_owned(), stat))
        })
}

fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = find_file(&path, name) {
                return Some(found);
            }
        } else if path.file_name().is_some_and(|n| n == name) {
            return Some(path);
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread")]
async fn a_real_acp_agent_answers_asks_writes_remembers_and_survives_kills() {
    let model = Model::default();
    let base = start_model(model.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let home = hermes_home(dir.path(), &base);
    let hs = Homeserver::from_env();
    let mut opts = StackOptions::default();
    opts.agent_env.extend([
        ("AGENT_BRAIN".to_owned(), "acp".to_owned()),
        (
            "AGENT_ACP_COMMAND".to_owned(),
            hermes().display().to_string(),
        ),
        ("AGENT_ACP_ENV".to_owned(), "HERMES_HOME".to_owned()),
        ("HERMES_HOME".to_owned(), home.display().to_string()),
    ]);
    opts.surface_env
        .insert("SURFACE_STREAM_EDITS".into(), "300ms".into());
    let mut stack = Stack::start(&hs, opts).await.expect("stack");
    let bot = stack.bot.user_id.clone();
    let user = E2eeUser::register(&hs, "acp").await.expect("user");
    let room = user.create_encrypted_dm(&bot).await.expect("DM");
    user.wait_joined(&room, &bot, TURN).await.expect("join");

    // 1. An answer, streamed into the room.
    let hello = user.send_text(&room, "hello there").await.unwrap();
    wait_answer(
        &stack,
        &user,
        &room,
        &hello,
        "the first answer",
        "I am Hermes, here to help.",
    )
    .await;

    // 2. A file write: Hermes asks permission, the room gets our approval prompt, a reply
    //    approves it, the file is written in the chat's folder.
    let write = user
        .send_text(&room, "please write the notes")
        .await
        .unwrap();
    let prompt = bot_says(
        &stack,
        &user,
        &room,
        "the approval prompt",
        "Approval needed",
    )
    .await;
    assert!(prompt.body.contains("acp__edit"), "{}", prompt.body);
    user.send_text(&room, "yes").await.unwrap();
    wait_answer(
        &stack,
        &user,
        &room,
        &write,
        "the answer after the write",
        "I wrote notes.txt",
    )
    .await;
    let notes = find_file(&stack.workspace, "notes.txt").expect("notes.txt in the workspace");
    assert_eq!(std::fs::read(&notes).unwrap(), b"hello from hermes\n");
    assert!(
        notes.starts_with(stack.workspace.join("chats")),
        "written in the chat's folder: {}",
        notes.display()
    );

    // 3. The file goes to the room as native media, through our MCP server's send_file.
    let send = user.send_text(&room, "send me the notes").await.unwrap();
    wait_answer(
        &stack,
        &user,
        &room,
        &send,
        "the answer after sending",
        "Sent.",
    )
    .await;
    let files: Vec<Received> = user
        .messages_from(&room, &bot)
        .await
        .unwrap()
        .into_iter()
        .filter(|m| m.thread_root.as_deref() == Some(send.as_str()) && m.msgtype == "m.file")
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(files[0].file_name(), "notes.txt");
    let bytes = user
        .download(files[0].source.as_ref().expect("media"))
        .await
        .expect("download");
    assert_eq!(bytes, b"hello from hermes\n");

    // 4. A later turn sees the first turn's context (the session is kept).
    let recall = user
        .send_text(&room, "what was my first message?")
        .await
        .unwrap();
    wait_answer(
        &stack,
        &user,
        &room,
        &recall,
        "the recalled context",
        "Your first message was: hello there",
    )
    .await;

    // 5. The ACP process is SIGKILLed mid-answer: the turn runs again once and completes.
    let story = user.send_text(&room, "tell me a slow story").await.unwrap();
    wait_answer(
        &stack,
        &user,
        &room,
        &story,
        "the story under way",
        "bridge",
    )
    .await;
    let acp = processes_with("hermes-acp");
    assert!(!acp.is_empty(), "hermes-acp runs");
    for pid in &acp {
        unsafe_kill(*pid);
    }
    let told = bot_says(
        &stack,
        &user,
        &room,
        "the notice of the restart",
        "The agent stopped",
    )
    .await;
    assert_eq!(
        told.thread_root.as_deref(),
        Some(story.as_str()),
        "{told:?}"
    );
    wait_answer(
        &stack,
        &user,
        &room,
        &story,
        "the story, whole",
        "and lost none.",
    )
    .await;
    let notices = user
        .messages_from(&room, &bot)
        .await
        .unwrap()
        .into_iter()
        .filter(|m| m.body.contains("The agent stopped"))
        .count();
    assert_eq!(notices, 1, "told once");
    let agent_pid = stack.agent.pid().expect("agent runs");
    assert_eq!(
        zombies_of(agent_pid),
        Vec::<u32>::new(),
        "the killed agent was reaped"
    );

    // 6. The agent worker is SIGKILLed mid-answer and started again: the surface sends the
    //    turn again, the ACP session is resumed (session/load), and the room ends with one
    //    answer, whole.
    let story2 = user
        .send_text(&room, "tell me a slow story again")
        .await
        .unwrap();
    wait_answer(
        &stack,
        &user,
        &room,
        &story2,
        "the second story under way",
        "bridge",
    )
    .await;
    let resumed_before = stack.agent.log().matches("ACP session resumed").count();
    stack.agent.kill9().await;
    stack.agent.start().expect("agent again");
    stack.wait_agent_healthy().await;
    // The notice comes after the answer, once the turn ran again to its end.
    let told = wait_answer(
        &stack,
        &user,
        &room,
        &story2,
        "the second story, whole, then the notice",
        "I was interrupted while answering this",
    )
    .await;
    assert!(told.contains("and lost none."), "{told}");
    assert_eq!(
        told.matches("I was interrupted while answering this")
            .count(),
        1,
        "the room is told once that the turn runs again: {told}"
    );
    assert_eq!(
        told.matches("Once upon a time").count(),
        1,
        "the story shown once: {told}"
    );
    assert!(
        stack.agent.log().matches("ACP session resumed").count() > resumed_before,
        "resumed with session/load after the restart"
    );

    // 7. The next turn still has the first message in the agent's context.
    let again = user
        .send_text(&room, "and my first message?")
        .await
        .unwrap();
    wait_answer(
        &stack,
        &user,
        &room,
        &again,
        "the context after a restart",
        "Your first message was: hello there",
    )
    .await;
    assert!(
        stack.agent.log().contains("ACP session resumed"),
        "resumed with session/load"
    );

    // No ACP process outlives the agent, and none is left a zombie.
    stack.agent.stop().await;
    let left = user
        .wait_for(
            Duration::from_secs(10),
            "the ACP processes gone",
            || async {
                let left = processes_with("hermes-acp");
                left.is_empty().then_some(left)
            },
        )
        .await;
    assert!(
        left.is_ok(),
        "left behind: {:?}",
        processes_with("hermes-acp")
    );
}

fn unsafe_kill(pid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
}
