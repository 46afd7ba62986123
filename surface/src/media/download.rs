//! Authenticated, streaming download of an attachment into a room's inbox.

use std::time::SystemTime;

use matrix_sdk::Client;
use matrix_sdk::ruma::events::room::{EncryptedFile, MediaSource};
use matrix_sdk::ruma::{EventId, OwnedEventId, OwnedRoomId, OwnedUserId};
use protocol::{AttachmentInfo, WorkspacePath};

use super::cipher;
use super::spool::Spool;
use super::{
    HEADERS_TIMEOUT, HttpError, MediaApi, RetryClass, human_size, next_chunk, quoted_name, send,
    transfer_timeout, with_retries,
};
use crate::filename::sanitize_filename;
use crate::mime::{self, HEAD_BYTES};
use crate::workspace::{InboxTemp, Workspace, WorkspaceError};

/// An attachment to fetch, as found in an `m.file`/`m.image`/`m.audio`/`m.video` event.
#[derive(Debug, Clone)]
pub struct DownloadRequest {
    /// The event carrying the attachment (for logs).
    pub event_id: OwnedEventId,
    /// The room it was sent in: decides the inbox folder.
    pub room_id: OwnedRoomId,
    /// Who sent it: decides the inbox folder.
    pub sender: OwnedUserId,
    /// When it was sent (`origin_server_ts`): the time in the file's name, which, with a digest
    /// of the event id, makes a download after a crash land on the same name, kept once.
    pub sent_at: SystemTime,
    /// Where the content is (`content.source` of the event).
    pub source: MediaSource,
    /// `info.size` of the event, if any. Checked against the limit before downloading.
    pub declared_size: Option<u64>,
    /// `info.mimetype` of the event, if any.
    pub declared_mime: Option<String>,
    /// The name the sender gave (see [`crate::filename::pick_name`]); sanitized here.
    pub name: String,
}

/// A committed download.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Downloaded {
    /// Where the file is, relative to the workspace.
    pub path: WorkspacePath,
    /// Name (sanitized), MIME type (sniffed / reconciled) and size.
    pub info: AttachmentInfo,
}

/// A failed download: the sanitized name of the file and what went wrong.
#[derive(Debug, thiserror::Error)]
#[error("download of `{name}` failed: {failure}")]
pub struct DownloadError {
    /// The sanitized file name, for messages.
    pub name: String,
    /// What went wrong.
    #[source]
    pub failure: DownloadFailure,
}

/// What went wrong with a download.
#[derive(Debug, thiserror::Error)]
pub enum DownloadFailure {
    /// Declared or actual size over the limit. Nothing is kept.
    #[error("larger than the {} byte limit{}", limit, size.map(|s| format!(" ({s} bytes)")).unwrap_or_default())]
    TooLarge {
        /// The limit.
        limit: u64,
        /// The size, when known (declared, announced or counted so far).
        size: Option<u64>,
    },
    /// An end-to-end encrypted attachment could not be decrypted (unknown scheme, bad key, or
    /// the content does not match its hash). Nothing is kept.
    #[error("could not decrypt the attachment: {0}")]
    Decryption(String),
    /// The `mxc://` URI is malformed.
    #[error("invalid media URI")]
    InvalidUri,
    /// The homeserver does not have the media (404), or refuses it.
    #[error("the homeserver does not have this file")]
    NotFound,
    /// The homeserver or network failed (after retries, when retryable).
    #[error(transparent)]
    Http(#[from] HttpError),
    /// Writing to the workspace failed (e.g. disk full). Nothing partial is left.
    #[error(transparent)]
    Disk(#[from] WorkspaceError),
}

impl RetryClass for DownloadFailure {
    fn is_retryable(&self) -> bool {
        matches!(self, Self::Http(e) if e.is_retryable())
    }
    fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Self::Http(e) => e.retry_after(),
            _ => None,
        }
    }
}

impl DownloadError {
    /// Whether the same download could succeed later (it failed on a transient condition and
    /// the retries ran out).
    pub fn is_retryable(&self) -> bool {
        self.failure.is_retryable()
    }

    /// A sentence for the room, naming the file, without internal details.
    pub fn user_message(&self) -> String {
        let why = match &self.failure {
            DownloadFailure::TooLarge { limit, .. } => {
                format!("it is larger than the {} limit", human_size(*limit))
            }
            DownloadFailure::Decryption(_) => "it could not be decrypted".to_owned(),
            DownloadFailure::InvalidUri => "its media link is invalid".to_owned(),
            DownloadFailure::NotFound => "the homeserver no longer has it".to_owned(),
            DownloadFailure::Http(HttpError::Status {
                status: 401 | 403, ..
            }) => "the homeserver refused access to it".to_owned(),
            DownloadFailure::Http(_) => {
                "the homeserver did not deliver it (try again later)".to_owned()
            }
            DownloadFailure::Disk(e) if e.is_disk_full() => "the disk is full".to_owned(),
            DownloadFailure::Disk(_) => "it could not be saved".to_owned(),
        };
        format!("I could not download `{}`: {why}.", quoted_name(&self.name))
    }
}

/// Downloads the attachment of `req` into `surfaces/matrix/<sender>/<room>/inbox/`.
///
/// The declared size is checked against `limit` before anything is fetched, the announced
/// `Content-Length` before the body is read, and the running count while streaming (the
/// download is aborted as soon as it exceeds `limit`). The content is written to a hidden
/// temporary file, sniffed on the way (an encrypted file's ciphertext is hash-checked), and
/// renamed into place only when complete; on any failure nothing is left behind. 429 and 5xx
/// answers and broken connections are retried a few times (starting over); 404 is final.
#[tracing::instrument(skip_all, fields(event_id = %req.event_id, room_id = %req.room_id))]
pub async fn download_to_inbox(
    client: &Client,
    ws: &Workspace,
    req: &DownloadRequest,
    limit: u64,
) -> Result<Downloaded, DownloadError> {
    let name = sanitize_filename(&req.name, 200);
    let fail = |failure| DownloadError {
        name: name.clone(),
        failure,
    };
    let api = MediaApi::from_client(client).map_err(|e| fail(e.into()))?;
    download_with(&api, ws, req, limit).await.map_err(fail)
}

pub(super) async fn download_with(
    api: &MediaApi,
    ws: &Workspace,
    req: &DownloadRequest,
    limit: u64,
) -> Result<Downloaded, DownloadFailure> {
    if let Some(size) = req.declared_size.filter(|s| *s > limit) {
        return Err(DownloadFailure::TooLarge {
            limit,
            size: Some(size),
        });
    }
    let (mxc, encrypted) = match &req.source {
        MediaSource::Plain(mxc) => (mxc, None),
        MediaSource::Encrypted(file) => (&file.url, Some(&**file)),
    };
    let (server, media_id) = mxc.parts().map_err(|_| DownloadFailure::InvalidUri)?;
    let url = api.url(&[
        "_matrix",
        "client",
        "v1",
        "media",
        "download",
        server.as_str(),
        media_id,
    ])?;
    let started = std::time::Instant::now();
    let downloaded =
        with_retries("download", || attempt(api, ws, req, encrypted, &url, limit)).await?;
    tracing::info!(
        path = %downloaded.path,
        size = downloaded.info.size,
        mime = %downloaded.info.mime,
        us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        "attachment downloaded"
    );
    Ok(downloaded)
}

/// One try: a fresh temporary file, the whole body (decrypted on the way when `encrypted`),
/// commit.
async fn attempt(
    api: &MediaApi,
    ws: &Workspace,
    req: &DownloadRequest,
    encrypted: Option<&EncryptedFile>,
    url: &url::Url,
    limit: u64,
) -> Result<Downloaded, DownloadFailure> {
    let (mut resp, announced) = fetch(api, url, limit).await?;
    let mut temp = ws
        .create_inbox_file(
            req.sender.as_str(),
            req.room_id.as_str(),
            &req.name,
            req.sent_at,
        )?
        .keyed(&event_key(&req.event_id));
    let disk = |e| WorkspaceError::Io {
        op: "write",
        path: temp_label(req),
        source: e,
    };
    // The bytes go through a round of buffers to blocking threads (`spool`): an encrypted
    // file's ciphertext is hashed on one, decrypted and written on the next, while this task
    // reads the network; the work spreads over the cores, memory bounded by the round. A plain
    // file is not hashed: nothing needs its hash, and on two cores shared with the homeserver
    // every CPU second counts.
    let (keystream, expected) = match encrypted.map(cipher::for_decryption).transpose() {
        Ok(k) => k.unzip(),
        Err(e) => return Err(DownloadFailure::Decryption(e.to_string())),
    };
    let out = temp
        .file()
        .try_clone()
        .await
        .map_err(disk)?
        .into_std()
        .await;
    let head_cap = HEAD_BYTES.min(usize::try_from(limit).unwrap_or(HEAD_BYTES));
    let mut spool = Spool::start(out, keystream, expected.is_some(), head_cap);
    let size = pump(&mut resp, &mut spool, limit).await?;
    let landed = spool.finish().await.map_err(disk)?;
    if let (Some(got), Some(expected)) = (landed.sha256, expected) {
        cipher::check(&got, &expected).map_err(|e| DownloadFailure::Decryption(e.to_string()))?;
    }
    if let Some(expected) = announced.filter(|e| *e != size) {
        return Err(HttpError::Truncated {
            got: size,
            expected,
        }
        .into());
    }
    land(temp, req, &landed.head, landed.size, size).await
}

/// Asks for the file; refuses one whose announced size is over `limit`. Returns the response
/// and the announced size.
async fn fetch(
    api: &MediaApi,
    url: &url::Url,
    limit: u64,
) -> Result<(reqwest::Response, Option<u64>), DownloadFailure> {
    let resp = send(
        api.get(url.clone(), transfer_timeout(limit)),
        HEADERS_TIMEOUT,
    )
    .await
    .map_err(|e| match e {
        HttpError::Status { status: 404, .. } => DownloadFailure::NotFound,
        e => e.into(),
    })?;
    let announced = resp.content_length();
    if let Some(size) = announced.filter(|s| *s > limit) {
        return Err(DownloadFailure::TooLarge {
            limit,
            size: Some(size),
        });
    }
    Ok((resp, announced))
}

/// Streams the body into `spool`; returns how many bytes came. More than `limit` is an error.
async fn pump(
    resp: &mut reqwest::Response,
    spool: &mut Spool,
    limit: u64,
) -> Result<u64, DownloadFailure> {
    let mut size: u64 = 0;
    while let Some(chunk) = next_chunk(resp).await? {
        size += chunk.len() as u64;
        if size > limit {
            // The caller's temporary file is dropped on return: the partial file goes with it.
            return Err(DownloadFailure::TooLarge { limit, size: None });
        }
        if spool.push(&chunk).await.is_err() {
            break; // A stage failed; its error comes from `Spool::finish`.
        }
    }
    Ok(size)
}

/// The downloaded file takes its place in the inbox, with the type its first bytes show.
async fn land(
    mut temp: InboxTemp,
    req: &DownloadRequest,
    head: &[u8],
    landed_size: u64,
    size: u64,
) -> Result<Downloaded, DownloadFailure> {
    let mime = mime::reconcile(req.declared_mime.as_deref(), head, temp.name());
    if mime::disagrees(req.declared_mime.as_deref(), &mime) {
        tracing::warn!(
            declared = req.declared_mime.as_deref().unwrap_or_default(),
            sniffed = %mime,
            "declared MIME type does not match the content"
        );
    }
    let name = temp.name().to_owned();
    // The same inode after the rename into place: the agent may open that very file at once.
    let inode = temp
        .file()
        .metadata()
        .await
        .ok()
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m));
    let path = temp.commit().await?;
    crate::metrics::media_bytes("in", size);
    Ok(Downloaded {
        path,
        info: AttachmentInfo {
            name,
            mime,
            size: landed_size,
            inode,
            ..AttachmentInfo::default()
        },
    })
}

/// The unique part of an inbox file's name: 8 hex digits of the event id's SHA-256 (the
/// eight characters `protocol::original_name` expects between the time and the name).
fn event_key(event_id: &EventId) -> String {
    use sha2::Digest;
    hex::encode(&sha2::Sha256::digest(event_id.as_str().as_bytes())[..4])
}

fn temp_label(req: &DownloadRequest) -> String {
    Workspace::inbox_dir(req.sender.as_str(), req.room_id.as_str()).to_string()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use matrix_sdk::ruma::{event_id, owned_room_id, owned_user_id};

    use super::*;

    #[test]
    fn inbox_names_keep_the_original_name_readable() {
        let key = event_key(matrix_sdk::ruma::event_id!("$abc:example.org"));
        let name = format!("20260101T120000Z-{key}-photo.png");
        assert_eq!(protocol::original_name(&name), "photo.png");
    }
    use crate::media::test_server::{Reply, TestServer};

    const ROOM: &str = "!room:example.org";
    const USER: &str = "@alice:example.org";

    fn request(media_id: &str, name: &str) -> DownloadRequest {
        DownloadRequest {
            event_id: event_id!("$ev").to_owned(),
            room_id: owned_room_id!("!room:example.org"),
            sender: owned_user_id!("@alice:example.org"),
            sent_at: SystemTime::now(),
            source: MediaSource::Plain(format!("mxc://example.org/{media_id}").into()),
            declared_size: None,
            declared_mime: None,
            name: name.to_owned(),
        }
    }

    fn workspace() -> (tempfile::TempDir, Workspace) {
        let tmp = tempfile::tempdir().unwrap();
        let ws = Workspace::open(tmp.path()).unwrap();
        (tmp, ws)
    }

    fn inbox_entries(tmp: &tempfile::TempDir) -> Vec<String> {
        let dir = Workspace::inbox_dir(USER, ROOM).to_path_under(tmp.path());
        std::fs::read_dir(dir)
            .map(|rd| {
                rd.map(|e| e.unwrap().file_name().into_string().unwrap())
                    .collect()
            })
            .unwrap_or_default()
    }

    const PNG: &[u8] = &[
        0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0x00, 0x00, 0x00, 0x0D, 0x49, 0x48, 0x44,
        0x52, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x02, 0x08, 0x06, 0x00, 0x00, 0x00, 0x9D,
    ];

    #[tokio::test]
    async fn downloads_and_sniffs() {
        let server = TestServer::start().await;
        server.put_media("png1", Reply::Body(PNG.to_vec()));
        let (tmp, ws) = workspace();
        let mut req = request("png1", "picture.txt");
        req.declared_mime = Some("text/plain".into());
        let d = download_with(&server.api(), &ws, &req, 1000).await.unwrap();
        assert_eq!(d.info.mime, "image/png");
        assert_eq!(d.info.size, PNG.len() as u64);
        assert_eq!(d.info.name, "picture.txt");
        assert_eq!(
            std::fs::read(d.path.to_path_under(tmp.path())).unwrap(),
            PNG
        );
        assert!(
            d.path
                .as_str()
                .starts_with(Workspace::inbox_dir(USER, ROOM).as_str())
        );
        assert_eq!(server.auth_failures.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn refuses_declared_oversize_without_fetching() {
        let server = TestServer::start().await;
        let (tmp, ws) = workspace();
        let mut req = request("big", "big.bin");
        req.declared_size = Some(2000);
        let err = download_with(&server.api(), &ws, &req, 1000)
            .await
            .unwrap_err();
        assert!(matches!(
            err,
            DownloadFailure::TooLarge {
                size: Some(2000),
                ..
            }
        ));
        assert_eq!(server.hits("big"), 0);
        assert!(inbox_entries(&tmp).is_empty());
    }

    #[tokio::test]
    async fn aborts_when_streaming_past_the_limit() {
        let server = TestServer::start().await;
        // Chunked, no Content-Length, and the declared size lies.
        server.put_media("liar", Reply::Chunked(vec![vec![7u8; 600], vec![7u8; 600]]));
        let (tmp, ws) = workspace();
        let mut req = request("liar", "small.bin");
        req.declared_size = Some(10);
        let err = download_with(&server.api(), &ws, &req, 1000)
            .await
            .unwrap_err();
        assert!(matches!(err, DownloadFailure::TooLarge { .. }), "{err}");
        assert!(inbox_entries(&tmp).is_empty(), "{:?}", inbox_entries(&tmp));
        // Announced length over the limit: refused before the body.
        server.put_media("announced", Reply::Body(vec![1u8; 1001]));
        let err = download_with(&server.api(), &ws, &request("announced", "a"), 1000)
            .await
            .unwrap_err();
        assert!(matches!(
            err,
            DownloadFailure::TooLarge {
                size: Some(1001),
                ..
            }
        ));
        assert!(inbox_entries(&tmp).is_empty());
    }

    #[tokio::test]
    async fn retries_rate_limits_and_server_errors() {
        let server = TestServer::start().await;
        server.put_media("flaky", Reply::Body(b"finally".to_vec()));
        server.fail_first("flaky", vec![Reply::RateLimited(10), Reply::Status(502)]);
        let (tmp, ws) = workspace();
        let d = download_with(&server.api(), &ws, &request("flaky", "f.txt"), 1000)
            .await
            .unwrap();
        assert_eq!(server.hits("flaky"), 3);
        assert_eq!(d.info.mime, "text/plain");
        assert_eq!(inbox_entries(&tmp).len(), 1);
    }

    #[tokio::test]
    async fn not_found_is_final_and_user_message_names_the_file() {
        let server = TestServer::start().await;
        let (tmp, ws) = workspace();
        let err = download_with(&server.api(), &ws, &request("missing", "r.pdf"), 1000)
            .await
            .unwrap_err();
        assert!(matches!(err, DownloadFailure::NotFound), "{err}");
        assert_eq!(server.hits("missing"), 1);
        assert!(inbox_entries(&tmp).is_empty());
        let e = DownloadError {
            name: "report.pdf".into(),
            failure: DownloadFailure::TooLarge {
                limit: 100 * 1024 * 1024,
                size: None,
            },
        };
        assert_eq!(
            e.user_message(),
            "I could not download `report.pdf`: it is larger than the 100 MiB limit."
        );
        assert!(!e.is_retryable());
    }

    fn encrypt(plain: &[u8], media_id: &str) -> (Vec<u8>, EncryptedFile) {
        use std::io::Read;
        let mut cursor = std::io::Cursor::new(plain.to_vec());
        let mut enc = matrix_sdk_crypto::AttachmentEncryptor::new(&mut cursor);
        let mut cipher = Vec::new();
        enc.read_to_end(&mut cipher).unwrap();
        let info = enc.finish();
        let file = EncryptedFile::new(
            format!("mxc://example.org/{media_id}").into(),
            info.encryption_info,
            info.hashes,
        );
        (cipher, file)
    }

    #[tokio::test]
    async fn decrypts_encrypted_media_while_streaming() {
        let server = TestServer::start().await;
        let (tmp, ws) = workspace();
        let plain: Vec<u8> = PNG
            .iter()
            .copied()
            .chain((0..5000u32).map(|i| i as u8))
            .collect();
        let (cipher, file) = encrypt(&plain, "enc");
        assert_ne!(cipher, plain);
        // Odd chunk boundaries, no Content-Length.
        let chunks = cipher.chunks(777).map(<[u8]>::to_vec).collect();
        server.put_media("enc", Reply::Chunked(chunks));
        let mut req = request("enc", "secret.png");
        req.source = MediaSource::Encrypted(Box::new(file));
        let d = download_with(&server.api(), &ws, &req, 100_000)
            .await
            .unwrap();
        assert_eq!(
            std::fs::read(d.path.to_path_under(tmp.path())).unwrap(),
            plain
        );
        assert_eq!(d.info.mime, "image/png");
    }

    #[tokio::test]
    async fn tampered_encrypted_media_leaves_nothing() {
        let server = TestServer::start().await;
        let (tmp, ws) = workspace();
        let (mut cipher, file) = encrypt(b"attack at dawn", "bad");
        cipher[3] ^= 1;
        server.put_media("bad", Reply::Body(cipher));
        let mut req = request("bad", "orders.txt");
        req.source = MediaSource::Encrypted(Box::new(file));
        let err = download_with(&server.api(), &ws, &req, 1000)
            .await
            .unwrap_err();
        assert!(matches!(err, DownloadFailure::Decryption(_)), "{err}");
        assert_eq!(server.hits("bad"), 1);
        assert!(inbox_entries(&tmp).is_empty());
    }
}
