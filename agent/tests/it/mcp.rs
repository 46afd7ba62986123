//! MCP servers as tool sources, against a real MCP server: `mcp_server.py` on the official
//! Python SDK, started by the agent as a child process over stdio.
//!
//! The interpreter with the `mcp` package comes from `MXBRIDGE_MCP_PYTHON`, else the venv at
//! `$HOME/.cache/mxbridge/mcp-venv` (`python3 -m venv …; …/bin/pip install 'mcp<2'`). Without
//! either the tests say so and pass without running.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use agent::config::{
    BrainConfig, Config, McpConfig, McpServerConfig, McpTransport, OpenAiConfig, Policy, Secret,
};
use protocol::{ApprovalDecision, ChatId, Decision, EndStatus, ToSurface};
use serde_json::json;

use crate::openai::{Fake, sse, tool_call};
use crate::support::*;

/// The Python interpreter that has the `mcp` package, if this machine has one.
pub(crate) fn python() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("MXBRIDGE_MCP_PYTHON").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let home = std::env::var_os("HOME")?;
    let venv = PathBuf::from(home).join(".cache/mxbridge/mcp-venv/bin/python");
    if venv.exists() {
        return Some(venv);
    }
    eprintln!(
        "skipped: no Python with the `mcp` package (set MXBRIDGE_MCP_PYTHON, or create \
         ~/.cache/mxbridge/mcp-venv with `pip install 'mcp<2'`)"
    );
    None
}

/// The demo server (`mcp_server.py`) run by `python`.
fn demo(python: &std::path::Path) -> McpServerConfig {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/it/mcp_server.py");
    stdio(
        "demo",
        python.display().to_string(),
        vec![script.display().to_string()],
    )
}

pub(crate) fn stdio(name: &str, program: String, args: Vec<String>) -> McpServerConfig {
    McpServerConfig {
        name: name.to_owned(),
        transport: McpTransport::Stdio { program, args },
        chats: None,
    }
}

/// Adds `servers` (and `policies`, e.g. `demo__*=allow`) to the agent's configuration.
pub(crate) fn with_mcp<'a>(
    servers: Vec<McpServerConfig>,
    policies: &'a [(&'a str, Policy)],
    timeout: Duration,
) -> impl FnOnce(&mut Config) + 'a {
    move |c: &mut Config| {
        c.mcp = McpConfig {
            servers: servers.into_iter().map(|s| (s.name.clone(), s)).collect(),
            timeout,
        };
        for (key, policy) in policies {
            c.tool_policy.insert((*key).to_owned(), *policy);
        }
    }
}

const ALLOW_DEMO: &[(&str, Policy)] = &[("demo__*", Policy::Allow)];
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(30);

fn approvals(t: &Transcript) -> usize {
    t.messages
        .iter()
        .filter(|m| matches!(m, ToSurface::ApprovalRequest(_)))
        .count()
}

#[tokio::test]
async fn builtin_mcp_command_calls_an_allowed_tool() {
    let Some(python) = python() else { return };
    let agent =
        TestAgent::start_with(with_mcp(vec![demo(&python)], ALLOW_DEMO, CALL_TIMEOUT)).await;
    let (mut c, _) = agent.connect(&chat()).await;

    let t = c
        .turn(message(1, "$m1", r#"mcp demo.echo {"text":"hi"}"#))
        .await;
    assert_eq!(t.end().status, EndStatus::Completed);
    assert_eq!(t.text(), "hi");
    assert_eq!(t.tool_calls(), ["demo__echo"]);
    assert_eq!(approvals(&t), 0);

    // The model's spelling works too, and the connection is reused.
    let t = c
        .turn(message(2, "$m2", r#"mcp demo__add {"a": 2, "b": 40}"#))
        .await;
    assert_eq!(t.text(), "42");

    // Arguments the tool's schema refuses come back as the server's error.
    let t = c
        .turn(message(3, "$m3", r#"mcp demo.add {"a": "x"}"#))
        .await;
    assert!(t.text().starts_with("The MCP call failed:"), "{}", t.text());
    let t = c.turn(message(4, "$m4", "mcp demo.nope {}")).await;
    assert!(
        t.text().contains(r#"has no tool "demo__nope""#),
        "{}",
        t.text()
    );
}

#[tokio::test]
async fn mcp_tools_ask_by_default_once_per_call() {
    let Some(python) = python() else { return };
    let agent = TestAgent::start_with(with_mcp(vec![demo(&python)], &[], CALL_TIMEOUT)).await;
    let (mut c, _) = agent.connect(&chat()).await;

    c.submit(message(1, "$q1", r#"mcp demo.echo {"text":"approved hi"}"#))
        .await;
    let asked = c
        .until(|m| matches!(m, ToSurface::ApprovalRequest(_)))
        .await;
    let Some(ToSurface::ApprovalRequest(r)) = asked.messages.last() else {
        unreachable!()
    };
    assert_eq!(r.tool, "demo__echo");
    assert_eq!(r.resource, r#"{"text":"approved hi"}"#);
    assert!(r.summary.contains("MCP server demo"), "{}", r.summary);
    c.send(ApprovalDecision {
        request_id: r.request_id.clone(),
        decision: Decision::AllowOnce,
        by: USER.into(),
    })
    .await;
    let rest = c.until_end("$q1").await;
    assert_eq!(approvals(&asked) + approvals(&rest), 1);
    assert_eq!(rest.text(), "approved hi");

    // Denied: the tool does not run, and the brain hears why.
    c.submit(message(2, "$q2", r#"mcp demo.echo {"text":"no"}"#))
        .await;
    let asked = c
        .until(|m| matches!(m, ToSurface::ApprovalRequest(_)))
        .await;
    let Some(ToSurface::ApprovalRequest(r)) = asked.messages.last() else {
        unreachable!()
    };
    c.send(ApprovalDecision {
        request_id: r.request_id.clone(),
        decision: Decision::Deny,
        by: USER.into(),
    })
    .await;
    let rest = c.until_end("$q2").await;
    assert!(
        rest.text()
            .starts_with("The MCP call failed: the user did not approve demo__echo"),
        "{}",
        rest.text()
    );
}

#[tokio::test]
async fn a_hanging_server_times_out_and_the_agent_carries_on() {
    let Some(python) = python() else { return };
    let timeout = Duration::from_secs(2);
    let agent = TestAgent::start_with(with_mcp(vec![demo(&python)], ALLOW_DEMO, timeout)).await;
    let (mut c, _) = agent.connect(&chat()).await;

    let t = c
        .turn(message(1, "$h1", r#"mcp demo.hang {"seconds": 60}"#))
        .await;
    assert_eq!(t.end().status, EndStatus::Completed);
    assert!(
        t.text()
            .contains(r#"the MCP server "demo" did not answer within 2s"#),
        "{}",
        t.text()
    );
    assert!(
        t.messages
            .iter()
            .any(|m| matches!(m, ToSurface::ToolResult(r) if !r.ok))
    );

    // The next turn is served, by a fresh server process.
    let t = c
        .turn(message(2, "$h2", r#"mcp demo.echo {"text":"still here"}"#))
        .await;
    assert_eq!(t.text(), "still here");
}

#[tokio::test]
async fn a_server_that_exits_is_started_again_on_the_next_call() {
    let Some(python) = python() else { return };
    let agent =
        TestAgent::start_with(with_mcp(vec![demo(&python)], ALLOW_DEMO, CALL_TIMEOUT)).await;
    let (mut c, _) = agent.connect(&chat()).await;
    let t = c.turn(message(1, "$e1", "mcp demo.crash {}")).await;
    assert_eq!(t.end().status, EndStatus::Completed);
    assert!(
        t.text()
            .starts_with(r#"The MCP call failed: the MCP server "demo" went away during the call"#),
        "{}",
        t.text()
    );
    let t = c
        .turn(message(2, "$e2", r#"mcp demo.echo {"text":"back"}"#))
        .await;
    assert_eq!(t.text(), "back");
}

#[tokio::test]
async fn a_server_that_cannot_start_gives_a_clear_error() {
    let Some(python) = python() else { return };
    let exits = stdio(
        "exits",
        python.display().to_string(),
        vec!["-c".into(), "raise SystemExit('no such config')".into()],
    );
    let missing = stdio("missing", "/nonexistent/mcp-server".into(), Vec::new());
    let policies = &[("exits__*", Policy::Allow), ("missing__*", Policy::Allow)];
    let agent = TestAgent::start_with(with_mcp(vec![exits, missing], policies, CALL_TIMEOUT)).await;
    let (mut c, _) = agent.connect(&chat()).await;

    let t = c.turn(message(1, "$x1", "mcp exits.echo {}")).await;
    assert_eq!(t.end().status, EndStatus::Completed);
    assert!(
        t.text()
            .starts_with(r#"The MCP call failed: the MCP server "exits" could not be started"#),
        "{}",
        t.text()
    );
    // Its last words on stderr say why.
    assert!(
        t.text().ends_with("it said: no such config"),
        "{}",
        t.text()
    );
    let t = c.turn(message(2, "$x2", "mcp missing.echo {}")).await;
    assert!(
        t.text()
            .contains("could not be started: cannot run /nonexistent/mcp-server"),
        "{}",
        t.text()
    );
    let t = c.turn(message(3, "$x3", "help")).await;
    assert!(t.text().contains("mcp <server>.<tool>"), "{}", t.text());
}

#[tokio::test]
async fn http_servers_get_their_bearer_token() {
    let Some(python) = python() else { return };
    // A free port for the server (taken back by the OS when the probe closes).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/it/mcp_server.py");
    let _server = tokio::process::Command::new(&python)
        .arg(&script)
        .args(["--http", &port.to_string(), "http-token-1234"])
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the HTTP server starts"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let http = |name: &str, token: &str| McpServerConfig {
        name: name.to_owned(),
        transport: McpTransport::Http {
            url: format!("http://127.0.0.1:{port}/mcp"),
            token: Some(Secret::new(token)),
        },
        chats: None,
    };
    let servers = vec![http("web", "http-token-1234"), http("wrong", "nope")];
    let policies = &[("web__*", Policy::Allow), ("wrong__*", Policy::Allow)];
    let agent = TestAgent::start_with(with_mcp(servers, policies, CALL_TIMEOUT)).await;
    let (mut c, _) = agent.connect(&chat()).await;
    let t = c
        .turn(message(1, "$w1", r#"mcp web.echo {"text":"over http"}"#))
        .await;
    assert_eq!(t.text(), "over http");
    let t = c
        .turn(message(2, "$w2", r#"mcp wrong.echo {"text":"x"}"#))
        .await;
    assert!(
        t.text()
            .starts_with(r#"The MCP call failed: the MCP server "wrong" could not be started"#),
        "{}",
        t.text()
    );
    assert!(t.text().contains("401 Unauthorized"), "{}", t.text());
    assert!(!t.text().contains("nope"), "{}", t.text());
}

#[tokio::test]
async fn servers_can_be_limited_to_some_chats() {
    let Some(python) = python() else { return };
    let mut server = demo(&python);
    server.chats = Some([ChatId::new("r-elsewhere-0123").unwrap()].into());
    let agent = TestAgent::start_with(with_mcp(vec![server], ALLOW_DEMO, CALL_TIMEOUT)).await;
    let (mut c, _) = agent.connect(&chat()).await;
    let t = c
        .turn(message(1, "$c1", r#"mcp demo.echo {"text":"hi"}"#))
        .await;
    assert!(
        t.text().contains(r#"no MCP server "demo" for this chat"#),
        "{}",
        t.text()
    );
}

#[tokio::test]
async fn the_openai_brain_offers_and_runs_mcp_tools() {
    let Some(python) = python() else { return };
    let fake = Fake::default();
    let base = fake
        .start(vec![
            sse(&[
                tool_call(0, "call_1", "demo__add", r#"{"a": 20, "b": 22}"#),
                json!({"choices":[{"delta":{},"finish_reason":"tool_calls"}]}),
            ]),
            sse(&[json!({"choices":[{"delta":{"content":"It is 42."},"finish_reason":"stop"}]})]),
            sse(&[json!({"choices":[{"delta":{"content":"Done."},"finish_reason":"stop"}]})]),
        ])
        .await;
    let agent = TestAgent::start_with(|c| {
        with_mcp(vec![demo(&python)], ALLOW_DEMO, CALL_TIMEOUT)(c);
        c.brain = BrainConfig::OpenAi(OpenAiConfig::new(base, "fake-model", None));
    })
    .await;
    let (mut c, _) = agent.connect(&chat()).await;
    let t = c.turn(message(1, "$a1", "what is 20 + 22?")).await;
    assert_eq!(t.end().status, EndStatus::Completed);
    assert_eq!(t.tool_calls(), ["demo__add"]);
    assert_eq!(t.text(), "It is 42.");
    // The server starts in the background with the agent and a turn's list of tools never
    // waits for it, so the first turn may have been offered none of its tools; the model's
    // call waited for it, so the next turn surely is.
    let t = c.turn(message(2, "$a2", "thanks")).await;
    assert_eq!(t.text(), "Done.");

    let requests = fake.requests.lock().unwrap();
    let tools: BTreeMap<&str, &serde_json::Value> = requests[2].1["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["function"]["name"].as_str().unwrap(), &t["function"]))
        .collect();
    for name in ["demo__echo", "demo__add", "demo__hang", "read_file"] {
        assert!(tools.contains_key(name), "{name} offered: {tools:?}");
    }
    let add = tools["demo__add"];
    assert_eq!(add["parameters"]["required"], json!(["a", "b"]));
    assert!(
        add["description"]
            .as_str()
            .unwrap()
            .starts_with("Add two whole numbers."),
        "{add}"
    );
    let answer = requests[1].1["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap();
    assert_eq!(answer["tool_call_id"], "call_1");
    assert_eq!(answer["content"], "42");
}
