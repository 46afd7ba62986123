//! The OpenAI brain against responses recorded from, or written to the documented shapes of,
//! other servers (`tests/fixtures/openai/replay/*.json`, from the team's shared fixtures):
//! each scenario is served in order by a local server, then a plain final answer.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};

use agent::config::{BrainConfig, OpenAiConfig, Secret};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use protocol::EndStatus;
use serde::Deserialize;

use crate::support::*;

/// One recorded response.
#[derive(Debug, Clone, Deserialize)]
struct Recorded {
    status: u16,
    content_type: String,
    body: String,
}

const FINAL: &str = "data: {\"choices\":[{\"delta\":{\"content\":\" final words\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";

#[derive(Clone, Default)]
struct Replay {
    script: Arc<Mutex<VecDeque<Recorded>>>,
    requests: Arc<Mutex<u32>>,
}

async fn serve(State(r): State<Replay>) -> impl IntoResponse {
    *r.requests.lock().unwrap() += 1;
    let next = r.script.lock().unwrap().pop_front().unwrap_or(Recorded {
        status: 200,
        content_type: "text/event-stream".into(),
        body: FINAL.into(),
    });
    (
        StatusCode::from_u16(next.status).unwrap(),
        [("content-type", next.content_type)],
        next.body,
    )
}

/// Starts the replay of `scenario` and an agent whose brain talks to it.
async fn replay(scenario: &str) -> (TestAgent, Replay) {
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/openai/replay")
        .join(format!("{scenario}.json"));
    let recorded: Vec<Recorded> =
        serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    replay_of(recorded).await
}

/// Serves `recorded`, then plain final answers, to an agent whose brain talks to it.
async fn replay_of(recorded: Vec<Recorded>) -> (TestAgent, Replay) {
    let r = Replay::default();
    *r.script.lock().unwrap() = recorded.into();
    let router = axum::Router::new()
        .route("/v1/chat/completions", post(serve))
        .with_state(r.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let agent = TestAgent::start_with(|c| {
        c.brain = BrainConfig::OpenAi(OpenAiConfig::new(
            base,
            "replayed",
            Some(Secret::new("sk-test")),
        ));
    })
    .await;
    (agent, r)
}

/// Connects to `agent` and runs one turn saying `text`.
async fn one_turn(agent: &TestAgent, text: &str) -> Transcript {
    let (mut c, _) = agent.connect(&chat()).await;
    c.turn(message(1, "$r1", text)).await
}

#[tokio::test]
async fn ollama_parallel_calls_all_at_index_0_are_two_calls() {
    let (agent, r) = replay("a-ollama-index0").await;
    let t = one_turn(&agent, "list twice").await;
    assert_eq!(t.end().status, EndStatus::Completed, "{t:?}");
    assert_eq!(t.tool_calls(), ["list_files", "list_files"]);
    assert!(t.text().contains("final words"));
    assert_eq!(*r.requests.lock().unwrap(), 2);
}

#[tokio::test]
async fn an_error_in_the_middle_of_a_stream_fails_the_turn() {
    let (agent, _) = replay("b-midstream-error").await;
    let t = one_turn(&agent, "answer").await;
    assert_eq!(t.end().status, EndStatus::Failed, "{t:?}");
    let error = t.end().error.clone().unwrap_or_default();
    assert!(
        error.contains("mid-answer") && error.contains("had an error"),
        "{error}"
    );
}

#[tokio::test]
async fn a_name_repeated_in_every_delta_is_one_name() {
    let (agent, _) = replay("c-repeated-name").await;
    let t = one_turn(&agent, "list").await;
    assert_eq!(t.end().status, EndStatus::Completed, "{t:?}");
    assert_eq!(t.tool_calls(), ["list_files"]);
}

#[tokio::test]
async fn null_tool_calls_are_no_tool_calls() {
    let (agent, r) = replay("d-null-tool-calls").await;
    let t = one_turn(&agent, "hi").await;
    assert_eq!(t.end().status, EndStatus::Completed, "{t:?}");
    assert_eq!(t.text(), "Hello");
    assert_eq!(*r.requests.lock().unwrap(), 1);
}

#[tokio::test]
async fn an_answer_cut_by_the_length_limit_says_so() {
    let (agent, r) = replay("e-length-no-done").await;
    let t = one_turn(&agent, "long").await;
    assert_eq!(t.end().status, EndStatus::Completed, "{t:?}");
    assert!(t.text().starts_with("This answer was cut"), "{}", t.text());
    assert!(t.text().contains("cut off"), "{}", t.text());
    assert_eq!(
        *r.requests.lock().unwrap(),
        1,
        "nothing asked after a cut-off"
    );
}

#[tokio::test]
async fn a_refusal_says_what_the_server_said_without_the_key() {
    let (agent, _) = replay_of(vec![Recorded {
        status: 401,
        content_type: "application/json".into(),
        body: r#"{"error":{"message":"Incorrect API key provided: sk-test","type":"invalid_request_error"}}"#.into(),
    }])
    .await;
    let t = one_turn(&agent, "hi").await;
    assert_eq!(t.end().status, EndStatus::Failed);
    let error = t.end().error.clone().unwrap_or_default();
    assert!(
        error.contains("401") && error.contains("refused the API key"),
        "{error}"
    );
    assert!(!error.contains("sk-test"), "{error}");
}

#[tokio::test]
async fn a_failed_turn_is_not_sent_again_as_history() {
    // First turn: the server refuses (context exceeded); second: a plain answer. The second
    // request must not carry the failed turn.
    let r = Replay::default();
    *r.script.lock().unwrap() = VecDeque::from([Recorded {
        status: 400,
        content_type: "application/json".into(),
        body: r#"{"error":{"code":400,"message":"the request exceeds the available context size","type":"exceed_context_size_error"}}"#.into(),
    }]);
    let bodies: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
    let (r2, b2) = (r.clone(), bodies.clone());
    let router = axum::Router::new().route(
        "/v1/chat/completions",
        post(move |body: axum::Json<serde_json::Value>| {
            let (r, b) = (r2.clone(), b2.clone());
            async move {
                b.lock().unwrap().push(body.0);
                serve(State(r)).await.into_response()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let agent = TestAgent::start_with(|c| {
        c.brain = BrainConfig::OpenAi(OpenAiConfig::new(base, "replayed", None));
    })
    .await;
    let (mut c, _) = agent.connect(&chat()).await;
    let huge = "x".repeat(2000);
    let t = c.turn(message(1, "$r1", &huge)).await;
    assert_eq!(t.end().status, EndStatus::Failed);
    let t = c.turn(message(2, "$r2", "hello")).await;
    assert_eq!(t.end().status, EndStatus::Completed, "{t:?}");
    let bodies = bodies.lock().unwrap();
    let second = bodies.last().unwrap().to_string();
    assert!(!second.contains(&huge), "the failed turn went along again");
}

fn call_chunk(id: &str, name: &str, args: &str) -> String {
    let chunk = serde_json::json!({"choices":[{"delta":{"tool_calls":[
        {"index":0,"id":id,"type":"function","function":{"name":name,"arguments":args}}
    ]},"finish_reason":"tool_calls"}]});
    format!("data: {chunk}\n\ndata: [DONE]\n\n")
}

#[tokio::test]
async fn a_tool_call_repeated_every_round_runs_once() {
    let args = format!(r#"{{"path":"chats/{}/a.txt","content":"x"}}"#, chat());
    let rounds: Vec<Recorded> = (0..6)
        .map(|i| Recorded {
            status: 200,
            content_type: "text/event-stream".into(),
            body: call_chunk(&format!("c{i}"), "write_file", &args),
        })
        .collect();
    let (agent, r) = replay_of(rounds).await;
    let t = one_turn(&agent, "write it").await;
    assert_eq!(t.end().status, EndStatus::Failed, "{t:?}");
    assert_eq!(t.tool_calls().len(), 1, "run once: {:?}", t.tool_calls());
    let error = t.end().error.clone().unwrap_or_default();
    assert!(error.contains("kept repeating"), "{error}");
    assert!(*r.requests.lock().unwrap() <= 3);
}

#[tokio::test]
async fn a_loading_server_is_waited_for() {
    let busy = Recorded {
        status: 503,
        content_type: "application/json".into(),
        body: r#"{"error":{"message":"Loading model","code":503}}"#.into(),
    };
    let (agent, r) = replay_of(vec![busy.clone(), busy]).await;
    let t = one_turn(&agent, "hi").await;
    assert_eq!(t.end().status, EndStatus::Completed, "{t:?}");
    assert!(t.text().contains("final words"));
    assert_eq!(*r.requests.lock().unwrap(), 3, "two 503s, then the answer");
}
