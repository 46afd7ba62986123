//! CPU time of the surface, of Synapse and of the whole machine over one transfer, as cores kept
//! busy: next to the machine's core count it tells whether the processor, shared by both and by
//! the kernel (which writes the file out to the disk in its own threads), set the pace. And how
//! often Synapse's threads were preempted (involuntary context switches): a GIL-bound process
//! whose thread is taken off the processor while it holds the lock stops as a whole.

use std::time::Instant;

use anyhow::{Context, Result};

/// `/proc/<pid>/stat` counts in clock ticks of `USER_HZ`, which Linux fixes at 100 for
/// userspace on every architecture it runs the benchmark on.
const TICKS_PER_S: f64 = 100.0;

/// A window over the CPU time of the surface and (when known) Synapse.
#[derive(Debug, Clone, Copy)]
pub struct CpuWindow {
    surface: u32,
    synapse: Option<u32>,
    start: (f64, Option<f64>),
    /// Synapse's involuntary context switches at the start, all its threads added.
    preempted: Option<u64>,
    /// The machine's busy CPU seconds at the start, all cores added.
    machine: Option<f64>,
    at: Instant,
}

/// Cores kept busy in a window: CPU seconds over wall seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cores {
    /// The surface.
    pub surface: f64,
    /// Synapse, when its pid is known.
    pub synapse: Option<f64>,
    /// The whole machine (every process and the kernel), when `/proc/stat` can be read.
    pub machine: Option<f64>,
    /// Times per second Synapse's threads were preempted, when its pid is known.
    pub synapse_preempted: Option<f64>,
}

impl CpuWindow {
    /// Starts counting for the surface `pid` and the Synapse of `E2E_SYNAPSE_DIR`.
    pub fn open(surface: Option<u32>) -> Result<Self> {
        let surface = surface.context("the surface is not running")?;
        let synapse = synapse_pid();
        Ok(Self {
            surface,
            synapse,
            start: (
                cpu_secs(surface).context("read the surface's CPU time")?,
                synapse.and_then(cpu_secs),
            ),
            preempted: synapse.and_then(preemptions),
            machine: machine_busy_secs(),
            at: Instant::now(),
        })
    }

    /// Cores kept busy since [`CpuWindow::open`].
    pub fn cores(&self) -> Result<Cores> {
        let wall = self.at.elapsed().as_secs_f64().max(1e-9);
        let surface = cpu_secs(self.surface).context("read the surface's CPU time")?;
        let synapse = match (self.synapse.and_then(cpu_secs), self.start.1) {
            (Some(now), Some(then)) => Some((now - then) / wall),
            _ => None,
        };
        let machine = match (machine_busy_secs(), self.machine) {
            (Some(now), Some(then)) => Some((now - then) / wall),
            _ => None,
        };
        let synapse_preempted = match (self.synapse.and_then(preemptions), self.preempted) {
            (Some(now), Some(then)) => Some(now.saturating_sub(then) as f64 / wall),
            _ => None,
        };
        Ok(Cores {
            surface: (surface - self.start.0) / wall,
            synapse,
            machine,
            synapse_preempted,
        })
    }
}

impl Cores {
    /// As a figure: the surface next to Synapse.
    pub fn sample(self) -> super::figures::Sample {
        super::figures::Sample {
            this: Some(self.surface),
            other: self.synapse,
        }
    }

    /// As a figure: the whole machine next to its core count.
    pub fn machine_sample(self) -> super::figures::Sample {
        super::figures::Sample {
            this: self.machine,
            other: std::thread::available_parallelism()
                .ok()
                .map(|n| n.get() as f64),
        }
    }
}

/// Synapse's pid, from the pid file `scripts/synapse.sh` configures in `E2E_SYNAPSE_DIR`.
fn synapse_pid() -> Option<u32> {
    let dir = std::env::var_os("E2E_SYNAPSE_DIR")?;
    let text = std::fs::read_to_string(std::path::Path::new(&dir).join("homeserver.pid")).ok()?;
    text.trim().parse().ok()
}

/// User plus system CPU seconds of `pid` (all its threads).
fn cpu_secs(pid: u32) -> Option<f64> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Involuntary context switches of all of `pid`'s threads.
fn preemptions(pid: u32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0;
    for task in tasks.flatten() {
        // A thread that ended meanwhile counts no more.
        if let Ok(status) = std::fs::read_to_string(task.path().join("status")) {
            total += parse_preemptions(&status).unwrap_or(0);
        }
    }
    Some(total)
}

/// `nonvoluntary_ctxt_switches` of a `/proc/<pid>/task/<tid>/status`.
fn parse_preemptions(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("nonvoluntary_ctxt_switches:"))?
        .trim()
        .parse()
        .ok()
}

/// Busy CPU seconds of the whole machine since boot, all cores added.
fn machine_busy_secs() -> Option<f64> {
    parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// The busy time of `/proc/stat`'s first line (`cpu  user nice system idle iowait irq softirq
/// steal …`, all cores added): everything but `idle` and `iowait`, in seconds. `guest` time is
/// already inside `user`, so the fields after `steal` are left out.
fn parse_proc_stat(stat: &str) -> Option<f64> {
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .take(8)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    let [user, nice, system, _idle, _iowait, irq, softirq, steal] = ticks[..] else {
        return None;
    };
    Some((user + nice + system + irq + softirq + steal) as f64 / TICKS_PER_S)
}

/// `utime + stime` of a `/proc/<pid>/stat` line, in seconds. The command name (field 2) may
/// hold spaces and parentheses, so fields are counted from its last `)`.
fn parse_stat(stat: &str) -> Option<f64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11); // field 3 (state) is index 0
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / TICKS_PER_S)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preemptions_are_read_from_a_threads_status() {
        let status =
            "Name:\tpython\nvoluntary_ctxt_switches:\t120\nnonvoluntary_ctxt_switches:\t37\n";
        assert_eq!(parse_preemptions(status), Some(37));
        assert_eq!(parse_preemptions("Name:\tpython\n"), None);
        assert!(preemptions(std::process::id()).is_some());
    }

    #[test]
    fn stat_lines_are_read_after_the_command_name() {
        let line = "4242 (python3 -m (syn)) S 1 4242 4242 0 -1 4194560 9 0 0 0 250 50 0 0 20 0 3 0";
        assert_eq!(parse_stat(line), Some(3.0));
        assert_eq!(parse_stat("4242 (x) S 1"), None);
        assert_eq!(parse_stat("no parenthesis"), None);
    }

    #[test]
    fn the_machines_busy_time_leaves_idle_and_iowait_out() {
        let stat = "cpu  100 20 30 5000 400 5 6 7 50 0\ncpu0 50 10 15 2500 200 2 3 3 25 0\n";
        // user + nice + system + irq + softirq + steal, in ticks of 1/100 s.
        assert_eq!(parse_proc_stat(stat), Some(1.68));
        assert_eq!(parse_proc_stat("cpu  1 2 3\n"), None);
        assert_eq!(parse_proc_stat("intr 1 2 3 4 5 6 7 8\n"), None);
        assert!(machine_busy_secs().is_some_and(|s| s > 0.0));
    }

    #[test]
    fn this_process_burning_cpu_is_counted() {
        let me = std::process::id();
        let w = CpuWindow {
            surface: me,
            synapse: None,
            start: (cpu_secs(me).unwrap(), None),
            preempted: None,
            machine: machine_busy_secs(),
            at: Instant::now(),
        };
        let until = Instant::now() + std::time::Duration::from_millis(300);
        let mut x = 0u64;
        while Instant::now() < until {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let c = w.cores().unwrap();
        assert!(c.surface > 0.3, "{c:?}");
        assert_eq!(c.synapse, None);
        assert_eq!(c.synapse_preempted, None);
        assert!(c.machine.is_some_and(|m| m >= 0.8 * c.surface), "{c:?}");
    }
}
