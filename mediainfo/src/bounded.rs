//! A reader that ends early: decoders that read a whole file into memory (the `image` crate's
//! JPEG decoder does) get at most a fixed number of bytes, whatever the file's size.

use std::io::{self, BufRead, Read, Seek, SeekFrom};

/// Presents the bytes of `inner` up to absolute position `end` as the whole file.
#[derive(Debug)]
pub(crate) struct Bounded<R> {
    inner: R,
    /// Current absolute position in `inner`.
    pos: u64,
    /// Absolute position where the presented file ends.
    end: u64,
}

impl<R: Seek> Bounded<R> {
    /// Bounds `inner` to `max` bytes from its current position.
    pub(crate) fn new(mut inner: R, max: u64) -> io::Result<Self> {
        let pos = inner.stream_position()?;
        Ok(Bounded {
            inner,
            pos,
            end: pos.saturating_add(max),
        })
    }
}

impl<R> Bounded<R> {
    fn left(&self) -> usize {
        usize::try_from(self.end.saturating_sub(self.pos)).unwrap_or(usize::MAX)
    }
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let max = buf.len().min(self.left());
        let n = self.inner.read(&mut buf[..max])?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl<R: BufRead> BufRead for Bounded<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        let left = self.left();
        let buf = self.inner.fill_buf()?;
        Ok(&buf[..buf.len().min(left)])
    }

    fn consume(&mut self, amount: usize) {
        let amount = amount.min(self.left());
        self.inner.consume(amount);
        self.pos += amount as u64;
    }
}

impl<R: Seek> Seek for Bounded<R> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        // Seeking from the end means from the bound, if the real end lies beyond it.
        let to = match to {
            SeekFrom::End(offset) => {
                let real_end = self.inner.seek(SeekFrom::End(0))?;
                let end = real_end.min(self.end);
                let target = end.checked_add_signed(offset).ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidInput, "seek before the start")
                })?;
                SeekFrom::Start(target)
            }
            other => other,
        };
        self.pos = self.inner.seek(to)?;
        Ok(self.pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_stop_at_the_bound_and_seeks_from_the_end_start_there() {
        let mut bounded = Bounded::new(io::Cursor::new(b"0123456789".to_vec()), 4).expect("new");
        let mut all = Vec::new();
        bounded.read_to_end(&mut all).expect("read");
        assert_eq!(all, b"0123");
        assert_eq!(bounded.seek(SeekFrom::End(-1)).expect("seek"), 3);
        assert_eq!(bounded.fill_buf().expect("fill"), b"3");
        bounded.consume(5);
        assert_eq!(bounded.fill_buf().expect("fill"), b"");
    }
}
