//! Uploads of small content made in memory (thumbnails), deduplicated by content hash through
//! the same [`UploadCache`] as files: the same thumbnail is uploaded once per kind of room.

use bytes::Bytes;
use matrix_sdk::ruma::events::room::{EncryptedFile, MediaSource};
use matrix_sdk_crypto::AttachmentEncryptor;
use sha2::{Digest, Sha256};

use super::upload::post_stream;
use super::{MediaApi, UploadCache, UploadError, with_retries};

/// Uploads `bytes` (of type `mime`), encrypted with a fresh key when `encrypt`, unless the same
/// bytes went up that way before; returns where they are.
pub(super) async fn upload_bytes(
    api: &MediaApi,
    bytes: Bytes,
    mime: &str,
    encrypt: bool,
    cache: &UploadCache,
) -> Result<MediaSource, UploadError> {
    let sha = hex::encode(Sha256::digest(&bytes));
    let len = bytes.len() as u64;
    let url = api.url(&["_matrix", "media", "v3", "upload"])?;
    if !encrypt {
        if let Some(mxc) = cache.get(&sha, len).await {
            return Ok(MediaSource::Plain(mxc));
        }
        let mxc = with_retries("thumbnail upload", || {
            let body = futures_util::stream::iter([Ok(bytes.clone())]);
            post_stream(api, url.clone(), mime, len, body)
        })
        .await?;
        if let Err(e) = cache.insert(&sha, len, mxc.clone()).await {
            tracing::warn!(error = %e, "could not persist the upload cache");
        }
        return Ok(MediaSource::Plain(mxc));
    }
    if let Some(file) = cache.get_encrypted(&sha, len).await {
        return Ok(MediaSource::Encrypted(Box::new(file)));
    }
    // Encrypted once, outside the retry loop: a retry sends the same ciphertext.
    let (cipher, info) = {
        let mut plain = &bytes[..];
        let mut encryptor = AttachmentEncryptor::new(&mut plain);
        let mut cipher = Vec::with_capacity(bytes.len());
        std::io::copy(&mut encryptor, &mut cipher).map_err(UploadError::Read)?;
        (Bytes::from(cipher), encryptor.finish())
    };
    let mxc = with_retries("encrypted thumbnail upload", || {
        let body = futures_util::stream::iter([Ok(cipher.clone())]);
        post_stream(api, url.clone(), "application/octet-stream", len, body)
    })
    .await?;
    let file = EncryptedFile::new(mxc, info.encryption_info, info.hashes);
    if let Err(e) = cache.insert_encrypted(&sha, len, file.clone()).await {
        tracing::warn!(error = %e, "could not persist the upload cache");
    }
    Ok(MediaSource::Encrypted(Box::new(file)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::media::test_server::TestServer;

    #[tokio::test]
    async fn the_same_thumbnail_is_uploaded_once_per_kind_of_room() {
        let server = TestServer::start().await;
        let cache = UploadCache::in_memory();
        let api = server.api();
        let thumb = Bytes::from_static(b"\xff\xd8\xff a tiny jpeg");
        let up = |bytes: &Bytes, encrypt| {
            upload_bytes(&api, bytes.clone(), "image/jpeg", encrypt, &cache)
        };
        let first = up(&thumb, false).await.unwrap();
        let again = up(&thumb, false).await.unwrap();
        assert_eq!(
            serde_json::to_value(&first).unwrap(),
            serde_json::to_value(&again).unwrap()
        );
        assert_eq!(server.uploads().len(), 1);
        assert_eq!(server.uploads()[0].bytes, &thumb[..]);

        let sealed = up(&thumb, true).await.unwrap();
        let MediaSource::Encrypted(file) = &sealed else {
            panic!("an encrypted room gets thumbnail_file: {sealed:?}");
        };
        assert_eq!(server.uploads().len(), 2);
        assert_ne!(server.uploads()[1].bytes, &thumb[..], "ciphertext only");
        let resealed = up(&thumb, true).await.unwrap();
        let MediaSource::Encrypted(again) = &resealed else {
            panic!("{resealed:?}");
        };
        assert_eq!(again.url, file.url, "the cached key and upload are reused");
        assert_eq!(server.uploads().len(), 2);

        up(&Bytes::from_static(b"another picture"), false)
            .await
            .unwrap();
        assert_eq!(server.uploads().len(), 3);
    }
}
