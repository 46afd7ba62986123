//! The surface's peak memory during one transfer: its `VmHWM` after, minus where the peak
//! stood before. Linux lets the peak be reset (`clear_refs` 5) so each transfer starts from the
//! current RSS; where it cannot be reset, the growth is that of the all-time peak.

use anyhow::{Context, Result};

/// A window over one process's peak RSS.
#[derive(Debug, Clone, Copy)]
pub struct PeakWindow {
    pid: u32,
    start_kib: u64,
}

fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

impl PeakWindow {
    /// Resets the peak of `pid` if the kernel lets us, and remembers where it stands.
    pub fn open(pid: Option<u32>) -> Result<Self> {
        let pid = pid.context("the surface is not running")?;
        if std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_err() {
            super::note("cannot reset the surface's peak RSS: growth is of its all-time peak");
        }
        let start_kib = status_kib(pid, "VmHWM:").context("read the surface's VmHWM")?;
        Ok(Self { pid, start_kib })
    }

    /// How far the peak rose since [`PeakWindow::open`], MiB.
    pub fn growth_mib(&self) -> Result<f64> {
        let now = status_kib(self.pid, "VmHWM:").context("read the surface's VmHWM")?;
        Ok(now.saturating_sub(self.start_kib) as f64 / 1024.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_over_this_process_sees_an_allocation() {
        if std::fs::write("/proc/self/clear_refs", "5").is_err() {
            return; // no peak reset here: the window would see the old peak
        }
        let w = PeakWindow::open(Some(std::process::id())).unwrap();
        let big = vec![1u8; 64 << 20];
        std::hint::black_box(&big);
        let growth = w.growth_mib().unwrap();
        assert!(growth >= 32.0, "grew {growth} MiB");
    }
}
