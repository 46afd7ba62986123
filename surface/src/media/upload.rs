//! Streaming upload of a workspace file, deduplicated by content hash (and by file version, so
//! a large file sent again is not even read).

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use matrix_sdk::Client;
use matrix_sdk::reqwest;
use matrix_sdk::ruma::OwnedMxcUri;
use matrix_sdk::ruma::events::room::EncryptedFile;
use matrix_sdk_crypto::MediaEncryptionInfo;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use super::{
    HttpError, MAX_ERROR_BODY, MediaApi, RetryClass, cipher, next_chunk, pipe, send,
    transfer_timeout, with_retries,
};
use crate::workspace::OpenedFile;

/// File name of the cache inside the surface state directory.
pub const UPLOAD_CACHE_FILE: &str = "upload-cache.json";

/// Entries kept; the oldest are forgotten first (a forgotten file is simply uploaded again).
const MAX_CACHE_ENTRIES: usize = 10_000;

/// Why an upload failed.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    /// The homeserver refused the size (413 `M_TOO_LARGE`).
    #[error("the homeserver refused the file as too large")]
    TooLarge,
    /// The homeserver or network failed (after retries, when retryable).
    #[error(transparent)]
    Http(#[from] HttpError),
    /// Reading the file failed (or it shrank while being read).
    #[error("could not read the file: {0}")]
    Read(#[source] io::Error),
}

impl UploadError {
    /// Whether trying again later can succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Http(e) if e.is_retryable())
    }
}

impl RetryClass for UploadError {
    fn is_retryable(&self) -> bool {
        UploadError::is_retryable(self)
    }
    fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Self::Http(e) => e.retry_after(),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct CacheEntry {
    mxc: OwnedMxcUri,
    /// For uploads to encrypted rooms: the key and hashes of the ciphertext at `mxc`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    encrypted: Option<EncryptedFile>,
    size: u64,
    /// Unix seconds of the upload, for eviction.
    at: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct CacheFile {
    version: u32,
    /// SHA-256 (hex) of the content → where it was uploaded.
    entries: BTreeMap<String, CacheEntry>,
}

/// Files smaller than this are hashed before uploading and cached by content, so the same bytes
/// under another name are not uploaded again; larger ones are read once, while they upload, and
/// cached by their version (device, inode, size, times: [`OpenedFile::version_key`]), so the same
/// file sent again is not even read.
pub const PREHASH_BELOW: u64 = 16 * 1024 * 1024;

/// Content hash → `mxc://` URI of what this account already uploaded, persisted as JSON in the
/// surface state directory and rewritten atomically (temp file, fsync, rename) on each change.
///
/// The same bytes are uploaded once; changed bytes have a new hash and are uploaded again.
#[derive(Debug)]
pub struct UploadCache {
    path: Option<PathBuf>,
    file: Mutex<CacheFile>,
}

impl UploadCache {
    /// Loads (or starts) the cache at `<state_dir>/upload-cache.json`. An unreadable or corrupt
    /// file is logged and replaced: the cache only saves bandwidth.
    pub fn open(state_dir: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(state_dir)?;
        let path = state_dir.join(UPLOAD_CACHE_FILE);
        let file = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                tracing::warn!(path = %path.display(), error = %e, "upload cache is corrupt; starting a new one");
                CacheFile::default()
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => CacheFile::default(),
            Err(e) => return Err(e),
        };
        Ok(Self {
            path: Some(path),
            file: Mutex::new(file),
        })
    }

    /// A cache that is not persisted (tests, or a surface without a state directory).
    pub fn in_memory() -> Self {
        Self {
            path: None,
            file: Mutex::new(CacheFile::default()),
        }
    }

    /// Where content with this hash and size was uploaded (in the clear), if it was.
    pub async fn get(&self, sha256: &str, size: u64) -> Option<OwnedMxcUri> {
        let file = self.file.lock().await;
        file.entries
            .get(sha256)
            .filter(|e| e.size == size && e.encrypted.is_none())
            .map(|e| e.mxc.clone())
    }

    /// Records an upload and persists the cache.
    pub async fn insert(&self, sha256: &str, size: u64, mxc: OwnedMxcUri) -> io::Result<()> {
        self.store(sha256.to_owned(), size, mxc, None).await
    }

    /// The encrypted upload of content with this (plaintext) hash and size, if there was one.
    pub async fn get_encrypted(&self, sha256: &str, size: u64) -> Option<EncryptedFile> {
        let file = self.file.lock().await;
        file.entries
            .get(&encrypted_key(sha256))
            .filter(|e| e.size == size)
            .and_then(|e| e.encrypted.clone())
    }

    /// Records an encrypted upload (key and all: the cache lives with the crypto store).
    pub async fn insert_encrypted(
        &self,
        sha256: &str,
        size: u64,
        file: EncryptedFile,
    ) -> io::Result<()> {
        self.store(encrypted_key(sha256), size, file.url.clone(), Some(file))
            .await
    }

    async fn store(
        &self,
        key: String,
        size: u64,
        mxc: OwnedMxcUri,
        encrypted: Option<EncryptedFile>,
    ) -> io::Result<()> {
        let mut file = self.file.lock().await;
        let at = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        file.version = 1;
        file.entries.insert(
            key,
            CacheEntry {
                mxc,
                encrypted,
                size,
                at,
            },
        );
        while file.entries.len() > MAX_CACHE_ENTRIES {
            let oldest = file
                .entries
                .iter()
                .min_by_key(|(_, e)| e.at)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => file.entries.remove(&k),
                None => break,
            };
        }
        let Some(path) = self.path.clone() else {
            return Ok(());
        };
        let json = serde_json::to_vec_pretty(&*file).map_err(io::Error::other)?;
        // Written under the lock so concurrent inserts land in order.
        tokio::task::spawn_blocking(move || write_atomically(&path, &json))
            .await
            .map_err(io::Error::other)?
    }
}

fn encrypted_key(sha256: &str) -> String {
    format!("e2ee:{sha256}")
}

/// Writes `bytes` to `path` through a temporary file in the same folder, fsynced, then renamed.
fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Uploads an opened workspace file, unless the same bytes were uploaded before.
///
/// A file sent before (same version: [`OpenedFile::version_key`]) is not read again; a small
/// file is hashed first and looked up by content ([`PREHASH_BELOW`]); anything else is streamed
/// from disk to `POST /_matrix/media/v3/upload?filename=..` with `Content-Type` and
/// `Content-Length`, hashed on the way, and the returned `content_uri` is cached. 429/5xx/network
/// failures are retried a few times, re-reading the same open file each time. Memory use does
/// not depend on the file size.
#[tracing::instrument(skip_all, fields(path = %opened.path, size = opened.size))]
pub async fn upload_file(
    client: &Client,
    opened: &OpenedFile,
    mime: &str,
    cache: &UploadCache,
) -> Result<OwnedMxcUri, UploadError> {
    let api = MediaApi::from_client(client)?;
    upload_with(&api, opened, mime, cache).await
}

/// How `opened` is found in the cache: its content hash when it is small (read once more to
/// hash it), else its version; `None` when neither is available.
async fn cache_key(opened: &OpenedFile) -> Result<Option<String>, UploadError> {
    if opened.size < PREHASH_BELOW {
        let (sha, _) = hash_file(opened).await.map_err(UploadError::Read)?;
        return Ok(Some(sha));
    }
    Ok(opened.version_key().ok().map(|v| format!("version:{v}")))
}

/// The key to cache a finished upload under: the hash of what was sent (small files), or the
/// version, if the file did not change while it was sent.
fn key_after(
    opened: &OpenedFile,
    before: Option<String>,
    sent_sha: Option<String>,
) -> Option<String> {
    if sent_sha.is_some() {
        return sent_sha;
    }
    let after = opened.version_key().ok().map(|v| format!("version:{v}"));
    before.filter(|b| after.as_ref() == Some(b))
}

pub(super) async fn upload_with(
    api: &MediaApi,
    opened: &OpenedFile,
    mime: &str,
    cache: &UploadCache,
) -> Result<OwnedMxcUri, UploadError> {
    let started = std::time::Instant::now();
    let key = cache_key(opened).await?;
    if let Some(k) = &key
        && let Some(mxc) = cache.get(k, opened.size).await
    {
        tracing::debug!(%mxc, "same content uploaded before; reusing it");
        return Ok(mxc);
    }
    let len = opened.size;
    let hash = len < PREHASH_BELOW;
    let mut url = api.url(&["_matrix", "media", "v3", "upload"])?;
    url.query_pairs_mut().append_pair("filename", &opened.name);
    let (mxc, sent_sha) =
        with_retries("upload", || attempt(api, opened, mime, hash, url.clone())).await?;
    if let Some(k) = key_after(opened, key, sent_sha)
        && let Err(e) = cache.insert(&k, len, mxc.clone()).await
    {
        tracing::warn!(error = %e, "could not persist the upload cache");
    }
    tracing::info!(%mxc, us = elapsed_us(started), "file uploaded");
    Ok(mxc)
}

/// Encrypts an opened workspace file for an end-to-end encrypted room (AES-256-CTR with a fresh
/// key, Matrix attachment encryption v2) and uploads the ciphertext, unless the same content was
/// uploaded encrypted before (the cached key is reused then).
///
/// The file is read, hashed and encrypted on a blocking thread while the ciphertext streams to
/// the homeserver: one read, no temporary copy, flat memory. The file name is not sent.
#[tracing::instrument(skip_all, fields(path = %opened.path, size = opened.size))]
pub async fn upload_file_encrypted(
    client: &Client,
    opened: &OpenedFile,
    cache: &UploadCache,
) -> Result<EncryptedFile, UploadError> {
    let api = MediaApi::from_client(client)?;
    upload_encrypted_with(&api, opened, cache).await
}

pub(super) async fn upload_encrypted_with(
    api: &MediaApi,
    opened: &OpenedFile,
    cache: &UploadCache,
) -> Result<EncryptedFile, UploadError> {
    let started = std::time::Instant::now();
    let key = cache_key(opened).await?;
    if let Some(k) = &key
        && let Some(file) = cache.get_encrypted(k, opened.size).await
    {
        tracing::debug!(mxc = %file.url, "same content uploaded encrypted before; reusing it");
        return Ok(file);
    }
    let len = opened.size;
    let hash = len < PREHASH_BELOW;
    let url = api.url(&["_matrix", "media", "v3", "upload"])?;
    let (mxc, sent_sha, info) = with_retries("encrypted upload", || {
        attempt_encrypted(api, opened, hash, url.clone())
    })
    .await?;
    let file = EncryptedFile::new(mxc, info.encryption_info, info.hashes);
    if let Some(k) = key_after(opened, key, sent_sha)
        && let Err(e) = cache.insert_encrypted(&k, len, file.clone()).await
    {
        tracing::warn!(error = %e, "could not persist the upload cache");
    }
    tracing::info!(mxc = %file.url, us = elapsed_us(started), "file uploaded encrypted");
    Ok(file)
}

/// Microseconds since `started`, for the log (the benchmark reads the upload's time there).
fn elapsed_us(started: std::time::Instant) -> u64 {
    u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// SHA-256 (hex) and length of the whole file, read on a blocking thread.
async fn hash_file(opened: &OpenedFile) -> io::Result<(String, u64)> {
    let file = opened.std_reader()?;
    tokio::task::spawn_blocking(move || {
        let mut src = pipe::Hashing::new(file, true);
        let n = io::copy(&mut src, &mut io::sink())?;
        Ok((src.hex().unwrap_or_default(), n))
    })
    .await
    .map_err(io::Error::other)?
}

#[derive(Deserialize)]
struct UploadResponse {
    content_uri: String,
}

fn shrank() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the file shrank while being uploaded",
    )
}

/// One try: stream exactly `opened.size` bytes of the file, read on a blocking thread (and
/// hashed on the way when `hash`). Returns the URI and the SHA-256 of what was actually sent.
async fn attempt(
    api: &MediaApi,
    opened: &OpenedFile,
    mime: &str,
    hash: bool,
    url: url::Url,
) -> Result<(OwnedMxcUri, Option<String>), UploadError> {
    let len = opened.size;
    let source = opened.std_reader().map_err(UploadError::Read)?;
    let (stream, done) = pipe::produce(move |emit| {
        let mut src = pipe::Hashing::new(source.take(len), hash);
        if pipe::pump(&mut src, pipe::UPLOAD_CHUNK, emit)? != len {
            return Err(shrank());
        }
        Ok(src.hex())
    });
    let mxc = post_stream(api, url, mime, len, stream).await?;
    let sha = done
        .await
        .map_err(|e| UploadError::Read(io::Error::other(e)))?
        .map_err(UploadError::Read)?;
    Ok((mxc, sha))
}

/// One try of an encrypted upload: the file is read (and hashed, when `hash`) and encrypted with
/// a fresh key on a blocking thread while the ciphertext (as long as the plaintext) streams out.
/// The ciphertext's hash, which the event carries, is needed only once the homeserver has the
/// upload, so it comes from a second read of the file that starts when the last bytes have been
/// handed to the request ([`cipher::hash_again`]): it runs while the homeserver stores (and
/// itself hashes) what it received, instead of taking a core from the upload. A file that
/// changed between the two reads fails the try.
async fn attempt_encrypted(
    api: &MediaApi,
    opened: &OpenedFile,
    hash: bool,
    url: url::Url,
) -> Result<(OwnedMxcUri, Option<String>, MediaEncryptionInfo), UploadError> {
    let len = opened.size;
    let source = opened.std_reader().map_err(UploadError::Read)?;
    let again = opened.std_reader().map_err(UploadError::Read)?;
    let (fresh, mut keystream) = cipher::Fresh::new();
    let from_start = keystream.fork();
    let (stream, done) = pipe::produce(move |emit| {
        let mut plain = pipe::Hashing::new(source.take(len), hash);
        let mut check = cipher::plain_checksum();
        let mut sent = 0u64;
        loop {
            let mut buf = vec![0u8; pipe::UPLOAD_CHUNK];
            let n = pipe::fill(&mut plain, &mut buf)?;
            if n == 0 {
                break;
            }
            buf.truncate(n);
            check.update(&buf);
            keystream.apply(&mut buf);
            emit.send(Bytes::from(buf))?;
            sent += n as u64;
        }
        if sent != len {
            return Err(shrank());
        }
        let rehashed = cipher::hash_again(again.take(len), len, from_start);
        Ok((plain.hex(), check.digest128(), rehashed))
    });
    let mxc = post_stream(api, url, "application/octet-stream", len, stream).await?;
    let (sha, sent_check, rehashed) = done
        .await
        .map_err(|e| UploadError::Read(io::Error::other(e)))?
        .map_err(UploadError::Read)?;
    let again = rehashed
        .await
        .map_err(|_| UploadError::Read(io::Error::other("the hashing thread stopped")))?
        .map_err(UploadError::Read)?;
    if again.plain != sent_check {
        return Err(UploadError::Read(io::Error::other(
            "the file changed while being uploaded",
        )));
    }
    Ok((mxc, sha, fresh.finish(again.sha256)))
}

/// Posts a streamed body of `len` bytes to the media upload endpoint; returns the URI.
pub(super) async fn post_stream(
    api: &MediaApi,
    url: url::Url,
    mime: &str,
    len: u64,
    body: impl futures_util::Stream<Item = io::Result<Bytes>> + Send + 'static,
) -> Result<OwnedMxcUri, UploadError> {
    let timeout = transfer_timeout(len);
    let req = api
        .post(url, timeout)
        .header(reqwest::header::CONTENT_TYPE, mime)
        .header(reqwest::header::CONTENT_LENGTH, len)
        .body(reqwest::Body::wrap_stream(body));
    let mut resp = send(req, timeout).await.map_err(|e| match e {
        HttpError::Status { status: 413, .. } => UploadError::TooLarge,
        e => UploadError::Http(e),
    })?;
    let mut answer = Vec::new();
    while let Some(chunk) = next_chunk(&mut resp).await? {
        answer.extend_from_slice(&chunk);
        if answer.len() > MAX_ERROR_BODY {
            return Err(HttpError::InvalidResponse("upload answer too long".into()).into());
        }
    }
    let parsed: UploadResponse = serde_json::from_slice(&answer)
        .map_err(|e| HttpError::InvalidResponse(format!("upload answer: {e}")))?;
    let mxc = OwnedMxcUri::from(parsed.content_uri);
    mxc.validate()
        .map_err(|e| HttpError::InvalidResponse(format!("content_uri: {e}")))?;
    crate::metrics::media_bytes("out", len);
    Ok(mxc)
}

#[cfg(test)]
mod tests {
    use matrix_sdk::ruma::owned_mxc_uri;
    use protocol::{ChatId, WorkspacePath};
    use sha2::{Digest, Sha256};

    use super::*;
    use crate::media::test_server::{Reply, TestServer};
    use crate::workspace::{ChatScope, Workspace};

    struct Files {
        _tmp: tempfile::TempDir,
        root: PathBuf,
        ws: Workspace,
        scope: ChatScope,
    }

    impl Files {
        fn new() -> Self {
            let tmp = tempfile::tempdir().unwrap();
            let root = tmp.path().to_owned();
            let ws = Workspace::open(&root).unwrap();
            let scope = ChatScope::new(ChatId::new("c1").unwrap(), "!r:example.org");
            Self {
                _tmp: tmp,
                root,
                ws,
                scope,
            }
        }
        fn put(&self, name: &str, content: &[u8]) -> OpenedFile {
            let rel = format!("chats/c1/{name}");
            let p = self.root.join(&rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            // A new file each time (a new inode), as an agent writing it again makes.
            let _ = std::fs::remove_file(&p);
            std::fs::write(&p, content).unwrap();
            self.open(name)
        }
        fn open(&self, name: &str) -> OpenedFile {
            let rel = format!("chats/c1/{name}");
            self.ws
                .open_for_upload(&WorkspacePath::new(rel).unwrap(), &self.scope, u64::MAX)
                .unwrap()
        }
    }

    #[tokio::test]
    async fn uploads_once_per_content() {
        let server = TestServer::start().await;
        let files = Files::new();
        let cache = UploadCache::in_memory();
        let a = files.put("a.txt", b"same bytes");
        let mxc1 = upload_with(&server.api(), &a, "text/plain", &cache)
            .await
            .unwrap();
        // Same bytes under another name: no second upload.
        let b = files.put("b.txt", b"same bytes");
        let mxc2 = upload_with(&server.api(), &b, "text/plain", &cache)
            .await
            .unwrap();
        assert_eq!(mxc1, mxc2);
        assert_eq!(server.uploads().len(), 1);
        let up = &server.uploads()[0];
        assert_eq!(up.bytes, b"same bytes");
        assert_eq!(up.content_type.as_deref(), Some("text/plain"));
        assert_eq!(up.content_length.as_deref(), Some("10"));
        assert_eq!(up.filename.as_deref(), Some("a.txt"));
        // Changed bytes: uploaded again.
        let a2 = files.put("a.txt", b"other bytes");
        let mxc3 = upload_with(&server.api(), &a2, "text/plain", &cache)
            .await
            .unwrap();
        assert_ne!(mxc1, mxc3);
        assert_eq!(server.uploads().len(), 2);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_large_file_is_read_once_and_recognized_by_its_version() {
        let server = TestServer::start().await;
        let files = Files::new();
        let cache = UploadCache::in_memory();
        let big: Vec<u8> = (0..PREHASH_BELOW as usize + 1000)
            .map(|i| (i % 253) as u8)
            .collect();
        let f = files.put("big.bin", &big);
        let mxc = upload_with(&server.api(), &f, "application/octet-stream", &cache)
            .await
            .unwrap();
        assert_eq!(server.uploads().len(), 1);
        assert_eq!(server.uploads()[0].bytes, big);
        // The same version again (reopened): not uploaded, not needed to read.
        let again = files.open("big.bin");
        let mxc2 = upload_with(&server.api(), &again, "application/octet-stream", &cache)
            .await
            .unwrap();
        assert_eq!(mxc, mxc2);
        assert_eq!(server.uploads().len(), 1);
        // Rewritten (a new version, even with the same bytes): uploaded again.
        let rewritten = files.put("big.bin", &big);
        upload_with(
            &server.api(),
            &rewritten,
            "application/octet-stream",
            &cache,
        )
        .await
        .unwrap();
        assert_eq!(server.uploads().len(), 2);
    }

    #[tokio::test]
    async fn retries_and_reads_the_file_again() {
        let server = TestServer::start().await;
        server.fail_uploads_first(vec![Reply::Status(503), Reply::RateLimited(5)]);
        let files = Files::new();
        let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let f = files.put("big.bin", &big);
        let mxc = upload_with(
            &server.api(),
            &f,
            "application/octet-stream",
            &UploadCache::in_memory(),
        )
        .await
        .unwrap();
        assert_eq!(server.uploads().len(), 1);
        assert_eq!(server.uploads()[0].bytes, big);
        assert!(mxc.is_valid());
    }

    #[tokio::test]
    async fn too_large_is_final() {
        let server = TestServer::start().await;
        server.fail_uploads_first(vec![Reply::Status(413), Reply::Status(413)]);
        let files = Files::new();
        let f = files.put("x.bin", b"x");
        let err = upload_with(
            &server.api(),
            &f,
            "application/octet-stream",
            &UploadCache::in_memory(),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, UploadError::TooLarge), "{err}");
        assert!(server.uploads().is_empty());
    }

    #[tokio::test]
    async fn encrypted_uploads_round_trip_and_dedupe() {
        use std::io::Read;
        let server = TestServer::start().await;
        let files = Files::new();
        let state = tempfile::tempdir().unwrap();
        let cache = UploadCache::open(state.path()).unwrap();
        let plain: Vec<u8> = (0..200_000u32).map(|i| (i % 13) as u8).collect();
        let f = files.put("secret.bin", &plain);
        let enc = upload_encrypted_with(&server.api(), &f, &cache)
            .await
            .unwrap();
        let up = &server.uploads()[0];
        assert_ne!(up.bytes, plain);
        assert_eq!(up.bytes.len(), plain.len());
        assert_eq!(up.filename, None, "the name stays private");
        assert_eq!(up.content_type.as_deref(), Some("application/octet-stream"));
        let mut cursor = std::io::Cursor::new(up.bytes.clone());
        let mut dec = matrix_sdk_crypto::AttachmentDecryptor::new(
            &mut cursor,
            MediaEncryptionInfo::from(enc.clone()),
        )
        .unwrap();
        let mut back = Vec::new();
        dec.read_to_end(&mut back).unwrap();
        assert_eq!(back, plain);
        // Same content again: reused, not re-uploaded; a plain upload is separate.
        let again = upload_encrypted_with(&server.api(), &f, &cache)
            .await
            .unwrap();
        assert_eq!(again.url, enc.url);
        assert_eq!(server.uploads().len(), 1);
        assert_eq!(
            cache
                .get(&hex::encode(Sha256::digest(&plain)), 200_000)
                .await,
            None
        );
        // No scratch files left behind.
        let names: Vec<_> = std::fs::read_dir(state.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![UPLOAD_CACHE_FILE]);
    }

    #[tokio::test]
    async fn cache_persists_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let cache = UploadCache::open(dir.path()).unwrap();
        cache
            .insert("abc", 3, owned_mxc_uri!("mxc://example.org/one"))
            .await
            .unwrap();
        let again = UploadCache::open(dir.path()).unwrap();
        assert_eq!(
            again.get("abc", 3).await,
            Some(owned_mxc_uri!("mxc://example.org/one"))
        );
        assert_eq!(again.get("abc", 4).await, None);
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![UPLOAD_CACHE_FILE]);
        // A corrupt file is replaced, not fatal.
        std::fs::write(dir.path().join(UPLOAD_CACHE_FILE), b"{not json").unwrap();
        let fresh = UploadCache::open(dir.path()).unwrap();
        assert_eq!(fresh.get("abc", 3).await, None);
    }
}
