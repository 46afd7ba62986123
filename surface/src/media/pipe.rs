//! Bytes from the disk to the network (an upload), with the heavy work (reading, hashing,
//! encryption) on a blocking thread beside the network I/O: a transfer uses two cores instead
//! of taking turns on one, and no chunk waits for a thread hop of its own. Memory is bounded by
//! [`DEPTH`] chunks in flight. (Downloads go the other way through `spool`.)

use std::io::{self, Read};

use bytes::Bytes;
use futures_util::Stream;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Chunks in flight between the two sides, at most.
pub const DEPTH: usize = 8;
/// Size of the chunks read from disk for an upload.
pub const UPLOAD_CHUNK: usize = 256 * 1024;

/// Where a producer on the blocking thread puts its chunks.
#[derive(Debug)]
pub struct Emit {
    tx: mpsc::Sender<io::Result<Bytes>>,
}

impl Emit {
    /// Hands one chunk to the stream, waiting while [`DEPTH`] chunks are in flight; fails once
    /// nobody reads the stream any more (the request ended).
    pub fn send(&mut self, chunk: Bytes) -> io::Result<()> {
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the transfer stopped"))
    }
}

/// Runs `produce` on a blocking thread; the chunks it emits are the returned stream (a request
/// body), and its result comes from the handle. A producer that fails also fails the stream,
/// so a request never sends a short body as if it were whole.
pub fn produce<T, F>(
    produce: F,
) -> (
    impl Stream<Item = io::Result<Bytes>> + Send + 'static,
    JoinHandle<io::Result<T>>,
)
where
    T: Send + 'static,
    F: FnOnce(&mut Emit) -> io::Result<T> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(DEPTH);
    let handle = tokio::task::spawn_blocking(move || {
        let mut emit = Emit { tx };
        let result = produce(&mut emit);
        if let Err(e) = &result {
            let _ = emit
                .tx
                .blocking_send(Err(io::Error::new(e.kind(), e.to_string())));
        }
        result
    });
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    (stream, handle)
}

/// Reads from `src` until `buf` is full or the input ends; returns how many bytes it holds.
pub fn fill(src: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match src.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// Copies `src` into `emit` in chunks of `chunk` bytes; returns how many bytes went.
pub fn pump(src: &mut impl Read, chunk: usize, emit: &mut Emit) -> io::Result<u64> {
    let mut total = 0u64;
    loop {
        let mut buf = vec![0u8; chunk];
        // Whole chunks: fewer, larger items through the channel.
        let filled = fill(src, &mut buf)?;
        if filled == 0 {
            return Ok(total);
        }
        buf.truncate(filled);
        total += filled as u64;
        emit.send(Bytes::from(buf))?;
        if filled < chunk {
            return Ok(total);
        }
    }
}

/// A reader that hashes (SHA-256) what passes through it, when asked to.
#[derive(Debug)]
pub struct Hashing<R> {
    inner: R,
    hasher: Option<Sha256>,
}

impl<R: Read> Hashing<R> {
    /// Reads `inner`, hashing what is read when `hash`.
    pub fn new(inner: R, hash: bool) -> Self {
        Self {
            inner,
            hasher: hash.then(Sha256::new),
        }
    }

    /// The hex SHA-256 of everything read, if hashing.
    pub fn hex(self) -> Option<String> {
        self.hasher.map(|h| hex::encode(h.finalize()))
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(h) = &mut self.hasher {
            h.update(&buf[..n]);
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;

    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn a_produced_stream_is_the_input_whole_and_hashed() {
        let data: Vec<u8> = (0..1_000_003u32).map(|i| (i % 251) as u8).collect();
        let input = data.clone();
        let (stream, done) = produce(move |emit| {
            let mut src = Hashing::new(&input[..], true);
            let n = pump(&mut src, 4096, emit)?;
            Ok((n, src.hex()))
        });
        let chunks: Vec<Bytes> = stream.map(|c| c.unwrap()).collect().await;
        assert!(chunks.iter().all(|c| c.len() <= 4096));
        assert_eq!(chunks.concat(), data);
        let (n, sha) = done.await.unwrap().unwrap();
        assert_eq!(n, data.len() as u64);
        assert_eq!(sha, Some(hex::encode(Sha256::digest(&data))));
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_failing_producer_fails_the_stream() {
        let (stream, done) = produce(|emit| {
            emit.send(Bytes::from_static(b"half"))?;
            Err::<(), _>(io::Error::new(io::ErrorKind::UnexpectedEof, "shrank"))
        });
        let items: Vec<io::Result<Bytes>> = stream.collect().await;
        assert_eq!(items.len(), 2);
        assert!(items[1].is_err());
        assert!(done.await.unwrap().is_err());
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_dropped_stream_stops_the_producer() {
        let (stream, done) = produce(|emit| {
            let mut src = std::io::repeat(7).take(1 << 30);
            pump(&mut src, 4096, emit)
        });
        drop(stream);
        let err = done.await.unwrap().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    }
}
