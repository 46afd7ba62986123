//! Every wire message against literal JSON, in both directions.

#![allow(clippy::unwrap_used)] // test helpers outside #[test] fns

mod decode;
mod fuzz;

use std::collections::BTreeMap;

use protocol::*;
use serde::{Serialize, de::DeserializeOwned};
use serde_json::{Value, json};

/// `json` decodes to `value`, and `value` encodes to exactly `json`.
fn both_ways<T>(json: Value, value: T)
where
    T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let decoded: T = serde_json::from_value(json.clone()).expect("decodes");
    assert_eq!(decoded, value, "decoding {json}");
    assert_eq!(
        serde_json::to_value(&value).expect("encodes"),
        json,
        "encoding {value:?}"
    );
}

fn p(s: &str) -> WorkspacePath {
    WorkspacePath::new(s).unwrap()
}

#[test]
fn hello() {
    both_ways(
        json!({"type": "hello", "protocol_version": 1, "surface": "matrix",
               "workspace_sentinel": {"path": "surfaces/matrix/.sentinel/n1", "nonce": "n1"}}),
        ToAgent::Hello(Hello {
            protocol_version: 1,
            surface: "matrix".into(),
            workspace_sentinel: Some(Sentinel {
                path: p("surfaces/matrix/.sentinel/n1"),
                nonce: "n1".into(),
            }),
        }),
    );
}

#[test]
fn user_message_full_and_minimal() {
    let a = p("surfaces/matrix/@a%3Ahs/!r%3Ahs/inbox/20260101T000000Z-x1-cat.png");
    both_ways(
        json!({"type": "user_message", "seq": 7, "id": "$ev", "room_id": "!r:hs",
               "thread_root": "$root",
               "sender": {"user_id": "@a:hs", "display_name": "Alice"},
               "text": "look", "attachments": [a.as_str()],
               "attachment_info": {a.as_str(): {"name": "cat.png", "mime": "image/png", "size": 42}},
               "context": [{"id": "$c", "sender": {"user_id": "@b:hs"}, "text": "earlier",
                            "attachments": [], "timestamp_ms": 1}],
               "timestamp_ms": 2}),
        ToAgent::UserMessage(UserMessage {
            seq: 7,
            id: "$ev".into(),
            room_id: "!r:hs".into(),
            thread_root: Some("$root".into()),
            sender: Sender {
                user_id: "@a:hs".into(),
                display_name: Some("Alice".into()),
            },
            text: "look".into(),
            attachments: vec![a.clone()],
            attachment_info: BTreeMap::from([(
                a,
                AttachmentInfo {
                    name: "cat.png".into(),
                    mime: "image/png".into(),
                    size: 42,
                    ..Default::default()
                },
            )]),
            context: vec![ContextMessage {
                id: "$c".into(),
                sender: Sender {
                    user_id: "@b:hs".into(),
                    display_name: None,
                },
                text: "earlier".into(),
                attachments: vec![],
                timestamp_ms: 1,
            }],
            timestamp_ms: 2,
            settings: None,
        }),
    );
    both_ways(
        json!({"type": "user_message", "seq": 1, "id": "$e", "room_id": "!r:hs",
               "sender": {"user_id": "@a:hs"}, "text": "hi", "attachments": [], "timestamp_ms": 0}),
        ToAgent::UserMessage(UserMessage {
            seq: 1,
            id: "$e".into(),
            room_id: "!r:hs".into(),
            thread_root: None,
            sender: Sender {
                user_id: "@a:hs".into(),
                display_name: None,
            },
            text: "hi".into(),
            attachments: vec![],
            attachment_info: BTreeMap::new(),
            context: vec![],
            timestamp_ms: 0,
            settings: None,
        }),
    );
}

#[test]
fn user_message_with_escaping_attachment_is_refused_with_reason() {
    let err = serde_json::from_value::<ToAgent>(json!({
        "type": "user_message", "seq": 1, "id": "$e", "room_id": "!r", "sender": {"user_id": "@a"},
        "text": "", "attachments": ["../../etc/passwd"], "timestamp_ms": 0}))
    .unwrap_err();
    assert!(err.to_string().contains("`..`"), "{err}");
}

#[test]
fn approval_decision_each_value() {
    for (s, d) in [
        ("allow_once", Decision::AllowOnce),
        ("allow_always", Decision::AllowAlways),
        ("deny", Decision::Deny),
    ] {
        both_ways(
            json!({"type": "approval_decision", "request_id": "r1", "decision": s, "by": "@a:hs"}),
            ToAgent::ApprovalDecision(ApprovalDecision {
                request_id: "r1".into(),
                decision: d,
                by: "@a:hs".into(),
            }),
        );
    }
}

#[test]
fn answer() {
    both_ways(
        json!({"type": "answer", "question_id": "q1", "text": "blue", "by": "@a:hs"}),
        ToAgent::Answer(Answer {
            question_id: "q1".into(),
            text: "blue".into(),
            by: "@a:hs".into(),
        }),
    );
}

#[test]
fn delivery_result_ok_and_failed() {
    both_ways(
        json!({"type": "delivery_result", "request_id": "f1", "ok": true, "event_id": "$x"}),
        ToAgent::DeliveryResult(DeliveryResult {
            request_id: "f1".into(),
            ok: true,
            event_id: Some("$x".into()),
            error: None,
        }),
    );
    both_ways(
        json!({"type": "delivery_result", "request_id": "f1", "ok": false, "error": "file not found"}),
        ToAgent::DeliveryResult(DeliveryResult {
            request_id: "f1".into(),
            ok: false,
            event_id: None,
            error: Some("file not found".into()),
        }),
    );
}

#[test]
fn cancel() {
    both_ways(
        json!({"type": "cancel", "turn": "$t"}),
        ToAgent::Cancel(Cancel { turn: "$t".into() }),
    );
}

#[test]
fn welcome() {
    both_ways(
        json!({"type": "welcome", "protocol_version": 1, "agent": "agent", "agent_version": "0.1.0",
               "last_seq": 5,
               "workspace": {"surface_sentinel_ok": true,
                             "agent_sentinel": {"path": "chats/.sentinel/a1", "nonce": "a1"}}}),
        ToSurface::Welcome(Welcome {
            protocol_version: 1,
            agent: "agent".into(),
            agent_version: "0.1.0".into(),
            last_seq: 5,
            workspace: WorkspaceCheck {
                surface_sentinel_ok: Some(true),
                agent_sentinel: Some(Sentinel {
                    path: p("chats/.sentinel/a1"),
                    nonce: "a1".into(),
                }),
            },
            models: vec![],
        }),
    );
}

#[test]
fn ack_plain_and_duplicate() {
    both_ways(
        json!({"type": "ack", "seq": 3}),
        ToSurface::Ack(Ack {
            seq: 3,
            duplicate: false,
        }),
    );
    both_ways(
        json!({"type": "ack", "seq": 3, "duplicate": true}),
        ToSurface::Ack(Ack {
            seq: 3,
            duplicate: true,
        }),
    );
}

#[test]
fn text_chunk() {
    both_ways(
        json!({"type": "text_chunk", "turn": "$t", "text": "Hel"}),
        ToSurface::TextChunk(TextChunk {
            turn: "$t".into(),
            text: "Hel".into(),
        }),
    );
}

#[test]
fn tool_call_chunk() {
    both_ways(
        json!({"type": "tool_call_chunk", "turn": "$t", "call_id": "c1", "name": "list_files", "arguments": "{\"dir\""}),
        ToSurface::ToolCallChunk(ToolCallChunk {
            turn: "$t".into(),
            call_id: "c1".into(),
            name: "list_files".into(),
            arguments: "{\"dir\"".into(),
        }),
    );
}

#[test]
fn tool_result() {
    both_ways(
        json!({"type": "tool_result", "turn": "$t", "call_id": "c1", "ok": false, "output": "denied"}),
        ToSurface::ToolResult(ToolResult {
            turn: "$t".into(),
            call_id: "c1".into(),
            ok: false,
            output: "denied".into(),
        }),
    );
}

#[test]
fn custom_update() {
    both_ways(
        json!({"type": "custom_update", "turn": "$t", "name": "progress", "data": {"pct": 50}}),
        ToSurface::CustomUpdate(CustomUpdate {
            turn: "$t".into(),
            name: "progress".into(),
            data: json!({"pct": 50}),
        }),
    );
}

#[test]
fn send_file() {
    both_ways(
        json!({"type": "send_file", "turn": "$t", "request_id": "f1", "path": "chats/c/a.txt", "caption": "here"}),
        ToSurface::SendFile(SendFile {
            turn: "$t".into(),
            request_id: "f1".into(),
            path: p("chats/c/a.txt"),
            caption: Some("here".into()),
            voice: false,
        }),
    );
    assert!(
        serde_json::from_value::<ToSurface>(
            json!({"type": "send_file", "turn": "$t", "request_id": "f1", "path": "/etc/passwd"})
        )
        .is_err()
    );
}

#[test]
fn approval_request() {
    both_ways(
        json!({"type": "approval_request", "turn": "$t", "request_id": "a1", "tool": "write_file",
               "resource": "chats/c/x", "summary": "Write 3 bytes to chats/c/x"}),
        ToSurface::ApprovalRequest(ApprovalRequest {
            turn: "$t".into(),
            request_id: "a1".into(),
            tool: "write_file".into(),
            resource: "chats/c/x".into(),
            summary: "Write 3 bytes to chats/c/x".into(),
        }),
    );
}

#[test]
fn ask_user() {
    both_ways(
        json!({"type": "ask_user", "turn": "$t", "question_id": "q1", "text": "Which?", "options": ["a", "b"]}),
        ToSurface::AskUser(AskUser {
            turn: "$t".into(),
            question_id: "q1".into(),
            text: "Which?".into(),
            options: vec!["a".into(), "b".into()],
        }),
    );
}

#[test]
fn end_each_status() {
    both_ways(
        json!({"type": "end", "turn": "$t", "status": "completed"}),
        ToSurface::End(End {
            turn: "$t".into(),
            status: EndStatus::Completed,
            error: None,
        }),
    );
    both_ways(
        json!({"type": "end", "turn": "$t", "status": "cancelled"}),
        ToSurface::End(End {
            turn: "$t".into(),
            status: EndStatus::Cancelled,
            error: None,
        }),
    );
    both_ways(
        json!({"type": "end", "turn": "$t", "status": "failed", "error": "model unreachable"}),
        ToSurface::End(End {
            turn: "$t".into(),
            status: EndStatus::Failed,
            error: Some("model unreachable".into()),
        }),
    );
}

#[test]
fn error() {
    both_ways(
        json!({"type": "error", "code": "bad_message", "message": "expected value at line 1"}),
        ToSurface::Error(ErrorMsg {
            code: ErrorCode::BadMessage,
            message: "expected value at line 1".into(),
        }),
    );
    let e: ErrorMsg =
        serde_json::from_value(json!({"code": "from_the_future", "message": "m"})).unwrap();
    assert_eq!(e.code, ErrorCode::Other);
}

#[test]
fn unknown_types_decode_to_unknown_both_directions() {
    let frame = r#"{"type": "telepathy", "payload": [1, 2, 3]}"#;
    assert_eq!(
        serde_json::from_str::<ToAgent>(frame).unwrap(),
        ToAgent::Unknown
    );
    assert_eq!(
        serde_json::from_str::<ToSurface>(frame).unwrap(),
        ToSurface::Unknown
    );
    assert_eq!(peek_type(frame).as_deref(), Some("telepathy"));
    // A known type that is malformed is an error, not "unknown".
    assert!(serde_json::from_str::<ToSurface>(r#"{"type": "ack"}"#).is_err());
    assert!(serde_json::from_str::<ToAgent>(r#"{"no_type": 1}"#).is_err());
    assert!(serde_json::from_str::<ToAgent>(r#"[1]"#).is_err());
}

#[test]
fn versions_and_paths() {
    assert_eq!(PROTOCOL_VERSION, 1);
    let chat = ChatId::new("abc-r-0123").unwrap();
    assert_eq!(agent_ws_path(&chat), "/v1/agent_ws/abc-r-0123/");
    assert_eq!(chat_dir(&chat).as_str(), "chats/abc-r-0123");
}
