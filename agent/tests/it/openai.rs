//! The OpenAI-compatible brain against a tiny fake SSE server on 127.0.0.1:0.

use std::sync::{Arc, Mutex};

use agent::config::{BrainConfig, OpenAiConfig, Secret};
use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::routing::post;
use protocol::{EndStatus, ToSurface};
use serde_json::{Value, json};

use crate::support::*;

/// Each request the fake server got: its `Authorization` header and JSON body.
type Requests = Arc<Mutex<Vec<(Option<String>, Value)>>>;

#[derive(Clone, Default)]
struct Fake {
    requests: Requests,
}

fn sse(chunks: &[Value]) -> String {
    let mut body: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    body.push_str("data: [DONE]\n\n");
    body
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
    let round = {
        let mut r = fake.requests.lock().unwrap();
        r.push((auth, body.clone()));
        r.len()
    };
    let body = if round == 1 {
        // First answer: some text, then a tool call split over two chunks.
        sse(&[
            json!({"choices":[{"delta":{"content":"Let me write "}}]}),
            json!({"choices":[{"delta":{"content":"that."}}]}),
            json!({"choices":[{"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"write_file","arguments":"{\"path\":\"chats/"}}]}}]}),
            json!({"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments": format!("{}/out.txt\",\"content\":\"from the model\"}}", chat())}}]}}]}),
            json!({"choices":[{"delta":{},"finish_reason":"tool_calls"}]}),
        ])
    } else {
        sse(&[json!({"choices":[{"delta":{"content":" Done."},"finish_reason":"stop"}]})])
    };
    ([("content-type", "text/event-stream")], body)
}

#[tokio::test]
async fn streams_text_and_runs_tool_calls() {
    let fake = Fake::default();
    let router = axum::Router::new()
        .route("/v1/chat/completions", post(completions))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });

    let agent = TestAgent::start_with(|c| {
        c.brain = BrainConfig::OpenAi(OpenAiConfig {
            base_url: base,
            model: "fake-model".into(),
            api_key: Some(Secret::new("sk-test")),
        });
    })
    .await;
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
    let write = tools
        .iter()
        .find(|t| t["function"]["name"] == "write_file")
        .unwrap();
    assert_eq!(write["function"]["parameters"]["type"], "object");
    assert_eq!(tools.len(), agent::tools::TOOL_NAMES.len());
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
}
