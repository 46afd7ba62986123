//! A CPU limit for one process, as a container or a Kubernetes pod gets one: a cgroup of its own
//! with a CFS quota (a share of one core). It lets a 2-core machine show how agents scale when
//! each is bound by its own CPU, which three unlimited agents sharing two cores cannot show.
//! cgroup v2 (`cpu.max`) and v1 (`cpu/…/cpu.cfs_quota_us`); `None` where neither can be
//! written (not root, a read-only `/sys/fs/cgroup`), and the caller says so.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The CFS period: short, so a limited process runs often in short slices rather than once in
/// a long one (latency stays even).
const PERIOD_US: u64 = 10_000;

/// A cgroup holding one process under a CPU quota; removed when dropped (once the process is
/// gone: drop it after the process).
#[derive(Debug)]
pub struct CpuQuota {
    dir: PathBuf,
}

/// The cgroup hierarchy that can hold a CPU limit, and how the limit is written there.
enum Hierarchy {
    V2(PathBuf),
    V1(PathBuf),
}

fn hierarchy() -> Option<Hierarchy> {
    let root = Path::new("/sys/fs/cgroup");
    let controllers = std::fs::read_to_string(root.join("cgroup.controllers")).ok();
    if controllers.is_some_and(|c| c.split_whitespace().any(|c| c == "cpu")) {
        return Some(Hierarchy::V2(root.to_owned()));
    }
    let v1 = root.join("cpu");
    v1.join("cpu.cfs_quota_us")
        .exists()
        .then_some(Hierarchy::V1(v1))
}

impl CpuQuota {
    /// Puts process `pid` under `cores` of CPU (e.g. 0.25: a quarter of one core).
    pub fn apply(pid: u32, cores: f64, tag: &str) -> Option<Self> {
        let quota = ((cores * PERIOD_US as f64) as u64).max(1_000);
        let name = format!("mxbridge-bench-{}-{tag}", std::process::id());
        let (dir, files) = match hierarchy()? {
            Hierarchy::V2(root) => {
                // The parent must hand the cpu controller down (the root does once enabled).
                let _ = std::fs::write(root.join("cgroup.subtree_control"), "+cpu");
                let dir = root.join(name);
                let files = vec![("cpu.max", format!("{quota} {PERIOD_US}"))];
                (dir, files)
            }
            Hierarchy::V1(root) => {
                let dir = root.join(name);
                let files = vec![
                    ("cpu.cfs_period_us", PERIOD_US.to_string()),
                    ("cpu.cfs_quota_us", quota.to_string()),
                ];
                (dir, files)
            }
        };
        std::fs::create_dir(&dir).ok()?;
        let limit = Self { dir };
        for (file, value) in files {
            std::fs::write(limit.dir.join(file), value).ok()?;
        }
        // The whole process, with the threads it has and those it starts later.
        std::fs::write(limit.dir.join("cgroup.procs"), pid.to_string()).ok()?;
        Some(limit)
    }
}

impl Drop for CpuQuota {
    fn drop(&mut self) {
        // A cgroup is removed once empty: the process may still be exiting.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
