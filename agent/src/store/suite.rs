//! One suite of cases every chat-record backend passes: each case runs against the file log and
//! against PostgreSQL (`MXBRIDGE_TEST_DATABASE_URL`, which the test command sets).

use std::collections::BTreeMap;

use protocol::{ChatId, Sender, UserMessage, WorkspacePath};

use super::admission::{Admission, MAX_SEQ_AHEAD};
use super::{
    AnyChat, Backend, Begun, ChatRecord, Perceived, RECENT_TURNS, Step, Store, TurnEnd, TurnStatus,
};
use crate::db::test_database;

/// A backend of each kind (the file one in `dir`); PostgreSQL only when there is a test server.
async fn backends(dir: &std::path::Path) -> Vec<Backend> {
    let mut all = vec![Backend::Files(Store::open(dir).unwrap())];
    if let Some(db) = test_database().await {
        all.push(Backend::postgres(db));
    }
    all
}

/// Runs `case` against every backend, with a reopen function (a fresh handle on the same data,
/// as after a restart).
macro_rules! each_backend {
    (|$backend:ident| $body:expr) => {{
        let dir = tempfile::tempdir().unwrap();
        for $backend in backends(dir.path()).await {
            $body;
        }
    }};
}

fn chat() -> ChatId {
    ChatId::new("c1").unwrap()
}

pub(super) fn message(seq: u64, id: &str) -> UserMessage {
    UserMessage {
        seq,
        id: id.into(),
        room_id: "!r:x".into(),
        thread_root: None,
        sender: Sender {
            user_id: "@a:b".into(),
            display_name: None,
        },
        text: format!("text {seq}"),
        attachments: vec![WorkspacePath::new("chats/c1/a").unwrap()],
        attachment_info: BTreeMap::new(),
        context: vec![],
        timestamp_ms: seq,
        settings: None,
    }
}

pub(super) fn end(id: &str, output: &str) -> TurnEnd {
    TurnEnd {
        id: id.into(),
        status: TurnStatus::Completed,
        output: output.into(),
        sent_files: vec![],
        error: None,
        perceived: BTreeMap::new(),
    }
}

fn open(backend: &Backend) -> AnyChat {
    backend.load(&chat()).unwrap()
}

#[tokio::test]
async fn admission_by_id_survives_reopening() {
    each_backend!(|backend| {
        let mut c = open(&backend);
        assert_eq!(c.last_seq().await.unwrap(), 0);
        for seq in 1..=3 {
            let id = format!("${seq}");
            assert_eq!(c.admit(&message(seq, &id)).await.unwrap(), Admission::New);
        }
        assert_eq!(
            c.admit(&message(2, "$2")).await.unwrap(),
            Admission::Duplicate
        );
        let far = message(3 + MAX_SEQ_AHEAD + 1, "$far");
        assert!(matches!(
            c.admit(&far).await.unwrap(),
            Admission::Refused(_)
        ));
        // A new id with an old seq is stored; last_seq stays.
        assert_eq!(c.admit(&message(1, "$late")).await.unwrap(), Admission::New);
        let mut c = open(&backend);
        assert_eq!(c.last_seq().await.unwrap(), 3);
        assert_eq!(c.pending().await.unwrap(), ["$1", "$2", "$3", "$late"]);
        assert!(
            c.turn("$far").await.unwrap().is_none(),
            "refused: not stored"
        );
        assert_eq!(
            c.admit(&message(3, "$3")).await.unwrap(),
            Admission::Duplicate
        );
    });
}

#[tokio::test]
async fn a_turn_begins_with_its_history_and_ends_once() {
    each_backend!(|backend| {
        let mut c = open(&backend);
        let last = RECENT_TURNS as u64 + 5;
        for seq in 1..=last {
            c.admit(&message(seq, &format!("${seq}"))).await.unwrap();
        }
        c.finish(end("$1", "one")).await.unwrap();
        assert!(c.begin("$1").await.unwrap().is_none(), "finished");
        let mut c = open(&backend);
        let Begun {
            turn,
            history,
            room_id: room,
            steps,
        } = c.begin(&format!("${last}")).await.unwrap().unwrap();
        assert!(steps.is_empty());
        assert_eq!(turn.text, format!("text {last}"));
        assert_eq!(room.as_deref(), Some("!r:x"));
        assert_eq!(history.earlier, last as usize - 1);
        assert_eq!(history.attachments, last as usize - 1);
        assert_eq!(history.recent.len(), RECENT_TURNS);
        assert_eq!(history.recent[RECENT_TURNS - 1].seq, last - 1);
        let history = c.begin("$2").await.unwrap().unwrap().history;
        assert_eq!(history.recent[0].output, "one");
        assert_eq!(history.recent[0].status, TurnStatus::Completed);
        let done = c.turn("$1").await.unwrap().unwrap();
        assert_eq!(
            (done.status, done.output.as_str()),
            (TurnStatus::Completed, "one")
        );
    });
}

#[tokio::test]
async fn what_was_perceived_stays_through_the_end() {
    each_backend!(|backend| {
        let mut c = open(&backend);
        c.admit(&message(1, "$1")).await.unwrap();
        let path = WorkspacePath::new("chats/c1/a").unwrap();
        let heard = BTreeMap::from([(
            path,
            Perceived::Heard {
                text: "hello there".into(),
            },
        )]);
        c.perceive("$1", heard.clone()).await.unwrap();
        assert_eq!(c.pending().await.unwrap(), ["$1"], "still pending");
        let mut c = open(&backend);
        assert_eq!(c.begin("$1").await.unwrap().unwrap().turn.perceived, heard);
        c.finish(end("$1", "done")).await.unwrap();
        let mut c = open(&backend);
        let turn = c.turn("$1").await.unwrap().unwrap();
        assert_eq!(turn.perceived, heard, "the end kept it");
        assert!(c.pending().await.unwrap().is_empty());
        // An unknown turn is nobody's business.
        c.finish(end("$nope", "x")).await.unwrap();
        assert!(c.turn("$nope").await.unwrap().is_none());
    });
}

/// A NUL typed in a message, written by a model or read from a file is stored: PostgreSQL
/// (whose `jsonb` refuses it) keeps U+FFFD in its place, so the chat never stalls behind it.
#[tokio::test]
async fn text_holding_a_nul_is_stored_and_the_chat_goes_on() {
    each_backend!(|backend| {
        let files = matches!(backend, Backend::Files(_));
        let kept = |s: &str| {
            if files {
                s.to_owned()
            } else {
                s.replace('\0', "\u{FFFD}")
            }
        };
        let mut c = open(&backend);
        let mut msg = message(1, "$1");
        msg.text = "before\0after".into();
        assert_eq!(c.admit(&msg).await.unwrap(), Admission::New);
        let step = Step::Tool {
            name: "read_file".into(),
            arguments: "{}".into(),
            ok: true,
            output: "bin\0ary".into(),
            sent_file: None,
            picture: None,
        };
        c.record_step("$1", 0, &step).await.unwrap();
        let begun = c.begin("$1").await.unwrap().unwrap();
        assert_eq!(begun.turn.text, kept("before\0after"));
        let Step::Tool { output, .. } = &begun.steps[0] else {
            panic!("{:?}", begun.steps)
        };
        assert_eq!(output, &kept("bin\0ary"));
        c.finish(end("$1", "said \0 this")).await.unwrap();
        assert_eq!(c.admit(&message(2, "$2")).await.unwrap(), Admission::New);
        let history = c.begin("$2").await.unwrap().unwrap().history;
        assert_eq!(history.recent[0].output, kept("said \0 this"));
        // A typed backslash-u-0000 is text, kept as it is.
        let mut msg = message(3, "$3");
        msg.text = r"\u0000".into();
        c.admit(&msg).await.unwrap();
        assert_eq!(c.turn("$3").await.unwrap().unwrap().text, r"\u0000");
    });
}

fn outputs(turns: &[super::TurnRecord]) -> Vec<String> {
    turns.iter().map(|t| t.output.clone()).collect()
}

/// Turns run one after the other each see every earlier answer in their history (the database's
/// record holds the last ended turns instead of reading them again, `store::recent`), also what
/// was perceived while a turn ran, a turn another agent admitted and ran in between, and one
/// cancelled while it waited.
#[tokio::test]
async fn turns_run_one_after_the_other_see_every_earlier_answer() {
    each_backend!(|backend| {
        let mut a = open(&backend);
        let runs = RECENT_TURNS as u64 + 3;
        for seq in 1..=runs {
            let id = format!("${seq}");
            a.admit(&message(seq, &id)).await.unwrap();
            let begun = a.begin(&id).await.unwrap().unwrap();
            let from = seq.saturating_sub(RECENT_TURNS as u64).max(1);
            let expected: Vec<String> = (from..seq).map(|s| format!("answer {s}")).collect();
            assert_eq!(outputs(&begun.history.recent), expected, "turn {seq}");
            assert_eq!(begun.history.earlier, seq as usize - 1);
            if seq == runs {
                let heard = BTreeMap::from([(
                    WorkspacePath::new("chats/c1/a").unwrap(),
                    Perceived::Heard { text: "hi".into() },
                )]);
                a.perceive(&id, heard).await.unwrap();
            }
            a.finish(end(&id, &format!("answer {seq}"))).await.unwrap();
        }
        // Another agent admits and runs the next turn (a state directory has one owner: there
        // the same handle does).
        let mut other = match &backend {
            Backend::Postgres(_) => Some(open(&backend)),
            Backend::Files(_) => None,
        };
        let b = other.as_mut().unwrap_or(&mut a);
        let (elsewhere, cancelled, next) = (runs + 1, runs + 2, runs + 3);
        b.admit(&message(elsewhere, "$elsewhere")).await.unwrap();
        b.begin("$elsewhere").await.unwrap().unwrap();
        b.finish(end("$elsewhere", "ran elsewhere")).await.unwrap();
        // One is cancelled before it runs; the next one sees both.
        a.admit(&message(cancelled, "$cancelled")).await.unwrap();
        let mut gone = end("$cancelled", "");
        gone.status = TurnStatus::Cancelled;
        a.finish(gone).await.unwrap();
        a.admit(&message(next, "$next")).await.unwrap();
        let history = a.begin("$next").await.unwrap().unwrap().history;
        assert_eq!(history.earlier, next as usize - 1);
        let n = history.recent.len();
        assert_eq!(n, RECENT_TURNS);
        assert_eq!(
            outputs(&history.recent[n - 3..]),
            [
                format!("answer {runs}"),
                "ran elsewhere".into(),
                String::new()
            ]
        );
        assert_eq!(history.recent[n - 1].status, TurnStatus::Cancelled);
        assert_eq!(
            history.recent[n - 3].perceived.len(),
            1,
            "what was perceived while it ran"
        );
    });
}

#[tokio::test]
async fn approvals_are_remembered_per_user() {
    each_backend!(|backend| {
        let mut c = open(&backend);
        let key = ("t".to_owned(), "r".to_owned());
        assert!(!c.is_always_allowed("@a:x", &key).await.unwrap());
        c.allow_always("@a:x", key.clone()).await.unwrap();
        c.allow_always("@a:x", key.clone()).await.unwrap();
        let mut c = open(&backend);
        assert!(c.is_always_allowed("@a:x", &key).await.unwrap());
        assert!(
            !c.is_always_allowed("@b:x", &key).await.unwrap(),
            "per user"
        );
        let other = ("t".to_owned(), "other".to_owned());
        assert!(!c.is_always_allowed("@a:x", &other).await.unwrap());
    });
}

/// An approval whose resource holds U+0000 (a model's tool arguments can): the file store
/// remembers it; PostgreSQL's text cannot hold it, so it is refused there with a reason and never
/// found (asked again), never stored as another resource that would then be allowed too.
#[tokio::test]
async fn an_approval_holding_a_nul_is_remembered_or_refused_never_merged() {
    each_backend!(|backend| {
        let mut c = open(&backend);
        let nul = ("t".to_owned(), "a\0b".to_owned());
        let look_alike = ("t".to_owned(), "a\u{FFFD}b".to_owned());
        let stored = c.allow_always("@a:x", nul.clone()).await;
        match &backend {
            Backend::Files(_) => {
                stored.unwrap();
                assert!(c.is_always_allowed("@a:x", &nul).await.unwrap());
            }
            Backend::Postgres(_) => {
                let e = stored.unwrap_err().to_string();
                assert!(e.contains("U+0000") && e.contains("asked for again"), "{e}");
                assert!(!c.is_always_allowed("@a:x", &nul).await.unwrap());
            }
        }
        assert!(!c.is_always_allowed("@a:x", &look_alike).await.unwrap());
        // The chat's other approvals are unaffected.
        let plain = ("t".to_owned(), "ab".to_owned());
        c.allow_always("@a:x", plain.clone()).await.unwrap();
        assert!(c.is_always_allowed("@a:x", &plain).await.unwrap());
    });
}

/// Agents racing with one message store it once (the database decides; a file log has one
/// owner, whose chat lock orders its admissions).
#[tokio::test]
async fn racing_admissions_of_one_message_store_it_once() {
    let Some(db) = test_database().await else {
        return;
    };
    let backend = Backend::postgres(db);
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let mut c = open(&backend);
            tokio::spawn(async move { c.admit(&message(1, "$same")).await.unwrap() })
        })
        .collect();
    let mut new = 0;
    for t in tasks {
        if t.await.unwrap() == Admission::New {
            new += 1;
        }
    }
    assert_eq!(new, 1);
    assert_eq!(open(&backend).pending().await.unwrap(), ["$same"]);
}

#[tokio::test]
async fn a_pending_turns_steps_are_kept_until_it_ends() {
    each_backend!(|backend| {
        let mut c = open(&backend);
        c.admit(&message(1, "$1")).await.unwrap();
        c.admit(&message(2, "$2")).await.unwrap();
        let brain = Step::Brain {
            data: serde_json::json!({"model_response": {"content": "hi", "calls": []}}),
        };
        let tool = Step::Tool {
            name: "write_file".into(),
            arguments: "{}".into(),
            ok: true,
            output: "wrote 4 bytes".into(),
            sent_file: None,
            picture: None,
        };
        c.record_step("$1", 0, &brain).await.unwrap();
        c.record_step("$1", 1, &tool).await.unwrap();
        // The first record of a step counts; an unknown turn has none.
        c.record_step("$1", 1, &brain).await.unwrap();
        c.record_step("$nope", 0, &brain).await.unwrap();
        let mut c = open(&backend);
        assert_eq!(c.steps("$1").await.unwrap(), [brain.clone(), tool.clone()]);
        // A turn begins with them (one read for the worker).
        let begun = c.begin("$1").await.unwrap().unwrap();
        assert_eq!(begun.steps, [brain.clone(), tool.clone()]);
        assert!(c.begin("$2").await.unwrap().unwrap().steps.is_empty());
        assert!(c.steps("$2").await.unwrap().is_empty());
        assert!(c.steps("$nope").await.unwrap().is_empty());
        c.finish(end("$1", "done")).await.unwrap();
        assert!(c.steps("$1").await.unwrap().is_empty(), "gone with its end");
        // An ended turn takes no more steps.
        c.record_step("$1", 2, &tool).await.unwrap();
        let mut c = open(&backend);
        assert!(c.steps("$1").await.unwrap().is_empty());
    });
}
