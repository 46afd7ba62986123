//! MCP servers that are hostile or broken (`mcp_hostile.py`, plain JSON-RPC on stdio): they
//! cannot stall other chats' turns, bloat the agent's memory, flood or forge its log, or make
//! every model request huge. Run by the same interpreter as `mcp.rs` (skipped without one).

use std::path::Path;
use std::time::{Duration, Instant};

use agent::config::{BrainConfig, McpServerConfig, OpenAiConfig, Policy};
use protocol::{ChatId, EndStatus};
use serde_json::json;

use crate::mcp::{CALL_TIMEOUT, python, stdio, with_mcp};
use crate::openai::{Fake, sse, tool_call};
use crate::support::*;

/// `mcp_hostile.py MODE ARGS…` as the server `name`.
fn hostile(python: &Path, name: &str, args: &[&str]) -> McpServerConfig {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/mcp_hostile.py");
    let mut all = vec![script.display().to_string()];
    all.extend(args.iter().map(|a| (*a).to_owned()));
    stdio(name, python.display().to_string(), all)
}

/// A model answer: just `text`.
fn says(text: &str) -> String {
    sse(&[json!({"choices":[{"delta":{"content":text},"finish_reason":"stop"}]})])
}

/// A model answer: call `tool` with no arguments.
fn calls(tool: &str) -> String {
    sse(&[
        tool_call(0, "call_1", tool, "{}"),
        json!({"choices":[{"delta":{},"finish_reason":"tool_calls"}]}),
    ])
}

/// One turn that runs `command` in an agent whose only MCP server is `mcp_hostile.py MODE` as
/// `name`: its transcript, and how long it took.
async fn one_call(python: &Path, name: &str, mode: &str, command: &str) -> (Transcript, Duration) {
    let servers = vec![hostile(python, name, &[mode])];
    let policy = format!("{name}__*");
    let policies = &[(policy.as_str(), Policy::Allow)];
    let agent = TestAgent::start_with(with_mcp(servers, policies, CALL_TIMEOUT)).await;
    let (mut c, _) = agent.connect(&chat()).await;
    let started = Instant::now();
    let t = c.turn(message(1, "$p1", command)).await;
    (t, started.elapsed())
}

/// The names of the tools a model request offered.
fn offered(request: &serde_json::Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_server_that_never_starts_holds_up_no_other_chat() {
    let Some(python) = python() else { return };
    let fake = Fake::default();
    let base = fake
        .start(vec![calls("stuck__anything"), says("B is served.")])
        .await;
    let servers = vec![hostile(&python, "stuck", &["silent"])];
    let policies = &[("stuck__*", Policy::Allow)];
    let agent = TestAgent::start_with(|c| {
        with_mcp(servers, policies, CALL_TIMEOUT)(c);
        c.brain = BrainConfig::OpenAi(OpenAiConfig::new(base, "fake-model", None));
    })
    .await;

    // Chat A's model calls a tool of the stuck server: only A waits for its start (30 s).
    let (mut a, _) = agent.connect(&chat()).await;
    let started = Instant::now();
    a.submit(message(1, "$a1", "use the stuck server")).await;
    let deadline = Instant::now() + DEADLINE;
    while fake.requests.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "chat A asks the model");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let a_asked = started.elapsed();

    // Chat B's turn meanwhile: served at once, without the stuck server's tools.
    let thread = ChatId::for_conversation(ROOM, Some("$root"));
    let (mut b, _) = agent.connect(&thread).await;
    let mut m = message(1, "$b1", "hello");
    m.thread_root = Some("$root".to_owned());
    let started = Instant::now();
    let t = b.turn(m).await;
    let b_took = started.elapsed();
    eprintln!("chat A reached the model after {a_asked:?}; chat B's turn took {b_took:?}");
    assert_eq!(t.end().status, EndStatus::Completed);
    assert_eq!(t.text(), "B is served.");
    // Well before the 30 s start timeout: nothing waited for the stuck server.
    assert!(a_asked < Duration::from_secs(5), "{a_asked:?}");
    assert!(b_took < Duration::from_secs(5), "{b_took:?}");
    let requests = fake.requests.lock().unwrap();
    for (_, request) in requests.iter() {
        let names = offered(request);
        assert!(names.iter().all(|n| !n.starts_with("stuck__")), "{names:?}");
        assert!(names.iter().any(|n| n == "read_file"), "{names:?}");
    }
}

#[tokio::test]
async fn a_server_whose_tool_list_does_not_parse_fails_at_once() {
    let Some(python) = python() else { return };
    let (t, took) = one_call(&python, "bad", "bad-tools", "mcp bad.anything {}").await;
    eprintln!("the unparsable tool list failed the start after {took:?}");
    assert!(
        t.text()
            .starts_with(r#"The MCP call failed: the MCP server "bad" could not be started"#),
        "{}",
        t.text()
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
}

// A line that is not JSON is one rmcp drops without a word: the start would wait out its
// 30 s limit. The agent reads the server's stdout itself and ends the start at that line, and
// the error (also the one line logged) quotes it escaped. (Not checked in the log here: two
// tests capturing the log in one process lose each other's lines.)
#[tokio::test]
async fn a_server_whose_tool_list_is_not_json_fails_at_once_and_alone() {
    let Some(python) = python() else { return };
    let servers = vec![
        hostile(&python, "garbled", &["garbled-tools"]),
        hostile(&python, "fine", &["tools", "2"]),
    ];
    let policies = &[("garbled__*", Policy::Allow), ("fine__*", Policy::Allow)];
    let agent = TestAgent::start_with(with_mcp(servers, policies, CALL_TIMEOUT)).await;
    let (mut c, _) = agent.connect(&chat()).await;
    let started = Instant::now();
    let t = c.turn(message(1, "$g1", "mcp garbled.anything {}")).await;
    let took = started.elapsed();
    eprintln!("the tool list that is not JSON failed the start after {took:?}");
    assert_eq!(t.end().status, EndStatus::Completed);
    assert!(
        t.text().starts_with(
            r#"The MCP call failed: the MCP server "garbled" could not be started: it wrote a line that is not JSON on stdout: tools: echo, add \u{1b}[31mFORGED"#
        ),
        "{}",
        t.text()
    );
    assert!(took < Duration::from_secs(5), "{took:?}");

    // The other server, in this chat and another, is served as usual.
    let t = c.turn(message(2, "$g2", "mcp fine.tool_0 {}")).await;
    assert_eq!(t.text(), "ok");
    let thread = ChatId::for_conversation(ROOM, Some("$root"));
    let (mut b, _) = agent.connect(&thread).await;
    let mut m = message(1, "$g3", "mcp fine.tool_1 {}");
    m.thread_root = Some("$root".to_owned());
    let t = b.turn(m).await;
    assert_eq!(t.text(), "ok");
}

#[tokio::test]
async fn a_call_answered_with_a_line_that_is_not_json_fails_at_once() {
    let Some(python) = python() else { return };
    let (t, took) = one_call(&python, "garbled", "garbled-call", "mcp garbled.echo {}").await;
    eprintln!("the answer that is not JSON failed the call after {took:?}");
    assert!(
        t.text().starts_with(
            r#"The MCP call failed: the MCP server "garbled" went away during the call (it wrote a line that is not JSON on stdout: tools: echo"#
        ),
        "{}",
        t.text()
    );
    // Well within the call's 30 s limit.
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[tokio::test]
async fn a_server_flooding_stderr_leaves_a_bounded_tail() {
    let Some(python) = python() else { return };
    // 64 MiB on stderr without a newline, then the server exits.
    let servers = vec![hostile(&python, "flood", &["flood", "67108864"])];
    let policies = &[("flood__*", Policy::Allow)];
    let agent = TestAgent::start_with(with_mcp(servers, policies, CALL_TIMEOUT)).await;
    let (mut c, _) = agent.connect(&chat()).await;
    let t = c.turn(message(1, "$f1", "mcp flood.echo {}")).await;
    assert_eq!(t.end().status, EndStatus::Completed);
    let text = t.text();
    assert!(
        text.starts_with(r#"The MCP call failed: the MCP server "flood" could not be started"#),
        "{text}"
    );
    // Its last words: the end of the endless line, cut short.
    assert!(text.contains("it said: xxxxxxxx"), "{text}");
    assert!(text.ends_with('…'), "{text}");
    assert!(text.len() < 1000, "{} bytes: {text}", text.len());
}

#[tokio::test]
async fn a_server_offering_thousands_of_tools_is_capped_per_turn() {
    let Some(python) = python() else { return };
    let fake = Fake::default();
    let base = fake
        .start(vec![calls("many__tool_0"), says("done"), says("again")])
        .await;
    let servers = vec![hostile(&python, "many", &["tools", "3000"])];
    let policies = &[("many__*", Policy::Allow)];
    let agent = TestAgent::start_with(|c| {
        with_mcp(servers, policies, CALL_TIMEOUT)(c);
        c.brain = BrainConfig::OpenAi(OpenAiConfig::new(base, "fake-model", None));
    })
    .await;
    let (mut c, _) = agent.connect(&chat()).await;
    let t = c.turn(message(1, "$t1", "use many tools")).await;
    assert_eq!(t.end().status, EndStatus::Completed);
    assert_eq!(t.tool_calls(), ["many__tool_0"]);
    assert_eq!(t.text(), "done");
    // The call waited for the server's start, so the next turn shows what a live one costs.
    let t = c.turn(message(2, "$t2", "again")).await;

    let requests = fake.requests.lock().unwrap();
    assert_eq!(t.text(), "again");
    let request = &requests[2].1;
    let names = offered(request);
    let mcp = names.iter().filter(|n| n.starts_with("many__")).count();
    eprintln!(
        "{mcp} of the server's 3000 tools offered; the request is {} bytes",
        request.to_string().len()
    );
    assert_eq!(mcp, 128, "{names:?}");
    assert!(names.iter().any(|n| n == "read_file"), "{names:?}");
}

// The real agent binary, its log read from its own output: a subscriber set for one test
// thread misses lines when other tests log at the same time (tracing's per-callsite interest
// is shared by the whole process), which made this test flaky in-process.
#[tokio::test]
async fn a_noisy_server_neither_floods_nor_forges_the_log() {
    let Some(python) = python() else { return };
    let workspace = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/it/mcp_hostile.py");
    let log_path = state.path().join("agent.log");
    let log_file = std::fs::File::create(&log_path).unwrap();
    // Each call of `ping` sends 10,000 log notifications, newlines in every name, first.
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agent"))
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("AGENT_BIND", format!("127.0.0.1:{port}"))
        .env("AGENT_TOKEN", TOKEN)
        .env("WORKSPACE_ROOT", workspace.path())
        .env("AGENT_STATE_DIR", state.path())
        .env("AGENT_TEST_HOOKS", "1")
        .env(
            "AGENT_MCP_SERVERS",
            format!(
                "noisy=stdio:{} {} noisy 10000",
                python.display(),
                script.display()
            ),
        )
        .env("AGENT_TOOL_POLICY", "noisy__*=allow")
        .stdin(std::process::Stdio::null())
        .stdout(log_file.try_clone().unwrap())
        .stderr(log_file)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let url = format!("ws://127.0.0.1:{port}/v1/agent_ws/{}/", chat().as_str());
    let deadline = Instant::now() + DEADLINE;
    let ws = loop {
        match tokio_tungstenite::connect_async(request(&url, Some(TOKEN), None)).await {
            Ok((ws, _)) => break ws,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("the agent did not listen: {e}"),
        }
    };
    let mut c = Client {
        ws,
        delivery_error: None,
    };
    c.hello(None).await;
    let t = c.turn(message(1, "$n1", "mcp noisy.ping {}")).await;
    assert_eq!(t.text(), "pong");
    child.kill().await.unwrap();

    let text = std::fs::read_to_string(&log_path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    eprintln!("{} log lines, {} bytes:\n{text}", lines.len(), text.len());
    assert!(lines.len() < 100, "{text}");
    // The server's names are logged, escaped: no line of its making.
    assert!(lines.iter().all(|l| !l.starts_with("FORGED")), "{text}");
    assert!(
        text.contains(r"noisy\nFORGED INFO agent::session"),
        "the server's own name, escaped: {text}"
    );
    assert!(
        text.contains("MCP tool left out") && text.contains(r"xxx\nFORGED"),
        "the tool whose name is too long, escaped: {text}"
    );
}
