//! How a lane carries out a turn: it feeds what the agent link says into the pure
//! [`TurnState`] and executes the steps that come out — posts (with transaction ids derived
//! from the trigger, so a resumed turn posts nothing twice), uploads, prompts and their
//! timeouts, the read receipt and typing notice (`progress`) — then marks the turn finished in
//! the journal.

use std::time::Duration;

use matrix_sdk::ruma::OwnedEventId;
use matrix_sdk::ruma::events::MessageLikeEventContent;
use matrix_sdk::ruma::events::room::message::{
    ReplacementMetadata, RoomMessageEventContent, RoomMessageEventContentWithoutRelation,
};
use matrix_sdk::ruma::{EventId, OwnedTransactionId};
use protocol::{
    ApprovalDecision, ApprovalRequest, AskUser, Cancel, Decision as ApprovalChoice, DeliveryResult,
    SendFile, ToAgent, UserMessage,
};
use tracing::{debug, error, info, instrument, warn};

use super::live::{self, Live, LiveStep};
use super::progress::{self, Progress, RoomSignals};
use super::turn::{Input, Outcome, Step, TurnState, WaitsFor};
use super::{Lane, Running};
use crate::agent_link::LinkEvent;
use crate::media;
use crate::prompts;
use crate::purpose::Purpose;
use crate::render::{self, ReplyTarget};
use crate::send::{self, Outgoing, PostError};
use crate::waits::Wait;
use crate::workspace::ChatScope;

/// A turn with no news from the agent for this long is given up (and reported).
const TURN_IDLE_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// When the agent already had the turn (a duplicate ack, or a reconnect whose `last_seq`
/// covers it), it may have finished it while we were not listening: wait this long for news.
const RECOVERY_IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long an approval prompt waits for an answer before it counts as a denial.
pub const APPROVAL_TIMEOUT: Duration = Duration::from_secs(10 * 60);
/// How long an `ask_user` question waits before it is answered "no reply".
pub const QUESTION_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// The deadlines a turn keeps while it waits.
#[derive(Debug, Default)]
struct Clock {
    /// While recovering, a fixed deadline: only a reconnect after the link was down extends
    /// it, or a lost end blocks the chat for good.
    recovering: Option<tokio::time::Instant>,
    /// Since when the turn has been waiting for the agent (not accepted, or the link down).
    waiting_since: Option<tokio::time::Instant>,
}

impl Clock {
    /// When the turn stops waiting for what it waits for (`None`: as long as it takes).
    fn deadline(
        &mut self,
        waits: WaitsFor,
        agent_down_notice: Option<Duration>,
    ) -> Option<tokio::time::Instant> {
        let now = tokio::time::Instant::now();
        match waits {
            WaitsFor::News => {
                self.waiting_since = None;
                Some(self.recovering.unwrap_or(now + TURN_IDLE_TIMEOUT))
            }
            WaitsFor::Agent => {
                agent_down_notice.map(|grace| *self.waiting_since.get_or_insert(now) + grace)
            }
            // The message is in the journal: it waits for the agent as long as it takes.
            WaitsFor::AgentTold => None,
        }
    }
}

/// Where a running turn posts.
pub(super) struct Turn {
    target: ReplyTarget,
    turn: String,
    /// The user who triggered the turn: the only one whose answers count.
    user: String,
    out_index: u32,
    /// Shutdown came before one of its posts went out: the turn must stay open.
    interrupted: bool,
    /// The answer shown while it is being written.
    live: Live,
    /// What the live message shows now.
    live_text: String,
    /// When the last agent message arrived (for the latency log).
    since: tokio::time::Instant,
    /// Tells the read receipt and typing notice when the turn posts and when it is over.
    progress: Progress,
    /// Outages the room was told of during this turn (each notice has its own transaction id,
    /// outside the numbering of the turn's answers, which a resumed turn repeats).
    outages: u32,
    /// The answer is shown while it is written (the room's `streaming` setting).
    streaming: bool,
}

/// Waits until `deadline`, or for ever without one.
async fn until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

impl Lane {
    /// Starts showing progress (read receipt, typing notice) for the turn `trigger` starts: the
    /// user's wait starts when the message arrived, before its file is downloaded.
    pub(super) fn start_progress(&self, trigger: OwnedEventId) -> Progress {
        let (progress, activity) = Progress::start();
        let signals = RoomSignals {
            room: self.room.clone(),
            trigger,
        };
        self.ctx.tracker.spawn(progress::show(signals, activity));
        progress
    }

    /// Runs one stored turn until the agent ends it (the link sends it), showing `progress` if
    /// it was started already (while the message's file was downloaded), else from now. Leaves
    /// the turn unended on shutdown, so it resumes after the restart.
    #[instrument(skip_all, fields(room_id = %msg.room_id, event_id = %msg.id, seq = msg.seq))]
    pub(super) async fn run_turn(&mut self, msg: UserMessage, progress: Option<Progress>) {
        let Some(target) = self.target_for(&msg.id, msg.thread_root.as_deref()) else {
            warn!("malformed event id; dropping turn");
            let _ = self
                .ctx
                .journal
                .finish_turn(&self.chat.chat_id, msg.seq, "dropped");
            return;
        };
        let progress = progress.unwrap_or_else(|| self.start_progress(target.event_id.clone()));
        let mut turn = Turn {
            target,
            turn: msg.id.clone(),
            user: msg.sender.user_id.clone(),
            out_index: 0,
            interrupted: false,
            live: Live::default(),
            live_text: String::new(),
            since: tokio::time::Instant::now(),
            progress,
            outages: 0,
            streaming: crate::room_settings::read(&self.room).await.0.streaming != Some(false),
        };
        let mut state = TurnState::new(
            &msg.id,
            msg.seq,
            self.ctx.config.show_tool_calls,
            self.outage_told,
        );
        let mut clock = Clock::default();
        self.handle.start(Running {
            chat: self.chat.chat_id.clone(),
            room_id: self.chat.room_id.to_string(),
            turn: msg.id.clone(),
            requester: msg.sender.user_id.clone(),
            thread_root: msg.thread_root.clone(),
            live: None,
            offers: Vec::new(),
        });
        let holding = crate::delayed::start(&self.ctx, &self.room, &turn.target, &turn.turn);
        let outcome = 'turn: loop {
            let deadline = clock.deadline(state.wait(), self.ctx.config.agent_down_notice);
            let input = self.next_input(&mut turn, deadline).await;
            for step in state.on(input) {
                if let Some(outcome) = self.carry_out(&mut turn, &mut clock, &state, step).await {
                    break 'turn outcome;
                }
            }
        };
        self.handle.over();
        self.outage_told = state.told();
        turn.progress.over();
        self.ctx.waits.turn_over(&turn.turn);
        match outcome {
            Outcome::Ended => {}
            Outcome::Timeout => warn!("agent went quiet; gave up on the turn"),
            Outcome::Lost => {
                warn!("no news about a turn the agent already had; its end was probably lost");
            }
            Outcome::Interrupted => info!("turn interrupted by shutdown; it resumes after restart"),
            Outcome::Stopped => info!("turn stopped on request"),
        }
        let over = outcome.is_final() && !turn.interrupted;
        holding.finish(&self.ctx, &self.room, &turn.turn, over);
        if !outcome.is_final() {
            return;
        }
        if turn.interrupted {
            info!("shutdown came before everything was posted; the turn resumes after restart");
            return;
        }
        crate::metrics::turn(outcome.label());
        if let Err(e) = self
            .ctx
            .journal
            .finish_turn(&self.chat.chat_id, msg.seq, outcome.label())
        {
            error!(error = %e, "could not mark the turn finished");
        }
    }

    /// What the turn hears next: the agent, its link, the shutdown, or nothing before
    /// `deadline`.
    async fn next_input(
        &mut self,
        turn: &mut Turn,
        deadline: Option<tokio::time::Instant>,
    ) -> Input {
        let handle = self.handle.clone();
        tokio::select! {
            _ = self.ctx.shutdown.cancelled() => Input::Stop,
            by = handle.stop_requested() => Input::StopRequested { by },
            _ = until(deadline) => Input::Quiet,
            r = self.events.recv() => match r {
                None => Input::Stop,
                Some(LinkEvent::Connected { last_seq }) => {
                    debug!(last_seq, "link (re)connected during turn");
                    Input::Connected { last_seq }
                }
                Some(LinkEvent::Disconnected) => Input::Disconnected,
                Some(LinkEvent::Message(m)) => {
                    turn.since = tokio::time::Instant::now();
                    turn.progress.agent_heard();
                    Input::Message(m)
                }
            },
        }
    }

    /// Carries out one step of the turn's state machine; `Some` when the turn is over.
    async fn carry_out(
        &mut self,
        turn: &mut Turn,
        clock: &mut Clock,
        state: &TurnState,
        step: Step,
    ) -> Option<Outcome> {
        match step {
            Step::Answer(text) => self.answer(turn, &text).await,
            Step::Progress => self.progress(turn, state.pending_text()).await,
            Step::Notice {
                text,
                purpose: purpose @ Purpose::AgentUnreachable,
            } => {
                let waited = clock
                    .waiting_since
                    .map(|t| t.elapsed().as_secs())
                    .unwrap_or(0);
                warn!(
                    waited_s = waited,
                    "the agent cannot be reached; the room is told its message waits"
                );
                turn.outages += 1;
                let txn =
                    render::notice_txn_id(&format!("{}#{}", turn.turn, turn.outages), purpose);
                let content = turn.target.notice(&text);
                self.post_as(turn, content, purpose, txn).await;
            }
            Step::Notice { text, purpose } => {
                if purpose == Purpose::TurnFailed {
                    warn!(notice = %text, "turn did not complete");
                }
                self.post_notice(turn, &text, purpose).await;
            }
            Step::SendFile(f) => self.send_file(turn, f).await,
            Step::Approval(r) => self.approval(turn, r).await,
            Step::Ask(q) => self.ask(turn, q).await,
            Step::Recover => {
                clock.recovering = Some(tokio::time::Instant::now() + RECOVERY_IDLE_TIMEOUT);
            }
            Step::Resume => clock.recovering = None,
            Step::Cancel { by } => {
                info!(by = %by, "stop asked for: the agent is told to cancel the turn");
                self.link.send(ToAgent::Cancel(Cancel {
                    turn: turn.turn.clone(),
                }));
            }
            Step::Stray(m) => self.answer_stray(&m),
            Step::AgentError(e) => warn!(error = %e, "agent error"),
            Step::Finish(outcome) => return Some(outcome),
        }
        None
    }

    /// Posts answer text (in as many messages as it takes). An answer shown while it was
    /// written (now, or before a restart) has its message edited to the first part instead.
    async fn answer(&self, turn: &mut Turn, text: &str) {
        let index = turn.out_index;
        let live = match turn.live.event_id.take() {
            Some(id) => Some(id),
            None => self
                .ctx
                .journal
                .posted_event(render::live_txn_id(&turn.turn, index).as_str())
                .unwrap_or_else(|e| {
                    warn!(error = %e, "journal lookup failed");
                    None
                }),
        };
        turn.live.reset();
        turn.live_text.clear();
        let mut parts = turn.target.markdown_parts(text).into_iter();
        if let Some(id) = live.and_then(|id| EventId::parse(id).ok()) {
            let Some(first) = parts.next() else { return };
            turn.out_index += 1;
            let edit = RoomMessageEventContentWithoutRelation::new(first.msgtype)
                .make_replacement(ReplacementMetadata::new(id, None));
            let txn = render::final_edit_txn_id(&turn.turn, index);
            self.post_as(turn, edit, Purpose::AnswerFinal, txn).await;
        }
        for content in parts {
            self.post(turn, content, Purpose::Answer).await;
        }
    }

    /// More answer text arrived: shows it, when streaming is on and it is time (see
    /// [`live::next`]).
    async fn progress(&self, turn: &mut Turn, text: &str) {
        let interval = self.ctx.config.stream_interval.filter(|_| turn.streaming);
        let Some(pace) = interval else { return };
        let now = tokio::time::Instant::now();
        turn.live.text_at(now);
        let text = text.trim();
        let chars = text.chars().count();
        let step = live::next(&turn.live, now, chars, interval);
        let shown = format!("{}{}", render::first_part(text), live::WRITING);
        match step {
            LiveStep::Wait => {}
            LiveStep::Post => {
                let txn = render::live_txn_id(&turn.turn, turn.out_index);
                let content = live::Marked(turn.target.markdown(&shown));
                let id = self.post_as(turn, content, Purpose::AnswerLive, txn).await;
                if let Some(id) = &id {
                    self.handle.live_posted(id.as_str());
                }
                turn.live.event_id = id.map(|id| id.to_string());
                turn.live.shown(now, chars, pace, None);
                turn.live_text = shown;
            }
            LiveStep::Edit if shown == turn.live_text => turn.live.shown(now, chars, pace, None),
            LiveStep::Edit => {
                let Some(id) = turn
                    .live
                    .event_id
                    .as_deref()
                    .and_then(|id| EventId::parse(id).ok())
                else {
                    return;
                };
                let edit = RoomMessageEventContentWithoutRelation::new(
                    render::safe_markdown(&shown).msgtype,
                )
                .make_replacement(ReplacementMetadata::new(id, None));
                let posting = turn.progress.posting();
                let wait = send::try_once(&self.room, live::Marked(edit), Purpose::AnswerProgress)
                    .await
                    .err();
                drop(posting);
                turn.live.edited();
                turn.live.shown(now, chars, pace, wait.flatten());
                turn.live_text = shown;
            }
        }
    }

    async fn post_notice(
        &self,
        turn: &mut Turn,
        text: &str,
        purpose: Purpose,
    ) -> Option<OwnedEventId> {
        let content = turn.target.notice(text);
        self.post(turn, content, purpose).await
    }

    async fn post(
        &self,
        turn: &mut Turn,
        content: RoomMessageEventContent,
        purpose: Purpose,
    ) -> Option<OwnedEventId> {
        let txn = render::txn_id(&turn.turn, turn.out_index);
        turn.out_index += 1;
        self.post_as(turn, content, purpose, txn).await
    }

    async fn post_as<C>(
        &self,
        turn: &mut Turn,
        content: C,
        purpose: Purpose,
        txn: OwnedTransactionId,
    ) -> Option<OwnedEventId>
    where
        C: MessageLikeEventContent + serde::Serialize + Clone,
    {
        if purpose != Purpose::File {
            // A file's post waits for its upload, which is not latency.
            crate::latency::agent_to_send(turn.since.into_std());
        }
        let target = turn.target.clone();
        let out = Outgoing {
            txn: &txn,
            thread_root: Some(target.root()),
            about: Some(&target.event_id),
            purpose,
        };
        let posting = turn.progress.posting();
        let posted = send::post(&self.ctx, &self.room, content, out).await;
        drop(posting);
        match posted {
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
                info!(error = %e, %purpose, txn_id = %txn, "not posting a parked message again");
                None
            }
            Err(e) => {
                error!(error = %e, %purpose, txn_id = %txn, "could not post to the room");
                None
            }
        }
    }

    #[instrument(skip_all, fields(request_id = %f.request_id, path = %f.path))]
    async fn send_file(&self, turn: &mut Turn, f: SendFile) {
        let ctx = &self.ctx;
        let scope = ChatScope::new(self.chat.chat_id.clone(), self.chat.room_id.as_str());
        let posting = media::Posting {
            caption: f.caption.as_deref(),
            voice: f.voice,
        };
        let result = ctx.prepare_file(&f.path, &scope, posting).await;
        let delivery = match result {
            Ok(content) => {
                let content = turn.target.apply(content);
                // Keyed by the request: an agent that runs the turn's request again after a crash
                // gets the first post's event, and the room sees the file once.
                let txn = render::file_txn_id(&turn.turn, &f.request_id);
                match self.post_as(turn, content, Purpose::File, txn).await {
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
                crate::metrics::media_failure("out");
                warn!(
                    room_id = %self.chat.room_id,
                    path = %f.path,
                    reason = %e.failure,
                    refused = e.is_refused(),
                    "file not sent"
                );
                let user_error = e.user_message();
                self.post_notice(turn, &format!("⚠️ {user_error}"), Purpose::FileFailed)
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
            room_id: self.chat.room_id.to_string(),
            user_id: turn.user.clone(),
            turn: turn.turn.clone(),
            id: r.request_id.clone(),
            extra_request_ids: Vec::new(),
            approval: Some((r.tool.clone(), r.resource.clone())),
            link: self.link.clone(),
            prompt_event: None,
        });
        // Reactions arrive unencrypted, and an encrypted room acts only on encrypted events: no
        // answers to tap there.
        let encrypted = self.room.encryption_state().is_encrypted();
        let text = render::approval_prompt(&r, &turn.user, encrypted);
        let content = prompts::with_mention(turn.target.markdown(&text), &turn.user);
        if let Some(prompt) = self.post(turn, content, Purpose::Approval).await {
            turn.progress.awaiting_user();
            waits.set_prompt_event(&r.request_id, prompt.as_str());
            if !encrypted {
                prompts::seed_reactions(&self.ctx, &self.room, &prompt).await;
            }
        }
        self.spawn_timeout(turn, r.request_id, true);
    }

    #[instrument(skip_all, fields(question_id = %q.question_id))]
    async fn ask(&self, turn: &mut Turn, q: AskUser) {
        self.ctx.waits.add(Wait {
            room_id: self.chat.room_id.to_string(),
            user_id: turn.user.clone(),
            turn: turn.turn.clone(),
            id: q.question_id.clone(),
            extra_request_ids: Vec::new(),
            approval: None,
            link: self.link.clone(),
            prompt_event: None,
        });
        let text = render::question_prompt(&q, &turn.user);
        let content = prompts::with_mention(turn.target.markdown(&text), &turn.user);
        if let Some(prompt) = self.post(turn, content, Purpose::Question).await {
            turn.progress.awaiting_user();
            self.ctx
                .waits
                .set_prompt_event(&q.question_id, prompt.as_str());
        }
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
                let decided = ctx.waits.decide(&id, ApprovalChoice::Deny, &user);
                if let Some(w) = &decided {
                    prompts::show_outcome(&ctx, w, ApprovalChoice::Deny, &user);
                }
                decided.is_some()
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
                purpose: Purpose::Timeout,
            };
            if let Err(e) = send::post(&ctx, &room, target.notice(text), out).await {
                warn!(error = %e, "could not post the timeout notice");
            }
        });
    }
}
