//! A real model's behaviour, as an Element user in an encrypted DM sees it: the agent runs the
//! OpenAI brain against a model server started here that streams slowly, the surface shows the
//! answer while it is written (one message, edited) and ends on exactly the answer; a model
//! that asks to send a file twice delivers it once.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use axum::routing::post;
use e2e::{E2eeUser, Homeserver, Received, Stack, StackOptions};
use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::TURN;

/// One scripted completion: SSE `data` payloads and the pause before each.
pub type Script = Vec<(Duration, Value)>;
/// Makes a completion's script from the request.
pub type Scripter = Box<dyn Fn(&Value) -> Script + Send + Sync>;

/// An OpenAI-compatible model server that streams scripted completions, one per request.
#[derive(Clone, Default)]
pub struct Model {
    pub scripts: Arc<Mutex<VecDeque<Scripter>>>,
    /// When the last chunk of each completion was written.
    pub finished: Arc<Mutex<Vec<Instant>>>,
    /// Completions whose client closed the stream before its end.
    pub cut: Arc<AtomicU32>,
    /// The `model` each request asked for.
    pub models: Arc<Mutex<Vec<String>>>,
}

/// Counts a completion cut off by its client: dropped with the stream before the end.
struct CutGuard {
    done: Arc<AtomicBool>,
    cut: Arc<AtomicU32>,
}

impl Drop for CutGuard {
    fn drop(&mut self) {
        if !self.done.load(Ordering::SeqCst) {
            self.cut.fetch_add(1, Ordering::SeqCst);
        }
    }
}

async fn complete(State(m): State<Model>, body: axum::Json<Value>) -> Response {
    m.models
        .lock()
        .unwrap()
        .push(body.0["model"].as_str().unwrap_or_default().to_owned());
    let script = m.scripts.lock().unwrap().pop_front();
    let chunks = match script {
        Some(f) => f(&body.0),
        None => vec![(Duration::ZERO, text_delta("(script over)", Some("stop")))],
    };
    let finished = m.finished.clone();
    let done = Arc::new(AtomicBool::new(false));
    let guard = CutGuard {
        done: done.clone(),
        cut: m.cut.clone(),
    };
    let stream =
        futures_util::stream::iter(chunks.into_iter().map(Some).chain([None])).then(move |c| {
            let _alive = &guard;
            let (finished, done) = (finished.clone(), done.clone());
            async move {
                match c {
                    Some((pause, payload)) => {
                        tokio::time::sleep(pause).await;
                        Ok::<_, std::io::Error>(format!("data: {payload}\n\n"))
                    }
                    None => {
                        done.store(true, Ordering::SeqCst);
                        finished.lock().unwrap().push(Instant::now());
                        Ok("data: [DONE]\n\n".to_owned())
                    }
                }
            }
        });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap()
}

pub fn text_delta(text: &str, finish: Option<&str>) -> Value {
    json!({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]})
}

/// A tool call as a model streams it.
pub fn call(id: &str, name: &str, args: Value) -> Vec<(Duration, Value)> {
    vec![(
        Duration::from_millis(50),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": id,
            "type": "function", "function": {"name": name, "arguments": args.to_string()}}]},
            "finish_reason": "tool_calls"}]}),
    )]
}

/// The chat's own folder, as the agent's system prompt names it.
pub fn own_dir(request: &Value) -> String {
    let system = request["messages"][0]["content"]
        .as_str()
        .unwrap_or_default();
    let after = system.split("own folder is ").nth(1).unwrap_or_default();
    after.split("/ ").next().unwrap_or_default().to_owned()
}

/// Serves `model` on loopback; returns its base URL (`…/v1`).
pub async fn start_model(model: Model) -> String {
    let router = axum::Router::new()
        .route("/v1/chat/completions", post(complete))
        .with_state(model);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    base
}

const STORY: [&str; 10] = [
    "Once ",
    "upon ",
    "a time, ",
    "a bridge ",
    "carried ",
    "messages ",
    "across ",
    "the river, ",
    "one by one, ",
    "**never losing one**.",
];

#[tokio::test]
async fn a_streamed_answer_is_shown_while_written_and_a_file_goes_out_once() {
    let model = Model::default();
    {
        let mut s = model.scripts.lock().unwrap();
        // Turn 1: a story streamed over ~4 s.
        s.push_back(Box::new(|_| {
            let last = STORY.len() - 1;
            STORY
                .iter()
                .enumerate()
                .map(|(i, w)| {
                    let finish = (i == last).then_some("stop");
                    (Duration::from_millis(450), text_delta(w, finish))
                })
                .collect()
        }));
        // Turn 2: write a report, send it, send it again (a model in a loop), then answer.
        s.push_back(Box::new(|r| {
            let path = format!("{}/report.txt", own_dir(r));
            call(
                "w1",
                "write_file",
                json!({"path": path, "content": "quarterly numbers\n"}),
            )
        }));
        s.push_back(Box::new(|r| {
            call(
                "s1",
                "send_file",
                json!({"path": format!("{}/report.txt", own_dir(r))}),
            )
        }));
        s.push_back(Box::new(|r| {
            call(
                "s2",
                "send_file",
                json!({"path": format!("{}/report.txt", own_dir(r))}),
            )
        }));
        s.push_back(Box::new(|_| {
            vec![(
                Duration::from_millis(50),
                text_delta("There it is.", Some("stop")),
            )]
        }));
    }
    let base = start_model(model.clone()).await;

    let hs = Homeserver::from_env();
    let mut opts = StackOptions::default();
    opts.agent_env.extend([
        ("AGENT_BRAIN".to_owned(), "openai".to_owned()),
        ("OPENAI_BASE_URL".to_owned(), base),
        ("OPENAI_MODEL".to_owned(), "scripted".to_owned()),
    ]);
    opts.surface_env
        .insert("SURFACE_STREAM_EDITS".into(), "500ms".into());
    let stack = Stack::start(&hs, opts).await.expect("stack");
    let bot = stack.bot.user_id.clone();
    let user = E2eeUser::register(&hs, "stream").await.expect("user");
    let room = user.create_encrypted_dm(&bot).await.expect("DM");
    user.wait_joined(&room, &bot, TURN).await.expect("join");

    // The story: a message appears while the model is still writing, is edited as it grows,
    // and its last edit is exactly the answer.
    let root = user
        .send_text(&room, "tell me a story")
        .await
        .expect("send");
    let bot_messages = || async { user.messages_from(&room, &bot).await.unwrap_or_default() };
    let live: Received = user
        .wait_for(TURN, "the answer shown while written", || async {
            bot_messages()
                .await
                .into_iter()
                .find(|m| m.thread_root.as_deref() == Some(root.as_str()))
        })
        .await
        .expect("live message");
    let seen_at = Instant::now();
    assert!(
        model.finished.lock().unwrap().is_empty(),
        "the message appeared only after the model finished"
    );
    assert!(live.body.ends_with(" …"), "{:?}", live.body);
    let story = STORY.concat();
    let edits: Vec<Received> = user
        .wait_for(TURN, "the final edit", || async {
            let edits: Vec<Received> = bot_messages()
                .await
                .into_iter()
                .filter(|m| m.replaces.as_deref() == Some(live.event_id.as_str()))
                .collect();
            (edits.last()?.new_body.as_deref() == Some(story.as_str())).then_some(edits)
        })
        .await
        .expect("final edit");
    assert!(
        edits.len() >= 2,
        "edited as it grew, then finished: {:?}",
        edits.iter().map(|e| &e.new_body).collect::<Vec<_>>()
    );
    let grew = edits
        .iter()
        .filter_map(|e| e.new_body.as_deref())
        .all(|b| story.starts_with(b.trim_end_matches(" …").trim_end()) || b == story);
    assert!(grew, "every edit shows a prefix of the answer");
    let in_thread = bot_messages()
        .await
        .into_iter()
        .filter(|m| m.thread_root.as_deref() == Some(root.as_str()))
        .count();
    assert_eq!(in_thread, 1, "one message for the answer, not one per edit");
    println!(
        "streamed answer: edits={} first_shown_before_model_finished_by_ms={}",
        edits.len(),
        model
            .finished
            .lock()
            .unwrap()
            .first()
            .map_or(0, |f| f.saturating_duration_since(seen_at).as_millis())
    );

    // The report: sent once although the model asked twice, then the answer.
    let ask = user
        .send_text(&room, "send me the report")
        .await
        .expect("send");
    user.wait_for(TURN, "the closing answer", || async {
        bot_messages().await.into_iter().find(|m| {
            m.thread_root.as_deref() == Some(ask.as_str()) && m.body.contains("There it is.")
        })
    })
    .await
    .expect("answer");
    let files: Vec<Received> = bot_messages()
        .await
        .into_iter()
        .filter(|m| m.thread_root.as_deref() == Some(ask.as_str()) && m.msgtype == "m.file")
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert_eq!(files[0].file_name(), "report.txt");
    let bytes = user
        .download(files[0].source.as_ref().expect("media"))
        .await
        .expect("download");
    assert_eq!(bytes, b"quarterly numbers\n");
}
