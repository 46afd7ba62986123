//! Big-file figures: a file of `--size-mib` into the bot's inbox (inbound) and out of the
//! agent's chat folder into the room (outbound), in a plain and in an encrypted room, each next
//! to curl moving the same bytes against the same Synapse, with the surface's RSS growth.

mod inbound;
mod outbound;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use super::curl::Curl;
use super::figures::{Room, RunFigures};
use super::machine::fill_noise;
use super::media::Media;
use super::setup::Setup;

const MIB: u64 = 1024 * 1024;

/// One run's transfers.
#[derive(Debug)]
pub struct Transfers<'a> {
    s: &'a Setup,
    curl: Curl,
    media: Media<'a>,
    size: u64,
    timeout: Duration,
    /// Source files and curl downloads: on the same disk as the workspace.
    tmp: tempfile::TempDir,
}

impl<'a> Transfers<'a> {
    /// Transfers of `size_mib` MiB through `s`'s stack.
    pub fn new(s: &'a Setup, size_mib: u64) -> Result<Self> {
        Ok(Self {
            s,
            curl: Curl::new(&s.hs.url, &s.stack.bot.token)?,
            media: Media::new(&s.hs.url, &s.user)?,
            size: size_mib * MIB,
            // Generous: a failure here means broken, never slow (1 MiB/s at least).
            timeout: super::setup::TURN + Duration::from_secs(size_mib),
            tmp: tempfile::Builder::new()
                .prefix("mxbridge-bench-files-")
                .tempdir()?,
        })
    }

    /// Inbound and outbound (those asked for), plain and encrypted; `seed` makes this run's
    /// files its own.
    pub async fn measure(&self, seed: u64, inbound: bool, outbound: bool) -> Result<RunFigures> {
        let mut out = RunFigures::new();
        let rooms = |wanted: bool| -> &[Room] {
            if wanted {
                &[Room::Plain, Room::Encrypted]
            } else {
                &[]
            }
        };
        for (i, &room) in rooms(inbound).iter().enumerate() {
            super::note(&format!("inbound {}", room.as_str()));
            out.extend(self.inbound(room, seed * 10 + i as u64).await?);
        }
        for (i, &room) in rooms(outbound).iter().enumerate() {
            super::note(&format!("outbound {}", room.as_str()));
            out.extend(self.outbound(room, seed * 10 + 5 + i as u64).await?);
        }
        Ok(out)
    }

    fn mib(&self) -> f64 {
        self.size as f64 / MIB as f64
    }

    fn room_id(&self, room: Room) -> &str {
        match room {
            Room::Plain => &self.s.plain_dm,
            Room::Encrypted => &self.s.enc_dm,
        }
    }

    /// A scratch path on the workspace's disk.
    fn scratch(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }

    /// Puts every timed transfer, the surface's and curl's alike, on the same footing: writes
    /// and deletes [`PRIME_FACTOR`] times the file's size on the workspace's disk, so the page
    /// cache the transfer (and Synapse storing or serving it) fills comes from memory just
    /// released. Memory the kernel has not used for a while can cost far more than the disk: on
    /// a virtual machine the host may have to fault it in again, and writing a GiB into such
    /// memory ran at 400 MiB/s here, into reused memory at 3 GiB/s. Without this, whichever of
    /// the two transfers came first paid for the other (measured with perf: Synapse's time went
    /// to copying into fresh page cache for one upload, not for the next).
    ///
    /// Then it writes every dirty page of the machine to the disk (`sync(2)`), so that nothing
    /// written before (the source file, Synapse's copy of the user's upload) is still being
    /// written back while the timed transfer uses the same disk: without it, the surface's
    /// download of an upload just made shared the disk with Synapse's writeback of that upload,
    /// and curl's download, minutes later, did not.
    async fn prime(&self) -> Result<()> {
        let path = self.scratch("prime.bin");
        let size = self.size * PRIME_FACTOR;
        tokio::task::spawn_blocking(move || -> Result<()> {
            let mut f = std::fs::File::create(&path)?;
            let buf = vec![0x5au8; MIB as usize];
            let mut left = size;
            while left > 0 {
                let n = left.min(MIB) as usize;
                f.write_all(&buf[..n])?;
                left -= n as u64;
            }
            drop(f);
            // Unlinked, its dirty pages are dropped without being written.
            std::fs::remove_file(&path)?;
            rustix::fs::sync();
            Ok(())
        })
        .await
        .context("prime the page cache")?
    }
}

/// How much page cache [`Transfers::prime`] releases before a transfer, in file sizes: the
/// transfer's own file, and Synapse's copy (it writes an upload once as it arrives and once
/// into its media store).
const PRIME_FACTOR: u64 = 3;

/// Writes `size` bytes of noise from `seed` to `path` (on a blocking thread).
async fn write_noise(path: &Path, size: u64, seed: u64) -> Result<()> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || -> Result<()> {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path)?);
        let mut buf = vec![0u8; MIB as usize];
        let mut left = size;
        let mut block = seed.wrapping_mul(1_000_003);
        while left > 0 {
            let n = left.min(MIB) as usize;
            block += 1;
            fill_noise(&mut buf[..n], block);
            f.write_all(&buf[..n])?;
            left -= n as u64;
        }
        f.flush()?;
        Ok(())
    })
    .await
    .context("write noise")?
}

/// The file's length, or 0 when it cannot be read.
fn len(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}
