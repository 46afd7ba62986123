//! Bounded-time fuzzing (see `fuzzkit`) of the agent's admission against its real store: a
//! random run of user messages (ids from `tests/corpus/admission_ids.json` and mutations of
//! them, sequence numbers around every edge) is admitted, compared with a model, and the
//! store reopened must agree. Properties: an id runs at most once; an implausible `seq` is
//! refused and stores nothing; `last_seq` is the highest admitted `seq` and survives a restart.

use std::collections::BTreeMap;
use std::path::Path;

use agent::chat::{Admission, Chats, MAX_SEQ, MAX_SEQ_AHEAD};
use agent::store::{Backend, Store};
use protocol::{ChatId, Sender, UserMessage};

fn message(id: &str, seq: u64) -> UserMessage {
    UserMessage {
        seq,
        id: id.to_owned(),
        room_id: "!room:example.org".into(),
        thread_root: None,
        sender: Sender {
            user_id: "@alice:example.org".into(),
            display_name: None,
        },
        text: "hi".into(),
        attachments: vec![],
        attachment_info: BTreeMap::new(),
        context: vec![],
        timestamp_ms: 0,
        settings: None,
    }
}

/// What admission must decide, written from the rules rather than from the code.
#[derive(Default)]
struct Model {
    stored: Vec<String>,
    last_seq: u64,
}

impl Model {
    fn admit(&mut self, id: &str, seq: u64) -> &'static str {
        if self.stored.iter().any(|s| s == id) {
            return "duplicate";
        }
        if seq == 0 || seq > MAX_SEQ || seq > self.last_seq.saturating_add(MAX_SEQ_AHEAD) {
            return "refused";
        }
        self.stored.push(id.to_owned());
        self.last_seq = self.last_seq.max(seq);
        "new"
    }
}

#[test]
fn fuzz_admission() {
    let seeds = fuzzkit::seed_strings(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/admission_ids.json"),
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let chat_id = ChatId::new("fuzz").unwrap();
    let mut refused = 0u64;
    fuzzkit::run("admission", |u| {
        let dir = tempfile::tempdir().unwrap();
        let mut model = Model::default();
        let mut ids: Vec<String> = Vec::new();
        let messages = u.int_in_range(1..=10)?;
        let mut plan = Vec::new();
        for _ in 0..messages {
            let id = if !ids.is_empty() && u.ratio(1, 3)? {
                u.choose(&ids)?.clone()
            } else {
                let id = fuzzkit::mutate_text(u, &seeds)?;
                ids.push(id.clone());
                id
            };
            let last = model.last_seq;
            let seq = match u.int_in_range(0..=9u8)? {
                0 => 0,
                1 => last + 1,
                2 => last,
                3 => last.saturating_sub(1),
                4 => last + MAX_SEQ_AHEAD,
                5 => last + MAX_SEQ_AHEAD + 1,
                6 => MAX_SEQ,
                7 => MAX_SEQ + 1,
                8 => u64::MAX,
                _ => u.arbitrary()?,
            };
            let expected = model.admit(&id, seq);
            plan.push((id, seq, expected));
        }
        runtime.block_on(async {
            let chats = Chats::new(Backend::Files(Store::open(dir.path()).unwrap()));
            let chat = chats.chat(&chat_id).unwrap();
            for (id, seq, expected) in &plan {
                let got = match chat.admit(&message(id, *seq)).await.unwrap() {
                    Admission::New => "new",
                    Admission::Duplicate => "duplicate",
                    Admission::Refused(_) => "refused",
                };
                assert_eq!(got, *expected, "{id:?} seq {seq} in {plan:?}");
                if got == "refused" {
                    refused += 1;
                }
            }
            assert_eq!(chat.last_seq().await.unwrap(), model.last_seq, "{plan:?}");
            assert_eq!(
                chat.pending_turns().await.unwrap(),
                model.stored,
                "{plan:?}"
            );
            // What a restart finds.
            let again = Chats::new(Backend::Files(Store::open(dir.path()).unwrap()));
            let chat = again.chat(&chat_id).unwrap();
            assert_eq!(chat.last_seq().await.unwrap(), model.last_seq, "{plan:?}");
            assert_eq!(
                chat.pending_turns().await.unwrap(),
                model.stored,
                "{plan:?}"
            );
        });
        Ok(())
    });
    assert!(refused > 0, "the edges were reached");
}
