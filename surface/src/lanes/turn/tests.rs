//! The turn state machine's table tests.
use serde_json::json;

use super::*;

/// An agent message from its JSON (the wire format keeps these tests readable).
fn msg(v: serde_json::Value) -> Input {
    Input::Message(serde_json::from_value(v).unwrap())
}

fn text(t: &str) -> Input {
    msg(json!({"type": "text_chunk", "turn": "$t", "text": t}))
}

fn end(status: &str) -> Input {
    msg(json!({"type": "end", "turn": "$t", "status": status}))
}

fn notice(text: &str, purpose: Purpose) -> Step {
    Step::Notice {
        text: text.to_owned(),
        purpose,
    }
}

fn answer(t: &str) -> Step {
    Step::Answer(t.to_owned())
}

/// A case: name, whether tool calls are shown, inputs, and the steps for each input.
type Case = (&'static str, bool, Vec<Input>, Vec<Vec<Step>>);

/// Runs `inputs` through a fresh turn `$t` (seq 3) and returns every step, per input.
fn run(show_tools: bool, inputs: Vec<Input>) -> Vec<Vec<Step>> {
    let mut s = TurnState::new("$t", 3, show_tools, false);
    inputs.into_iter().map(|i| s.on(i)).collect()
}

fn stop_by(user: &str) -> Input {
    Input::StopRequested { by: user.into() }
}

fn ack(seq: u64, duplicate: bool) -> Input {
    msg(json!({"type": "ack", "seq": seq, "duplicate": duplicate}))
}

fn unreachable() -> Step {
    notice(UNREACHABLE_NOTICE, Purpose::AgentUnreachable)
}

#[test]
fn what_the_turn_waits_for() {
    let mut s = TurnState::new("$t", 3, false, false);
    assert_eq!(
        s.wait(),
        WaitsFor::Agent,
        "a new turn waits for the agent to take it"
    );
    s.on(ack(2, false));
    assert_eq!(
        s.wait(),
        WaitsFor::Agent,
        "another turn's ack is not this one's"
    );
    s.on(Input::Quiet);
    assert_eq!(s.wait(), WaitsFor::AgentTold, "told: no deadline any more");
    assert!(s.told());
    s.on(ack(3, false));
    assert_eq!(s.wait(), WaitsFor::News);
    assert!(!s.told(), "the agent took the turn: the outage is over");
    s.on(Input::Disconnected);
    assert_eq!(s.wait(), WaitsFor::Agent, "a dropped link is a new outage");
    s.on(Input::Connected { last_seq: 3 });
    assert_eq!(s.wait(), WaitsFor::News);

    let told = TurnState::new("$u", 4, false, true);
    assert_eq!(
        told.wait(),
        WaitsFor::AgentTold,
        "told in an earlier turn of this outage"
    );
    let mut told = told;
    assert_eq!(told.on(Input::Quiet), vec![], "and not told again");
    assert!(told.told(), "the next turn is not told either");
}

#[test]
fn table() {
    let send_file =
        json!({"type": "send_file", "turn": "$t", "request_id": "f1", "path": "chats/c/a.txt"});
    let approval = json!({"type": "approval_request", "turn": "$t", "request_id": "r1",
        "tool": "write_file", "resource": "a.txt", "summary": "write a.txt"});
    let ask = json!({"type": "ask_user", "turn": "$t", "question_id": "q1", "text": "Color?"});
    let cases: Vec<Case> = vec![
        (
            "text streams, then is posted at the end",
            false,
            vec![text("Hel"), text("lo "), end("completed")],
            vec![
                vec![Step::Progress],
                vec![Step::Progress],
                vec![answer("Hello"), Step::Finish(Outcome::Ended)],
            ],
        ),
        (
            "a stop while the agent has the turn: it cancels, the text so far is kept, marked",
            false,
            vec![
                ack(3, false),
                text("Once"),
                stop_by("@a:hs"),
                end("cancelled"),
            ],
            vec![
                vec![],
                vec![Step::Progress],
                vec![Step::Cancel { by: "@a:hs".into() }],
                vec![
                    answer(&format!("Once\n\n{STOPPED_MARK}")),
                    Step::Finish(Outcome::Stopped),
                ],
            ],
        ),
        (
            "a stop before the agent took the turn ends it here, the cancel still goes",
            false,
            vec![stop_by("@m:hs")],
            vec![vec![
                Step::Cancel { by: "@m:hs".into() },
                notice(STOPPED_NOTICE, Purpose::TurnStopped),
                Step::Finish(Outcome::Stopped),
            ]],
        ),
        (
            "a second stop asks nothing more",
            false,
            vec![
                ack(3, false),
                stop_by("@a:hs"),
                stop_by("@a:hs"),
                end("cancelled"),
            ],
            vec![
                vec![],
                vec![Step::Cancel { by: "@a:hs".into() }],
                vec![],
                vec![
                    notice(STOPPED_NOTICE, Purpose::TurnStopped),
                    Step::Finish(Outcome::Stopped),
                ],
            ],
        ),
        (
            "a turn that completes before the cancel arrives ends as usual",
            false,
            vec![
                ack(3, false),
                text("done"),
                stop_by("@a:hs"),
                end("completed"),
            ],
            vec![
                vec![],
                vec![Step::Progress],
                vec![Step::Cancel { by: "@a:hs".into() }],
                vec![answer("done"), Step::Finish(Outcome::Ended)],
            ],
        ),
        (
            "a failed turn says why",
            false,
            vec![text("partial"), end("failed")],
            vec![
                vec![Step::Progress],
                vec![
                    answer("partial"),
                    notice("⚠️ I could not finish this: failed", Purpose::TurnFailed),
                    Step::Finish(Outcome::Ended),
                ],
            ],
        ),
        (
            "a notice from the agent is posted in order; other custom updates are not",
            false,
            vec![
                text("so far"),
                msg(
                    json!({"type": "custom_update", "turn": "$t", "name": "notice",
                    "data": {"text": "🎤 voice message: “hello”"}}),
                ),
                msg(
                    json!({"type": "custom_update", "turn": "$t", "name": "progress",
                    "data": {"text": "not for the room"}}),
                ),
                msg(
                    json!({"type": "custom_update", "turn": "$other", "name": "notice",
                    "data": {"text": "another turn's"}}),
                ),
            ],
            vec![
                vec![Step::Progress],
                vec![
                    answer("so far"),
                    notice("🎤 voice message: “hello”", Purpose::AgentNotice),
                ],
                vec![],
                vec![],
            ],
        ),
        (
            "text before a file is posted before it",
            false,
            vec![text("here:"), msg(send_file.clone())],
            vec![
                vec![Step::Progress],
                vec![
                    answer("here:"),
                    Step::SendFile(serde_json::from_value(send_file.clone()).unwrap()),
                ],
            ],
        ),
        (
            "prompts flush text too",
            false,
            vec![text("need ok"), msg(approval.clone()), msg(ask.clone())],
            vec![
                vec![Step::Progress],
                vec![
                    answer("need ok"),
                    Step::Approval(serde_json::from_value(approval.clone()).unwrap()),
                ],
                vec![Step::Ask(serde_json::from_value(ask.clone()).unwrap())],
            ],
        ),
        (
            "whitespace alone is not posted",
            false,
            vec![text("  \n"), end("completed")],
            vec![vec![Step::Progress], vec![Step::Finish(Outcome::Ended)]],
        ),
        (
            "another turn's messages are ignored",
            false,
            vec![
                msg(json!({"type": "text_chunk", "turn": "$other", "text": "x"})),
                msg(json!({"type": "end", "turn": "$other", "status": "completed"})),
            ],
            vec![vec![], vec![]],
        ),
        (
            "tool calls are shown when asked, with their streamed arguments",
            true,
            vec![
                msg(
                    json!({"type": "tool_call_chunk", "turn": "$t", "call_id": "c1", "name": "list_files", "arguments": "{\"a\""}),
                ),
                msg(
                    json!({"type": "tool_call_chunk", "turn": "$t", "call_id": "c1", "name": "", "arguments": ":1}"}),
                ),
                msg(
                    json!({"type": "tool_result", "turn": "$t", "call_id": "c1", "ok": true, "output": "3 files"}),
                ),
            ],
            vec![
                vec![],
                vec![],
                vec![notice(
                    &render::tool_notice("list_files", "{\"a\":1}", true, "3 files"),
                    Purpose::Tool,
                )],
            ],
        ),
        (
            "tool calls are silent by default",
            false,
            vec![msg(
                json!({"type": "tool_result", "turn": "$t", "call_id": "c1", "ok": true, "output": "x"}),
            )],
            vec![vec![]],
        ),
        (
            "quiet agent: what was said is posted, then the timeout notice",
            false,
            vec![text("half"), Input::Quiet],
            vec![
                vec![Step::Progress],
                vec![
                    answer("half"),
                    notice(TIMEOUT_NOTICE, Purpose::TurnTimeout),
                    Step::Finish(Outcome::Timeout),
                ],
            ],
        ),
        (
            "a duplicate ack means the agent had the turn: recover, once",
            false,
            vec![
                msg(json!({"type": "ack", "seq": 3, "duplicate": true})),
                Input::Connected { last_seq: 3 },
                Input::Quiet,
            ],
            vec![
                vec![Step::Recover],
                vec![],
                vec![
                    notice(LOST_NOTICE, Purpose::TurnLost),
                    Step::Finish(Outcome::Lost),
                ],
            ],
        ),
        (
            "a reconnect that does not cover the turn changes nothing",
            false,
            vec![Input::Connected { last_seq: 2 }, Input::Disconnected],
            vec![vec![], vec![]],
        ),
        (
            "a turn run again after the link was down is not said twice",
            false,
            vec![
                msg(json!({"type": "ack", "seq": 3, "duplicate": false})),
                text("Once upon "),
                Input::Disconnected,
                Input::Connected { last_seq: 3 },
                text("Once upon a time."),
                end("completed"),
            ],
            vec![
                vec![],
                vec![Step::Progress],
                vec![],
                vec![Step::Recover],
                vec![Step::Resume, Step::Progress],
                vec![answer("Once upon a time."), Step::Finish(Outcome::Ended)],
            ],
        ),
        (
            "news about the turn ends recovery",
            false,
            vec![
                Input::Connected { last_seq: 5 },
                text("again"),
                end("completed"),
            ],
            vec![
                vec![Step::Recover],
                vec![Step::Resume, Step::Progress],
                vec![answer("again"), Step::Finish(Outcome::Ended)],
            ],
        ),
        (
            "an ack of another seq, or a fresh ack, is not news",
            false,
            vec![
                msg(json!({"type": "ack", "seq": 2, "duplicate": true})),
                msg(json!({"type": "ack", "seq": 3, "duplicate": false})),
            ],
            vec![vec![], vec![]],
        ),
        (
            "an agent that never takes the turn: the room is told once, the turn waits",
            false,
            vec![Input::Quiet, Input::Quiet, Input::Connected { last_seq: 2 }],
            vec![vec![unreachable()], vec![], vec![]],
        ),
        (
            "when the agent takes the turn after an outage, the answer comes as usual",
            false,
            vec![Input::Quiet, ack(3, false), text("hi"), end("completed")],
            vec![
                vec![unreachable()],
                vec![],
                vec![Step::Progress],
                vec![answer("hi"), Step::Finish(Outcome::Ended)],
            ],
        ),
        (
            "a link lost mid-turn is an outage too; its return covers the turn: recover",
            false,
            vec![
                text("half"),
                Input::Disconnected,
                Input::Quiet,
                Input::Connected { last_seq: 3 },
                Input::Quiet,
            ],
            vec![
                vec![Step::Progress],
                vec![],
                vec![unreachable()],
                vec![Step::Recover],
                vec![
                    answer("half"),
                    notice(LOST_NOTICE, Purpose::TurnLost),
                    Step::Finish(Outcome::Lost),
                ],
            ],
        ),
        (
            "recovery is extended by a reconnect after a drop, not by one without",
            false,
            vec![
                ack(3, true),
                Input::Connected { last_seq: 3 },
                Input::Disconnected,
                Input::Connected { last_seq: 3 },
            ],
            vec![vec![Step::Recover], vec![], vec![], vec![Step::Recover]],
        ),
        (
            "shutdown leaves the turn open",
            false,
            vec![text("x"), Input::Stop],
            vec![
                vec![Step::Progress],
                vec![Step::Finish(Outcome::Interrupted)],
            ],
        ),
        (
            "agent errors are reported",
            false,
            vec![msg(
                json!({"type": "error", "code": "bad_message", "message": "nope"}),
            )],
            vec![vec![Step::AgentError("BadMessage: nope".into())]],
        ),
    ];
    for (name, show, inputs, expected) in cases {
        assert_eq!(run(show, inputs), expected, "{name}");
    }
    assert!(Outcome::Ended.is_final() && Outcome::Lost.is_final());
    assert!(!Outcome::Interrupted.is_final());
}

#[test]
fn requests_for_another_turn_are_strays_and_refused_once_that_turn_is_over() {
    let wire = |v: serde_json::Value| -> ToSurface { serde_json::from_value(v).unwrap() };
    let file = wire(
        json!({"type": "send_file", "turn": "$old", "request_id": "send-$old-3",
                           "path": "chats/c/out.txt"}),
    );
    let approval = wire(
        json!({"type": "approval_request", "turn": "$old", "request_id": "a1",
                               "tool": "write_file", "resource": "x", "summary": "write x"}),
    );
    let question = wire(
        json!({"type": "ask_user", "turn": "$old", "question_id": "q1",
                               "text": "which one?"}),
    );
    // During `$t`, a request for `$old` is a stray, not this turn's.
    let steps = run(false, vec![Input::Message(file.clone())]);
    assert!(
        matches!(&steps[0][..], [Step::Stray(ToSurface::SendFile(_))]),
        "{steps:?}"
    );
    assert_eq!(request_turn(&file), Some("$old"));
    assert_eq!(
        request_turn(&wire(
            json!({"type": "text_chunk", "turn": "$t", "text": "x"})
        )),
        None
    );

    let table: [(&ToSurface, Option<&str>, Option<serde_json::Value>); 5] = [
        (
            &file,
            Some("ended"),
            Some(
                json!({"type": "delivery_result", "request_id": "send-$old-3", "ok": false,
                        "error": STRAY_REFUSAL}),
            ),
        ),
        (
            &approval,
            Some("stopped"),
            Some(
                json!({"type": "approval_decision", "request_id": "a1", "decision": "deny",
                        "by": "@bot:hs"}),
            ),
        ),
        (
            &question,
            Some("timeout"),
            Some(json!({"type": "answer", "question_id": "q1",
                        "text": format!("(no answer: {STRAY_REFUSAL})"), "by": "@bot:hs"})),
        ),
        // Not over (or unknown): nothing is said for it.
        (&file, None, None),
        (&question, None, None),
    ];
    for (m, outcome, expected) in table {
        let got = stray_reply(m, outcome, "@bot:hs").map(|r| serde_json::to_value(r).unwrap());
        assert_eq!(got, expected, "{m:?} {outcome:?}");
    }
}
