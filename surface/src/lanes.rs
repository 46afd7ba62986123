//! One lane per chat: a task that takes the chat's journaled events in order, downloads their
//! files, stores turns, and renders what the agent answers. Chats run concurrently; within a
//! chat one turn runs at a time. The queue is the journal itself, so nothing is ever dropped.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use matrix_sdk::Room;
use matrix_sdk::ruma::events::room::MediaSource;
use matrix_sdk::ruma::events::room::message::{MessageType, RoomMessageEventContent};
use matrix_sdk::ruma::{EventId, OwnedEventId, OwnedRoomId, OwnedUserId, RoomId};
use protocol::{
    Answer, ApprovalDecision, ApprovalRequest, AskUser, AttachmentInfo, ChatId, ContextMessage,
    Decision as ApprovalChoice, DeliveryResult, EndStatus, SendFile, Sender, ToAgent, ToSurface,
    UserMessage, WorkspacePath,
};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, error, info, info_span, instrument, warn};

use crate::agent_link::{self, LinkEvent, LinkHandle};
use crate::context::Ctx;
use crate::decide::Waiting;
use crate::filename::pick_name;
use crate::journal::{ChatRef, Disposition, JournaledEvent, NewEvent};
use crate::media::{self, DownloadRequest};
use crate::render::{self, ReplyTarget};
use crate::send::{self, Outgoing, PostError};
use crate::workspace::{ChatScope, Workspace};

/// Pending events of a chat beyond which the room is told that messages are queued.
pub const LANE_BACKLOG_NOTICE: u64 = 5;
/// A turn with no news from the agent for this long is given up (and reported).
const TURN_IDLE_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// When the agent already had the turn (a duplicate ack, or a reconnect whose `last_seq`
/// covers it), it may have finished it while we were not listening: wait this long for news.
const RECOVERY_IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long an approval prompt waits for an answer before it counts as a denial.
pub const APPROVAL_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// How long an `ask_user` question waits before it is answered "no reply".
pub const QUESTION_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// A text sent by the same user within this time after a file-only message is its caption.
const CAPTION_WINDOW: Duration = Duration::from_secs(10);
/// How long after a file-only message we give its caption to arrive.
const CAPTION_SETTLE: Duration = Duration::from_secs(2);
/// Synthetic text of a turn that only carries files.
pub const ATTACHMENTS_ONLY_TEXT: &str = "User sent one or more attachments.";

// ---------------------------------------------------------------------------------------------
// Waiting questions and approvals

/// A question or approval prompt waiting for one user's next message in one room.
#[derive(Debug, Clone)]
pub struct Wait {
    /// The room.
    pub room_id: String,
    /// The user whose answer counts.
    pub user_id: String,
    /// The turn that asked.
    pub turn: String,
    /// Question id, or the first approval request id.
    pub id: String,
    /// Coalesced approval requests for the same (tool, resource) in the same turn.
    pub extra_request_ids: Vec<String>,
    /// Tool and resource, for approvals.
    pub approval: Option<(String, String)>,
    /// Where the answer goes.
    pub link: LinkHandle,
}

/// The registry of [`Wait`]s, consulted by the sync ingest before a message reaches a lane
/// (the lane is busy with the very turn that waits).
#[derive(Debug, Default)]
pub struct Waits {
    inner: Mutex<WaitsInner>,
}

#[derive(Debug, Default)]
struct WaitsInner {
    waits: Vec<Wait>,
    /// Approval decisions per (turn, tool, resource), to coalesce repeated requests.
    decided: HashMap<(String, String, String), ApprovalChoice>,
}

impl Waits {
    fn lock(&self) -> std::sync::MutexGuard<'_, WaitsInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// What the bot waits for from `user_id` in `room_id` (the oldest wait).
    pub fn lookup(&self, room_id: &str, user_id: &str) -> Option<Waiting> {
        self.lock()
            .waits
            .iter()
            .find(|w| w.room_id == room_id && w.user_id == user_id)
            .map(|w| match w.approval {
                Some(_) => Waiting::Approval {
                    request_id: w.id.clone(),
                },
                None => Waiting::Question {
                    question_id: w.id.clone(),
                },
            })
    }

    fn add(&self, w: Wait) {
        self.lock().waits.push(w);
    }

    /// Adds `request_id` to a pending prompt for the same (turn, tool, resource), if any.
    fn coalesce(&self, turn: &str, tool: &str, resource: &str, request_id: &str) -> bool {
        let mut inner = self.lock();
        let key = (tool.to_owned(), resource.to_owned());
        match inner
            .waits
            .iter_mut()
            .find(|w| w.turn == turn && w.approval.as_ref() == Some(&key))
        {
            Some(w) => {
                w.extra_request_ids.push(request_id.to_owned());
                true
            }
            None => false,
        }
    }

    fn decided(&self, turn: &str, tool: &str, resource: &str) -> Option<ApprovalChoice> {
        self.lock()
            .decided
            .get(&(turn.to_owned(), tool.to_owned(), resource.to_owned()))
            .copied()
    }

    /// Removes and returns the wait with id `id`.
    pub fn take(&self, id: &str) -> Option<Wait> {
        let mut inner = self.lock();
        let pos = inner.waits.iter().position(|w| w.id == id)?;
        let w = inner.waits.remove(pos);
        Some(w)
    }

    /// Forgets everything about a finished turn.
    fn turn_over(&self, turn: &str) {
        let mut inner = self.lock();
        inner.waits.retain(|w| w.turn != turn);
        inner.decided.retain(|k, _| k.0 != turn);
    }

    /// Delivers the answer to question `question_id`. Returns false if nobody waits any more.
    pub fn answer(&self, question_id: &str, text: &str, by: &str) -> bool {
        let Some(w) = self.take(question_id) else {
            return false;
        };
        w.link.send(ToAgent::Answer(Answer {
            question_id: question_id.to_owned(),
            text: text.to_owned(),
            by: by.to_owned(),
        }));
        true
    }

    /// Delivers an approval decision (to every coalesced request). Returns false if nobody
    /// waits any more.
    pub fn decide(&self, request_id: &str, choice: ApprovalChoice, by: &str) -> bool {
        let Some(w) = self.take(request_id) else {
            return false;
        };
        if let Some((tool, resource)) = &w.approval {
            self.lock()
                .decided
                .insert((w.turn.clone(), tool.clone(), resource.clone()), choice);
        }
        for id in std::iter::once(&w.id).chain(&w.extra_request_ids) {
            w.link.send(ToAgent::ApprovalDecision(ApprovalDecision {
                request_id: id.clone(),
                decision: choice,
                by: by.to_owned(),
            }));
        }
        true
    }
}

// ---------------------------------------------------------------------------------------------
// The lane registry

#[derive(Debug)]
struct LaneHandle {
    notify: Arc<Notify>,
    backlog_noticed: AtomicBool,
}

/// The running lanes, by chat.
#[derive(Debug, Default)]
pub struct Lanes {
    map: Mutex<HashMap<ChatId, Arc<LaneHandle>>>,
}

impl Lanes {
    /// Wakes the lane of `chat` (starting it if needed): new events are in the journal.
    pub fn poke(&self, ctx: &Ctx, chat: ChatRef) {
        let (handle, fresh) = {
            let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
            match map.get(&chat.chat_id) {
                Some(h) => (h.clone(), false),
                None => {
                    let h = Arc::new(LaneHandle {
                        notify: Arc::new(Notify::new()),
                        backlog_noticed: AtomicBool::new(false),
                    });
                    map.insert(chat.chat_id.clone(), h.clone());
                    (h, true)
                }
            }
        };
        if fresh {
            let span = info_span!("lane", chat_id = %chat.chat_id, room_id = %chat.room_id);
            ctx.tracker
                .spawn(lane(ctx.clone(), chat.clone(), handle.clone()).instrument(span));
        }
        handle.notify.notify_one();
        self.maybe_notice_backlog(ctx, &chat, &handle);
    }

    fn maybe_notice_backlog(&self, ctx: &Ctx, chat: &ChatRef, handle: &LaneHandle) {
        let pending = ctx.journal.pending_count(&chat.chat_id).unwrap_or(0);
        if pending <= LANE_BACKLOG_NOTICE || handle.backlog_noticed.swap(true, Ordering::SeqCst) {
            return;
        }
        let ctx2 = ctx.clone();
        let chat = chat.clone();
        ctx.tracker.spawn(async move {
            let Some(room) = room_of(&ctx2, &chat.room_id) else {
                return;
            };
            let text = format!(
                "I am still working on an earlier message; {pending} messages are queued and \
                 will be answered in order."
            );
            // One notice per backlog, also across a crash: the backlog is named by its oldest
            // waiting event, which a restarted surface finds the same.
            let oldest = match ctx2.journal.next_pending(&chat.chat_id) {
                Ok(Some(ev)) => ev.event.event_id,
                _ => format!("{}:{}", chat.chat_id, ctx2.started_ms),
            };
            let txn = render::notice_txn_id(&oldest, "backlog");
            let content = RoomMessageEventContent::notice_plain(text);
            let out = Outgoing {
                txn: &txn,
                thread_root: None,
                about: None,
                purpose: "backlog",
            };
            if let Err(e) = send::post(&ctx2, &room, content, out).await {
                warn!(error = %e, "could not post the backlog notice");
            }
        });
    }

    fn backlog_drained(&self, chat: &ChatId) {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(h) = map.get(chat) {
            h.backlog_noticed.store(false, Ordering::SeqCst);
        }
    }
}

fn room_of(ctx: &Ctx, room_id: &str) -> Option<Room> {
    let id = RoomId::parse(room_id).ok()?;
    ctx.client.get_room(&id)
}

// ---------------------------------------------------------------------------------------------
// The lane worker

struct Lane {
    ctx: Ctx,
    chat: ChatRef,
    room: Room,
    link: LinkHandle,
    events: mpsc::Receiver<LinkEvent>,
}

async fn lane(ctx: Ctx, chat: ChatRef, handle: Arc<LaneHandle>) {
    // Right after a join the SDK may not know the room yet.
    let mut room = None;
    for _ in 0..50 {
        room = room_of(&ctx, &chat.room_id);
        if room.is_some() || ctx.shutdown.is_cancelled() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let Some(room) = room else {
        warn!("room unknown to the client; lane not started");
        return;
    };
    let (link, events) = agent_link::spawn(
        ctx.endpoint.clone(),
        chat.chat_id.clone(),
        ctx.journal.clone(),
        ctx.shutdown.clone(),
        &ctx.tracker,
    );
    let mut lane = Lane {
        ctx: ctx.clone(),
        chat,
        room,
        link,
        events,
    };

    // Turns stored before a restart: the link resends them, we render their answers.
    match ctx.journal.unended_turns(&lane.chat.chat_id) {
        Ok(turns) => {
            for msg in turns {
                info!(seq = msg.seq, event_id = %msg.id, "resuming unfinished turn");
                lane.run_turn(msg).await;
                if ctx.shutdown.is_cancelled() {
                    return;
                }
            }
        }
        Err(e) => error!(error = %e, "journal read failed"),
    }

    loop {
        if ctx.shutdown.is_cancelled() {
            return;
        }
        let notified = handle.notify.notified();
        match ctx.journal.next_pending(&lane.chat.chat_id) {
            Ok(Some(ev)) if ev.event.disposition != Disposition::Waiting => lane.process(ev).await,
            // Nothing to do, or the next message waits for its room key: later ones wait too
            // (`undecrypted` pokes the lane when the key comes or the wait is over).
            Ok(next) => {
                if next.is_none() {
                    ctx.lanes.backlog_drained(&lane.chat.chat_id);
                }
                tokio::select! {
                    _ = ctx.shutdown.cancelled() => return,
                    _ = notified => {}
                    // Drain link events (acks, late messages) while idle.
                    ev = lane.events.recv() => match ev {
                        Some(LinkEvent::Message(m)) => debug!(msg = ?m, "agent message outside a turn"),
                        Some(_) => {}
                        None => return,
                    },
                }
            }
            Err(e) => {
                error!(error = %e, "journal read failed; retrying");
                tokio::select! {
                    _ = ctx.shutdown.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                }
            }
        }
    }
}

/// The text, files and file facts of a message, after downloading.
#[derive(Debug, Default)]
struct Prepared {
    text: String,
    attachments: Vec<WorkspacePath>,
    info: BTreeMap<WorkspacePath, AttachmentInfo>,
    /// The message had a file that could not be downloaded.
    failed_file: bool,
}

impl Lane {
    #[instrument(skip_all, fields(room_id = %journaled.event.room_id, event_id = %journaled.event.event_id))]
    async fn process(&mut self, journaled: JournaledEvent) {
        let JournaledEvent { ord, event: ev } = journaled;
        // Create the sender's outbox for this room early, so it is being watched before anyone
        // drops a file there (a folder created together with its first file can race the
        // watcher).
        let outbox = Workspace::outbox_dir(&ev.sender, &ev.room_id);
        if let Err(e) = self.ctx.workspace.create_dir_all(&outbox) {
            warn!(error = %e, "could not create the outbox folder");
        }
        let prepared = self.prepare(&ev).await;
        let sender = Sender {
            user_id: ev.sender.clone(),
            display_name: ev.sender_name.clone(),
        };
        let journal = &self.ctx.journal;
        let nothing_left = prepared.text.trim().is_empty() && prepared.attachments.is_empty();
        let result = match ev.disposition {
            Disposition::Context if nothing_left => journal.mark_handled(&ev.event_id),
            Disposition::Context => journal.set_context_ready(
                &ev.event_id,
                &ContextMessage {
                    id: ev.event_id.clone(),
                    sender,
                    text: prepared.text,
                    attachments: prepared.attachments,
                    timestamp_ms: ev.origin_ts,
                },
            ),
            Disposition::Trigger if nothing_left && prepared.failed_file => {
                // The user was told; there is nothing to forward.
                journal.mark_handled(&ev.event_id)
            }
            Disposition::Trigger => {
                let context = match journal.ready_context(&self.chat.chat_id) {
                    Ok(c) => c,
                    Err(e) => {
                        error!(error = %e, "journal read failed");
                        Vec::new()
                    }
                };
                let mut context_ids: Vec<String> =
                    context.iter().map(|(id, _)| id.clone()).collect();
                let mut prepared = prepared;
                if prepared.text.trim().is_empty()
                    && !prepared.attachments.is_empty()
                    && let Some((caption_id, caption)) = self.caption_for(&ev, ord).await
                {
                    info!(caption_event_id = %caption_id, "file and caption become one turn");
                    prepared.text = caption;
                    context_ids.push(caption_id);
                }
                let msg = UserMessage {
                    seq: 0,
                    id: ev.event_id.clone(),
                    room_id: ev.room_id.clone(),
                    thread_root: ev.thread_root.clone(),
                    sender,
                    text: if prepared.text.trim().is_empty() {
                        ATTACHMENTS_ONLY_TEXT.to_owned()
                    } else {
                        prepared.text
                    },
                    attachments: prepared.attachments,
                    attachment_info: prepared.info,
                    context: context.into_iter().map(|(_, c)| c).collect(),
                    timestamp_ms: ev.origin_ts,
                };
                match journal.create_turn(&self.chat.chat_id, msg, &context_ids) {
                    Ok(msg) => {
                        info!(
                            seq = msg.seq,
                            attachments = msg.attachments.len(),
                            context = msg.context.len(),
                            "turn stored"
                        );
                        self.link.turns_stored();
                        self.run_turn(msg).await;
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            Disposition::Skip | Disposition::Answered => journal.mark_handled(&ev.event_id),
            // Never handed to `process` (the lane stops before it); left as it is.
            Disposition::Waiting => Ok(()),
        };
        if let Err(e) = result {
            // Leave the event pending: it is retried, never dropped.
            error!(error = %e, "journal write failed; will retry");
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }

    /// A text message the same sender sent right after a file-only message: its caption, sent
    /// as a second event by some clients. Returns its event id and text.
    async fn caption_for(&self, file_ev: &NewEvent, ord: i64) -> Option<(String, String)> {
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
        let content: RoomMessageEventContent =
            serde_json::from_str(next.event.content.as_deref()?).ok()?;
        match content.msgtype {
            MessageType::Text(t) if !t.body.trim().is_empty() => {
                Some((next.event.event_id, t.body))
            }
            _ => None,
        }
    }

    /// Parses the event and downloads its file, if any. Download failures are told to the
    /// room and logged; the message's other content still goes on.
    async fn prepare(&self, ev: &NewEvent) -> Prepared {
        let content: RoomMessageEventContent =
            match serde_json::from_str(ev.content.as_deref().unwrap_or("{}")) {
                Ok(c) => c,
                Err(e) => {
                    warn!(error = %e, "message content does not parse; forwarding nothing");
                    return Prepared::default();
                }
            };
        let file = match &content.msgtype {
            MessageType::Image(c) => Some((
                c.source.clone(),
                c.filename.clone(),
                c.body.clone(),
                c.info.as_ref().and_then(|i| i.size).map(u64::from),
                c.info.as_ref().and_then(|i| i.mimetype.clone()),
            )),
            MessageType::File(c) => Some((
                c.source.clone(),
                c.filename.clone(),
                c.body.clone(),
                c.info.as_ref().and_then(|i| i.size).map(u64::from),
                c.info.as_ref().and_then(|i| i.mimetype.clone()),
            )),
            MessageType::Audio(c) => Some((
                c.source.clone(),
                c.filename.clone(),
                c.body.clone(),
                c.info.as_ref().and_then(|i| i.size).map(u64::from),
                c.info.as_ref().and_then(|i| i.mimetype.clone()),
            )),
            MessageType::Video(c) => Some((
                c.source.clone(),
                c.filename.clone(),
                c.body.clone(),
                c.info.as_ref().and_then(|i| i.size).map(u64::from),
                c.info.as_ref().and_then(|i| i.mimetype.clone()),
            )),
            _ => None,
        };
        let Some((source, filename, body, size, mime)) = file else {
            let body = match &content.msgtype {
                MessageType::Emote(e) => format!("* {}", e.body),
                other => other.body().to_owned(),
            };
            return Prepared {
                text: body,
                ..Prepared::default()
            };
        };
        let (name, caption) = pick_name(filename.as_deref(), &body);
        let mut prepared = Prepared {
            text: caption.unwrap_or_default(),
            ..Prepared::default()
        };
        match self.download(ev, source, name, size, mime).await {
            Ok(d) => {
                prepared.attachments.push(d.path.clone());
                prepared.info.insert(d.path, d.info);
            }
            Err(()) => prepared.failed_file = true,
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
        let (Ok(event_id), Ok(room_id), Ok(sender)) = (
            OwnedEventId::try_from(ev.event_id.as_str()),
            OwnedRoomId::try_from(ev.room_id.as_str()),
            OwnedUserId::try_from(ev.sender.as_str()),
        ) else {
            warn!("malformed ids in journal; skipping file");
            return Err(());
        };
        let req = DownloadRequest {
            event_id,
            room_id,
            sender,
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
                warn!(
                    event_id = %ev.event_id,
                    room_id = %ev.room_id,
                    file = %e.name,
                    reason = %e.failure,
                    "download failed"
                );
                let target = self.target_for(&ev.event_id, ev.thread_root.as_deref());
                if let Some(target) = target {
                    let txn = render::notice_txn_id(&ev.event_id, "download-failed");
                    let content = target.notice(&e.user_message());
                    let out = Outgoing {
                        txn: &txn,
                        thread_root: Some(target.root()),
                        about: Some(&target.event_id),
                        purpose: "download-failed",
                    };
                    match send::post(ctx, &self.room, content, out).await {
                        Ok(_) => {}
                        Err(PostError::Refused(r)) => {
                            send::report_refusal(ctx, &self.room, out, Some(&target), &r).await;
                        }
                        Err(pe) => {
                            warn!(error = %pe, "could not tell the room about the failed download");
                        }
                    }
                }
                Err(())
            }
        }
    }

    fn target_for(&self, event_id: &str, thread_root: Option<&str>) -> Option<ReplyTarget> {
        Some(ReplyTarget {
            event_id: EventId::parse(event_id).ok()?,
            thread_root: thread_root.and_then(|r| EventId::parse(r).ok()),
        })
    }

    /// Runs one stored turn until the agent ends it (the link sends it). Leaves it unended on
    /// shutdown, so it resumes after the restart.
    #[instrument(skip_all, fields(room_id = %msg.room_id, event_id = %msg.id, seq = msg.seq))]
    async fn run_turn(&mut self, msg: UserMessage) {
        let Some(target) = self.target_for(&msg.id, msg.thread_root.as_deref()) else {
            warn!("malformed event id; dropping turn");
            let _ = self.ctx.journal.finish_turn(&self.chat.chat_id, msg.seq);
            return;
        };
        let typing = CancellationToken::new();
        self.ctx
            .tracker
            .spawn(keep_typing(self.room.clone(), typing.clone()));
        let mut turn = Turn {
            target,
            turn: msg.id.clone(),
            user: msg.sender.user_id.clone(),
            out_index: 0,
            text: String::new(),
            interrupted: false,
            tool_calls: HashMap::new(),
        };
        // True when the agent already had this turn before this connection: its end may have
        // been lost with the old connection (the protocol has no "turn finished" query yet).
        // While recovering, a fixed deadline: reconnects of the link must not extend it, or a
        // lost end blocks the chat for good.
        let mut recovering: Option<tokio::time::Instant> = None;
        let recover = |r: &mut Option<tokio::time::Instant>| {
            r.get_or_insert_with(|| tokio::time::Instant::now() + RECOVERY_IDLE_TIMEOUT);
        };
        let outcome = loop {
            let deadline =
                recovering.unwrap_or_else(|| tokio::time::Instant::now() + TURN_IDLE_TIMEOUT);
            let ev = tokio::select! {
                _ = self.ctx.shutdown.cancelled() => break TurnOutcome::Interrupted,
                r = tokio::time::timeout_at(deadline, self.events.recv()) => r,
            };
            let m = match ev {
                Err(_) if recovering.is_some() => break TurnOutcome::Lost,
                Err(_) => break TurnOutcome::Timeout,
                Ok(None) => break TurnOutcome::Interrupted,
                Ok(Some(LinkEvent::Connected { last_seq })) => {
                    debug!(last_seq, "link (re)connected during turn");
                    if last_seq >= msg.seq {
                        recover(&mut recovering);
                    }
                    continue;
                }
                Ok(Some(LinkEvent::Disconnected)) => continue,
                Ok(Some(LinkEvent::Message(m))) => m,
            };
            if turn_of(&m) == Some(turn.turn.as_str()) {
                // The agent is answering this turn (again): the normal idle limit applies.
                recovering = None;
            }
            match m {
                ToSurface::Ack(a) if a.seq == msg.seq => {
                    debug!(duplicate = a.duplicate, "turn acked");
                    if a.duplicate {
                        recover(&mut recovering);
                    }
                }
                ToSurface::End(e) if e.turn == turn.turn => {
                    self.flush(&mut turn).await;
                    if e.status != EndStatus::Completed {
                        let why = e
                            .error
                            .unwrap_or_else(|| format!("{:?}", e.status).to_lowercase());
                        warn!(status = ?e.status, error = %why, "turn did not complete");
                        let text = format!("⚠️ I could not finish this: {why}");
                        self.post_notice(&mut turn, &text, "turn-failed").await;
                    }
                    break TurnOutcome::Ended;
                }
                ToSurface::TextChunk(t) if t.turn == turn.turn => turn.text.push_str(&t.text),
                ToSurface::ToolCallChunk(c) if c.turn == turn.turn => {
                    let entry = turn.tool_calls.entry(c.call_id).or_default();
                    if !c.name.is_empty() {
                        entry.0 = c.name;
                    }
                    entry.1.push_str(&c.arguments);
                }
                ToSurface::ToolResult(r) if r.turn == turn.turn => {
                    let (name, args) = turn.tool_calls.remove(&r.call_id).unwrap_or_default();
                    if self.ctx.config.show_tool_calls {
                        self.flush(&mut turn).await;
                        let text = render::tool_notice(&name, &args, r.ok, &r.output);
                        self.post_notice(&mut turn, &text, "tool").await;
                    }
                }
                ToSurface::SendFile(f) if f.turn == turn.turn => {
                    self.flush(&mut turn).await;
                    self.send_file(&mut turn, f).await;
                }
                ToSurface::ApprovalRequest(r) if r.turn == turn.turn => {
                    self.flush(&mut turn).await;
                    self.approval(&mut turn, r).await;
                }
                ToSurface::AskUser(q) if q.turn == turn.turn => {
                    self.flush(&mut turn).await;
                    self.ask(&mut turn, q).await;
                }
                ToSurface::CustomUpdate(u) => debug!(name = %u.name, "agent update"),
                ToSurface::Error(e) => warn!(code = ?e.code, message = %e.message, "agent error"),
                other => debug!(msg = ?other, "agent message for another turn; ignored"),
            }
        };
        typing.cancel();
        let _ = self.room.typing_notice(false).await;
        self.ctx.waits.turn_over(&turn.turn);
        match outcome {
            TurnOutcome::Ended => {}
            TurnOutcome::Timeout => {
                self.flush(&mut turn).await;
                warn!("agent went quiet; giving up on the turn");
                self.post_notice(
                    &mut turn,
                    "⚠️ The agent did not finish answering this message.",
                    "turn-timeout",
                )
                .await;
            }
            TurnOutcome::Lost => {
                self.flush(&mut turn).await;
                warn!("no news about a turn the agent already had; its end was probably lost");
                self.post_notice(
                    &mut turn,
                    "⚠️ I lost the connection to the agent while it was answering; \
                     the answer may be incomplete.",
                    "turn-lost",
                )
                .await;
            }
            TurnOutcome::Interrupted => {
                info!("turn interrupted by shutdown; it resumes after restart");
                return;
            }
        }
        if turn.interrupted {
            info!("shutdown came before everything was posted; the turn resumes after restart");
            return;
        }
        if let Err(e) = self.ctx.journal.finish_turn(&self.chat.chat_id, msg.seq) {
            error!(error = %e, "could not mark the turn finished");
        }
    }

    /// Posts the accumulated answer text, if any.
    async fn flush(&self, turn: &mut Turn) {
        let text = std::mem::take(&mut turn.text);
        if text.trim().is_empty() {
            return;
        }
        for content in turn.target.markdown_parts(text.trim()) {
            self.post(turn, content, "answer").await;
        }
    }

    async fn post_notice(
        &self,
        turn: &mut Turn,
        text: &str,
        purpose: &str,
    ) -> Option<OwnedEventId> {
        let content = turn.target.notice(text);
        self.post(turn, content, purpose).await
    }

    async fn post(
        &self,
        turn: &mut Turn,
        content: RoomMessageEventContent,
        purpose: &str,
    ) -> Option<OwnedEventId> {
        let txn = render::txn_id(&turn.turn, turn.out_index);
        turn.out_index += 1;
        let target = turn.target.clone();
        let out = Outgoing {
            txn: &txn,
            thread_root: Some(target.root()),
            about: Some(&target.event_id),
            purpose,
        };
        match send::post(&self.ctx, &self.room, content, out).await {
            Ok(id) => Some(id),
            Err(PostError::Refused(r)) => {
                send::report_refusal(&self.ctx, &self.room, out, Some(&target), &r).await;
                None
            }
            Err(PostError::Shutdown) => {
                turn.interrupted = true;
                None
            }
            Err(e @ PostError::AlreadyParked(_)) => {
                info!(error = %e, purpose, txn_id = %txn, "not posting a parked message again");
                None
            }
            Err(e) => {
                error!(error = %e, purpose, txn_id = %txn, "could not post to the room");
                None
            }
        }
    }

    #[instrument(skip_all, fields(request_id = %f.request_id, path = %f.path))]
    async fn send_file(&self, turn: &mut Turn, f: SendFile) {
        let ctx = &self.ctx;
        let scope = ChatScope::new(self.chat.chat_id.clone(), self.chat.room_id.clone());
        let result = media::prepare_file_message(
            &ctx.client,
            &ctx.workspace,
            &f.path,
            &scope,
            f.caption.as_deref(),
            &ctx.upload_cache,
            ctx.config.max_file_size,
        )
        .await;
        let delivery = match result {
            Ok(content) => {
                let content = turn.target.apply(content);
                match self.post(turn, content, "file").await {
                    Some(id) => {
                        info!(event_id = %id, "file posted");
                        DeliveryResult {
                            request_id: f.request_id.clone(),
                            ok: true,
                            event_id: Some(id.to_string()),
                            error: None,
                        }
                    }
                    None => DeliveryResult {
                        request_id: f.request_id.clone(),
                        ok: false,
                        event_id: None,
                        error: Some("the homeserver did not accept the message".into()),
                    },
                }
            }
            Err(e) => {
                warn!(
                    room_id = %self.chat.room_id,
                    path = %f.path,
                    reason = %e.failure,
                    refused = e.is_refused(),
                    "file not sent"
                );
                let user_error = e.user_message();
                self.post_notice(turn, &format!("⚠️ {user_error}"), "file-failed")
                    .await;
                DeliveryResult {
                    request_id: f.request_id.clone(),
                    ok: false,
                    event_id: None,
                    error: Some(user_error),
                }
            }
        };
        self.link.send(ToAgent::DeliveryResult(delivery));
    }

    #[instrument(skip_all, fields(request_id = %r.request_id, tool = %r.tool))]
    async fn approval(&self, turn: &mut Turn, r: ApprovalRequest) {
        let waits = &self.ctx.waits;
        if let Some(choice) = waits.decided(&turn.turn, &r.tool, &r.resource)
            && choice != ApprovalChoice::Deny
        {
            info!("same tool and resource already approved in this turn");
            self.link.send(ToAgent::ApprovalDecision(ApprovalDecision {
                request_id: r.request_id,
                decision: choice,
                by: turn.user.clone(),
            }));
            return;
        }
        if waits.coalesce(&turn.turn, &r.tool, &r.resource, &r.request_id) {
            info!("coalesced with a pending prompt");
            return;
        }
        waits.add(Wait {
            room_id: self.chat.room_id.clone(),
            user_id: turn.user.clone(),
            turn: turn.turn.clone(),
            id: r.request_id.clone(),
            extra_request_ids: Vec::new(),
            approval: Some((r.tool.clone(), r.resource.clone())),
            link: self.link.clone(),
        });
        let text = render::approval_prompt(&r, &turn.user);
        let content = turn.target.markdown(&text);
        self.post(turn, content, "approval").await;
        self.spawn_timeout(turn, r.request_id, true);
    }

    #[instrument(skip_all, fields(question_id = %q.question_id))]
    async fn ask(&self, turn: &mut Turn, q: AskUser) {
        self.ctx.waits.add(Wait {
            room_id: self.chat.room_id.clone(),
            user_id: turn.user.clone(),
            turn: turn.turn.clone(),
            id: q.question_id.clone(),
            extra_request_ids: Vec::new(),
            approval: None,
            link: self.link.clone(),
        });
        let text = render::question_prompt(&q, &turn.user);
        let content = turn.target.markdown(&text);
        self.post(turn, content, "question").await;
        self.spawn_timeout(turn, q.question_id, false);
    }

    fn spawn_timeout(&self, turn: &mut Turn, id: String, approval: bool) {
        let ctx = self.ctx.clone();
        let room = self.room.clone();
        let target = turn.target.clone();
        let index = turn.out_index + 1000;
        let turn_id = turn.turn.clone();
        let user = turn.user.clone();
        let limit = if approval {
            APPROVAL_TIMEOUT
        } else {
            QUESTION_TIMEOUT
        };
        self.ctx.tracker.spawn(async move {
            tokio::select! {
                _ = ctx.shutdown.cancelled() => return,
                _ = tokio::time::sleep(limit) => {}
            }
            let answered = if approval {
                ctx.waits.decide(&id, ApprovalChoice::Deny, &user)
            } else {
                ctx.waits.answer(&id, "no reply", &user)
            };
            if !answered {
                return;
            }
            info!(id = %id, "no answer in time");
            let text = if approval {
                "⏱️ No answer in time: denied."
            } else {
                "⏱️ No answer in time."
            };
            let txn = render::txn_id(&turn_id, index);
            let out = Outgoing {
                txn: &txn,
                thread_root: Some(target.root()),
                about: Some(&target.event_id),
                purpose: "timeout",
            };
            if let Err(e) = send::post(&ctx, &room, target.notice(text), out).await {
                warn!(error = %e, "could not post the timeout notice");
            }
        });
    }
}

struct Turn {
    target: ReplyTarget,
    turn: String,
    /// The user who triggered the turn: the only one whose answers count.
    user: String,
    out_index: u32,
    text: String,
    /// Shutdown came before one of its posts went out: the turn must stay open.
    interrupted: bool,
    tool_calls: HashMap<String, (String, String)>,
}

/// The turn an agent message belongs to, for messages that belong to one.
fn turn_of(m: &ToSurface) -> Option<&str> {
    match m {
        ToSurface::TextChunk(t) => Some(&t.turn),
        ToSurface::ToolCallChunk(c) => Some(&c.turn),
        ToSurface::ToolResult(r) => Some(&r.turn),
        ToSurface::SendFile(f) => Some(&f.turn),
        ToSurface::ApprovalRequest(r) => Some(&r.turn),
        ToSurface::AskUser(q) => Some(&q.turn),
        ToSurface::End(e) => Some(&e.turn),
        _ => None,
    }
}

enum TurnOutcome {
    Ended,
    Timeout,
    Lost,
    Interrupted,
}

/// Keeps the typing notice up until `stop`.
async fn keep_typing(room: Room, stop: CancellationToken) {
    loop {
        if let Err(e) = room.typing_notice(true).await {
            debug!(error = %e, "typing notice failed");
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(3)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent_link::{drain, test_handle};

    fn wait(link: &LinkHandle, id: &str, approval: Option<(&str, &str)>) -> Wait {
        Wait {
            room_id: "!r:hs".into(),
            user_id: "@alice:hs".into(),
            turn: "$turn".into(),
            id: id.into(),
            extra_request_ids: Vec::new(),
            approval: approval.map(|(t, r)| (t.into(), r.into())),
            link: link.clone(),
        }
    }

    #[test]
    fn questions_are_answered_once_by_the_asked_user() {
        let (link, mut rx) = test_handle();
        let waits = Waits::default();
        waits.add(wait(&link, "q1", None));
        assert_eq!(
            waits.lookup("!r:hs", "@bob:hs"),
            None,
            "others are not asked"
        );
        assert_eq!(waits.lookup("!other:hs", "@alice:hs"), None);
        assert_eq!(
            waits.lookup("!r:hs", "@alice:hs"),
            Some(Waiting::Question {
                question_id: "q1".into()
            })
        );
        assert!(waits.answer("q1", "blue", "@alice:hs"));
        assert!(!waits.answer("q1", "again", "@alice:hs"), "answered once");
        assert_eq!(waits.lookup("!r:hs", "@alice:hs"), None);
        assert_eq!(
            drain(&mut rx),
            vec![ToAgent::Answer(Answer {
                question_id: "q1".into(),
                text: "blue".into(),
                by: "@alice:hs".into()
            })]
        );
    }

    #[test]
    fn repeated_approvals_are_coalesced_and_remembered_for_the_turn() {
        let (link, mut rx) = test_handle();
        let waits = Waits::default();
        waits.add(wait(&link, "r1", Some(("write_file", "a.txt"))));
        assert!(waits.coalesce("$turn", "write_file", "a.txt", "r2"));
        assert!(!waits.coalesce("$turn", "write_file", "b.txt", "r3"));
        assert!(!waits.coalesce("$other", "write_file", "a.txt", "r4"));
        assert_eq!(
            waits.lookup("!r:hs", "@alice:hs"),
            Some(Waiting::Approval {
                request_id: "r1".into()
            })
        );
        assert!(waits.decide("r1", ApprovalChoice::AllowOnce, "@alice:hs"));
        let ids: Vec<String> = drain(&mut rx)
            .into_iter()
            .map(|m| match m {
                ToAgent::ApprovalDecision(d) => {
                    assert_eq!(d.decision, ApprovalChoice::AllowOnce);
                    d.request_id
                }
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(ids, vec!["r1", "r2"]);
        assert_eq!(
            waits.decided("$turn", "write_file", "a.txt"),
            Some(ApprovalChoice::AllowOnce)
        );
        waits.turn_over("$turn");
        assert_eq!(waits.decided("$turn", "write_file", "a.txt"), None);
        assert!(!waits.decide("r1", ApprovalChoice::Deny, "@alice:hs"));
    }
}
