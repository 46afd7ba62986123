//! Pictures reach a vision model: the fake chat-completions server records every request, so
//! the tests see what a model would get: upright, bounded pictures on the turn they arrive,
//! placeholders afterwards, `view_image`, and one retry without pictures for a model that
//! refuses them (a recorded llama.cpp refusal), with exactly one notice to the room.

use std::collections::{BTreeMap, VecDeque};
use std::io::Cursor;
use std::sync::{Arc, Mutex};

use agent::brain::openai::BLIND_NOTICE;
use agent::config::{BrainConfig, OpenAiConfig, Secret};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use base64::Engine as _;
use protocol::{AttachmentInfo, EndStatus, UserMessage, WorkspacePath};
use serde_json::{Value, json};

use crate::openai::{sse, tool_call};
use crate::support::*;

/// A chat-completions server answering with scripted (status, body) pairs, then a plain
/// answer, recording every request body.
#[derive(Clone, Default)]
struct Model {
    requests: Arc<Mutex<Vec<Value>>>,
    script: Arc<Mutex<VecDeque<(u16, String)>>>,
}

async fn completions(State(m): State<Model>, Json(body): Json<Value>) -> impl IntoResponse {
    m.requests.lock().unwrap().push(body);
    let (status, body) = m.script.lock().unwrap().pop_front().unwrap_or_else(|| {
        (
            200,
            sse(&[json!({"choices":[{"delta":{"content":"ok"},"finish_reason":"stop"}]})]),
        )
    });
    let kind = if status == 200 {
        "text/event-stream"
    } else {
        "application/json"
    };
    (
        StatusCode::from_u16(status).unwrap(),
        [("content-type", kind)],
        body,
    )
}

impl Model {
    async fn agent(&self, script: Vec<(u16, String)>, edge: u32) -> TestAgent {
        *self.script.lock().unwrap() = script.into();
        let router = axum::Router::new()
            .route("/v1/chat/completions", post(completions))
            .with_state(self.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}/v1", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        TestAgent::start_with(|c| {
            let mut brain = OpenAiConfig::new(base, "vision-test", Some(Secret::new("sk-test")));
            brain.vision.long_edge = edge;
            c.brain = BrainConfig::OpenAi(brain);
        })
        .await
    }

    fn requests(&self) -> Vec<Value> {
        self.requests.lock().unwrap().clone()
    }
}

/// The pictures of a request's messages, decoded: (message index, MIME type, picture).
fn pictures(request: &Value) -> Vec<(usize, String, image::DynamicImage)> {
    let mut out = Vec::new();
    for (i, m) in request["messages"].as_array().unwrap().iter().enumerate() {
        let Some(parts) = m["content"].as_array() else {
            continue;
        };
        for p in parts.iter().filter(|p| p["type"] == "image_url") {
            let url = p["image_url"]["url"].as_str().unwrap();
            let (head, data) = url.split_once(";base64,").unwrap();
            let mime = head.strip_prefix("data:").unwrap().to_owned();
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(data)
                .unwrap();
            out.push((i, mime, image::load_from_memory(&bytes).unwrap()));
        }
    }
    out
}

/// The text of the last user message of a request.
fn last_user_text(request: &Value) -> String {
    let m = request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .unwrap();
    match &m["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts[0]["text"].as_str().unwrap().to_owned(),
        other => panic!("content {other}"),
    }
}

/// A 1000x500 JPEG growing redder to the right whose EXIF says: show it turned 90° clockwise.
fn exif_rotated_jpeg() -> Vec<u8> {
    let landscape = image::RgbImage::from_fn(1000, 500, |x, _| image::Rgb([(x / 4) as u8, 0, 0]));
    let mut plain = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut plain, 90)
        .encode_image(&landscape)
        .unwrap();
    // APP1: a big-endian TIFF with one entry, Orientation (0x0112) = 6.
    let mut exif = b"Exif\0\0MM\0\x2a\0\0\0\x08\0\x01".to_vec();
    exif.extend_from_slice(&[0x01, 0x12, 0, 3, 0, 0, 0, 1, 0, 6, 0, 0, 0, 0, 0, 0]);
    let mut jpeg = plain[..2].to_vec();
    jpeg.extend_from_slice(&[0xff, 0xe1]);
    jpeg.extend_from_slice(&(exif.len() as u16 + 2).to_be_bytes());
    jpeg.extend_from_slice(&exif);
    jpeg.extend_from_slice(&plain[2..]);
    jpeg
}

/// A 600x400 PNG, transparent on its left half.
fn transparent_png() -> Vec<u8> {
    let px = image::RgbaImage::from_fn(600, 400, |x, _| {
        image::Rgba([20, 120, 220, if x < 300 { 0 } else { 255 }])
    });
    let mut png = Vec::new();
    px.write_to(&mut Cursor::new(&mut png), image::ImageFormat::Png)
        .unwrap();
    png
}

fn small_jpeg(shade: u8) -> Vec<u8> {
    let px = image::RgbImage::from_pixel(64, 48, image::Rgb([shade, 40, 40]));
    let mut jpeg = Vec::new();
    px.write_to(&mut Cursor::new(&mut jpeg), image::ImageFormat::Jpeg)
        .unwrap();
    jpeg
}

/// A message with files in the room's inbox, as the surface sends it.
fn with_files(
    agent: &TestAgent,
    mut m: UserMessage,
    files: &[(&str, &str, Vec<u8>)],
) -> UserMessage {
    let mut info = BTreeMap::new();
    for (name, mime, bytes) in files {
        let rel = format!("{}/{}-{name}", inbox(ROOM), m.seq);
        let path: WorkspacePath = write(agent.workspace.path(), &rel, bytes);
        info.insert(
            path.clone(),
            AttachmentInfo {
                name: (*name).to_owned(),
                mime: (*mime).to_owned(),
                size: bytes.len() as u64,
                duration_ms: None,
                voice: false,
                inode: None,
            },
        );
        m.attachments.push(path);
    }
    m.attachment_info = info;
    m
}

const BOMB: &[u8] = include_bytes!("../../../mediainfo/tests/corpus/bomb.png");

#[tokio::test]
async fn pictures_reach_the_model_upright_bounded_and_bombs_never() {
    let model = Model::default();
    let agent = model.agent(vec![], 800).await;
    let (mut c, _) = agent.connect(&chat()).await;
    let m = with_files(
        &agent,
        message(1, "$v1", "what are these?"),
        &[
            ("photo.jpg", "image/jpeg", exif_rotated_jpeg()),
            ("logo.png", "image/png", transparent_png()),
            ("bomb.png", "image/png", BOMB.to_vec()),
        ],
    );
    let t = c.turn(m).await;
    assert_eq!(t.end().status, EndStatus::Completed);

    let requests = model.requests();
    let shown = pictures(&requests[0]);
    assert_eq!(shown.len(), 2, "the photo and the logo; never the bomb");
    let (_, mime, photo) = &shown[0];
    assert_eq!(mime, "image/jpeg");
    assert_eq!(
        (photo.width(), photo.height()),
        (400, 800),
        "upright, long edge 800"
    );
    let photo = photo.to_rgb8();
    assert!(
        photo.get_pixel(200, 790).0[0] > photo.get_pixel(200, 10).0[0] + 100,
        "turned clockwise: redder downwards"
    );
    let (_, mime, logo) = &shown[1];
    assert_eq!(mime, "image/png", "transparency stays PNG");
    assert!(logo.to_rgba8().pixels().any(|p| p.0[3] == 0));

    let text = last_user_text(&requests[0]);
    assert!(text.contains("what are these?"), "{text}");
    for name in ["1-photo.jpg", "1-logo.png", "1-bomb.png"] {
        assert!(text.contains(name), "every workspace path is named: {text}");
    }
    assert!(
        text.contains("[picture attached below, 500x1000]"),
        "{text}"
    );
    assert!(
        text.contains("30000x30000 pixels, more than we decode"),
        "the bomb is refused from its header: {text}"
    );
}

#[tokio::test]
async fn a_model_that_refuses_pictures_is_asked_again_without_them_and_the_room_told_once() {
    let refusal = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/openai/replay/f-vision-llamacpp.json"
    ))
    .unwrap();
    let refusal: Value = serde_json::from_str(&refusal).unwrap();
    let model = Model::default();
    let agent = model
        .agent(
            vec![(500, refusal[0]["body"].as_str().unwrap().to_owned())],
            1536,
        )
        .await;
    let (mut c, _) = agent.connect(&chat()).await;
    let first = c
        .turn(with_files(
            &agent,
            message(1, "$b1", "what is this?"),
            &[("cat.jpg", "image/jpeg", small_jpeg(200))],
        ))
        .await;
    assert_eq!(first.end().status, EndStatus::Completed);
    assert_eq!(first.text(), "ok");
    let second = c
        .turn(with_files(
            &agent,
            message(2, "$b2", "and this?"),
            &[("dog.jpg", "image/jpeg", small_jpeg(90))],
        ))
        .await;
    assert_eq!(second.end().status, EndStatus::Completed);

    let all: Vec<String> = first
        .notices()
        .into_iter()
        .chain(second.notices())
        .collect();
    assert_eq!(all, [BLIND_NOTICE], "one notice for the chat");

    let requests = model.requests();
    assert_eq!(requests.len(), 3, "refused, asked again, the next turn");
    assert_eq!(pictures(&requests[0]).len(), 1);
    for (i, r) in requests.iter().enumerate().skip(1) {
        assert!(pictures(r).is_empty(), "request {i} has no pictures");
        let text = last_user_text(r);
        assert!(
            text.contains("[picture not shown: this model cannot see pictures]"),
            "request {i}: {text}"
        );
    }
}

#[tokio::test]
async fn view_image_shows_a_picture_from_an_earlier_turn() {
    let model = Model::default();
    let agent = model.agent(vec![], 1536).await;
    let (mut c, _) = agent.connect(&chat()).await;
    let m = with_files(
        &agent,
        message(1, "$w1", "a photo for later"),
        &[("beach.jpg", "image/jpeg", small_jpeg(230))],
    );
    let path = m.attachments[0].to_string();
    c.turn(m).await;
    model.script.lock().unwrap().extend([
        (
            200,
            sse(&[
                tool_call(
                    0,
                    "call_v",
                    "view_image",
                    &json!({ "path": path }).to_string(),
                ),
                json!({"choices":[{"delta":{},"finish_reason":"tool_calls"}]}),
            ]),
        ),
        (
            200,
            sse(&[json!({"choices":[{"delta":{"content":"It is red."},"finish_reason":"stop"}]})]),
        ),
    ]);
    let t = c
        .turn(message(2, "$w2", "look at the photo I sent this morning"))
        .await;
    assert_eq!(t.end().status, EndStatus::Completed);
    assert_eq!(t.text(), "It is red.");

    let requests = model.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(pictures(&requests[0]).len(), 1, "shown with its own turn");
    assert!(
        pictures(&requests[1]).is_empty(),
        "history holds a placeholder"
    );
    let history = requests[1]["messages"][1]["content"].as_str().unwrap();
    assert!(
        history.contains("call view_image to look again"),
        "{history}"
    );
    let after_tool = pictures(&requests[2]);
    assert_eq!(
        after_tool.len(),
        1,
        "view_image's picture follows the tool result"
    );
    let messages = requests[2]["messages"].as_array().unwrap();
    let (at, _, picture) = &after_tool[0];
    assert_eq!(messages[at - 1]["role"], "tool");
    assert_eq!(messages[*at]["role"], "user");
    assert!(
        picture.to_rgb8().get_pixel(10, 10).0[0] > 200,
        "the beach photo"
    );
}

#[tokio::test]
async fn a_long_chat_with_many_pictures_sends_only_the_current_turns_bytes() {
    let model = Model::default();
    let agent = model.agent(vec![], 1536).await;
    let (mut c, _) = agent.connect(&chat()).await;
    for seq in 1..=200u64 {
        let m = message(seq, &format!("$l{seq}"), &format!("message {seq}"));
        let m = if seq % 4 == 0 {
            with_files(&agent, m, &[("p.jpg", "image/jpeg", small_jpeg(seq as u8))])
        } else {
            m
        };
        assert_eq!(c.turn(m).await.end().status, EndStatus::Completed);
    }
    let requests = model.requests();
    assert_eq!(requests.len(), 200);
    for (i, r) in requests.iter().enumerate() {
        let seq = i + 1;
        let shown = pictures(r);
        let want = usize::from(seq % 4 == 0);
        assert_eq!(shown.len(), want, "request {seq}");
        if want == 1 {
            let last = r["messages"].as_array().unwrap().len() - 1;
            assert_eq!(shown[0].0, last, "request {seq}: only the current turn's");
        }
        assert_eq!(
            r.to_string().matches("data:image").count(),
            want,
            "request {seq}: no picture bytes from history"
        );
    }
}
