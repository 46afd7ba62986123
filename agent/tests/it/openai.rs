//! The OpenAI-compatible brain against a tiny fake SSE server on 127.0.0.1:0.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use agent::config::{BrainConfig, OpenAiConfig, Secret};
use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::routing::post;
use protocol::{ApprovalDecision, Decision, EndStatus, ToSurface};
use serde_json::{Value, json};

use crate::support::*;

/// Each request the fake server got: its `Authorization` header and JSON body.
pub(crate) type Requests = Arc<Mutex<Vec<(Option<String>, Value)>>>;

/// A fake chat-completions server answering each request with the next scripted stream.
#[derive(Clone, Default)]
pub(crate) struct Fake {
    pub(crate) requests: Requests,
    script: Arc<Mutex<VecDeque<String>>>,
}

impl Fake {
    /// Starts the server; returns its base URL (ending in `/v1`).
    pub(crate) async fn start(&self, script: Vec<String>) -> String {
        *self.script.lock().unwrap() = script.into();
        let router = axum::Router::new()
            .route("/v1/chat/completions", post(completions))
            .with_state(self.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}/v1", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        base
    }
}

pub(crate) fn sse(chunks: &[Value]) -> String {
    let mut body: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    body.push_str("data: [DONE]\n\n");
    body
}

pub(crate) fn tool_call(index: usize, id: &str, name: &str, arguments: &str) -> Value {
    json!({"choices":[{"delta":{"tool_calls":[
        {"index":index,"id":id,"type":"function","function":{"name":name,"arguments":arguments}}
    ]}}]})
}

async fn completions(
    State(fake): State<Fake>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> impl IntoResponse {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    fake.requests.lock().unwrap().push((auth, body));
    let next = fake.script.lock().unwrap().pop_front();
    let body =
        next.unwrap_or_else(|| sse(&[json!({"choices":[{"delta":{"content":"(script over)"}}]})]));
    ([("content-type", "text/event-stream")], body)
}

async fn agent_with(base: String) -> TestAgent {
    TestAgent::start_with(|c| {
        c.brain = BrainConfig::OpenAi(OpenAiConfig::new(
            base,
            "fake-model",
            Some(Secret::new("sk-test")),
        ));
    })
    .await
}

#[tokio::test]
async fn streams_text_and_runs_tool_calls() {
    let fake = Fake::default();
    let args = format!(
        r#"{{"path":"chats/{}/out.txt","content":"from the model"}}"#,
        chat()
    );
    let (first_half, second_half) = args.split_at(10);
    let base = fake
        .start(vec![
            // Some text, then a tool call whose arguments arrive in two pieces.
            sse(&[
                json!({"choices":[{"delta":{"content":"Let me write "}}]}),
                json!({"choices":[{"delta":{"content":"that."}}]}),
                tool_call(0, "call_1", "write_file", first_half),
                json!({"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":second_half}}]}}]}),
                json!({"choices":[{"delta":{},"finish_reason":"tool_calls"}]}),
            ]),
            sse(&[json!({"choices":[{"delta":{"content":" Done."},"finish_reason":"stop"}]})]),
        ])
        .await;
    let agent = agent_with(base).await;
    let (mut c, _) = agent.connect(&chat()).await;
    let t = c.turn(message(1, "$o1", "please write a file")).await;
    assert_eq!(t.end().status, EndStatus::Completed);
    assert_eq!(t.text(), "Let me write that. Done.");
    assert_eq!(t.tool_calls(), ["write_file"]);
    assert!(
        t.messages
            .iter()
            .any(|m| matches!(m, ToSurface::ToolResult(r) if r.ok))
    );
    let written = agent.ws_path(&format!("chats/{}/out.txt", chat()));
    assert_eq!(std::fs::read_to_string(written).unwrap(), "from the model");

    let requests = fake.requests.lock().unwrap();
    assert_eq!(requests.len(), 2);
    let (auth, first) = &requests[0];
    assert_eq!(auth.as_deref(), Some("Bearer sk-test"));
    assert_eq!(first["model"], "fake-model");
    assert_eq!(first["stream"], true);
    let tools = first["tools"].as_array().unwrap();
    assert_eq!(
        tools.len(),
        agent::config::TOOL_NAMES.len() - 1,
        "every tool but the demo dangerous_action, which the operator did not name"
    );
    assert!(
        tools
            .iter()
            .all(|t| t["function"]["name"] != "dangerous_action")
    );
    let write = tools
        .iter()
        .find(|t| t["function"]["name"] == "write_file")
        .unwrap();
    assert_eq!(write["function"]["parameters"]["type"], "object");
    // The second request carries the tool result back to the model.
    let (_, second) = &requests[1];
    let last = second["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["role"], "tool");
    assert_eq!(last["tool_call_id"], "call_1");
    assert!(
        last["content"]
            .as_str()
            .unwrap()
            .starts_with("wrote 14 bytes")
    );
}

#[tokio::test]
async fn repeated_approvals_in_one_turn_are_coalesced() {
    // Two writes of one file (different contents, so two calls): one approval prompt.
    let fake = Fake::default();
    let path = format!("chats/{}/plan.txt", chat());
    let base = fake
        .start(vec![
            sse(&[
                tool_call(
                    0,
                    "c1",
                    "write_file",
                    &json!({"path": path, "content": "a"}).to_string(),
                ),
                tool_call(
                    1,
                    "c2",
                    "write_file",
                    &json!({"path": path, "content": "b"}).to_string(),
                ),
            ]),
            sse(&[json!({"choices":[{"delta":{"content":"Both done."}}]})]),
        ])
        .await;
    let agent = TestAgent::start_with(|c| {
        c.brain = BrainConfig::OpenAi(OpenAiConfig::new(base, "fake-model", None));
        c.tool_policy
            .insert("write_file".into(), agent::config::Policy::Ask);
    })
    .await;
    let (mut c, _) = agent.connect(&chat()).await;
    c.submit(message(1, "$o1", "reboot twice")).await;
    let asked = c
        .until(|m| matches!(m, ToSurface::ApprovalRequest(_)))
        .await;
    let Some(ToSurface::ApprovalRequest(r)) = asked.messages.last() else {
        unreachable!()
    };
    assert_eq!(
        (r.tool.as_str(), r.resource.as_str()),
        ("write_file", path.as_str())
    );
    c.send(ApprovalDecision {
        request_id: r.request_id.clone(),
        decision: Decision::AllowOnce,
        by: USER.into(),
    })
    .await;
    let t = c.until_end("$o1").await;
    assert!(
        !t.messages
            .iter()
            .any(|m| matches!(m, ToSurface::ApprovalRequest(_))),
        "asked twice: {t:?}"
    );
    let ok_results = t
        .messages
        .iter()
        .filter(|m| matches!(m, ToSurface::ToolResult(r) if r.ok))
        .count();
    assert_eq!(ok_results, 2);
    assert!(t.text().ends_with("Both done."));
}

#[tokio::test]
async fn a_failing_model_fails_the_turn_cleanly() {
    // Nothing listens on this port: the request fails and the turn ends as failed.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    drop(listener);
    let agent = agent_with(base).await;
    let (mut c, _) = agent.connect(&chat()).await;
    let t = c.turn(message(1, "$o1", "hi")).await;
    assert_eq!(t.end().status, EndStatus::Failed);
    let error = t.end().error.clone().unwrap();
    assert!(!error.contains("sk-test"));
}

#[tokio::test]
async fn a_tool_call_reads_the_attachment_the_user_sent() {
    let fake = Fake::default();
    let path = format!("{}/20260101T120001Z-efgh5678-notes.txt", inbox(ROOM));
    let base = fake
        .start(vec![
            sse(&[
                tool_call(0, "r1", "read_file", &json!({ "path": path }).to_string()),
                json!({"choices":[{"delta":{},"finish_reason":"tool_calls"}]}),
            ]),
            sse(&[
                json!({"choices":[{"delta":{"content":"It says hello."},"finish_reason":"stop"}]}),
            ]),
        ])
        .await;
    let agent = agent_with(base).await;
    let written = write(
        agent.workspace.path(),
        &path,
        b"hello from the attachment\n",
    );
    let (mut c, _) = agent.connect(&chat()).await;
    let mut m = message(1, "$a1", "what does my file say?");
    m.attachments = vec![written];
    let t = c.turn(m).await;
    assert_eq!(t.end().status, EndStatus::Completed, "{t:?}");
    assert_eq!(t.tool_calls(), ["read_file"]);
    let requests = fake.requests.lock().unwrap();
    let first = requests[0].1.to_string();
    assert!(
        first.contains(&path),
        "the model is told the attachment's path: {first}"
    );
    let second = requests[1].1.to_string();
    assert!(
        second.contains("hello from the attachment"),
        "the file's text went back to the model: {second}"
    );
    assert_eq!(t.text(), "It says hello.");
}

#[tokio::test]
async fn the_model_learns_when_a_file_did_not_reach_the_room() {
    let fake = Fake::default();
    let path = format!("chats/{}/big.bin", chat());
    let base = fake
        .start(vec![
            sse(&[
                tool_call(0, "s1", "send_file", &json!({ "path": path }).to_string()),
                json!({"choices":[{"delta":{},"finish_reason":"tool_calls"}]}),
            ]),
            sse(&[json!({"choices":[{"delta":{"content":"Sorry, it did not go through."},"finish_reason":"stop"}]})]),
        ])
        .await;
    let agent = agent_with(base).await;
    write(agent.workspace.path(), &path, b"0123456789");
    let (mut c, _) = agent.connect(&chat()).await;
    c.delivery_error = Some("the homeserver refused it: M_TOO_LARGE".into());
    let t = c.turn(message(1, "$d1", "send me big.bin")).await;
    assert_eq!(t.end().status, EndStatus::Completed, "{t:?}");
    let result = t
        .messages
        .iter()
        .find_map(|m| match m {
            ToSurface::ToolResult(r) => Some(r.clone()),
            _ => None,
        })
        .expect("a tool result");
    assert!(!result.ok, "{result:?}");
    let requests = fake.requests.lock().unwrap();
    let second = requests[1].1.to_string();
    assert!(
        second.contains("did not get") && second.contains("M_TOO_LARGE"),
        "the model was told: {second}"
    );
    assert!(
        !second.contains("sent chats/"),
        "never told it was sent: {second}"
    );
}

#[tokio::test]
async fn usage_in_the_last_chunk_is_counted_as_tokens() {
    // As OpenAI (and llama.cpp, asked with `include_usage`) send it: a last chunk with no
    // choices. The amounts are unique in this test process, whose recorder all agents share.
    let fake = Fake::default();
    let base = fake
        .start(vec![sse(&[
            json!({"choices":[{"delta":{"content":"Counted."}}]}),
            json!({"choices":[{"delta":{},"finish_reason":"stop"}],"usage":null}),
            json!({"choices":[],"usage":{"prompt_tokens":7_000_003,"completion_tokens":3_000_001,"total_tokens":10_000_004}}),
        ])])
        .await;
    let agent = agent_with(base).await;
    let (mut c, _) = agent.connect(&chat()).await;
    let t = c.turn(message(1, "$u1", "count me")).await;
    assert_eq!(t.end().status, EndStatus::Completed, "{t:?}");
    assert_eq!(t.text(), "Counted.");
    let first = fake.requests.lock().unwrap()[0].1.clone();
    assert_eq!(first["stream_options"], json!({"include_usage": true}));
    let m = agent.metrics().await;
    let tokens = |direction: &str| {
        metric(
            &m,
            &format!("mxbridge_agent_model_tokens_total{{direction=\"{direction}\"}}"),
        )
    };
    assert!(tokens("in") >= 7_000_003.0, "{m}");
    assert!(tokens("out") >= 3_000_001.0, "{m}");
}

#[tokio::test]
async fn a_server_refusing_stream_options_is_asked_without_them_from_then_on() {
    // An older or strict server: 400 for the unknown field, as OpenAI-compatible servers word it.
    let bodies: Arc<Mutex<Vec<Value>>> = Arc::default();
    let seen = bodies.clone();
    let router = axum::Router::new().route(
        "/v1/chat/completions",
        post(move |Json(body): Json<Value>| {
            let seen = seen.clone();
            async move {
                let strict = body.get("stream_options").is_some();
                seen.lock().unwrap().push(body);
                if strict {
                    let refusal = json!({"error":{"message":"Unrecognized request argument supplied: stream_options","type":"invalid_request_error"}});
                    return (axum::http::StatusCode::BAD_REQUEST, Json(refusal)).into_response();
                }
                let answer = sse(&[
                    json!({"choices":[{"delta":{"content":"Fine."},"finish_reason":"stop"}]}),
                ]);
                ([("content-type", "text/event-stream")], answer).into_response()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let agent = agent_with(base).await;
    let (mut c, _) = agent.connect(&chat()).await;
    for (seq, id) in [(1, "$s1"), (2, "$s2")] {
        let t = c.turn(message(seq, id, "hi")).await;
        assert_eq!(t.end().status, EndStatus::Completed, "{t:?}");
        assert_eq!(t.text(), "Fine.");
    }
    let asked: Vec<bool> = bodies
        .lock()
        .unwrap()
        .iter()
        .map(|b| b.get("stream_options").is_some())
        .collect();
    assert_eq!(
        asked,
        [true, false, false],
        "asked again without them once, and remembered"
    );
}
