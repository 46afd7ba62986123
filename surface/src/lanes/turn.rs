//! One turn as a pure state machine: what the agent link says (and the idle deadline, and
//! shutdown) goes in, what to do in the room comes out. The lane executes the steps
//! (`lanes::effects`); this module decides them, and its table tests pin the rules: answer text
//! is posted before anything that follows it, a turn the agent already had waits only a fixed
//! time for news, a turn the agent cannot be reached for waits as long as it takes and says so
//! once per outage, and every way a turn ends is named.

use std::collections::HashMap;

use protocol::{
    Answer, ApprovalDecision, ApprovalRequest, AskUser, Decision, DeliveryResult, EndStatus,
    SendFile, ToAgent, ToSurface,
};

use crate::purpose::Purpose;
use crate::render;

/// What happened.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// The link (re)connected; the agent has stored every turn up to `last_seq`.
    Connected {
        /// From the agent's welcome.
        last_seq: u64,
    },
    /// The link dropped (it reconnects by itself).
    Disconnected,
    /// A message from the agent.
    Message(ToSurface),
    /// No news before the current deadline ([`TurnState::wait`] says which).
    Quiet,
    /// Shutdown, or the link is gone for good: the turn stays open and resumes after restart.
    Stop,
    /// Someone allowed to asked to stop the turn (`!stop`, ⏹️, or the message redacted).
    StopRequested {
        /// Who.
        by: String,
    },
}

/// What to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Post answer text (markdown; long text becomes several messages).
    Answer(String),
    /// More answer text arrived ([`TurnState::pending_text`]): show it if it is time.
    Progress,
    /// Post a notice in the turn's thread.
    Notice {
        /// The text.
        text: String,
        /// What it is, for the journal and the log.
        purpose: Purpose,
    },
    /// Upload and post a workspace file.
    SendFile(SendFile),
    /// Prompt the user for an approval.
    Approval(ApprovalRequest),
    /// Ask the user a question.
    Ask(AskUser),
    /// The agent had this turn before: from now on wait only a fixed time for news (a lost
    /// `end` must not block the chat). A reconnect extends that time only after the link was
    /// down (the agent resumes its unfinished turns on a new connection); a link that stays up
    /// does not.
    Recover,
    /// The agent is working on the turn: the normal idle deadline applies again.
    Resume,
    /// Tell the agent to cancel the turn.
    Cancel {
        /// Who asked, for the log.
        by: String,
    },
    /// A request (file, approval, question) for another turn than this one: answered by
    /// [`stray_reply`] when that turn is over.
    Stray(ToSurface),
    /// The agent reported an error (logged).
    AgentError(String),
    /// The turn is over.
    Finish(Outcome),
}

/// How a turn ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The agent ended it.
    Ended,
    /// The agent went quiet.
    Timeout,
    /// The agent had the turn, but its end never came (lost with a connection).
    Lost,
    /// Shutdown: not finished, resumed after the restart.
    Interrupted,
    /// Stopped on request: cancelled by the agent, or ended here while the agent did not have
    /// it (the cancel reaches it when it is back).
    Stopped,
}

impl Outcome {
    /// Whether the turn is done for the journal.
    pub fn is_final(self) -> bool {
        self != Self::Interrupted
    }

    /// How the journal and the metrics name it.
    pub fn label(self) -> &'static str {
        match self {
            Self::Ended => "ended",
            Self::Timeout => "timeout",
            Self::Lost => "lost",
            Self::Interrupted => "interrupted",
            Self::Stopped => "stopped",
        }
    }
}

/// What ends the kept part of a stopped answer.
pub const STOPPED_MARK: &str = "⏹️ *Stopped.*";
/// The notice of a turn stopped before it said anything.
pub const STOPPED_NOTICE: &str = "⏹️ Stopped.";

/// Text of the notice when the agent went quiet.
pub const TIMEOUT_NOTICE: &str = "⚠️ The agent did not finish answering this message.";
/// Text of the notice when the agent could not be reached for a while (once per outage).
pub const UNREACHABLE_NOTICE: &str = "⏳ I can't reach my agent right now; your message is saved \
                                      and will be answered when it is back.";
/// Text of the notice when a turn's end was lost.
pub const LOST_NOTICE: &str = "⚠️ I lost the connection to the agent while it was answering; \
                               the answer may be incomplete.";

/// What the turn waits for now, and so which deadline applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitsFor {
    /// The agent has the turn and the link is up: news within the idle (or recovery) time.
    News,
    /// The agent does not have the turn or the link is down: tell the room after the grace.
    Agent,
    /// As [`WaitsFor::Agent`], and the room was told in this outage: wait without a deadline (the
    /// message is in the journal; it is answered when the agent is back).
    AgentTold,
}

/// The state of one turn.
#[derive(Debug, Clone)]
pub struct TurnState {
    turn: String,
    seq: u64,
    show_tool_calls: bool,
    text: String,
    /// The link came back after it was down during the turn: the agent runs it again from the
    /// start and says its text again, so the text kept from before is replaced by the first
    /// new text (and posted as it is if none comes).
    said_before: bool,
    /// Tool calls being streamed: call id → (name, arguments so far).
    tool_calls: HashMap<String, (String, String)>,
    recovering: bool,
    /// The agent has the turn (its ack, a welcome that covers it, or news about it).
    accepted: bool,
    /// The link dropped and has not come back.
    link_down: bool,
    /// The room was told the agent cannot be reached, in this outage (it may have started in
    /// an earlier turn of the chat; it ends when the agent accepts a turn).
    told: bool,
    /// A stop was asked for (the agent was told to cancel).
    stopping: bool,
}

impl TurnState {
    /// A turn `turn` (the trigger's event id) stored as `seq`; `told`: the room was already told
    /// of the current outage (see [`TurnState::told`]).
    pub fn new(turn: impl Into<String>, seq: u64, show_tool_calls: bool, told: bool) -> Self {
        Self {
            turn: turn.into(),
            seq,
            show_tool_calls,
            text: String::new(),
            said_before: false,
            tool_calls: HashMap::new(),
            recovering: false,
            accepted: false,
            link_down: false,
            told,
            stopping: false,
        }
    }

    /// What the turn waits for now.
    pub fn wait(&self) -> WaitsFor {
        match (self.accepted && !self.link_down, self.told) {
            (true, _) => WaitsFor::News,
            (false, false) => WaitsFor::Agent,
            (false, true) => WaitsFor::AgentTold,
        }
    }

    /// Whether the room has been told of an outage that is not over (the chat's next turn
    /// starts with it).
    pub fn told(&self) -> bool {
        self.told
    }

    /// The steps `input` calls for.
    pub fn on(&mut self, input: Input) -> Vec<Step> {
        let mut steps = Vec::new();
        match input {
            Input::Stop => steps.push(Step::Finish(Outcome::Interrupted)),
            Input::StopRequested { .. } if self.stopping => {}
            Input::StopRequested { by } => {
                self.stopping = true;
                steps.push(Step::Cancel { by });
                // The agent does not have the turn now: it ends here; the cancel waits for the
                // link and reaches the agent before anything else of this chat.
                if self.wait() != WaitsFor::News {
                    self.stopped(&mut steps);
                }
            }
            Input::Quiet if self.wait() != WaitsFor::News => {
                if !self.told {
                    self.told = true;
                    steps.push(Step::Notice {
                        text: UNREACHABLE_NOTICE.to_owned(),
                        purpose: Purpose::AgentUnreachable,
                    });
                }
            }
            Input::Quiet => {
                self.flush(&mut steps);
                let (text, purpose, outcome) = if self.recovering {
                    (LOST_NOTICE, Purpose::TurnLost, Outcome::Lost)
                } else {
                    (TIMEOUT_NOTICE, Purpose::TurnTimeout, Outcome::Timeout)
                };
                steps.push(Step::Notice {
                    text: text.to_owned(),
                    purpose,
                });
                steps.push(Step::Finish(outcome));
            }
            Input::Disconnected => self.link_down = true,
            Input::Connected { last_seq } => {
                let was_down = std::mem::take(&mut self.link_down);
                if last_seq >= self.seq {
                    // The agent runs the turn again from its start and says its text again (a
                    // resumed turn replays what it had said): not kept twice.
                    self.said_before |= was_down && !self.text.is_empty();
                    self.accept();
                    if self.recovering && was_down {
                        steps.push(Step::Recover);
                    }
                    self.recover(&mut steps);
                }
            }
            Input::Message(m) => self.on_message(m, &mut steps),
        }
        steps
    }

    fn on_message(&mut self, m: ToSurface, steps: &mut Vec<Step>) {
        self.link_down = false;
        if turn_of(&m) == Some(self.turn.as_str()) {
            self.accept();
            if self.recovering {
                self.recovering = false;
                steps.push(Step::Resume);
            }
        }
        let mine = |t: &str| t == self.turn;
        match m {
            ToSurface::Ack(a) if a.seq == self.seq => {
                self.accept();
                if a.duplicate {
                    self.recover(steps);
                }
            }
            ToSurface::End(e) if mine(&e.turn) && e.status == EndStatus::Cancelled => {
                self.stopped(steps)
            }
            ToSurface::End(e) if mine(&e.turn) => {
                self.flush(steps);
                if e.status != EndStatus::Completed {
                    let why = e
                        .error
                        .unwrap_or_else(|| format!("{:?}", e.status).to_lowercase());
                    steps.push(Step::Notice {
                        text: format!("⚠️ I could not finish this: {why}"),
                        purpose: Purpose::TurnFailed,
                    });
                }
                steps.push(Step::Finish(Outcome::Ended));
            }
            ToSurface::TextChunk(t) if mine(&t.turn) => {
                if std::mem::take(&mut self.said_before) {
                    self.text.clear();
                }
                self.text.push_str(&t.text);
                steps.push(Step::Progress);
            }
            ToSurface::ToolCallChunk(c) if mine(&c.turn) => {
                let entry = self.tool_calls.entry(c.call_id).or_default();
                if !c.name.is_empty() {
                    entry.0 = c.name;
                }
                entry.1.push_str(&c.arguments);
            }
            ToSurface::ToolResult(r) if mine(&r.turn) => {
                let (name, args) = self.tool_calls.remove(&r.call_id).unwrap_or_default();
                if self.show_tool_calls {
                    self.flush(steps);
                    steps.push(Step::Notice {
                        text: render::tool_notice(&name, &args, r.ok, &r.output),
                        purpose: Purpose::Tool,
                    });
                }
            }
            ToSurface::SendFile(f) if mine(&f.turn) => {
                self.flush(steps);
                steps.push(Step::SendFile(f));
            }
            ToSurface::ApprovalRequest(r) if mine(&r.turn) => {
                self.flush(steps);
                steps.push(Step::Approval(r));
            }
            ToSurface::AskUser(q) if mine(&q.turn) => {
                self.flush(steps);
                steps.push(Step::Ask(q));
            }
            ToSurface::CustomUpdate(u) if mine(&u.turn) => {
                if let Some(text) = u.notice_text().map(str::trim).filter(|t| !t.is_empty()) {
                    self.flush(steps);
                    steps.push(Step::Notice {
                        text: text.to_owned(),
                        purpose: Purpose::AgentNotice,
                    });
                }
            }
            ToSurface::Error(e) => {
                steps.push(Step::AgentError(format!("{:?}: {}", e.code, e.message)))
            }
            m
            @ (ToSurface::SendFile(_) | ToSurface::ApprovalRequest(_) | ToSurface::AskUser(_)) => {
                steps.push(Step::Stray(m))
            }
            _ => {}
        }
    }

    /// The agent has the turn: an outage is over.
    fn accept(&mut self) {
        self.accepted = true;
        self.told = false;
    }

    /// Answer text not posted yet.
    pub fn pending_text(&self) -> &str {
        &self.text
    }

    fn recover(&mut self, steps: &mut Vec<Step>) {
        if !self.recovering {
            self.recovering = true;
            steps.push(Step::Recover);
        }
    }

    /// The turn ends stopped: what was said so far is kept, marked as stopped.
    fn stopped(&mut self, steps: &mut Vec<Step>) {
        let text = std::mem::take(&mut self.text);
        match text.trim() {
            "" => steps.push(Step::Notice {
                text: STOPPED_NOTICE.to_owned(),
                purpose: Purpose::TurnStopped,
            }),
            text => steps.push(Step::Answer(format!("{text}\n\n{STOPPED_MARK}"))),
        }
        steps.push(Step::Finish(Outcome::Stopped));
    }

    fn flush(&mut self, steps: &mut Vec<Step>) {
        let text = std::mem::take(&mut self.text);
        let text = text.trim();
        if !text.is_empty() {
            steps.push(Step::Answer(text.to_owned()));
        }
    }
}

/// What a turn's requests get once the turn is over.
pub const STRAY_REFUSAL: &str =
    "the turn this belongs to is over; nothing was posted and nobody was asked";

/// The answer to a request (file, approval, question) for a turn that is not running (pure):
/// when that turn is over (`outcome`, from the journal), a refusal at once, so the agent does
/// not wait out its timeout (600 s for a file); `None` for anything else, or a turn not over.
pub fn stray_reply(m: &ToSurface, outcome: Option<&str>, bot: &str) -> Option<ToAgent> {
    outcome?;
    Some(match m {
        ToSurface::SendFile(f) => ToAgent::DeliveryResult(DeliveryResult {
            request_id: f.request_id.clone(),
            ok: false,
            event_id: None,
            error: Some(STRAY_REFUSAL.to_owned()),
        }),
        ToSurface::ApprovalRequest(r) => ToAgent::ApprovalDecision(ApprovalDecision {
            request_id: r.request_id.clone(),
            decision: Decision::Deny,
            by: bot.to_owned(),
        }),
        ToSurface::AskUser(q) => ToAgent::Answer(Answer {
            question_id: q.question_id.clone(),
            text: format!("(no answer: {STRAY_REFUSAL})"),
            by: bot.to_owned(),
        }),
        _ => return None,
    })
}

/// The turn of a request (file, approval, question) from the agent.
pub fn request_turn(m: &ToSurface) -> Option<&str> {
    match m {
        ToSurface::SendFile(f) => Some(&f.turn),
        ToSurface::ApprovalRequest(r) => Some(&r.turn),
        ToSurface::AskUser(q) => Some(&q.turn),
        _ => None,
    }
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
        ToSurface::CustomUpdate(u) => Some(&u.turn),
        ToSurface::End(e) => Some(&e.turn),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
