//! Files the agent sends look as native as Element's own, in an encrypted and in a plain DM
//! with a matrix-sdk client: images carry a thumbnail (downloaded, decrypted and measured
//! here) and a blurhash that decodes, videos and audio their durations, an OGG/Opus note goes
//! out as a voice message with a waveform (and a user's voice message reaches the agent as
//! one), a video gets a poster made by ffmpeg, and a decompression bomb is still delivered, as a
//! plain file without a thumbnail, while the surface's memory stays flat.

use std::path::{Path, PathBuf};
use std::time::Duration;

use e2e::{E2eeUser, Homeserver, Received, Stack, StackOptions};
use matrix_sdk::ruma::events::room::{EncryptedFile, MediaSource};
use serde_json::Value;

use crate::TURN;

fn corpus(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../mediainfo/tests/corpus")
        .join(name)
}

/// Where a thumbnail is: `thumbnail_file` (encrypted rooms) or `thumbnail_url`.
fn thumbnail_source(info: &Value) -> Option<MediaSource> {
    if let Some(file) = info.get("thumbnail_file") {
        let file: EncryptedFile = serde_json::from_value(file.clone()).ok()?;
        return Some(MediaSource::Encrypted(Box::new(file)));
    }
    let url = info.get("thumbnail_url")?.as_str()?;
    Some(MediaSource::Plain(url.into()))
}

fn within_5_percent(got_ms: u64, want_ms: u64) -> bool {
    got_ms.abs_diff(want_ms) * 20 <= want_ms
}

struct Chat<'a> {
    user: &'a E2eeUser,
    room: String,
    bot: String,
    inbox: PathBuf,
    encrypted: bool,
}

impl Chat<'_> {
    /// Puts a corpus file where the chat can see it and has the agent send it with `command`
    /// (`send` or `voice`); returns the media message.
    async fn sent(&self, command: &str, name: &str) -> Received {
        std::fs::copy(corpus(name), self.inbox.join(name)).expect("copy corpus file");
        let ask = self
            .user
            .send_text(&self.room, &format!("{command} {name}"))
            .await
            .expect("send");
        self.user
            .wait_for(TURN, &format!("{name} in the room"), || async {
                self.user
                    .messages_from(&self.room, &self.bot)
                    .await
                    .unwrap_or_default()
                    .into_iter()
                    .find(|m| m.thread_root.as_deref() == Some(ask.as_str()) && m.source.is_some())
            })
            .await
            .expect("media message")
    }

    /// Checks the thumbnail of `m` (downloaded and decrypted) and its blurhash; returns the
    /// thumbnail's MIME type.
    async fn check_thumbnail(&self, m: &Received, dims: (u64, u64)) -> String {
        let info = &m.content["info"];
        let what = format!("{} ({})", m.file_name(), self.kind());
        assert_eq!(
            (info["w"].as_u64(), info["h"].as_u64()),
            (Some(dims.0), Some(dims.1)),
            "{what}: {info}"
        );
        let source =
            thumbnail_source(info).unwrap_or_else(|| panic!("{what}: no thumbnail: {info}"));
        assert_eq!(
            matches!(source, MediaSource::Encrypted(_)),
            self.encrypted,
            "{what}: thumbnail_file exactly in encrypted rooms: {info}"
        );
        let bytes = self
            .user
            .download(&source)
            .await
            .expect("thumbnail download");
        let size = imagesize::blob_size(&bytes).expect("the thumbnail is an image");
        let t = &info["thumbnail_info"];
        assert_eq!(
            (Some(size.width as u64), Some(size.height as u64)),
            (t["w"].as_u64(), t["h"].as_u64()),
            "{what}: thumbnail_info matches the thumbnail"
        );
        assert!(
            size.width <= 800 && size.height <= 600,
            "{what}: fits 800x600"
        );
        assert_eq!(t["size"].as_u64(), Some(bytes.len() as u64), "{what}");
        if m.msgtype == "m.image" {
            assert!(
                (bytes.len() as u64) < m.size.unwrap_or(u64::MAX),
                "{what}: smaller than the original"
            );
        }
        let hash = info["xyz.amorgan.blurhash"]
            .as_str()
            .unwrap_or_else(|| panic!("{what}: no blurhash"));
        let pixels = blurhash::decode(hash, 32, 24, 1.0).expect("the blurhash decodes");
        assert_eq!(pixels.len(), 32 * 24 * 4, "{what}");
        t["mimetype"].as_str().unwrap_or_default().to_owned()
    }

    fn kind(&self) -> &'static str {
        if self.encrypted { "encrypted" } else { "plain" }
    }
}

#[tokio::test]
async fn agent_media_looks_native_in_encrypted_and_plain_rooms() {
    let hs = Homeserver::from_env();
    let stack = Stack::start(&hs, StackOptions::default())
        .await
        .expect("stack");
    let bot = stack.bot.user_id.clone();
    let user = E2eeUser::register(&hs, "look").await.expect("user");

    for encrypted in [true, false] {
        let room = if encrypted {
            user.create_encrypted_dm(&bot).await
        } else {
            user.create_unencrypted_dm(&bot).await
        }
        .expect("DM");
        user.wait_joined(&room, &bot, TURN).await.expect("join");
        let inbox = stack
            .workspace
            .join(protocol::room_dir(&user.user_id, &room).as_str())
            .join("inbox");
        std::fs::create_dir_all(&inbox).expect("inbox");
        let chat = Chat {
            user: &user,
            room,
            bot: bot.clone(),
            inbox,
            encrypted,
        };
        let kind = chat.kind();

        // A voice message from the user: the agent is told it is one, and how long it plays.
        let bytes = std::fs::read(corpus("voice.ogg")).expect("corpus");
        let id = user
            .send_voice(
                &chat.room,
                "Voice message.ogg",
                bytes,
                Duration::from_millis(3040),
            )
            .await
            .expect("send voice");
        let described = user
            .wait_for(TURN, "the voice message described", || async {
                user.messages_from(&chat.room, &bot)
                    .await
                    .unwrap_or_default()
                    .into_iter()
                    .find(|m| m.thread_root.as_deref() == Some(id.as_str()))
            })
            .await
            .expect("description");
        assert!(
            described.body.contains("- voice message, 3.0 s"),
            "{kind}: {}",
            described.body
        );

        let png = chat.sent("send", "opaque.png").await;
        assert_eq!(png.msgtype, "m.image");
        let mime = chat.check_thumbnail(&png, (1600, 1200)).await;
        assert_eq!(mime, "image/jpeg", "an opaque image gets a JPEG thumbnail");

        let jpeg = chat.sent("send", "photo.jpg").await;
        assert_eq!(jpeg.msgtype, "m.image");
        let dims = (
            jpeg.content["info"]["w"].as_u64().unwrap_or(0),
            jpeg.content["info"]["h"].as_u64().unwrap_or(0),
        );
        assert_eq!(chat.check_thumbnail(&jpeg, dims).await, "image/jpeg");

        let clear = chat.sent("send", "transparent.png").await;
        let dims = (
            clear.content["info"]["w"].as_u64().unwrap_or(0),
            clear.content["info"]["h"].as_u64().unwrap_or(0),
        );
        let mime = chat.check_thumbnail(&clear, dims).await;
        assert!(
            mime == "image/png" || mime == "image/webp",
            "a transparent image keeps its transparency: {mime}"
        );

        let video = chat.sent("send", "clip.mp4").await;
        let info = &video.content["info"];
        assert_eq!(video.msgtype, "m.video", "{}", video.content);
        assert_eq!(
            (info["w"].as_u64(), info["h"].as_u64()),
            (Some(320), Some(240)),
            "{info}"
        );
        let ms = info["duration"].as_u64().expect("video duration");
        assert!(within_5_percent(ms, 2000), "video duration {ms} ms");
        // The poster, made by ffmpeg (the test command installs it).
        assert_eq!(chat.check_thumbnail(&video, (320, 240)).await, "image/jpeg");

        let voice = chat.sent("voice", "voice.ogg").await;
        let c = &voice.content;
        assert_eq!(voice.msgtype, "m.audio", "{c}");
        assert_eq!(c["info"]["mimetype"], "audio/ogg", "{c}");
        assert!(
            c["org.matrix.msc3245.voice"].is_object(),
            "flagged as voice: {c}"
        );
        let ms = c["org.matrix.msc1767.audio"]["duration"]
            .as_u64()
            .expect("voice duration");
        assert!(within_5_percent(ms, 3000), "voice duration {ms} ms");
        let waveform = c["org.matrix.msc1767.audio"]["waveform"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert!(
            !waveform.is_empty()
                && waveform
                    .iter()
                    .all(|v| v.as_u64().is_some_and(|v| v <= 1024)),
            "{c}"
        );
        assert!(
            waveform.iter().any(|v| v.as_u64() > Some(0)),
            "a waveform with sound in it: {c}"
        );

        let wav = chat.sent("send", "tone.wav").await;
        let c = &wav.content;
        assert_eq!(wav.msgtype, "m.audio", "{c}");
        assert_eq!(c["info"]["mimetype"], "audio/wav", "{c}");
        assert!(
            c.get("org.matrix.msc3245.voice").is_none(),
            "sent as voice only when asked: {c}"
        );
        let ms = c["info"]["duration"].as_u64().expect("wav duration");
        assert!(within_5_percent(ms, 1500), "wav duration {ms} ms");

        // A PNG declaring 30000x30000: delivered, as a plain file, without a thumbnail, and
        // the surface did not try to decode it.
        let before = stack.surface.peak_rss_kib().unwrap_or(0);
        let bomb = chat.sent("send", "bomb.png").await;
        let after = stack.surface.peak_rss_kib().unwrap_or(0);
        assert_eq!(bomb.msgtype, "m.file", "{}", bomb.content);
        assert!(bomb.content["info"].get("thumbnail_info").is_none());
        let bytes = user
            .download(bomb.source.as_ref().expect("media"))
            .await
            .expect("download");
        assert_eq!(bytes, std::fs::read(corpus("bomb.png")).unwrap());
        println!(
            "media look ({kind}): surface peak RSS before the bomb {before} KiB, after {after} KiB"
        );
        assert!(
            after.saturating_sub(before) < 64 * 1024,
            "the bomb grew the surface by {} KiB",
            after - before
        );
    }
}
