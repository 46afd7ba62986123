//! Inbound: the user sends a file; timed from the send returning (the upload is done) until the
//! complete file is in the bot's inbox. Comparator: curl downloading the same media (the
//! encrypted blob in an encrypted room) with the bot's token, without and with an fsync.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use matrix_sdk::ruma::events::room::MediaSource;
use serde_json::json;

use super::{Transfers, len, write_noise};
use crate::bench::figures::{Fig, Room, RunFigures, Sample};
use crate::bench::poll;
use crate::bench::rss::PeakWindow;
use crate::bench::setup::TURN;

const MIME: &str = "application/octet-stream";

impl Transfers<'_> {
    /// One inbound transfer in `room`.
    pub(super) async fn inbound(&self, room: Room, seed: u64) -> Result<RunFigures> {
        let s = self.s;
        let room_id = self.room_id(room);
        let name = format!("in-{}-{}.bin", room.as_str(), crate::unique(""));
        let src = self.scratch(&name);
        write_noise(&src, self.size, seed).await?;

        let window = PeakWindow::open(s.stack.surface.pid())?;
        let (id, mxc) = match room {
            Room::Plain => {
                let mxc = s.user.upload_path(&src, MIME).await?;
                let content = json!({"msgtype": "m.file", "body": name, "url": mxc,
                                     "info": {"mimetype": MIME, "size": self.size}});
                (s.user.send(room_id, content).await?, Some(mxc))
            }
            Room::Encrypted => {
                let bytes = tokio::fs::read(&src).await?;
                let id = s.alice.send_file(room_id, &name, MIME, bytes, None).await?;
                (id, None)
            }
        };
        let sent = Instant::now();
        let inbox = s
            .stack
            .workspace
            .join(protocol::room_dir(&s.user.user_id, room_id).as_str())
            .join("inbox");
        let done = wait_inbox(&inbox, &name, self.size, self.timeout).await?;
        let secs = (done - sent).as_secs_f64();
        // The agent's description ends the turn (and the surface's work for this file).
        s.wait_answer(room_id, &s.bot, &id, self.timeout, |_| true)
            .await?;
        let rss = window.growth_mib()?;
        std::fs::remove_file(&src)?;

        let mxc = match mxc {
            Some(m) => m,
            None => self.encrypted_blob(room_id, &id).await?,
        };
        let out = self.scratch(&format!("curl-{name}"));
        let plain = self.curl.download(&mxc, &out, false).await?;
        check_len(&out, self.size)?;
        std::fs::remove_file(&out)?;
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
                Fig::InboundRss(room),
                Sample::new(rss, plain.peak_rss_kib as f64 / 1024.0),
            ),
        ]))
    }

    /// The `mxc://` of the encrypted blob alice sent as event `id`.
    async fn encrypted_blob(&self, room_id: &str, id: &str) -> Result<String> {
        let s = self.s;
        poll(
            TURN,
            Duration::from_millis(50),
            "alice's own file event",
            || async {
                let mine = s.alice.messages_from(room_id, &s.user.user_id).await.ok()?;
                mine.into_iter()
                    .find(|m| m.event_id == id)
                    .and_then(|m| match m.source {
                        Some(MediaSource::Encrypted(f)) => Some(f.url.to_string()),
                        Some(MediaSource::Plain(u)) => Some(u.to_string()),
                        None => None,
                    })
            },
        )
        .await
    }
}

/// Waits until `inbox` holds the complete `name` (stored as `<time>-<unique>-<name>`, not a
/// `.partial-*` download) and returns when it was seen.
async fn wait_inbox(inbox: &Path, name: &str, size: u64, timeout: Duration) -> Result<Instant> {
    let suffix = format!("-{name}");
    poll(
        timeout,
        Duration::from_millis(2),
        &format!("{name} in the inbox"),
        || async {
            let entries = std::fs::read_dir(inbox).ok()?;
            entries
                .flatten()
                .any(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    !n.starts_with('.') && n.ends_with(&suffix) && len(&e.path()) == size
                })
                .then(Instant::now)
        },
    )
    .await
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
