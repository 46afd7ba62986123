//! Turns a workspace file the agent named into a Matrix media message, ready to send.

use std::io;

use matrix_sdk::Client;
use matrix_sdk::EncryptionState;
use matrix_sdk::ruma::OwnedRoomId;
use matrix_sdk::ruma::events::room::MediaSource;
use matrix_sdk::ruma::events::room::message::RoomMessageEventContent;
use protocol::WorkspacePath;
use tokio::io::AsyncReadExt;

use super::kind::{Look, MediaFields};
use super::look;
use super::upload::{upload_encrypted_with, upload_with};
use super::{MediaApi, UploadCache, UploadError, quoted_name};
use crate::mime::{self, HEAD_BYTES};
use crate::workspace::{ChatScope, ConfineError, OpenedFile, Workspace, user_reason};

/// A file could not be sent: which one, and why.
#[derive(Debug, thiserror::Error)]
#[error("sending `{name}` failed: {failure}")]
pub struct SendFileError {
    /// The file name (last component of the requested path).
    pub name: String,
    /// What went wrong.
    #[source]
    pub failure: SendFileFailure,
}

/// What went wrong sending a file.
#[derive(Debug, thiserror::Error)]
pub enum SendFileFailure {
    /// Missing, out of the chat's scope (reported as missing), a symlink, not a regular file,
    /// hard-linked, or over the size limit.
    #[error(transparent)]
    Refused(#[from] ConfineError),
    /// Reading the file's head failed.
    #[error("could not read the file: {0}")]
    Read(#[source] io::Error),
    /// The upload failed.
    #[error(transparent)]
    Upload(#[from] UploadError),
}

impl SendFileError {
    /// A short reason without the file name, for `delivery_result.error` and the log.
    pub fn reason(&self) -> String {
        match &self.failure {
            SendFileFailure::Refused(r) => user_reason(r),
            SendFileFailure::Read(_) => "it could not be read".to_owned(),
            SendFileFailure::Upload(UploadError::TooLarge) => {
                "the homeserver refused it as too large".to_owned()
            }
            SendFileFailure::Upload(UploadError::Read(_)) => "it could not be read".to_owned(),
            SendFileFailure::Upload(UploadError::Http(_)) => {
                "the upload to the homeserver failed".to_owned()
            }
        }
    }

    /// A sentence for the room, e.g. "I could not send `x.txt`: file not found."
    pub fn user_message(&self) -> String {
        format!(
            "I could not send `{}`: {}.",
            quoted_name(&self.name),
            self.reason()
        )
    }

    /// Whether the file was refused by the workspace rules (as opposed to a transfer failure).
    pub fn is_refused(&self) -> bool {
        matches!(self.failure, SendFileFailure::Refused(_))
    }
}

/// What every outbound file shares: the upload cache, the size limit, the video decoder.
#[derive(Debug, Clone, Copy)]
pub struct Outbound<'a> {
    /// Where uploads are remembered.
    pub cache: &'a UploadCache,
    /// Largest file sent, in bytes.
    pub limit: u64,
    /// `ffmpeg`, for video posters.
    pub ffmpeg: Option<&'a std::path::Path>,
}

/// How the agent asked for a file to be posted.
#[derive(Debug, Clone, Copy, Default)]
pub struct Posting<'a> {
    /// Text posted with the file.
    pub caption: Option<&'a str>,
    /// As a voice message (OGG/Opus audio only).
    pub voice: bool,
}

/// Opens `path` for `scope` (see [`Workspace::open_for_upload`]), uploads it (deduplicated by
/// content, see [`super::upload_file`]) and builds the message: `m.image`, `m.video`,
/// `m.audio` or `m.file` by sniffed MIME type, with `filename`, `mimetype`, `size` and what
/// makes it look native ([`super::look`]: dimensions, duration, thumbnail, blurhash, voice). With a `caption`, `body` is the caption (Matrix media
/// caption rules); otherwise `body` is the file name. In an end-to-end encrypted room (or one
/// whose state cannot be determined) the file is encrypted before upload and the content
/// carries its key (the event itself is encrypted by the SDK when sent).
///
/// The caller adds the thread relation and sends it with a transaction id.
#[tracing::instrument(skip_all, fields(path = %path, chat_id = %scope.chat()))]
pub async fn prepare_file_message(
    client: &Client,
    ws: &Workspace,
    path: &WorkspacePath,
    scope: &ChatScope,
    posting: Posting<'_>,
    out: &Outbound<'_>,
) -> Result<RoomMessageEventContent, SendFileError> {
    let fail = |failure| SendFileError {
        name: path.file_name().to_owned(),
        failure,
    };
    let api = MediaApi::from_client(client).map_err(|e| fail(UploadError::from(e).into()))?;
    // The surface's scopes always name their room; without one there is no room to post to,
    // like an invalid room id.
    let encrypt = room_is_encrypted(client, scope.room_id().unwrap_or_default()).await;
    prepare_with(&api, ws, path, scope, posting, out, encrypt)
        .await
        .map_err(fail)
}

/// Whether files for this room must be encrypted. When the state is unknown and cannot be
/// fetched, assume it is: an encrypted file works in any room, a clear one leaks the content.
async fn room_is_encrypted(client: &Client, room_id: &str) -> bool {
    let Ok(id) = OwnedRoomId::try_from(room_id) else {
        return false;
    };
    let Some(room) = client.get_room(&id) else {
        return true;
    };
    match room.encryption_state() {
        EncryptionState::Unknown => room
            .latest_encryption_state()
            .await
            .map_or(true, |s| s.is_encrypted()),
        state => state.is_encrypted(),
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn prepare_with(
    api: &MediaApi,
    ws: &Workspace,
    path: &WorkspacePath,
    scope: &ChatScope,
    posting: Posting<'_>,
    out: &Outbound<'_>,
    encrypt: bool,
) -> Result<RoomMessageEventContent, SendFileFailure> {
    let cache = out.cache;
    let opened = ws.open_for_upload(path, scope, out.limit)?;
    let head = read_head(&opened).await.map_err(SendFileFailure::Read)?;
    let mime = mime::reconcile(None, &head, &opened.name);
    let upload = async {
        Ok::<_, SendFileFailure>(if encrypt {
            MediaSource::Encrypted(Box::new(upload_encrypted_with(api, &opened, cache).await?))
        } else {
            MediaSource::Plain(upload_with(api, &opened, &mime, cache).await?)
        })
    };
    // The file's details (and thumbnail) are worked out while it uploads.
    let (source, mut look) = tokio::join!(
        upload,
        look::look(
            api,
            &opened,
            &mime,
            posting.voice,
            encrypt,
            cache,
            out.ffmpeg
        )
    );
    let source = source?;
    if look.dims.is_none() && !look.as_file && mime::msgtype_for(&mime) == mime::Kind::Image {
        // Not decodable, but the header may still tell the size.
        look.dims = mime::image_size(&head);
    }
    Ok(build_content(
        &opened.name,
        posting.caption,
        source,
        &mime,
        opened.size,
        look,
    ))
}

/// Up to [`HEAD_BYTES`] from the start of the file.
async fn read_head(opened: &OpenedFile) -> io::Result<Vec<u8>> {
    let reader = opened.reader()?;
    let mut head = Vec::with_capacity(HEAD_BYTES.min(opened.size as usize));
    reader
        .take(HEAD_BYTES as u64)
        .read_to_end(&mut head)
        .await?;
    Ok(head)
}

/// The message content for an uploaded file (pure, for tests).
fn build_content(
    name: &str,
    caption: Option<&str>,
    source: MediaSource,
    mime: &str,
    size: u64,
    look: Look,
) -> RoomMessageEventContent {
    RoomMessageEventContent::new(
        MediaFields::outgoing(name, caption, source, mime, size, look).into_message(),
    )
}

#[cfg(test)]
mod tests {
    use matrix_sdk::ruma::owned_mxc_uri;
    use protocol::ChatId;
    use serde_json::json;

    use super::*;
    use crate::media::test_server::TestServer;

    /// A whole 3x2 RGB PNG.
    const PNG: &[u8] = &[
        0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0x00, 0x00, 0x00, 0x0D, 0x49, 0x48, 0x44,
        0x52, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x02, 0x08, 0x02, 0x00, 0x00, 0x00, 0x12,
        0x16, 0xF1, 0x4D, 0x00, 0x00, 0x00, 0x10, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9C, 0x63, 0xF8,
        0xCF, 0xC0, 0x00, 0x41, 0x0C, 0x70, 0x16, 0x00, 0x41, 0xD2, 0x05, 0xFB, 0x87, 0xF0, 0xB9,
        0x48, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4E, 0x44, 0xAE, 0x42, 0x60, 0x82,
    ];

    fn out(cache: &UploadCache) -> Outbound<'_> {
        Outbound {
            cache,
            limit: 1000,
            ffmpeg: None,
        }
    }

    fn json_of(c: &RoomMessageEventContent) -> serde_json::Value {
        serde_json::to_value(c).unwrap()
    }

    #[test]
    fn content_by_kind() {
        let mxc = MediaSource::Plain(owned_mxc_uri!("mxc://example.org/m"));
        let img = build_content(
            "p.png",
            None,
            mxc.clone(),
            "image/png",
            30,
            Look {
                dims: Some((3, 2)),
                ..Look::default()
            },
        );
        assert_eq!(
            json_of(&img),
            json!({"msgtype": "m.image", "body": "p.png", "filename": "p.png",
                   "url": "mxc://example.org/m",
                   "info": {"mimetype": "image/png", "size": 30, "w": 3, "h": 2}})
        );
        let file = build_content(
            "r.pdf",
            Some("the report"),
            mxc.clone(),
            "application/pdf",
            9,
            Look::default(),
        );
        assert_eq!(
            json_of(&file),
            json!({"msgtype": "m.file", "body": "the report", "filename": "r.pdf",
                   "url": "mxc://example.org/m",
                   "info": {"mimetype": "application/pdf", "size": 9}})
        );
        let v = json_of(&build_content(
            "v.mp4",
            None,
            mxc.clone(),
            "video/mp4",
            1,
            Look::default(),
        ));
        assert_eq!(v["msgtype"], "m.video");
        let a = json_of(&build_content(
            "a.ogg",
            Some(" "),
            mxc,
            "audio/ogg",
            1,
            Look::default(),
        ));
        assert_eq!(a["msgtype"], "m.audio");
        assert_eq!(a["body"], "a.ogg");
    }

    #[tokio::test]
    async fn prepares_an_image_and_reports_missing_files() {
        let server = TestServer::start().await;
        let tmp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(tmp.path()).unwrap();
        let chat = ChatId::new("c1").unwrap();
        let scope = ChatScope::new(chat, "!r:example.org");
        std::fs::create_dir_all(tmp.path().join("chats/c1")).unwrap();
        std::fs::write(tmp.path().join("chats/c1/pic.bin"), PNG).unwrap();
        let cache = UploadCache::in_memory();
        let path = WorkspacePath::new("chats/c1/pic.bin").unwrap();
        let content = prepare_with(
            &server.api(),
            &ws,
            &path,
            &scope,
            Posting::default(),
            &out(&cache),
            false,
        )
        .await
        .unwrap();
        let j = json_of(&content);
        assert_eq!(j["msgtype"], "m.image");
        assert_eq!(j["info"]["mimetype"], "image/png");
        assert_eq!(j["info"]["w"], 3);
        assert_eq!(server.uploads()[0].bytes, PNG);

        for rel in ["chats/c1/missing.txt", "chats/other/pic.bin"] {
            let path = WorkspacePath::new(rel).unwrap();
            let failure = prepare_with(
                &server.api(),
                &ws,
                &path,
                &scope,
                Posting::default(),
                &out(&cache),
                false,
            )
            .await
            .unwrap_err();
            let err = SendFileError {
                name: path.file_name().to_owned(),
                failure,
            };
            assert!(err.is_refused());
            assert_eq!(
                err.user_message(),
                format!("I could not send `{}`: file not found.", path.file_name())
            );
        }
        assert_eq!(server.uploads().len(), 1);

        // Encrypted room: the content carries `file` (with key) instead of `url`.
        let path = WorkspacePath::new("chats/c1/pic.bin").unwrap();
        let content = prepare_with(
            &server.api(),
            &ws,
            &path,
            &scope,
            Posting {
                caption: Some("look"),
                voice: false,
            },
            &out(&cache),
            true,
        )
        .await
        .unwrap();
        let j = json_of(&content);
        assert_eq!(j["msgtype"], "m.image");
        assert_eq!(j["body"], "look");
        assert_eq!(j["filename"], "pic.bin");
        assert!(j.get("url").is_none());
        assert_eq!(j["file"]["v"], "v2");
        assert_eq!(j["file"]["url"], "mxc://example.org/up2");
        assert_eq!(server.uploads().len(), 2);
    }
}
