//! Outbound: a file in the chat's own folder, and the user says `send <path>` to the builtin
//! brain. The throughput is the surface's upload as its log times it (from taking the file up,
//! deduplication included, to the homeserver's answer), as curl times its own upload; the time
//! from the user's message to the file event the user sees is its own figure. Then the same file
//! again: what Synapse stored for the bot the second time (0 when the surface reuses the
//! upload), and how long it took. Comparator: curl uploading the same file with the bot's token.

use std::time::Instant;

use anyhow::{Context, Result, bail};

use super::{MIB, Transfers, write_noise};
use crate::bench::cpu::CpuWindow;
use crate::bench::figures::{Fig, Room, RunFigures, Sample};
use crate::bench::rss::PeakWindow;
use crate::bench::setup::POLL;

impl Transfers<'_> {
    /// One outbound transfer (and its repeat) in `room`.
    pub(super) async fn outbound(&self, room: Room, seed: u64) -> Result<RunFigures> {
        let s = self.s;
        let room_id = self.room_id(room);
        let chat = protocol::chat_dir(&protocol::ChatId::for_conversation(room_id, None));
        let name = format!("out-{}-{}.bin", room.as_str(), crate::unique(""));
        let rel = format!("{}/{name}", chat.as_str());
        let path = s.stack.workspace.join(&rel);
        std::fs::create_dir_all(path.parent().unwrap_or(&s.stack.workspace))?;
        write_noise(&path, self.size, seed).await?;

        self.prime().await?;
        let window = PeakWindow::open(s.stack.surface.pid())?;
        let log_from = s.stack.surface.log().len();
        let cpu = CpuWindow::open(s.stack.surface.pid())?;
        let first = self.send(room, &rel).await?;
        let cores = cpu.cores()?;
        let rss = window.growth_mib()?;
        let upload = crate::bench::legs::upload_secs(
            s.stack.surface.log().get(log_from..).unwrap_or_default(),
            &name,
        )
        .with_context(|| format!("the surface logged no upload time for {name}"))?;
        let before = self.media.uploaded_bytes(&s.bot).await?;
        let again = self.send(room, &rel).await?;
        let uploaded = self
            .media
            .uploaded_bytes(&s.bot)
            .await?
            .saturating_sub(before);

        self.prime().await?;
        let (curl, _) = self.curl.upload(&path).await?;
        std::fs::remove_file(&path)?;
        Ok(RunFigures::from([
            (
                Fig::Outbound(room),
                Sample::new(self.mib() / upload, self.mib() / curl.secs),
            ),
            (Fig::OutboundTotal(room), Sample::alone(first)),
            (Fig::OutboundCpu(room), cores.sample()),
            (Fig::OutboundMachine(room), cores.machine_sample()),
            (
                Fig::OutboundAgainBytes(room),
                Sample::new(uploaded as f64 / MIB as f64, self.mib()),
            ),
            (Fig::OutboundAgainTime(room), Sample::new(again, first)),
            (
                Fig::OutboundRss(room),
                Sample::new(rss, curl.peak_rss_kib as f64 / 1024.0),
            ),
        ]))
    }

    /// Says `send <rel>` in `room` and returns the seconds until the file event was seen; waits
    /// for the end of the turn (its text reply) too, so the next step starts from quiet.
    async fn send(&self, room: Room, rel: &str) -> Result<f64> {
        let s = self.s;
        let room_id = self.room_id(room);
        let text = format!("send {rel}");
        let started = Instant::now();
        let id = match room {
            Room::Plain => s.user.send_text(room_id, &text).await?,
            Room::Encrypted => s.alice.send_text(room_id, &text).await?,
        };
        let mut file_seen = None;
        loop {
            let answers: Vec<_> = s
                .alice
                .messages_from(room_id, &s.bot)
                .await?
                .into_iter()
                .filter(|m| m.answers() == Some(id.as_str()))
                .collect();
            if file_seen.is_none() && answers.iter().any(|m| m.source.is_some()) {
                file_seen = Some(started.elapsed());
            }
            let said = answers.iter().find(|m| m.source.is_none());
            match (file_seen, said) {
                (Some(t), Some(_)) => return Ok(t.as_secs_f64()),
                (None, Some(m)) if !m.body.starts_with("Sent") => {
                    bail!("the bot did not send {rel}: {}", m.body)
                }
                _ if started.elapsed() > self.timeout => {
                    bail!("no file event for {rel} after {:?}", self.timeout)
                }
                _ => tokio::time::sleep(POLL).await,
            }
        }
    }
}
