//! A reader with a file position of its own over a shared open file.

use std::io;

/// A reader of an open file that keeps its own position (`pread`), unlike a cloned handle,
/// which shares the position with every other clone.
#[derive(Debug)]
pub struct PositionedReader {
    file: std::fs::File,
    pos: u64,
}

impl io::Read for PositionedReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl io::Seek for PositionedReader {
    fn seek(&mut self, to: io::SeekFrom) -> io::Result<u64> {
        let base = match to {
            io::SeekFrom::Start(n) => {
                self.pos = n;
                return Ok(n);
            }
            io::SeekFrom::End(d) => (self.file.metadata()?.len(), d),
            io::SeekFrom::Current(d) => (self.pos, d),
        };
        self.pos = base
            .0
            .checked_add_signed(base.1)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek before the start"))?;
        Ok(self.pos)
    }
}

impl PositionedReader {
    /// Reads `file` from its start, whatever position other handles of it have.
    pub fn new(file: std::fs::File) -> Self {
        Self { file, pos: 0 }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::io::Read;

    use super::*;

    #[test]
    fn positioned_readers_of_one_file_do_not_move_each_other() {
        use std::io::Seek;
        let mut tmp = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut tmp, b"0123456789").unwrap();
        let mut a = PositionedReader::new(tmp.try_clone().unwrap());
        let mut b = PositionedReader::new(tmp);
        let (mut x, mut y) = ([0u8; 4], [0u8; 4]);
        a.read_exact(&mut x).unwrap();
        b.read_exact(&mut y).unwrap();
        assert_eq!((&x, &y), (b"0123", b"0123"));
        a.read_exact(&mut x).unwrap();
        assert_eq!(&x, b"4567");
        assert_eq!(b.seek(io::SeekFrom::End(-2)).unwrap(), 8);
        assert_eq!(b.seek(io::SeekFrom::Current(-1)).unwrap(), 7);
        assert!(b.seek(io::SeekFrom::Current(-8)).is_err());
        let mut rest = Vec::new();
        b.read_to_end(&mut rest).unwrap();
        assert_eq!(rest, b"789");
    }
}
