//! Matrix attachment encryption (version 2: AES-256-CTR, and the SHA-256 of the ciphertext in
//! the event) with its two halves apart. matrix-sdk-crypto's `AttachmentEncryptor` and
//! `AttachmentDecryptor` run the keystream and the hash one after the other on one thread; here
//! they run apart. A download checks the hash on a thread before the decryption's (`spool`):
//! the file may only be committed once it matches. An upload needs the hash
//! only for the event, after the bytes went out, so a second, low-priority read of the file
//! computes it ([`hash_again`]) and the upload never waits for it. The format is the SDK's: a
//! fresh 256-bit key, an IV whose first 8 bytes are random and whose last 8 (the counter) start
//! at zero, a 128-bit big-endian counter.

use aes::Aes256;
use aes::cipher::{KeyIvInit, StreamCipher};
use matrix_sdk::ruma::events::room::{
    EncryptedFile, EncryptedFileHash, EncryptedFileHashAlgorithm, EncryptedFileHashes,
    EncryptedFileInfo, V2EncryptedFileInfo,
};
use matrix_sdk::ruma::serde::Base64;
use matrix_sdk_crypto::MediaEncryptionInfo;
use rand::RngCore;
use sha2::{Digest, Sha256};

type Aes256Ctr = ctr::Ctr128BE<Aes256>;

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

    /// A second keystream at the same position: it makes the same ciphertext of the same
    /// plaintext ([`hash_again`]).
    pub fn fork(&self) -> Self {
        Self(self.0.clone())
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

/// What [`hash_again`] found: the SHA-256 of the ciphertext, and a checksum of the plaintext it
/// read, to compare with one taken of the plaintext that was sent ([`plain_checksum`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rehashed {
    /// SHA-256 of the ciphertext.
    pub sha256: [u8; 32],
    /// XXH3-128 of the plaintext read.
    pub plain: u128,
}

/// A fast checksum of plaintext, fed chunk by chunk; [`Rehashed::plain`] of the same bytes.
pub fn plain_checksum() -> xxhash_rust::xxh3::Xxh3 {
    xxhash_rust::xxh3::Xxh3::new()
}

/// Chunks the second reader of [`hash_again`] reads at a time.
const REHASH_CHUNK: usize = 256 * 1024;

/// Computes the SHA-256 of an upload's ciphertext by reading the plaintext once more (`len`
/// bytes of `plain`) and encrypting it again with `keystream` (a [`Keystream::fork`] of the
/// upload's), on a thread of its own at the lowest CPU priority.
///
/// The hash is needed only for the event, once the upload is done, so it must never hold the
/// upload back: hashed beside the upload from the same chunks, it did exactly that on a machine
/// whose cores are busy with the homeserver (the upload waits whenever the hasher falls behind,
/// and the hasher takes the core the homeserver needs to receive). Read apart, it can start once
/// the bytes are out and run while the homeserver stores them; at the lowest priority it yields
/// to anything else that wants the processor. The caller compares [`Rehashed::plain`] with the
/// checksum of what it sent: a file changed between the two reads is caught, never described
/// with a wrong hash.
/// Dropping the returned receiver stops the thread at its next chunk.
pub fn hash_again<R>(
    mut plain: R,
    len: u64,
    mut keystream: Keystream,
) -> tokio::sync::oneshot::Receiver<std::io::Result<Rehashed>>
where
    R: std::io::Read + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    let work = move || {
        lower_own_priority();
        let mut sha = Sha256::new();
        let mut check = plain_checksum();
        let mut buf = vec![0u8; REHASH_CHUNK];
        let mut left = len;
        while left > 0 {
            if tx.is_closed() {
                return;
            }
            let want = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
            let n = match super::pipe::fill(&mut plain, &mut buf[..want]) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => {
                    let _ = tx.send(Err(e));
                    return;
                }
            };
            let chunk = &mut buf[..n];
            check.update(chunk);
            keystream.apply(chunk);
            sha.update(&*chunk);
            left -= n as u64;
        }
        let _ = tx.send(Ok(Rehashed {
            sha256: sha.finalize().into(),
            plain: check.digest128(),
        }));
    };
    if let Err(e) = std::thread::Builder::new()
        .name("mxbridge-rehash".into())
        .spawn(work)
    {
        // The closure (and its sender) is gone with the failed spawn: the receiver reports it.
        tracing::warn!(error = %e, "could not start the hashing thread");
    }
    rx
}

/// Gives the calling thread the lowest CPU priority (nice 19), so it takes only what nothing
/// else wants. On Linux the nice value is per thread; elsewhere it would be the whole process's,
/// so nothing is done there.
fn lower_own_priority() {
    #[cfg(target_os = "linux")]
    if let Err(e) = rustix::process::setpriority_process(Some(rustix::thread::gettid()), 19) {
        tracing::debug!(error = %e, "could not lower the hashing thread's priority");
    }
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

    /// Ours, in uneven chunks.
    fn encrypt_ours(plain: &[u8]) -> (Vec<u8>, EncryptedFile) {
        let (fresh, mut stream) = Fresh::new();
        let mut sha = Sha256::new();
        let mut out = Vec::new();
        for chunk in plain.chunks(65_537) {
            let mut c = chunk.to_vec();
            stream.apply(&mut c);
            sha.update(&c);
            out.extend_from_slice(&c);
        }
        let info = fresh.finish(sha.finalize().into());
        (out, file(info))
    }

    #[tokio::test]
    async fn what_we_encrypt_the_sdk_decrypts() {
        let plain = data();
        let (cipher, f) = encrypt_ours(&plain);
        assert_ne!(cipher, plain);
        assert_eq!(sdk_decrypts(cipher, f), plain);
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

    #[tokio::test]
    async fn hashed_again_is_the_hash_of_what_was_sent() {
        let plain = data();
        let (fresh, mut stream) = Fresh::new();
        let again = hash_again(
            Cursor::new(plain.clone()),
            plain.len() as u64,
            stream.fork(),
        );
        let mut sent = plain.clone();
        let mut check = plain_checksum();
        for part in sent.chunks_mut(70_001) {
            check.update(part);
            stream.apply(part);
        }
        let got = again.await.unwrap().unwrap();
        assert_eq!(got.plain, check.digest128());
        // The SDK decrypts what was sent with the info made from the hash read again.
        let f = file(fresh.finish(got.sha256));
        assert_eq!(sdk_decrypts(sent, f), plain);
    }

    /// What matrix-sdk-crypto's decryptor makes of `cipher` with the info `f`.
    fn sdk_decrypts(cipher: Vec<u8>, f: EncryptedFile) -> Vec<u8> {
        let mut input = Cursor::new(cipher);
        let mut dec = AttachmentDecryptor::new(&mut input, f.into()).unwrap();
        let mut back = Vec::new();
        dec.read_to_end(&mut back).unwrap();
        back
    }

    #[tokio::test]
    async fn a_file_changed_between_the_reads_is_told_by_its_checksum() {
        let plain = data();
        let (_, stream) = Fresh::new();
        let mut changed = plain.clone();
        changed[12_345] ^= 1;
        let again = hash_again(Cursor::new(changed), plain.len() as u64, stream.fork());
        let mut check = plain_checksum();
        check.update(&plain);
        assert_ne!(again.await.unwrap().unwrap().plain, check.digest128());
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
