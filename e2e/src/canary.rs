//! A canary file outside the workspace whose reads (and opens) are seen by the kernel
//! (inotify), whoever does them and through whatever name (symlink, hard link, `/proc`).
//!
//! An open alone reads nothing: the confined opener may open a file swapped in under it and
//! refuse it on the handle before reading. A read is what must never happen. The kernel merges
//! identical events that were not fetched yet, so the counts are "at least", and zero is exact.

use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};

/// The planted file and the watch on it.
#[derive(Debug)]
pub struct Canary {
    /// Where it is (outside the workspace, on the same filesystem so hard links can reach it).
    pub path: PathBuf,
    /// Its content: unique, so finding it anywhere means the canary was read.
    pub content: String,
    fd: OwnedFd,
    opens: u64,
    reads: u64,
}

impl Canary {
    /// Writes the canary into `dir` and starts counting opens and reads of it.
    pub fn plant(dir: &Path) -> Result<Self> {
        let content = crate::unique("CANARY-outside-the-workspace-");
        let path = dir.join("canary.txt");
        std::fs::write(&path, &content).context("write the canary")?;
        let fd = inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC)?;
        inotify::add_watch(&fd, &path, WatchFlags::OPEN | WatchFlags::ACCESS)?;
        Ok(Self {
            path,
            content,
            fd,
            opens: 0,
            reads: 0,
        })
    }

    /// How many times (at least) the canary's content has been read since it was planted.
    pub fn reads(&mut self) -> u64 {
        self.fetch();
        self.reads
    }

    /// How many times (at least) the canary has been opened since it was planted.
    pub fn opens(&mut self) -> u64 {
        self.fetch();
        self.opens
    }

    fn fetch(&mut self) {
        let mut buf = [MaybeUninit::<u8>::uninit(); 4096];
        let mut reader = inotify::Reader::new(&self.fd, &mut buf);
        while let Ok(event) = reader.next() {
            if event.events().contains(ReadFlags::OPEN) {
                self.opens += 1;
            }
            if event.events().contains(ReadFlags::ACCESS) {
                self.reads += 1;
            }
        }
    }

    /// Whether `text` holds the canary's content.
    pub fn is_in(&self, text: &str) -> bool {
        text.contains(&self.content)
    }
}
