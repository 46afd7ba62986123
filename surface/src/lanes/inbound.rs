//! What a lane does with an incoming message before it becomes (part of) a turn: parse it,
//! stream its file into the inbox (telling the room when that fails), and pair a file-only
//! message with the caption some clients send right after it.

use std::collections::BTreeMap;
use std::time::Duration;

use matrix_sdk::ruma::OwnedEventId;
use matrix_sdk::ruma::events::room::MediaSource;
use matrix_sdk::ruma::events::room::message::MessageType;
use protocol::{AttachmentInfo, WorkspacePath};
use tracing::{error, info, warn};

use super::Lane;
use crate::filename::pick_name;
use crate::journal::{NewEvent, Stored};
use crate::media::{self, DownloadRequest, MediaFields};
use crate::purpose::Purpose;
use crate::render::{self, ReplyTarget};
use crate::send::{self, Outgoing, PostError};

/// A text sent by the same user within this time after a file-only message is its caption.
const CAPTION_WINDOW: Duration = Duration::from_secs(10);
/// How long after a file-only message we give its caption to arrive.
const CAPTION_SETTLE: Duration = Duration::from_secs(2);

/// The text, files and file facts of a message, after downloading.
#[derive(Debug, Default)]
pub(super) struct Prepared {
    pub text: String,
    pub attachments: Vec<WorkspacePath>,
    pub info: BTreeMap<WorkspacePath, AttachmentInfo>,
    /// Part of the message could not be forwarded (a file that did not download, a journal row
    /// this build cannot read); the room was told.
    pub failed: bool,
}

impl Prepared {
    /// Whether a caption may still arrive as a text of its own (some clients send it as a
    /// second event): only for a message of files and no text, and never for a voice message,
    /// which clients record without a caption (waiting for one would hold every voice turn
    /// back by [`CAPTION_SETTLE`]).
    pub(super) fn may_get_caption(&self) -> bool {
        self.text.trim().is_empty()
            && !self.attachments.is_empty()
            && !self.info.values().any(|i| i.voice)
    }
}

impl Lane {
    /// A text message the same sender sent right after a file-only message: its caption, sent
    /// as a second event by some clients. Returns its event id and text.
    pub(super) async fn caption_for(
        &self,
        file_ev: &NewEvent,
        ord: i64,
    ) -> Option<(OwnedEventId, String)> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or_default();
        let ready_at = file_ev
            .origin_ts
            .saturating_add(CAPTION_SETTLE.as_millis() as u64);
        if now < ready_at {
            let wait = Duration::from_millis(ready_at - now).min(CAPTION_SETTLE);
            tokio::time::sleep(wait).await;
        }
        let next = self
            .ctx
            .journal
            .next_pending_after(&self.chat.chat_id, ord)
            .ok()??;
        let window = CAPTION_WINDOW.as_millis() as u64;
        if next.event.sender != file_ev.sender
            || next.event.origin_ts > file_ev.origin_ts.saturating_add(window)
        {
            return None;
        }
        match next.event.content? {
            Stored::Message(MessageType::Text(t)) if !t.body.trim().is_empty() => {
                Some((next.event.event_id, t.body))
            }
            _ => None,
        }
    }

    /// The text and files of a journaled message, its file downloaded. Download failures
    /// and rows that cannot be read are told to the room and logged; the message's other
    /// content still goes on.
    pub(super) async fn prepare(&self, ev: &NewEvent) -> Prepared {
        let msgtype = match &ev.content {
            Some(Stored::Message(m)) => m,
            Some(said @ (Stored::Edited { .. } | Stored::Removed { .. })) => {
                return Prepared {
                    text: said.as_words().unwrap_or_default(),
                    ..Prepared::default()
                };
            }
            other => {
                self.unreadable(ev, other.as_ref()).await;
                return Prepared {
                    failed: true,
                    ..Prepared::default()
                };
            }
        };
        let Some(file) = MediaFields::of(msgtype) else {
            let body = match msgtype {
                MessageType::Emote(e) => format!("* {}", e.body),
                other => other.body().to_owned(),
            };
            return Prepared {
                text: body,
                ..Prepared::default()
            };
        };
        let (name, caption) = pick_name(file.filename.as_deref(), &file.body);
        let mut prepared = Prepared {
            text: caption.unwrap_or_default(),
            ..Prepared::default()
        };
        // The sender's own account of play length and voice (MSC3245) travels with the file.
        let duration_ms = file.look.duration.map(|d| d.as_millis() as u64);
        let voice = file.look.voice.is_some();
        match self
            .download(ev, file.source, name, file.size, file.mimetype)
            .await
        {
            Ok(mut d) => {
                d.info.duration_ms = duration_ms;
                d.info.voice = voice;
                prepared.attachments.push(d.path.clone());
                prepared.info.insert(d.path, d.info);
            }
            Err(()) => prepared.failed = true,
        }
        prepared
    }

    async fn download(
        &self,
        ev: &NewEvent,
        source: MediaSource,
        name: String,
        declared_size: Option<u64>,
        declared_mime: Option<String>,
    ) -> Result<media::Downloaded, ()> {
        let req = DownloadRequest {
            event_id: ev.event_id.clone(),
            room_id: ev.room_id.clone(),
            sender: ev.sender.clone(),
            sent_at: std::time::UNIX_EPOCH + std::time::Duration::from_millis(ev.origin_ts),
            source,
            declared_size,
            declared_mime,
            name,
        };
        let ctx = &self.ctx;
        match media::download_to_inbox(&ctx.client, &ctx.workspace, &req, ctx.config.max_file_size)
            .await
        {
            Ok(d) => {
                info!(path = %d.path, size = d.info.size, mime = %d.info.mime, "file saved to inbox");
                Ok(d)
            }
            Err(e) => {
                crate::metrics::media_failure("in");
                warn!(
                    event_id = %ev.event_id,
                    room_id = %ev.room_id,
                    file = %e.name,
                    reason = %e.failure,
                    "download failed"
                );
                self.tell(ev, &e.user_message(), Purpose::DownloadFailed)
                    .await;
                Err(())
            }
        }
    }

    /// A journal row the lane cannot forward: what a newer build stored, or what does not
    /// decode. Logged with its ids, and the sender is asked to send it again.
    async fn unreadable(&self, ev: &NewEvent, stored: Option<&Stored>) {
        let (kind, why) = match stored {
            Some(Stored::Unknown { kind, why }) => (kind.as_str(), why.as_str()),
            Some(other) => (other.kind(), "not a message a lane forwards"),
            None => ("none", "no content was kept"),
        };
        error!(
            event_id = %ev.event_id,
            room_id = %ev.room_id,
            chat_id = ?ev.chat_id,
            kind,
            why,
            "journal row cannot be forwarded to the agent"
        );
        let text = "⚠️ I could not read this message back from my journal (it may have been \
                    stored by another version of me), so my agent did not get it. Please send \
                    it again.";
        self.tell(ev, text, Purpose::UnreadableRow).await;
    }

    /// Tells the room about a problem with message `ev`, under it.
    async fn tell(&self, ev: &NewEvent, text: &str, purpose: Purpose) {
        let target = ReplyTarget {
            event_id: ev.event_id.clone(),
            thread_root: ev.thread_root.clone(),
        };
        let ctx = &self.ctx;
        let txn = render::notice_txn_id(ev.event_id.as_str(), purpose);
        let out = Outgoing {
            txn: &txn,
            thread_root: Some(target.root()),
            about: Some(&target.event_id),
            purpose,
        };
        match send::post(ctx, &self.room, target.notice(text), out).await {
            Ok(_) => {}
            Err(PostError::Refused(r)) => {
                send::report_refusal(ctx, &self.room, out, Some(&target), &r).await;
            }
            Err(pe) => warn!(error = %pe, %purpose, "could not tell the room"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_file_only_message_that_is_not_a_voice_message_waits_for_a_caption() {
        let path = WorkspacePath::new("surfaces/matrix/u/r/inbox/a.ogg").unwrap();
        let prepared = |text: &str, voice: Option<bool>| Prepared {
            text: text.into(),
            attachments: voice.map(|_| path.clone()).into_iter().collect(),
            info: voice
                .map(|voice| {
                    let info = AttachmentInfo {
                        name: "a.ogg".into(),
                        mime: "audio/ogg".into(),
                        size: 1,
                        duration_ms: Some(1000),
                        voice,
                        inode: None,
                    };
                    (path.clone(), info)
                })
                .into_iter()
                .collect(),
            failed: false,
        };
        let cases = [
            ("", Some(false), true),
            ("", Some(true), false),
            ("listen", Some(false), false),
            ("", None, false),
        ];
        for (text, voice, want) in cases {
            assert_eq!(
                prepared(text, voice).may_get_caption(),
                want,
                "{text:?} {voice:?}"
            );
        }
    }
}
