//! Matrix attachment encryption (version 2: AES-256-CTR, and the SHA-256 of the ciphertext in
//! the event) with its two halves apart. matrix-sdk-crypto's `AttachmentEncryptor` and
//! `AttachmentDecryptor` run the keystream and the hash one after the other on one thread; a
//! large transfer here runs them on two ([`Keystream`] in the disk-side thread, [`hash_beside`]
//! on its own), which on a machine shared with the homeserver is the difference between
//! keeping pace with the network and not. The format is the SDK's: a fresh 256-bit key, an IV
//! whose first 8 bytes are random and whose last 8 (the counter) start at zero, a 128-bit
//! big-endian counter.

use aes::Aes256;
use aes::cipher::{KeyIvInit, StreamCipher};
use bytes::Bytes;
use matrix_sdk::ruma::events::room::{
    EncryptedFile, EncryptedFileHash, EncryptedFileHashAlgorithm, EncryptedFileHashes,
    EncryptedFileInfo, V2EncryptedFileInfo,
};
use matrix_sdk::ruma::serde::Base64;
use matrix_sdk_crypto::MediaEncryptionInfo;
use rand::RngCore;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

type Aes256Ctr = ctr::Ctr128BE<Aes256>;

/// Chunks queued for the hashing thread, at most.
const HASH_DEPTH: usize = 8;

/// The AES-256-CTR keystream of one attachment: applying it encrypts plaintext and decrypts
/// ciphertext, in order, chunk after chunk.
pub struct Keystream(Aes256Ctr);

impl std::fmt::Debug for Keystream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keystream([redacted])")
    }
}

impl Keystream {
    /// XORs the next `buf.len()` bytes of the keystream into `buf`.
    pub fn apply(&mut self, buf: &mut [u8]) {
        self.0.apply_keystream(buf);
    }
}

/// Why a received attachment cannot be decrypted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CipherError {
    /// Not version 2 of the format.
    #[error("unknown version of attachment encryption")]
    UnknownVersion,
    /// No SHA-256 of the ciphertext to check it against.
    #[error("the encryption info has no SHA-256 hash")]
    MissingHash,
    /// The ciphertext is not what the sender hashed.
    #[error("the content does not match its hash")]
    HashMismatch,
}

/// What decrypting `file` takes: its keystream, and the SHA-256 its ciphertext must have.
pub fn for_decryption(file: &EncryptedFile) -> Result<(Keystream, [u8; 32]), CipherError> {
    let EncryptedFileInfo::V2(info) = &file.info else {
        return Err(CipherError::UnknownVersion);
    };
    let Some(EncryptedFileHash::Sha256(hash)) =
        file.hashes.get(&EncryptedFileHashAlgorithm::Sha256)
    else {
        return Err(CipherError::MissingHash);
    };
    let key = info.k.as_inner();
    let iv = info.iv.as_inner();
    Ok((
        Keystream(Aes256Ctr::new(key.into(), iv.into())),
        *hash.as_inner(),
    ))
}

/// A fresh key for one upload; [`Fresh::finish`] makes the event's encryption info once the
/// ciphertext's hash is known.
pub struct Fresh {
    key: [u8; 32],
    iv: [u8; 16],
}

impl std::fmt::Debug for Fresh {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Fresh([redacted])")
    }
}

impl Fresh {
    /// A random key and IV (counter half zero), and their keystream.
    pub fn new() -> (Self, Keystream) {
        let mut rng = rand::rng();
        let mut key = [0u8; 32];
        let mut iv = [0u8; 16];
        rng.fill_bytes(&mut key);
        rng.fill_bytes(&mut iv[..8]);
        let stream = Keystream(Aes256Ctr::new(&key.into(), &iv.into()));
        (Self { key, iv }, stream)
    }

    /// The encryption info of the ciphertext whose SHA-256 is `sha256`.
    pub fn finish(self, sha256: [u8; 32]) -> MediaEncryptionInfo {
        let mut hashes = EncryptedFileHashes::new();
        hashes.insert(EncryptedFileHash::Sha256(Base64::new(sha256)));
        MediaEncryptionInfo {
            encryption_info: V2EncryptedFileInfo::encode(self.key, self.iv).into(),
            hashes,
        }
    }
}

/// A thread hashing the chunks sent to it (SHA-256), beside whatever else handles them; the
/// handle gives the hash once the sender is dropped.
pub fn hash_beside() -> (mpsc::Sender<Bytes>, JoinHandle<[u8; 32]>) {
    let (tx, mut rx) = mpsc::channel::<Bytes>(HASH_DEPTH);
    let handle = tokio::task::spawn_blocking(move || {
        let mut sha = Sha256::new();
        while let Some(chunk) = rx.blocking_recv() {
            sha.update(&chunk);
        }
        sha.finalize().into()
    });
    (tx, handle)
}

/// Whether `got` is the `expected` hash, compared in constant time (the hash is public, but
/// nothing is lost by not leaking where it differs).
pub fn check(got: &[u8; 32], expected: &[u8; 32]) -> Result<(), CipherError> {
    let diff = got.iter().zip(expected).fold(0u8, |d, (a, b)| d | (a ^ b));
    if diff == 0 {
        Ok(())
    } else {
        Err(CipherError::HashMismatch)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Cursor, Read};

    use matrix_sdk::ruma::OwnedMxcUri;
    use matrix_sdk_crypto::{AttachmentDecryptor, AttachmentEncryptor};

    use super::*;

    fn data() -> Vec<u8> {
        (0..300_007u32).map(|i| (i * 7 % 251) as u8).collect()
    }

    fn file(info: MediaEncryptionInfo) -> EncryptedFile {
        EncryptedFile::new(
            OwnedMxcUri::from("mxc://example.org/x"),
            info.encryption_info,
            info.hashes,
        )
    }

    /// Ours, in uneven chunks, with the hash computed on its own thread.
    async fn encrypt_ours(plain: &[u8]) -> (Vec<u8>, EncryptedFile) {
        let (fresh, mut stream) = Fresh::new();
        let (tx, hashed) = hash_beside();
        let mut out = Vec::new();
        for chunk in plain.chunks(65_537) {
            let mut c = chunk.to_vec();
            stream.apply(&mut c);
            out.extend_from_slice(&c);
            tx.send(Bytes::from(c)).await.unwrap();
        }
        drop(tx);
        let info = fresh.finish(hashed.await.unwrap());
        (out, file(info))
    }

    #[tokio::test]
    async fn what_we_encrypt_the_sdk_decrypts() {
        let plain = data();
        let (cipher, f) = encrypt_ours(&plain).await;
        assert_ne!(cipher, plain);
        let mut input = Cursor::new(cipher);
        let mut dec = AttachmentDecryptor::new(&mut input, f.into()).unwrap();
        let mut back = Vec::new();
        dec.read_to_end(&mut back).unwrap();
        assert_eq!(back, plain);
    }

    #[tokio::test]
    async fn what_the_sdk_encrypts_we_decrypt_and_a_changed_byte_is_caught() {
        let plain = data();
        let mut input = Cursor::new(plain.clone());
        let mut enc = AttachmentEncryptor::new(&mut input);
        let mut cipher = Vec::new();
        enc.read_to_end(&mut cipher).unwrap();
        let f = file(enc.finish());

        let (mut stream, expected) = for_decryption(&f).unwrap();
        let got: [u8; 32] = Sha256::digest(&cipher).into();
        assert_eq!(check(&got, &expected), Ok(()));
        let mut back = cipher.clone();
        for part in back.chunks_mut(4099) {
            stream.apply(part);
        }
        assert_eq!(back, plain);

        cipher[1000] ^= 1;
        let got: [u8; 32] = Sha256::digest(&cipher).into();
        assert_eq!(check(&got, &expected), Err(CipherError::HashMismatch));
    }

    #[test]
    fn missing_hashes_are_refused() {
        let (fresh, _) = Fresh::new();
        let mut f = file(fresh.finish([0; 32]));
        f.hashes = EncryptedFileHashes::new();
        assert_eq!(
            for_decryption(&f).map(|_| ()).unwrap_err(),
            CipherError::MissingHash
        );
    }

    #[test]
    fn fresh_keys_differ_and_the_counter_starts_at_zero() {
        let (a, _) = Fresh::new();
        let (b, _) = Fresh::new();
        assert_ne!(a.key, b.key);
        assert_ne!(a.iv[..8], b.iv[..8]);
        assert_eq!(a.iv[8..], [0u8; 8]);
    }
}
