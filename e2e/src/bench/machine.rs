//! The machine the figures were taken on: what it is (cores, memory, file system of the
//! workspace's disk) and how fast it hashes, fsyncs and writes, the yardsticks the transfer
//! hints are computed from.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};
use serde::Serialize;
use sha2::Digest;

use super::figures::{Fig, RunFigures, Sample};

const MIB: usize = 1024 * 1024;

/// What the machine is.
#[derive(Debug, Clone, Serialize)]
pub struct MachineInfo {
    /// Logical CPUs this process may use.
    pub nproc: usize,
    /// `MemTotal`, MiB.
    pub mem_total_mib: u64,
    /// The CPU's model name, if `/proc/cpuinfo` says.
    pub cpu: Option<String>,
    /// The kernel release.
    pub kernel: Option<String>,
    /// The file system of the temporary folder (where the workspace, the curl downloads and the
    /// disk figures live), e.g. `ext4` or `tmpfs`.
    pub tmp_fs: String,
    /// The temporary folder.
    pub tmp_dir: String,
}

impl MachineInfo {
    /// Reads it from `/proc` and the temporary folder.
    pub fn read() -> Self {
        let proc = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let meminfo = proc("/proc/meminfo");
        let mem_total_kib = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or(0);
        let cpu = proc("/proc/cpuinfo")
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_owned());
        let kernel =
            Some(proc("/proc/sys/kernel/osrelease").trim().to_owned()).filter(|k| !k.is_empty());
        let tmp = std::env::temp_dir();
        Self {
            nproc: std::thread::available_parallelism().map_or(1, usize::from),
            mem_total_mib: mem_total_kib / 1024,
            cpu,
            kernel,
            tmp_fs: fs_type(&tmp),
            tmp_dir: tmp.display().to_string(),
        }
    }
}

/// The name of the file system `path` is on (from its `statfs` magic number).
fn fs_type(path: &Path) -> String {
    let Ok(st) = rustix::fs::statfs(path) else {
        return "unknown".into();
    };
    #[allow(clippy::unnecessary_cast)] // the field's type differs between targets
    let magic = st.f_type as i64;
    match magic {
        0xEF53 => "ext4".into(),
        0x0102_1994 => "tmpfs".into(),
        0x5846_5342 => "xfs".into(),
        0x9123_683E => "btrfs".into(),
        0x794C_7630 => "overlayfs".into(),
        0x2FC1_2FC1 => "zfs".into(),
        0x6573_5546 => "fuse".into(),
        other => format!("0x{other:x}"),
    }
}

/// How much the machine figures measure.
#[derive(Debug, Clone, Copy)]
pub struct MachineSizes {
    /// The in-memory buffer hashed, MiB.
    pub sha_mib: usize,
    /// The file written sequentially, MiB.
    pub seq_mib: usize,
    /// How many 4 KiB write + fsync rounds.
    pub fsyncs: usize,
}

/// Measures the machine figures (on a blocking thread), in a temporary folder on the
/// workspace's disk.
pub async fn measure(sizes: MachineSizes) -> Result<RunFigures> {
    tokio::task::spawn_blocking(move || measure_blocking(sizes))
        .await
        .context("machine figures")?
}

fn measure_blocking(sizes: MachineSizes) -> Result<RunFigures> {
    let mut out = RunFigures::new();
    out.insert(Fig::Sha, Sample::alone(sha_rate(sizes.sha_mib)));
    let dir = tempfile::Builder::new()
        .prefix("mxbridge-bench-disk-")
        .tempdir()?;
    let fsyncs = fsync_rounds(dir.path(), sizes.fsyncs)?;
    out.insert(Fig::Fsync, Sample::alone(fsyncs.rate));
    out.insert(Fig::FsyncP99, Sample::new(fsyncs.p99_ms, fsyncs.p50_ms));
    let with = seq_write(&dir.path().join("with-fsync"), sizes.seq_mib, true)?;
    let without = seq_write(&dir.path().join("without-fsync"), sizes.seq_mib, false)?;
    out.insert(Fig::SeqWrite, Sample::new(with, without));
    Ok(out)
}

/// Deterministic incompressible bytes (xorshift), different for each `seed`.
pub fn fill_noise(buf: &mut [u8], seed: u64) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let bytes = x.to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
}

/// MiB/s of SHA-256 over a `mib` MiB buffer.
fn sha_rate(mib: usize) -> f64 {
    let mut buf = vec![0u8; mib * MIB];
    fill_noise(&mut buf, 1);
    let t = Instant::now();
    let digest = sha2::Sha256::digest(&buf);
    let s = t.elapsed().as_secs_f64();
    std::hint::black_box(digest);
    mib as f64 / s
}

/// What `rounds` times a 4 KiB write and an fsync of the file showed.
struct Fsyncs {
    /// Rounds per second.
    rate: f64,
    /// The fsyncs' median and 99th percentile, ms: what one store commit waits for.
    p50_ms: f64,
    p99_ms: f64,
}

fn fsync_rounds(dir: &Path, rounds: usize) -> Result<Fsyncs> {
    let mut f = std::fs::File::create(dir.join("fsync"))?;
    let mut block = [0u8; 4096];
    fill_noise(&mut block, 2);
    let mut each = Vec::with_capacity(rounds);
    let t = Instant::now();
    for _ in 0..rounds {
        f.write_all(&block)?;
        let synced = Instant::now();
        f.sync_all()?;
        each.push(synced.elapsed().as_secs_f64() * 1000.0);
    }
    let rate = rounds as f64 / t.elapsed().as_secs_f64();
    let each = super::stats::sorted(each);
    let at = |p| super::stats::percentile(&each, p).unwrap_or(0.0);
    Ok(Fsyncs {
        rate,
        p50_ms: at(0.5),
        p99_ms: at(0.99),
    })
}

/// MiB/s writing `mib` MiB to `path` in 1 MiB writes, with or without a final fsync.
fn seq_write(path: &Path, mib: usize, fsync: bool) -> Result<f64> {
    let mut buf = vec![0u8; MIB];
    fill_noise(&mut buf, 3);
    let t = Instant::now();
    let mut f = std::fs::File::create(path)?;
    for _ in 0..mib {
        f.write_all(&buf)?;
    }
    if fsync {
        f.sync_all()?;
    }
    drop(f);
    let s = t.elapsed().as_secs_f64();
    std::fs::remove_file(path)?;
    Ok(mib as f64 / s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noise_differs_by_seed_and_fills_odd_lengths() {
        let (mut a, mut b) = ([0u8; 13], [0u8; 13]);
        fill_noise(&mut a, 1);
        fill_noise(&mut b, 2);
        assert_ne!(a, b);
        assert!(a[8..].iter().any(|&x| x != 0));
        let mut c = [0u8; 13];
        fill_noise(&mut c, 1);
        assert_eq!(a, c, "deterministic");
    }

    #[test]
    fn machine_info_has_cores_and_memory() {
        let m = MachineInfo::read();
        assert!(m.nproc >= 1);
        assert!(m.mem_total_mib > 0);
        assert!(!m.tmp_fs.is_empty());
    }
}
