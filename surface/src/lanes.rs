//! One lane per chat: a task that takes the chat's journaled events in order (stopping at
//! one still waiting for its room key), prepares them (`inbound`), stores turns, and runs each
//! (`effects`, executing the pure `turn` state machine). Chats run concurrently; within a chat
//! one turn runs at a time. The queue is the journal itself, so nothing is ever dropped.

mod effects;
mod inbound;
mod live;
mod progress;
mod turn;

use std::sync::Arc;
use std::time::Duration;

use matrix_sdk::Room;
use matrix_sdk::ruma::events::room::message::RoomMessageEventContent;
use matrix_sdk::ruma::{EventId, RoomId};
use protocol::{ContextMessage, Sender, ToSurface, UserMessage};
use tokio::sync::mpsc;
use tracing::{Instrument, debug, error, info, info_span, instrument, warn};

pub use effects::{APPROVAL_TIMEOUT, QUESTION_TIMEOUT};

use crate::agent_link::{self, LinkEvent, LinkHandle};
use crate::context::Ctx;
use crate::journal::{ChatRef, Disposition, JournalError, JournaledEvent, NewEvent, Stored};
use crate::lane_registry::{LaneHandle, Running};
use crate::purpose::Purpose;
use crate::render::{self, ReplyTarget};
use crate::send::{self, Outgoing};
use crate::workspace::Workspace;
use progress::Progress;

/// Pending events of a chat beyond which the room is told that messages are queued.
pub const LANE_BACKLOG_NOTICE: u64 = 5;
/// Synthetic text of a turn that only carries files.
pub const ATTACHMENTS_ONLY_TEXT: &str = "User sent one or more attachments.";

/// Wakes the lane of `chat` (starting it if needed): new events are in the journal.
pub fn poke(ctx: &Ctx, chat: ChatRef) {
    let (handle, fresh) = ctx.lanes.handle(&chat.chat_id);
    if fresh {
        let span = info_span!("lane", chat_id = %chat.chat_id, room_id = %chat.room_id);
        ctx.tracker
            .spawn(lane(ctx.clone(), chat.clone(), handle.clone()).instrument(span));
    }
    handle.notify.notify_one();
    maybe_notice_backlog(ctx, &chat, &handle);
}

fn maybe_notice_backlog(ctx: &Ctx, chat: &ChatRef, handle: &LaneHandle) {
    let pending = ctx.journal.pending_count(&chat.chat_id).unwrap_or(0);
    if pending <= LANE_BACKLOG_NOTICE || !handle.first_backlog_notice() {
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
            Ok(Some(ev)) => ev.event.event_id.to_string(),
            _ => format!("{}:{}", chat.chat_id, ctx2.started_ms),
        };
        let txn = render::notice_txn_id(&oldest, Purpose::Backlog);
        let content = RoomMessageEventContent::notice_plain(text);
        let out = Outgoing {
            txn: &txn,
            thread_root: None,
            about: None,
            purpose: Purpose::Backlog,
        };
        if let Err(e) = send::post(&ctx2, &room, content, out).await {
            warn!(error = %e, "could not post the backlog notice");
        }
    });
}

fn room_of(ctx: &Ctx, room_id: &RoomId) -> Option<Room> {
    ctx.client.get_room(room_id)
}

/// A chat's worker and what it holds.
struct Lane {
    ctx: Ctx,
    chat: ChatRef,
    room: Room,
    link: LinkHandle,
    events: mpsc::Receiver<LinkEvent>,
    /// Its handle: the turn it runs, and requests to stop it.
    handle: Arc<LaneHandle>,
    /// The room was told that the agent cannot be reached, and the agent has not accepted a
    /// turn since: the next turn does not tell it again.
    outage_told: bool,
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
        handle: handle.clone(),
        outage_told: false,
    };

    // Turns stored before a restart: the link resends them, we render their answers.
    match ctx.journal.unended_turns(&lane.chat.chat_id) {
        Ok(turns) => {
            for msg in turns {
                info!(seq = msg.seq, event_id = %msg.id, "resuming unfinished turn");
                lane.run_turn(msg, None).await;
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
                    handle.backlog_drained();
                }
                tokio::select! {
                    _ = ctx.shutdown.cancelled() => return,
                    _ = notified => {}
                    // Drain link events (acks, late messages) while idle.
                    ev = lane.events.recv() => match ev {
                        Some(LinkEvent::Message(m)) => lane.answer_stray(&m),
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

impl Lane {
    #[instrument(skip_all, fields(room_id = %journaled.event.room_id, event_id = %journaled.event.event_id))]
    async fn process(&mut self, journaled: JournaledEvent) {
        let JournaledEvent { ord, event: ev } = journaled;
        // Create the sender's outbox for this room early, so it is being watched before anyone
        // drops a file there (a folder created together with its first file can race the
        // watcher).
        let outbox = Workspace::outbox_dir(ev.sender.as_str(), ev.room_id.as_str());
        if let Err(e) = self.ctx.workspace.create_dir_all(&outbox) {
            warn!(error = %e, "could not create the outbox folder");
        }
        // An edit of the message a turn is answering now waits for that turn (stopping it, as
        // the room is offered, answers the edit at once).
        if ev.disposition == Disposition::Trigger
            && matches!(ev.content, Some(Stored::Edited { .. }))
            && let Some(edited) = &ev.thread_root
        {
            self.wait_for_turn_of(edited.as_str()).await;
        }
        // With the room's `queue: collect`, a message that another one of the chat waits behind
        // is not answered on its own: the last one takes it along as context.
        let disposition = match ev.disposition {
            Disposition::Trigger if self.collected(ord).await => {
                info!("collected into the next turn (queue: collect)");
                Disposition::Context
            }
            d => d,
        };
        // A message that starts a turn: the user waits from now, while its file downloads too
        // (minutes, for a large one from a slow server), so progress shows from now. Dropped
        // unused when no turn comes of it, which takes a typing notice down.
        let progress = match disposition {
            Disposition::Trigger => Some(self.start_progress(ev.event_id.clone())),
            _ => None,
        };
        let prepared = self.prepare(&ev).await;
        let sender = Sender {
            user_id: ev.sender.to_string(),
            display_name: ev.sender_name.clone(),
        };
        let journal = &self.ctx.journal;
        let nothing_left = prepared.text.trim().is_empty() && prepared.attachments.is_empty();
        let result = match disposition {
            Disposition::Context if nothing_left => journal.mark_handled(ev.event_id.as_str()),
            Disposition::Context => journal.set_context_ready(
                ev.event_id.as_str(),
                &ContextMessage {
                    id: ev.event_id.to_string(),
                    sender,
                    text: prepared.text,
                    attachments: prepared.attachments,
                    timestamp_ms: ev.origin_ts,
                },
            ),
            Disposition::Trigger if nothing_left && prepared.failed => {
                // The user was told; there is nothing to forward.
                journal.mark_handled(ev.event_id.as_str())
            }
            Disposition::Trigger => self.start_turn(&ev, ord, sender, prepared, progress).await,
            Disposition::Skip | Disposition::Answered => journal.mark_handled(ev.event_id.as_str()),
            // Never handed to `process` (the lane stops before it); left as it is.
            Disposition::Waiting => Ok(()),
        };
        if let Err(e) = result {
            // Leave the event pending: it is retried, never dropped.
            error!(error = %e, "journal write failed; will retry");
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }

    /// A message that starts a turn: with the context messages before it (and a caption sent
    /// right after a file), stored as the chat's next turn, then run.
    async fn start_turn(
        &mut self,
        ev: &NewEvent,
        ord: i64,
        sender: Sender,
        mut prepared: inbound::Prepared,
        progress: Option<Progress>,
    ) -> Result<(), JournalError> {
        let journal = &self.ctx.journal;
        let context = match journal.ready_context(&self.chat.chat_id) {
            Ok(c) => c,
            Err(e) => {
                error!(error = %e, "journal read failed");
                Vec::new()
            }
        };
        let mut context_ids: Vec<String> = context.iter().map(|(id, _)| id.clone()).collect();
        if prepared.may_get_caption()
            && let Some((caption_id, caption)) = self.caption_for(ev, ord).await
        {
            info!(caption_event_id = %caption_id, "file and caption become one turn");
            prepared.text = caption;
            context_ids.push(caption_id.to_string());
        }
        let bot_name = self.ctx.bot_display_name();
        let text = crate::decide::without_mention(
            &prepared.text,
            self.ctx.config.user_id.as_str(),
            bot_name.as_deref(),
        );
        let msg = UserMessage {
            seq: 0,
            id: ev.event_id.to_string(),
            room_id: ev.room_id.to_string(),
            thread_root: ev.thread_root.as_ref().map(ToString::to_string),
            sender,
            text: if text.trim().is_empty() {
                ATTACHMENTS_ONLY_TEXT.to_owned()
            } else {
                text.to_owned()
            },
            attachments: prepared.attachments,
            attachment_info: prepared.info,
            context: context.into_iter().map(|(_, c)| c).collect(),
            timestamp_ms: ev.origin_ts,
            // Stored with the turn: a turn run again after a crash keeps the settings it had.
            settings: crate::room_settings::read(&self.room)
                .await
                .0
                .for_turn()
                .map(Box::new),
        };
        let msg = self
            .ctx
            .journal
            .create_turn(&self.chat.chat_id, msg, &context_ids)?;
        info!(
            seq = msg.seq,
            attachments = msg.attachments.len(),
            context = msg.context.len(),
            "turn stored"
        );
        self.link.turns_stored();
        self.run_turn(msg, progress).await;
        Ok(())
    }

    /// An agent message for a turn this lane does not run now: a request (file, approval,
    /// question) for a turn that is over gets a refusal at once ([`turn::stray_reply`]), so
    /// the agent does not wait out its timeout; everything else is only logged.
    fn answer_stray(&self, m: &ToSurface) {
        let Some(turn) = turn::request_turn(m) else {
            debug!(msg = ?m, "agent message outside a turn");
            return;
        };
        let outcome = self.ctx.journal.turn_outcome(turn).ok().flatten();
        match turn::stray_reply(m, outcome.as_deref(), self.ctx.config.user_id.as_str()) {
            Some(reply) => {
                warn!(
                    turn,
                    outcome = outcome.as_deref().unwrap_or_default(),
                    "the agent asked for a turn that is over; refused so it does not wait"
                );
                self.link.send(reply);
            }
            None => warn!(
                turn,
                "the agent asked for a turn this chat does not run now; dropped"
            ),
        }
    }

    /// Waits while a turn answering `event_id` runs (in another chat of the room).
    async fn wait_for_turn_of(&self, event_id: &str) {
        let room_id = self.chat.room_id.as_str();
        let mut told = false;
        while self
            .ctx
            .lanes
            .running_for(room_id, event_id)
            .is_some_and(|(r, _)| r.turn == event_id)
        {
            if !std::mem::replace(&mut told, true) {
                info!(
                    edited = event_id,
                    "the edited message is being answered; the edit waits"
                );
            }
            tokio::select! {
                _ = self.ctx.shutdown.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_millis(300)) => {}
            }
        }
    }

    /// Whether the trigger at `ord` is collected into a later one (the room's `queue: collect`,
    /// and a later trigger of the chat waits).
    async fn collected(&self, ord: i64) -> bool {
        let later = self
            .ctx
            .journal
            .trigger_waits_after(&self.chat.chat_id, ord)
            .unwrap_or(false);
        later && crate::room_settings::read(&self.room).await.0.collect == Some(true)
    }

    fn target_for(&self, event_id: &str, thread_root: Option<&str>) -> Option<ReplyTarget> {
        Some(ReplyTarget {
            event_id: EventId::parse(event_id).ok()?,
            thread_root: thread_root.and_then(|r| EventId::parse(r).ok()),
        })
    }
}
