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

    /// Inbound and outbound, plain and encrypted; `seed` makes this run's files its own.
    pub async fn measure(&self, seed: u64) -> Result<RunFigures> {
        let mut out = RunFigures::new();
        for (i, room) in [Room::Plain, Room::Encrypted].into_iter().enumerate() {
            super::note(&format!("inbound {}", room.as_str()));
            out.extend(self.inbound(room, seed * 10 + i as u64).await?);
        }
        for (i, room) in [Room::Plain, Room::Encrypted].into_iter().enumerate() {
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
}

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
