//! Voice messages are transcribed before the turn runs, through a fake OpenAI-compatible
//! `/v1/audio/transcriptions` that records what it was sent: the builtin brain (no chat model)
//! gets the transcript, the room gets a notice of what was heard, the transcript is stored with
//! the turn, and a recording over the bounds or a server that is down gives one clear sentence
//! while the turn goes on.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent::config::TranscribeConfig;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::post;
use protocol::{AttachmentInfo, EndStatus, UserMessage};

use crate::support::*;

const VOICE: &[u8] = include_bytes!("../../../mediainfo/tests/corpus/voice.ogg");

/// One upload: the `Authorization` header and the multipart body.
type Upload = (Option<String>, Bytes);

/// Every upload.
#[derive(Clone, Default)]
struct Heard {
    uploads: Arc<Mutex<Vec<Upload>>>,
}

async fn transcriptions(
    State(h): State<Heard>,
    headers: HeaderMap,
    body: Bytes,
) -> impl IntoResponse {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    h.uploads.lock().unwrap().push((auth, body));
    (
        StatusCode::OK,
        [("content-type", "application/json")],
        r#"{"text":" please call me back tomorrow morning "}"#,
    )
}

async fn server(h: &Heard) -> String {
    let router = axum::Router::new()
        .route("/v1/audio/transcriptions", post(transcriptions))
        .with_state(h.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    base
}

fn config(base_url: String) -> TranscribeConfig {
    TranscribeConfig {
        base_url,
        model: "whisper-test".into(),
        api_key: Some(agent::config::Secret::new("sk-speech")),
        language: Some("en".into()),
        prompt: None,
        timeout: Duration::from_secs(10),
        attempts: 2,
        max_duration: Duration::from_secs(60),
        max_size: 1024 * 1024,
        show: true,
    }
}

fn voice_message(agent: &TestAgent, seq: u64) -> UserMessage {
    let mut m = message(seq, &format!("$voice{seq}"), "User sent a voice message");
    let rel = format!("{}/{seq}-voice.ogg", inbox(ROOM));
    let path = write(agent.workspace.path(), &rel, VOICE);
    // As the surface says it: the file it has just written opens at once.
    let inode = std::fs::metadata(agent.workspace.path().join(&rel))
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
        .ok();
    m.attachment_info = BTreeMap::from([(
        path.clone(),
        AttachmentInfo {
            name: "voice.ogg".into(),
            mime: "audio/ogg".into(),
            size: VOICE.len() as u64,
            duration_ms: Some(3000),
            voice: true,
            inode,
        },
    )]);
    m.attachments.push(path);
    m
}

#[tokio::test]
async fn a_voice_message_is_transcribed_once_shown_to_the_room_and_read_by_the_brain() {
    let heard = Heard::default();
    let base = server(&heard).await;
    let mut agent = TestAgent::start_with(|c| c.transcribe = Some(config(base.clone()))).await;
    let (mut c, _) = agent.connect(&chat()).await;
    let t = c.turn(voice_message(&agent, 1)).await;
    assert_eq!(t.end().status, EndStatus::Completed);
    let heard_line = "voice message, 3.0 s: “please call me back tomorrow morning”";
    assert_eq!(t.notices(), [format!("🎤 {heard_line}")]);
    assert!(
        t.text().contains(heard_line),
        "the builtin brain read the transcript: {}",
        t.text()
    );
    {
        let uploads = heard.uploads.lock().unwrap();
        assert_eq!(uploads.len(), 1);
        let (auth, body) = &uploads[0];
        assert_eq!(auth.as_deref(), Some("Bearer sk-speech"));
        let body = String::from_utf8_lossy(body);
        for field in [
            "name=\"model\"\r\n\r\nwhisper-test",
            "name=\"language\"\r\n\r\nen",
            "name=\"file\"; filename=\"voice.ogg\"",
            "OpusHead",
        ] {
            assert!(body.contains(field), "upload has {field:?}");
        }
    }

    // The transcript is stored with the turn: the history after a restart carries it, and
    // nothing is transcribed again.
    drop(c);
    agent
        .restart_with(|c| c.transcribe = Some(config(base)))
        .await;
    let (mut c, _) = agent.connect(&chat()).await;
    let t = c.turn(message(2, "$after", "history")).await;
    assert_eq!(t.end().status, EndStatus::Completed);
    assert_eq!(heard.uploads.lock().unwrap().len(), 1);
    let log = std::fs::read_to_string(agent.state.path().join(format!("chats/{}.jsonl", chat())))
        .unwrap();
    assert!(
        log.contains("please call me back tomorrow morning"),
        "{log}"
    );
}

#[tokio::test]
async fn a_recording_over_the_bounds_is_not_uploaded_and_the_room_is_told() {
    let heard = Heard::default();
    let base = server(&heard).await;
    let agent = TestAgent::start_with(|c| {
        let mut t = config(base.clone());
        t.max_duration = Duration::from_secs(2);
        c.transcribe = Some(t);
    })
    .await;
    let (mut c, _) = agent.connect(&chat()).await;
    let t = c.turn(voice_message(&agent, 1)).await;
    assert_eq!(t.end().status, EndStatus::Completed, "the turn goes on");
    assert_eq!(
        t.notices(),
        [
            "⚠️ I could not transcribe the voice message: it is 3.0 s long, more than the 2.0 s I \
          transcribe. I'll go on with the file itself."
        ]
    );
    assert!(
        t.text().contains("voice.ogg"),
        "the file is still described"
    );
    assert!(heard.uploads.lock().unwrap().is_empty(), "nothing uploaded");
}

#[tokio::test]
async fn a_transcription_server_that_is_down_costs_one_sentence() {
    // A port nothing listens on.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", closed.local_addr().unwrap());
    drop(closed);
    let agent = TestAgent::start_with(|c| {
        let mut t = config(base);
        t.attempts = 1;
        t.show = false;
        c.transcribe = Some(t);
    })
    .await;
    let (mut c, _) = agent.connect(&chat()).await;
    let t = c.turn(voice_message(&agent, 1)).await;
    assert_eq!(t.end().status, EndStatus::Completed);
    assert_eq!(
        t.notices(),
        [
            "⚠️ I could not transcribe the voice message: the transcription server cannot be \
          reached. I'll go on with the file itself."
        ],
        "failures are shown even with TRANSCRIBE_SHOW=false"
    );
    assert!(t.text().contains("not transcribed"), "{}", t.text());
}

/// A transcription server that accepts the upload and never answers, and one whose answer
/// never ends: each costs one sentence within the configured bounds, never a stuck turn.
#[tokio::test]
async fn a_server_that_never_answers_or_answers_without_end_is_cut_off() {
    // Accepts connections and reads, never writes.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_url = format!("http://{}/v1", silent.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = silent.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut sink = tokio::io::sink();
                let _ = tokio::io::copy(&mut socket, &mut sink).await;
                std::future::pending::<()>().await;
            });
        }
    });
    // Answers 200 with a body far over the 4 MiB an answer may have.
    let flood = axum::Router::new().route(
        "/v1/audio/transcriptions",
        post(|_: Bytes| async {
            (
                [("content-type", "application/json")],
                format!("{{\"text\":\"{}\"}}", "a".repeat(6 << 20)),
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let flood_url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, flood).await.unwrap() });

    let cases = [
        (
            silent_url,
            "the transcription server did not answer within 1.0 s",
        ),
        (flood_url, "the transcription server's answer had no text"),
    ];
    for (url, says) in cases {
        let agent = TestAgent::start_with(|c| {
            let mut t = config(url.clone());
            t.timeout = Duration::from_secs(1);
            t.attempts = 1;
            c.transcribe = Some(t);
        })
        .await;
        let (mut c, _) = agent.connect(&chat()).await;
        let t = c.turn(voice_message(&agent, 1)).await;
        assert_eq!(t.end().status, EndStatus::Completed, "{says}");
        let notices = t.notices();
        assert_eq!(notices.len(), 1, "{notices:?}");
        assert!(notices[0].contains(says), "{notices:?}");
    }
}
