//! Inbound: the user sends a file. The throughput is timed from the surface starting its download
//! (its `.partial-*` file appears in the inbox) until the complete file is there, as curl's
//! download is timed from its start to its end; how long the surface took to start (the event's
//! way to the bot through `/sync`, its journal, the lane) is its own figure, next to the echo
//! bot's reply. Both instants come from inotify (creations and renames only), so nothing polls
//! or wakes while the bytes move.
//! Comparator: curl downloading the same media (the encrypted blob in an encrypted room) with the
//! bot's token, without and with an fsync, and to `/dev/null`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use matrix_sdk::ruma::events::room::EncryptedFile;
use serde_json::json;

use super::{Transfers, len, write_noise};
use crate::bench::cpu::CpuWindow;
use crate::bench::figures::{Fig, Room, RunFigures, Sample};
use crate::bench::rss::PeakWindow;

const MIME: &str = "application/octet-stream";

/// The user's upload, made before the timed part.
enum Upload {
    Plain(String),
    Encrypted(EncryptedFile),
}

impl Upload {
    /// Where the homeserver serves it.
    fn mxc(&self) -> &str {
        match self {
            Self::Plain(mxc) => mxc,
            Self::Encrypted(file) => file.url.as_str(),
        }
    }
}

impl Transfers<'_> {
    /// One inbound transfer in `room`.
    pub(super) async fn inbound(&self, room: Room, seed: u64) -> Result<RunFigures> {
        let s = self.s;
        let room_id = self.room_id(room);
        let name = format!("in-{}-{}.bin", room.as_str(), crate::unique(""));
        let src = self.scratch(&name);
        write_noise(&src, self.size, seed).await?;

        let inbox = s
            .stack
            .workspace
            .join(protocol::room_dir(&s.user.user_id, room_id).as_str())
            .join("inbox");
        // The upload is the user's part: done before the clocks, the page cache priming and the
        // disk's flush start, so the surface's download starts as curl's does.
        let upload = match room {
            Room::Plain => Upload::Plain(s.user.upload_path(&src, MIME).await?),
            Room::Encrypted => {
                let bytes = tokio::fs::read(&src).await?;
                Upload::Encrypted(s.alice.upload_encrypted(&bytes).await?)
            }
        };
        // The surface's download used to be the first of a fresh upload, curl's the second and
        // third: one untimed download first puts them on the same footing (whatever a first
        // serving costs Synapse, nobody's figure pays it).
        let warm = self.scratch(&format!("warm-{name}"));
        self.curl.download(upload.mxc(), &warm, false).await?;
        std::fs::remove_file(&warm)?;
        self.prime().await?;
        let mut watch = InboxWatch::start(&inbox)?;
        let window = PeakWindow::open(s.stack.surface.pid())?;
        let cpu = CpuWindow::open(s.stack.surface.pid())?;
        let (id, mxc) = match upload {
            Upload::Plain(mxc) => {
                let content = json!({"msgtype": "m.file", "body": name, "url": mxc,
                                     "info": {"mimetype": MIME, "size": self.size}});
                (s.user.send(room_id, content).await?, mxc)
            }
            Upload::Encrypted(file) => {
                let mxc = file.url.to_string();
                let id = s
                    .alice
                    .send_encrypted_file(room_id, &name, MIME, self.size, file)
                    .await?;
                (id, mxc)
            }
        };
        let sent = Instant::now();
        let (started, done) = watch.wait(&name, self.size, self.timeout).await?;
        let cores = cpu.cores()?;
        let secs = (done - started).as_secs_f64();
        let notice_ms = started.saturating_duration_since(sent).as_secs_f64() * 1000.0;
        // The agent's description ends the turn (and the surface's work for this file).
        s.wait_answer(room_id, &s.bot, &id, self.timeout, |_| true)
            .await?;
        let rss = window.growth_mib()?;
        std::fs::remove_file(&src)?;

        let out = self.scratch(&format!("curl-{name}"));
        self.prime().await?;
        let curl_cpu = CpuWindow::open(s.stack.surface.pid())?;
        let plain = self.curl.download(&mxc, &out, false).await?;
        let curl_cores = curl_cpu.cores()?;
        check_len(&out, self.size)?;
        std::fs::remove_file(&out)?;
        // The reader that keeps nothing: whether Synapse serves a reader that does less than
        // curl writing a file any faster (it does not: its cost per byte rises the faster its
        // reader drains the socket).
        self.prime().await?;
        let null_cpu = CpuWindow::open(s.stack.surface.pid())?;
        let null = self
            .curl
            .download(&mxc, Path::new("/dev/null"), false)
            .await?;
        let null_cores = null_cpu.cores()?;
        self.prime().await?;
        let fsynced = self.curl.download(&mxc, &out, true).await?;
        check_len(&out, self.size)?;
        std::fs::remove_file(&out)?;

        let rate = self.mib() / secs;
        Ok(RunFigures::from([
            (
                Fig::Inbound(room),
                Sample::new(rate, self.mib() / plain.secs),
            ),
            (
                Fig::InboundFsync(room),
                Sample::new(rate, self.mib() / fsynced.secs),
            ),
            (
                Fig::InboundNull(room),
                Sample::new(rate, self.mib() / null.secs),
            ),
            (Fig::InboundNotice(room), Sample::alone(notice_ms)),
            (Fig::InboundCpu(room), cores.sample()),
            (Fig::InboundMachine(room), cores.machine_sample()),
            (
                Fig::InboundSynapseCurl(room),
                Sample {
                    this: curl_cores.synapse,
                    other: null_cores.synapse,
                },
            ),
            (
                Fig::InboundSynapsePreempted(room),
                Sample {
                    this: cores.synapse_preempted,
                    other: curl_cores.synapse_preempted,
                },
            ),
            (
                Fig::InboundRss(room),
                Sample::new(rss, plain.peak_rss_kib as f64 / 1024.0),
            ),
        ]))
    }
}

/// A room's inbox under inotify: when the surface's download began and when the file landed.
/// Only creations and renames into the folder are asked for, not every write: the measuring
/// process must not wake for each of the surface's writes (curl writes to a folder nobody
/// watches), nor the watch cost the surface the processor it shares.
struct InboxWatch {
    /// (when read, created (not moved in), name) of each entry that appeared.
    names: tokio::sync::mpsc::UnboundedReceiver<(Instant, bool, String)>,
    /// Tells the reading thread to stop.
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    dir: PathBuf,
}

impl Drop for InboxWatch {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl InboxWatch {
    /// Watches `dir` (created if missing, as the surface would) from now on.
    fn start(dir: &Path) -> Result<Self> {
        use rustix::fs::inotify::{self, CreateFlags, WatchFlags};
        std::fs::create_dir_all(dir)?;
        let fd = inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC).context("inotify")?;
        inotify::add_watch(&fd, dir, WatchFlags::CREATE | WatchFlags::MOVED_TO)
            .with_context(|| format!("watch {}", dir.display()))?;
        let (tx, names) = tokio::sync::mpsc::unbounded_channel();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = std::sync::Arc::clone(&stop);
        std::thread::Builder::new()
            .name("inbox-watch".into())
            .spawn(move || read_names(&fd, &tx, &stopped))?;
        Ok(Self {
            names,
            stop,
            dir: dir.to_owned(),
        })
    }

    /// When the first temporary download file (`.partial-*`) was created, and when the complete
    /// `name` (stored as `<time>-<unique>-<name>`) appeared with all `size` bytes.
    async fn wait(
        &mut self,
        name: &str,
        size: u64,
        timeout: Duration,
    ) -> Result<(Instant, Instant)> {
        let suffix = format!("-{name}");
        let deadline = tokio::time::Instant::now() + timeout;
        let mut started = None;
        loop {
            let Ok(next) = tokio::time::timeout_at(deadline, self.names.recv()).await else {
                bail!("{name} not in {} after {timeout:?}", self.dir.display());
            };
            let Some((at, created, file)) = next else {
                bail!("the watch of {} stopped", self.dir.display());
            };
            if file.starts_with(".partial-") && created {
                started.get_or_insert(at);
            } else if !file.starts_with('.')
                && file.ends_with(&suffix)
                && len(&self.dir.join(&file)) == size
            {
                let Some(started) = started else {
                    bail!("{name} landed in the inbox without a download being seen");
                };
                return Ok((started, at));
            }
        }
    }
}

/// Sends the names of the entries created in or moved into the watched folder, each with the
/// instant it was read, until `stop` is set (looked at twice a second) or the receiver is gone.
fn read_names(
    fd: &std::os::fd::OwnedFd,
    tx: &tokio::sync::mpsc::UnboundedSender<(Instant, bool, String)>,
    stop: &std::sync::atomic::AtomicBool,
) {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    use rustix::fs::inotify::{ReadFlags, Reader};
    let half_a_second = Timespec {
        tv_sec: 0,
        tv_nsec: 500_000_000,
    };
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let mut fds = [PollFd::new(fd, PollFlags::IN)];
        if poll(&mut fds, Some(&half_a_second)).is_err() {
            continue;
        }
        let at = Instant::now();
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
        let mut reader = Reader::new(fd, &mut buf);
        while let Ok(event) = reader.next() {
            let created = event.events().contains(ReadFlags::CREATE);
            if let Some(name) = event.file_name()
                && tx
                    .send((at, created, name.to_string_lossy().into_owned()))
                    .is_err()
            {
                return;
            }
        }
    }
}

fn check_len(path: &Path, size: u64) -> Result<()> {
    let got = len(path);
    if got < size {
        bail!(
            "curl downloaded {got} of {size} bytes to {}",
            path.display()
        );
    }
    Ok(())
}
