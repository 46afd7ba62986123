//! The OpenAI brain against a model server that misbehaves at the TCP level: llama.cpp's
//! recorded responses replayed byte for byte (`tests/fixtures/openai/llama-server-samples.txt`)
//! in small pieces, a server that never answers, one that stops mid-stream or hangs up, 429s
//! with `Retry-After`, and each failure class's message in the turn's `end`.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent::config::{BrainConfig, ModelTuning, OpenAiConfig, Secret};
use protocol::EndStatus;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::*;

/// What the server does with one request.
#[derive(Debug, Clone)]
enum Reply {
    /// Writes these bytes (a whole HTTP response) in small pieces, then closes.
    Raw(Vec<u8>),
    /// Writes these bytes, then holds the connection open without another byte.
    Stall(Vec<u8>),
    /// Reads the request and never answers.
    Freeze,
}

/// A plain streamed answer "final words", as llama-server frames it.
fn final_answer() -> Reply {
    sse_response(&[
        r#"{"choices":[{"index":0,"delta":{"content":"final"},"finish_reason":null}]}"#,
        r#"{"choices":[{"index":0,"delta":{"content":" words"},"finish_reason":"stop"}]}"#,
    ])
}

/// A `200 text/event-stream` response (chunked) with these `data` payloads and `[DONE]`.
fn sse_response(payloads: &[&str]) -> Reply {
    let mut body = Vec::new();
    for p in payloads.iter().copied().chain(["[DONE]"]) {
        let event = format!("data: {p}\n\n");
        body.extend(format!("{:x}\r\n{event}\r\n", event.len()).into_bytes());
    }
    body.extend(b"0\r\n\r\n");
    let mut r = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".to_vec();
    r.extend(body);
    Reply::Raw(r)
}

/// A JSON response with `status` and extra header lines.
fn json_response(status: &str, headers: &str, body: &str) -> Reply {
    Reply::Raw(
        format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{headers}Connection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

/// Recorded llama-server response `letter` (A…D), byte for byte.
fn llama(letter: char) -> Vec<u8> {
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/openai/llama-server-samples.txt");
    let all = std::fs::read(file).unwrap();
    let all = String::from_utf8(all).unwrap();
    let section = all
        .split(&format!("{}\n", "=".repeat(100)))
        .find(|s| s.starts_with(&format!("{letter}. ")))
        .unwrap();
    let start = section.find("HTTP/1.1 ").unwrap();
    let raw = &section[start..];
    raw.strip_suffix('\n').unwrap_or(raw).as_bytes().to_vec()
}

/// A model server on loopback answering requests from a script (then [`final_answer`]).
#[derive(Clone, Default)]
struct Server {
    script: Arc<Mutex<VecDeque<Reply>>>,
    requests: Arc<Mutex<Vec<String>>>,
}

impl Server {
    async fn start(script: Vec<Reply>) -> (Self, String) {
        let s = Self::default();
        *s.script.lock().unwrap() = script.into();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}/v1", listener.local_addr().unwrap());
        let server = s.clone();
        tokio::spawn(async move {
            loop {
                let (conn, _) = listener.accept().await.unwrap();
                tokio::spawn(server.clone().answer(conn));
            }
        });
        (s, base)
    }

    async fn answer(self, mut conn: TcpStream) {
        let request = read_request(&mut conn).await;
        self.requests.lock().unwrap().push(request);
        let reply = self
            .script
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or_else(final_answer);
        match reply {
            Reply::Raw(bytes) => {
                write_slowly(&mut conn, &bytes).await;
                let _ = conn.shutdown().await;
            }
            Reply::Stall(bytes) => {
                write_slowly(&mut conn, &bytes).await;
                tokio::time::sleep(Duration::from_secs(600)).await;
            }
            Reply::Freeze => tokio::time::sleep(Duration::from_secs(600)).await,
        }
    }

    fn count(&self) -> usize {
        self.requests.lock().unwrap().len()
    }
}

/// Reads one request (head and `Content-Length` body).
async fn read_request(conn: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = conn.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        if let Some(head_end) = text.find("\r\n\r\n") {
            let length = text[..head_end]
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if buf.len() >= head_end + 4 + length {
                return text;
            }
        }
    }
    String::from_utf8_lossy(&buf).to_string()
}

/// Writes in 61-byte pieces, so SSE events and chunk framing arrive split.
async fn write_slowly(conn: &mut TcpStream, bytes: &[u8]) {
    for piece in bytes.chunks(61) {
        if conn.write_all(piece).await.is_err() {
            return;
        }
        conn.flush().await.ok();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// An agent whose brain talks to `base` with `tune` applied to the default tuning.
async fn agent_for(base: String, tune: impl FnOnce(&mut ModelTuning)) -> TestAgent {
    let mut config = OpenAiConfig::new(base, "qwen-test", Some(Secret::new("sk-secret-key-42")));
    tune(&mut config.tuning);
    TestAgent::start_with(|c| c.brain = BrainConfig::OpenAi(config)).await
}

async fn one_turn(agent: &TestAgent, text: &str) -> Transcript {
    let (mut c, _) = agent.connect(&chat()).await;
    c.turn(message(1, "$m1", text)).await
}

fn error_of(t: &Transcript) -> String {
    t.end().error.clone().unwrap_or_default()
}

#[tokio::test]
async fn llama_server_tool_call_stream_is_one_call() {
    let (server, base) = Server::start(vec![Reply::Raw(llama('A'))]).await;
    let agent = agent_for(base, |_| {}).await;
    let t = one_turn(&agent, "list my notes").await;
    assert_eq!(t.end().status, EndStatus::Completed, "{t:?}");
    assert_eq!(t.tool_calls(), ["list_files"]);
    assert!(t.text().contains("final words"), "{}", t.text());
    // The second request carries the call's arguments as the model streamed them, whole.
    let second = &server.requests.lock().unwrap()[1];
    assert!(
        second.contains(r#"\"dir\": \"chats/<alice:test.local>/notes.txt\""#),
        "{second}"
    );
}

#[tokio::test]
async fn llama_server_cut_off_tool_call_is_not_run_or_sent_back() {
    // B is the cut-off call; C is what llama-server answers if the cut-off arguments are sent
    // back. The agent must never get that far.
    let (server, base) = Server::start(vec![Reply::Raw(llama('B')), Reply::Raw(llama('C'))]).await;
    let agent = agent_for(base, |_| {}).await;
    let t = one_turn(&agent, "list my notes").await;
    assert_eq!(t.end().status, EndStatus::Completed, "{t:?}");
    assert!(t.tool_calls().is_empty(), "{:?}", t.tool_calls());
    assert!(t.text().contains("length limit"), "{}", t.text());
    assert_eq!(server.count(), 1);
}

#[tokio::test]
async fn llama_server_500_is_tried_again_before_anything_was_shown() {
    let (server, base) = Server::start(vec![Reply::Raw(llama('C'))]).await;
    let agent = agent_for(base, |_| {}).await;
    let t = one_turn(&agent, "hello").await;
    assert_eq!(t.end().status, EndStatus::Completed, "{t:?}");
    assert_eq!(t.text(), "final words");
    assert_eq!(server.count(), 2);
}

#[tokio::test]
async fn llama_server_context_exceeded_says_so_and_the_chat_goes_on() {
    let (_server, base) = Server::start(vec![Reply::Raw(llama('D'))]).await;
    let agent = agent_for(base, |_| {}).await;
    let (mut c, _) = agent.connect(&chat()).await;
    let t = c.turn(message(1, "$m1", &"long ".repeat(3000))).await;
    assert_eq!(t.end().status, EndStatus::Failed);
    assert!(
        error_of(&t).contains("too long for the model's context"),
        "{t:?}"
    );
    let t = c.turn(message(2, "$m2", "short")).await;
    assert_eq!(t.end().status, EndStatus::Completed, "{t:?}");
}

#[tokio::test]
async fn a_frozen_server_ends_the_turn_with_a_clear_message() {
    let (server, base) = Server::start(vec![Reply::Freeze, Reply::Freeze]).await;
    let agent = agent_for(base, |t| {
        t.head_timeout = Duration::from_millis(800);
        t.attempts = 2;
    })
    .await;
    let t = one_turn(&agent, "hello").await;
    assert_eq!(t.end().status, EndStatus::Failed);
    assert!(error_of(&t).contains("did not answer within"), "{t:?}");
    assert_eq!(server.count(), 2, "tried again once");
}

#[tokio::test]
async fn a_stream_that_goes_silent_is_abandoned_and_not_retried() {
    let head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: {\"choices\":[{\"delta\":{\"content\":\"Half an\"}}]}\n\n";
    let (server, base) = Server::start(vec![Reply::Stall(head.to_vec())]).await;
    let agent = agent_for(base, |t| t.idle_timeout = Duration::from_millis(800)).await;
    let t = one_turn(&agent, "hello").await;
    assert_eq!(t.end().status, EndStatus::Failed);
    assert!(error_of(&t).contains("stopped sending"), "{t:?}");
    assert_eq!(t.text(), "Half an", "shown once, never again");
    assert_eq!(server.count(), 1, "text was shown: no retry");
}

#[tokio::test]
async fn a_server_that_hangs_up_mid_stream_fails_the_turn() {
    let head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\ndata: {\"choices\":[{\"delta\":{\"content\":\"Half\"}}]}\n\ndata: {\"choi";
    let (_server, base) = Server::start(vec![Reply::Raw(head.to_vec())]).await;
    let agent = agent_for(base, |_| {}).await;
    let t = one_turn(&agent, "hello").await;
    assert_eq!(t.end().status, EndStatus::Failed, "{t:?}");
    assert!(error_of(&t).contains("stream broke"), "{t:?}");
}

#[tokio::test]
async fn rate_limited_then_served_honours_retry_after() {
    let limited = json_response(
        "429 Too Many Requests",
        "Retry-After: 1\r\n",
        r#"{"error":{"message":"slow down","type":"rate_limit"}}"#,
    );
    let (server, base) = Server::start(vec![limited]).await;
    let agent = agent_for(base, |_| {}).await;
    let started = std::time::Instant::now();
    let t = one_turn(&agent, "hello").await;
    assert_eq!(t.end().status, EndStatus::Completed, "{t:?}");
    assert_eq!(t.text(), "final words", "one answer, shown once");
    assert_eq!(server.count(), 2);
    assert!(
        started.elapsed() >= Duration::from_millis(950),
        "waited as asked"
    );
}

#[tokio::test]
async fn each_failure_class_has_its_own_message_without_the_key() {
    let cases = [
        (
            json_response(
                "401 Unauthorized",
                "",
                r#"{"error":{"message":"bad key sk-secret-key-42"}}"#,
            ),
            "refused the API key",
        ),
        (
            json_response(
                "404 Not Found",
                "",
                r#"{"error":{"message":"model \"qwen-test\" not found, try pulling it first"}}"#,
            ),
            "has no model named \"qwen-test\"",
        ),
        (
            json_response(
                "429 Too Many Requests",
                "",
                r#"{"error":{"message":"quota"}}"#,
            ),
            "rate limiting",
        ),
        (
            json_response(
                "400 Bad Request",
                "",
                r#"{"error":{"message":"unsupported parameter sk-secret-key-42"}}"#,
            ),
            "answered HTTP 400: unsupported parameter [redacted]",
        ),
    ];
    for (reply, want) in cases {
        let (_server, base) = Server::start(vec![reply.clone(); 4]).await;
        let agent = agent_for(base, |t| t.attempts = 1).await;
        let t = one_turn(&agent, "hello").await;
        assert_eq!(t.end().status, EndStatus::Failed, "{want}");
        let error = error_of(&t);
        assert!(error.contains(want), "{error:?} should say {want:?}");
        assert!(!error.contains("sk-secret-key-42"));
    }
    // Nothing listening: unreachable.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}/v1", free.local_addr().unwrap());
    drop(free);
    let agent = agent_for(base, |t| t.attempts = 1).await;
    let t = one_turn(&agent, "hello").await;
    assert!(error_of(&t).contains("cannot be reached"), "{t:?}");
}
