//! The way of a download's bytes from the network task to the disk: a fixed set of
//! [`BUFFER`]-sized buffers goes round, the network task copies each chunk into the current one
//! and passes it on full, an encrypted file's ciphertext is hashed on one thread, decrypted and
//! written on the next ([`writeback`] on a third), and the emptied buffer comes back.
//!
//! Why buffers of our own instead of passing the HTTP client's chunks along: a chunk still held
//! by another thread keeps the client's read buffer from being reused, so it allocates a fresh
//! one for the next read: on glibc a fresh mapping whose pages fault in, zeroed, and are unmapped
//! again when the chunk is dropped (a tenth of the surface's time in a 1 GiB download, measured
//! with `perf`). Here the chunk is copied once, as it was before (into the write buffer), and
//! dropped at once; memory is [`BUFFERS`] × [`BUFFER`] whatever the file's size.

use std::io::{self, Write};

use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::cipher::Keystream;
use super::writeback::{self, Flusher, Writeback};

/// Size of the buffers, and of the writes to the file.
pub const BUFFER: usize = 256 * 1024;
/// Buffers in the round, at most: the bytes in flight between the network and the disk.
pub const BUFFERS: usize = 16;

/// What the stages learned on the way.
#[derive(Debug)]
pub struct Landed {
    /// The first bytes of the (decrypted) content, for sniffing.
    pub head: Vec<u8>,
    /// Bytes written.
    pub size: u64,
    /// The SHA-256 of the bytes as they came, when asked for.
    pub sha256: Option<[u8; 32]>,
}

/// A stage stopped taking buffers (it failed: [`Spool::finish`] says why).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped;

/// The network task's end.
#[derive(Debug)]
pub struct Spool {
    /// To the first stage (the hashing one, or the writing one).
    full: mpsc::Sender<Vec<u8>>,
    /// Emptied buffers, back from the writing stage.
    free: mpsc::Receiver<Vec<u8>>,
    /// The buffer being filled.
    current: Vec<u8>,
    /// Buffers allocated so far.
    made: usize,
    hasher: Option<JoinHandle<[u8; 32]>>,
    writer: JoinHandle<io::Result<(Vec<u8>, u64)>>,
}

impl Spool {
    /// Starts the stages writing to `out` from its start: hashing when `hash`, decrypting with
    /// `keystream` when given, keeping the first `head_cap` bytes.
    pub fn start(
        out: std::fs::File,
        keystream: Option<Keystream>,
        hash: bool,
        head_cap: usize,
    ) -> Self {
        let (full, to_first) = mpsc::channel::<Vec<u8>>(BUFFERS);
        let (give_back, free) = mpsc::channel::<Vec<u8>>(BUFFERS);
        let (hasher, to_writer) = if hash {
            let (tx, rx) = mpsc::channel::<Vec<u8>>(BUFFERS);
            let handle = tokio::task::spawn_blocking(move || hash_stage(to_first, tx));
            (Some(handle), rx)
        } else {
            (None, to_first)
        };
        let writer = tokio::task::spawn_blocking(move || {
            write_stage(to_writer, give_back, keystream, out, head_cap)
        });
        Self {
            full,
            free,
            current: Vec::with_capacity(BUFFER),
            made: 1,
            hasher,
            writer,
        }
    }

    /// Copies `data` in, passing on every buffer it fills. Waits while every buffer is on its
    /// way (back-pressure on the network).
    pub async fn push(&mut self, mut data: &[u8]) -> Result<(), Stopped> {
        while !data.is_empty() {
            let take = (BUFFER - self.current.len()).min(data.len());
            self.current.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.current.len() == BUFFER {
                self.pass().await?;
            }
        }
        Ok(())
    }

    async fn pass(&mut self) -> Result<(), Stopped> {
        let next = if self.made < BUFFERS {
            self.made += 1;
            Vec::with_capacity(BUFFER)
        } else {
            self.free.recv().await.ok_or(Stopped)?
        };
        let full = std::mem::replace(&mut self.current, next);
        self.full.send(full).await.map_err(|_| Stopped)
    }

    /// Passes on the last bytes and waits for the stages: what they learned, or the first
    /// error (a failed write).
    pub async fn finish(mut self) -> io::Result<Landed> {
        if !self.current.is_empty() {
            // A stage that stopped reports why below.
            let last = std::mem::take(&mut self.current);
            let _ = self.full.send(last).await;
        }
        drop(self.full);
        let (head, size) = self.writer.await.map_err(io::Error::other)??;
        let sha256 = match self.hasher {
            Some(h) => Some(h.await.map_err(io::Error::other)?),
            None => None,
        };
        Ok(Landed { head, size, sha256 })
    }

    /// Buffers allocated so far (for tests).
    #[cfg(test)]
    fn made(&self) -> usize {
        self.made
    }
}

/// Hashes each buffer and hands it on; ends when the input ends or the next stage is gone.
fn hash_stage(mut input: mpsc::Receiver<Vec<u8>>, next: mpsc::Sender<Vec<u8>>) -> [u8; 32] {
    let mut sha = Sha256::new();
    while let Some(buf) = input.blocking_recv() {
        sha.update(&buf);
        if next.blocking_send(buf).is_err() {
            break;
        }
    }
    sha.finalize().into()
}

/// Decrypts (when a `keystream` is given), keeps the head, writes to `out`, hands written windows
/// to the disk on a thread of their own ([`writeback`]), and gives each buffer back.
fn write_stage(
    mut input: mpsc::Receiver<Vec<u8>>,
    give_back: mpsc::Sender<Vec<u8>>,
    mut keystream: Option<Keystream>,
    mut out: std::fs::File,
    head_cap: usize,
) -> io::Result<(Vec<u8>, u64)> {
    let flusher = Flusher::start(out.try_clone()?)?;
    let mut head = Vec::with_capacity(head_cap);
    let mut size = 0u64;
    let mut writeback = Writeback::new(writeback::WINDOW);
    let result = loop {
        let Some(mut buf) = input.blocking_recv() else {
            break Ok((head, size));
        };
        if let Some(k) = &mut keystream {
            k.apply(&mut buf);
        }
        if head.len() < head_cap {
            let take = (head_cap - head.len()).min(buf.len());
            head.extend_from_slice(&buf[..take]);
        }
        if let Err(e) = out.write_all(&buf) {
            break Err(e);
        }
        size += buf.len() as u64;
        if let Some(advice) = writeback.after(size) {
            flusher.hand(advice);
        }
        buf.clear();
        // Never full: it holds at most the buffers that exist.
        let _ = give_back.try_send(buf);
    };
    flusher.finish();
    result
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Seek};

    use super::*;
    use crate::media::cipher;

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251) as u8).collect()
    }

    async fn through(
        input: &[u8],
        chunk: usize,
        keystream: Option<Keystream>,
        hash: bool,
    ) -> (Landed, Vec<u8>, usize) {
        let mut file = tempfile::tempfile().unwrap();
        let mut spool = Spool::start(file.try_clone().unwrap(), keystream, hash, 1000);
        for c in input.chunks(chunk) {
            spool.push(c).await.unwrap();
        }
        let made = spool.made();
        let landed = spool.finish().await.unwrap();
        file.rewind().unwrap();
        let mut back = Vec::new();
        file.read_to_end(&mut back).unwrap();
        (landed, back, made)
    }

    #[tokio::test]
    async fn bytes_land_whole_in_order_whatever_the_chunks() {
        // Uneven chunks, a chunk larger than a buffer, and sizes around a buffer's.
        let cases = [
            (0, 1000),
            (1, 1),
            (BUFFER - 1, 4096),
            (BUFFER, BUFFER),
            (BUFFER + 1, 65_537),
            (3 * BUFFER + 17, 3 * BUFFER / 2 + 5),
        ];
        for (len, chunk) in cases {
            let input = data(len);
            let (landed, back, _) = through(&input, chunk, None, false).await;
            assert_eq!(back, input, "len {len}, chunks of {chunk}");
            assert_eq!(landed.size, len as u64);
            assert_eq!(landed.head, input[..len.min(1000)]);
            assert_eq!(landed.sha256, None);
        }
    }

    #[tokio::test]
    async fn ciphertext_is_hashed_as_it_came_and_written_decrypted() {
        let plain = data(5 * BUFFER + 333);
        let (fresh, mut enc) = cipher::Fresh::new();
        let mut ciphertext = plain.clone();
        enc.apply(&mut ciphertext);
        let expected: [u8; 32] = Sha256::digest(&ciphertext).into();
        let info = fresh.finish(expected);
        let f = matrix_sdk::ruma::events::room::EncryptedFile::new(
            matrix_sdk::ruma::OwnedMxcUri::from("mxc://example.org/x"),
            info.encryption_info,
            info.hashes,
        );
        let (dec, want) = cipher::for_decryption(&f).unwrap();
        assert_eq!(want, expected);

        let (landed, back, _) = through(&ciphertext, 70_001, Some(dec), true).await;
        assert_eq!(landed.sha256, Some(expected));
        assert_eq!(back, plain);
        assert_eq!(landed.head, plain[..1000]);
    }

    #[tokio::test]
    async fn memory_is_a_fixed_round_of_buffers() {
        let input = data(40 * BUFFER);
        let (landed, back, made) = through(&input, 16 * 1024, None, true).await;
        assert_eq!(back, input);
        assert_eq!(landed.size, input.len() as u64);
        assert!(made <= BUFFERS, "{made} buffers for 40 buffers' worth");
    }

    #[tokio::test]
    async fn a_failed_write_stops_the_network_side_and_is_reported() {
        // A file opened read-only: the first write fails.
        let tmp = tempfile::NamedTempFile::new().unwrap();
        let ro = std::fs::File::open(tmp.path()).unwrap();
        let mut spool = Spool::start(ro, None, true, 10);
        let input = data(BUFFER);
        let mut stopped = false;
        for _ in 0..(4 * BUFFERS) {
            if spool.push(&input).await.is_err() {
                stopped = true;
                break;
            }
        }
        assert!(
            stopped,
            "the network side must stop once nothing takes its buffers"
        );
        let err = spool.finish().await.unwrap_err();
        assert_eq!(
            err.raw_os_error(),
            Some(rustix::io::Errno::BADF.raw_os_error()),
            "{err}"
        );
    }
}
