//! The agent hears a voice message, end to end and with real parts: a sentence spoken by
//! espeak-ng and encoded as OGG/Opus is sent as a voice message by the matrix-sdk user in an
//! encrypted DM; the agent sends it to a real transcription server (CMU PocketSphinx behind an
//! OpenAI-compatible `/v1/audio/transcriptions`, `e2e/transcribe_server.py`); the room shows
//! what was heard, and the (builtin) brain's answer shows it received the words.
//!
//! Needs espeak-ng, ffmpeg and `MXBRIDGE_SPEECH_PYTHON` (a Python with pocketsphinx):
//! `scripts/test.sh` installs them with `scripts/speech.sh`.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use e2e::{E2eeUser, Homeserver, Stack, StackOptions};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::TURN;

const SENTENCE: &str = "please call me back tomorrow morning";

/// The sentence as a voice note: espeak-ng's WAV encoded as Element records (Opus, 48 kHz,
/// mono), and its length.
async fn spoken(dir: &Path) -> (Vec<u8>, Duration) {
    let wav = dir.join("sentence.wav");
    let ogg = dir.join("sentence.ogg");
    let status = tokio::process::Command::new("espeak-ng")
        .args(["-v", "en-us", "-s", "130", "-w"])
        .arg(&wav)
        .arg(SENTENCE)
        .status()
        .await
        .expect("espeak-ng runs (scripts/speech.sh installs it)");
    assert!(status.success(), "espeak-ng failed");
    let status = tokio::process::Command::new("ffmpeg")
        .args(["-y", "-loglevel", "error", "-i"])
        .arg(&wav)
        .args(["-c:a", "libopus", "-b:a", "24k", "-ar", "48000", "-ac", "1"])
        .arg(&ogg)
        .status()
        .await
        .expect("ffmpeg runs");
    assert!(status.success(), "ffmpeg failed");
    let bytes = std::fs::read(&ogg).unwrap();
    let length = mediainfo::audio_length(
        std::io::Cursor::new(&bytes),
        "audio/ogg",
        bytes.len() as u64,
    )
    .unwrap()
    .expect("a length");
    (bytes, length)
}

/// The PocketSphinx transcription server on a free port; returns it and its `/v1` URL.
async fn transcription_server(record: &Path) -> (tokio::process::Child, String) {
    let python = std::env::var("MXBRIDGE_SPEECH_PYTHON")
        .expect("MXBRIDGE_SPEECH_PYTHON names a Python with pocketsphinx (scripts/speech.sh)");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("transcribe_server.py");
    let mut child = tokio::process::Command::new(python)
        .arg(script)
        .args(["--port", "0", "--record"])
        .arg(record)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the transcription server starts");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("the server says where it listens within a minute")
        .unwrap()
        .expect("a line");
    let addr = line.strip_prefix("listening on ").expect(&line).to_owned();
    (child, format!("http://{addr}/v1"))
}

/// How many of the sentence's words `text` has.
fn words_heard(text: &str) -> usize {
    let text = text.to_lowercase();
    SENTENCE.split(' ').filter(|w| text.contains(w)).count()
}

#[tokio::test]
async fn a_spoken_voice_message_is_heard_in_an_encrypted_dm() {
    let dir = tempfile::tempdir().unwrap();
    let (voice, length) = spoken(dir.path()).await;
    let record = dir.path().join("transcriptions.jsonl");
    let (_server, url) = transcription_server(&record).await;

    let hs = Homeserver::from_env();
    let stack = Stack::start(
        &hs,
        StackOptions {
            agent_env: BTreeMap::from([
                ("TRANSCRIBE_MODEL".into(), "pocketsphinx-en-us".into()),
                ("TRANSCRIBE_BASE_URL".into(), url),
            ]),
            ..StackOptions::default()
        },
    )
    .await
    .expect("stack starts");
    let bot = stack.bot.user_id.clone();
    let user = E2eeUser::register(&hs, "voice").await.expect("register");
    let room = user.create_encrypted_dm(&bot).await.expect("encrypted DM");
    user.wait_joined(&room, &bot, TURN)
        .await
        .expect("the bot joins");

    let id = user
        .send_voice(&room, "voice-message.ogg", voice, length)
        .await
        .expect("send the voice message");
    assert_eq!(
        user.wire_type(&room, &id).await.unwrap(),
        "m.room.encrypted"
    );
    let in_thread = |kind: &'static str| {
        let (user, room, bot, id, stack) = (&user, &room, &bot, &id, &stack);
        async move {
            user.wait_for(
                TURN,
                &format!("the bot's {kind} about the voice message"),
                || async {
                    user.messages_from(room, bot)
                        .await
                        .ok()?
                        .into_iter()
                        .find(|m| {
                            m.thread_root.as_deref() == Some(id.as_str()) && m.msgtype == kind
                        })
                },
            )
            .await
            .unwrap_or_else(|e| {
                stack.dump();
                panic!("{e}")
            })
        }
    };
    let notice = in_thread("m.notice").await;
    assert!(
        notice.body.starts_with("🎤 voice message"),
        "{}",
        notice.body
    );
    assert!(
        words_heard(&notice.body) >= 4,
        "the room sees recognizable words of {SENTENCE:?}: {}",
        notice.body
    );
    let answer = in_thread("m.text").await;
    assert!(
        words_heard(&answer.body) >= 4 && answer.body.contains("voice message"),
        "the agent received the words: {}",
        answer.body
    );

    let recorded = std::fs::read_to_string(&record).unwrap();
    let upload: serde_json::Value = serde_json::from_str(recorded.lines().next().unwrap()).unwrap();
    assert_eq!(upload["model"], "pocketsphinx-en-us");
    assert_eq!(recorded.lines().count(), 1, "transcribed once");
}
