//! Runs the crate's three functions on the committed corpus (`tests/corpus/`), on large files
//! made up on the fly, and on garbage.

#![allow(clippy::unwrap_used)]

mod audio;
mod hostile;
mod images;
mod model_images;
mod video;

use std::io::{self, Read, Seek, SeekFrom};
use std::time::Duration;

/// The bytes of a corpus file.
pub fn corpus(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/corpus/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Asserts `actual` is within 5 % of `expected`.
pub fn assert_close(actual: Option<Duration>, expected: Duration) {
    let actual = actual.expect("a duration");
    let error = actual.as_secs_f64() - expected.as_secs_f64();
    assert!(
        error.abs() <= expected.as_secs_f64() * 0.05,
        "duration {actual:?}, expected {expected:?} ± 5 %"
    );
}

/// A file made of literal bytes and long runs of zeros that are never stored, which counts
/// the bytes actually read from it: a 1 GiB input in a few KB of memory.
#[derive(Debug)]
pub struct Synthetic {
    parts: Vec<(u64, Part)>,
    len: u64,
    pos: u64,
    /// Bytes handed out by `read` so far.
    pub bytes_read: u64,
}

#[derive(Debug)]
pub enum Part {
    Bytes(Vec<u8>),
    Zeros(u64),
}

impl Synthetic {
    pub fn new(parts: Vec<Part>) -> Self {
        let mut at = 0;
        let parts = parts
            .into_iter()
            .map(|p| {
                let start = at;
                at += match &p {
                    Part::Bytes(b) => b.len() as u64,
                    Part::Zeros(n) => *n,
                };
                (start, p)
            })
            .collect();
        Synthetic {
            parts,
            len: at,
            pos: 0,
            bytes_read: 0,
        }
    }

    pub fn size(&self) -> u64 {
        self.len
    }
}

impl Read for Synthetic {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some((start, part)) = self.parts.iter().rev().find(|(s, _)| *s <= self.pos) else {
            return Ok(0);
        };
        let offset = self.pos - start;
        let n = match part {
            Part::Bytes(b) => {
                let rest = b.get(offset as usize..).unwrap_or_default();
                let n = rest.len().min(buf.len());
                buf[..n].copy_from_slice(&rest[..n]);
                n
            }
            Part::Zeros(len) => {
                let n = (len.saturating_sub(offset)).min(buf.len() as u64) as usize;
                buf[..n].fill(0);
                n
            }
        };
        self.pos += n as u64;
        self.bytes_read += n as u64;
        Ok(n)
    }
}

impl Seek for Synthetic {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let target = match to {
            SeekFrom::Start(n) => Some(n),
            SeekFrom::End(d) => self.len.checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = target.ok_or_else(|| io::Error::other("seek before the start"))?;
        Ok(self.pos)
    }
}

/// Deterministic pseudo-random bytes (xorshift), for garbage inputs.
pub fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}
