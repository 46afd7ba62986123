//! The decoder against hostile input, fuzz-style but bounded (it runs in the test command):
//! a committed seed corpus of malicious frames plus proptest mutations of it and of valid
//! messages. Properties: decoding never panics; whatever decodes, encodes and decodes back to
//! the same value; a path that decodes is a valid `WorkspacePath`.

use std::path::Path;

use proptest::prelude::*;
use protocol::{ToAgent, ToSurface, peek_type};

/// Decodes `bytes` as both directions; says for each whether it decoded to a message the
/// receiver acts on (not an error, not `Unknown`). Panics only if a property is broken.
pub(crate) fn decode_both(bytes: &[u8]) -> (bool, bool) {
    let text = String::from_utf8_lossy(bytes);
    let _ = peek_type(&text);
    let agent = serde_json::from_slice::<ToAgent>(bytes);
    if let Ok(m) = &agent {
        let again: ToAgent = serde_json::from_str(&serde_json::to_string(m).unwrap()).unwrap();
        assert_eq!(&again, m, "round trip of {text}");
    }
    let surface = serde_json::from_slice::<ToSurface>(bytes);
    if let Ok(m) = &surface {
        let again: ToSurface = serde_json::from_str(&serde_json::to_string(m).unwrap()).unwrap();
        assert_eq!(&again, m, "round trip of {text}");
        if let ToSurface::SendFile(f) = m {
            assert!(protocol::WorkspacePath::new(f.path.as_str()).is_ok());
        }
    }
    (
        agent.is_ok_and(|m| m != ToAgent::Unknown),
        surface.is_ok_and(|m| m != ToSurface::Unknown),
    )
}

fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus/frames");
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

#[test]
fn the_seed_corpus_is_refused_or_decoded_safely() {
    let seeds = corpus();
    assert!(seeds.len() >= 10, "the committed corpus is there");
    // What must never decode: hostile paths and impossible numbers.
    for name in [
        "user_message_traversal.json",
        "user_message_overflow_seq.json",
        "send_file_absolute.json",
        "send_file_nul.json",
        "send_file_backslash.json",
        "bidi_path.json",
        "truncated.json",
        "not_utf8.json",
        "end_bad_status.json",
        "hello_wrong_types.json",
    ] {
        let (_, bytes) = seeds.iter().find(|(n, _)| n == name).unwrap();
        assert_eq!(decode_both(bytes), (false, false), "{name} must be refused");
    }
    for (name, bytes) in &seeds {
        let _ = decode_both(bytes);
        let _ = name;
    }
}

/// One random edit of `bytes`: flip, insert, delete or duplicate a span.
fn mutate(bytes: &[u8], op: u8, at: usize, val: u8, len: usize) -> Vec<u8> {
    let mut b = bytes.to_vec();
    if b.is_empty() {
        return vec![val];
    }
    let at = at % b.len();
    match op % 4 {
        0 => b[at] ^= val,
        1 => b.insert(at, val),
        2 => {
            let end = (at + len).min(b.len());
            b.drain(at..end);
        }
        _ => {
            let end = (at + len).min(b.len());
            let span = b[at..end].to_vec();
            b.splice(at..at, span);
        }
    }
    b
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn mutated_seeds_never_panic(
        seed in 0usize..64,
        edits in proptest::collection::vec((any::<u8>(), any::<usize>(), any::<u8>(), 0usize..16), 1..6),
    ) {
        let seeds = corpus();
        let (_, base) = &seeds[seed % seeds.len()];
        let mut bytes = base.clone();
        for (op, at, val, len) in edits {
            bytes = mutate(&bytes, op, at, val, len);
        }
        decode_both(&bytes);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        decode_both(&bytes);
    }

    #[test]
    fn any_json_object_with_a_known_type_never_panics(
        kind in prop::sample::select(vec![
            "hello", "user_message", "approval_decision", "answer", "delivery_result", "cancel",
            "welcome", "ack", "text_chunk", "tool_call_chunk", "tool_result", "custom_update",
            "send_file", "approval_request", "ask_user", "end", "error",
        ]),
        fields in proptest::collection::btree_map(
            prop::sample::select(vec![
                "seq", "id", "turn", "path", "text", "room_id", "sender", "attachments",
                "status", "request_id", "question_id", "decision", "protocol_version",
                "workspace_sentinel", "timestamp_ms", "context", "duplicate", "code",
            ]),
            prop_oneof![
                Just(serde_json::json!(null)),
                any::<i64>().prop_map(|n| serde_json::json!(n)),
                any::<u64>().prop_map(|n| serde_json::json!(n)),
                ".{0,40}".prop_map(|s| serde_json::json!(s)),
                Just(serde_json::json!(["../x", "/abs", "a\u{0}b"])),
                Just(serde_json::json!({"user_id": "@a:hs", "path": "..", "nonce": 1})),
            ],
            0..8,
        ),
    ) {
        let mut obj = serde_json::Map::new();
        obj.insert("type".into(), serde_json::json!(kind));
        for (k, v) in fields {
            obj.insert(k.into(), v);
        }
        decode_both(serde_json::to_vec(&obj).unwrap().as_slice());
    }
}
