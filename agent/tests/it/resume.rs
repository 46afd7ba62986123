//! A turn interrupted half way resumes after its completed steps, with the file store and with
//! PostgreSQL: the model is not asked again for a response it gave, a tool call that completed
//! is not run again (its recorded outcome is used), and a call that had not completed runs.

use agent::config::{BrainConfig, OpenAiConfig};
use agent::db::DatabaseConfig;
use protocol::{Answer, EndStatus, Secret, ToSurface};
use serde_json::json;

use crate::openai::{Fake, sse, tool_call};
use crate::support::*;

/// The scripted model: write a file, then ask the user, then finish.
async fn model(fake: &Fake) -> String {
    let write = json!({"path": format!("chats/{}/out.txt", chat()), "content": "once"});
    let ask = json!({"question": "Which colour?"});
    fake.start(vec![
        sse(&[
            json!({"choices":[{"delta":{"content":"Writing. "}}]}),
            tool_call(0, "c1", "write_file", &write.to_string()),
            json!({"choices":[{"delta":{},"finish_reason":"tool_calls"}]}),
        ]),
        sse(&[
            tool_call(0, "c2", "ask_user", &ask.to_string()),
            json!({"choices":[{"delta":{},"finish_reason":"tool_calls"}]}),
        ]),
        sse(&[json!({"choices":[{"delta":{"content":"Done."},"finish_reason":"stop"}]})]),
    ])
    .await
}

async fn interrupted_turn_resumes(database: Option<String>) {
    let fake = Fake::default();
    let base = model(&fake).await;
    let tweak = |c: &mut agent::Config| {
        c.brain = BrainConfig::OpenAi(OpenAiConfig::new(base.clone(), "fake-model", None));
        c.database = database
            .as_ref()
            .map(|url| DatabaseConfig::new(Secret::new(url), 4));
    };
    let mut agent = TestAgent::start_with(tweak).await;
    let out = agent.ws_path(&format!("chats/{}/out.txt", chat()));
    {
        let (mut c, _) = agent.connect(&chat()).await;
        c.submit(message(1, "$r1", "write, then ask me")).await;
        c.until(|m| matches!(m, ToSurface::AskUser(_))).await;
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "once");
    }
    // The agent goes away while the turn waits for the answer; the file is removed meanwhile,
    // so running the write again would show.
    std::fs::remove_file(&out).unwrap();
    agent.restart_with(tweak).await;
    let resumed = |text: &str| metric(text, "mxbridge_agent_turns_resumed_total");
    let before = resumed(&agent.metrics().await);
    let (mut c, _) = agent.connect(&chat()).await;
    let asked = c.until(|m| matches!(m, ToSurface::AskUser(_))).await;
    assert!(resumed(&agent.metrics().await) >= before + 1.0, "counted");
    let Some(ToSurface::AskUser(q)) = asked.messages.last() else {
        unreachable!()
    };
    assert!(
        !asked.tool_calls().contains(&"write_file"),
        "the completed write is not run again: {:?}",
        asked.messages
    );
    c.send(Answer {
        question_id: q.question_id.clone(),
        text: "blue".into(),
        by: USER.into(),
    })
    .await;
    let t = c.until_end("$r1").await;
    assert_eq!(t.end().status, EndStatus::Completed);
    assert!(t.text().ends_with("Done."), "{}", t.text());
    assert!(!out.exists(), "write_file ran again");
    let requests = fake.requests.lock().unwrap();
    assert_eq!(requests.len(), 3, "each response asked for once");
    // The last request carries the recorded write's result and the new answer.
    let messages = requests[2].1["messages"].as_array().unwrap();
    let tool_results: Vec<&str> = messages
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(tool_results.len(), 2, "{tool_results:?}");
    assert!(
        tool_results[0].starts_with("wrote 4 bytes"),
        "{tool_results:?}"
    );
    assert!(tool_results[1].contains("blue"), "{tool_results:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interrupted_turn_resumes_after_its_steps_with_the_file_store() {
    interrupted_turn_resumes(None).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interrupted_turn_resumes_after_its_steps_with_postgres() {
    let Some(url) = crate::postgres::scratch().await else {
        return;
    };
    interrupted_turn_resumes(Some(url)).await;
}

/// A `send_file` whose turn was cut off before its delivery was reported runs again with the
/// same request id, so the surface (which posts once per request id) does not post it twice.
#[tokio::test(flavor = "multi_thread")]
async fn a_file_send_run_again_keeps_its_request_id() {
    let fake = Fake::default();
    let path = format!("chats/{}/report.txt", chat());
    let send = json!({ "path": path });
    let base = fake
        .start(vec![
            sse(&[
                tool_call(0, "c1", "send_file", &send.to_string()),
                json!({"choices":[{"delta":{},"finish_reason":"tool_calls"}]}),
            ]),
            sse(&[json!({"choices":[{"delta":{"content":"Sent."},"finish_reason":"stop"}]})]),
        ])
        .await;
    let tweak = |c: &mut agent::Config| {
        c.brain = BrainConfig::OpenAi(OpenAiConfig::new(base.clone(), "fake-model", None));
    };
    let agent = TestAgent::start_with(tweak).await;
    let file = agent.ws_path(&path);
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, "the report").unwrap();
    let first = {
        let (mut c, _) = agent.connect(&chat()).await;
        c.submit(message(1, "$f1", "send me the report")).await;
        // The connection ends before the surface reports the delivery.
        loop {
            match c.recv().await.expect("open") {
                ToSurface::SendFile(f) => break f.request_id,
                _ => continue,
            }
        }
    };
    let (mut c, _) = agent.connect(&chat()).await;
    let again = c.until(|m| matches!(m, ToSurface::SendFile(_))).await;
    let Some(ToSurface::SendFile(f)) = again.messages.last() else {
        unreachable!()
    };
    assert_eq!(f.request_id, first, "the same request, not a new one");
    let t = c.until_end("$f1").await;
    assert_eq!(t.end().status, EndStatus::Completed);
    assert!(t.text().ends_with("Sent."), "{}", t.text());
}
