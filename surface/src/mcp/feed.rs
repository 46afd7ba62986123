//! What MCP clients read, decided without I/O: the resource URIs, a journaled message as the
//! JSON a client gets, and a tool's arguments checked.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::journal::{FeedRow, Stored};
use crate::media::MediaFields;

/// How many messages a read returns unless asked for fewer.
pub const DEFAULT_LIMIT: usize = 100;
/// The most a read returns.
pub const MAX_LIMIT: usize = 500;
/// How many messages the `last` resource shows.
pub const LAST_COUNT: usize = 20;

/// A resource the server offers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RoomUri {
    /// `matrix://room/<room_id>/last`: the latest messages; subscribable.
    Last(String),
    /// `matrix://room/<room_id>/since/<event_id>`: the messages strictly after an event.
    Since(String, String),
}

impl RoomUri {
    /// Parses a resource URI; the ids may be percent-encoded.
    pub fn parse(uri: &str) -> Option<Self> {
        let rest = uri.strip_prefix("matrix://room/")?;
        let parts: Vec<&str> = rest.split('/').collect();
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .ok()
                .map(|s| s.into_owned())
                .filter(|s| !s.is_empty())
        };
        match parts.as_slice() {
            [room, "last"] => Some(Self::Last(decode(room)?)),
            [room, "since", event] => Some(Self::Since(decode(room)?, decode(event)?)),
            _ => None,
        }
    }

    /// The room it is about.
    pub fn room(&self) -> &str {
        match self {
            Self::Last(r) | Self::Since(r, _) => r,
        }
    }
}

/// The `last` resource's URI of a room (the form notifications carry).
pub fn last_uri(room_id: &str) -> String {
    format!("matrix://room/{room_id}/last")
}

/// A journaled message as clients see it.
pub fn message(row: &FeedRow) -> Value {
    let mut m = json!({
        "event_id": row.event_id,
        "sender": row.sender,
        "display_name": row.sender_name,
        "ts": row.origin_ts,
    });
    if let Some(root) = &row.thread_root {
        m["thread_root"] = json!(root);
    }
    if row.undecryptable {
        m["undecryptable"] = json!(true);
        m["body"] = json!("");
        return m;
    }
    match &row.content {
        Some(Stored::Message(msg)) => {
            m["msgtype"] = json!(msg.msgtype());
            m["body"] = json!(msg.body());
            if let Some(file) = MediaFields::of(msg) {
                m["file"] = json!({
                    "name": file.filename.as_deref().unwrap_or(&file.body),
                    "mimetype": file.mimetype,
                    "size": file.size,
                });
            }
        }
        other => {
            m["msgtype"] = json!("m.text");
            m["body"] = json!(
                other
                    .as_ref()
                    .and_then(Stored::as_words)
                    .unwrap_or_default()
            );
        }
    }
    m["attachments"] = json!(row.attachments);
    m
}

/// A batch of messages and the watermark after it: the last message's event id, or `after`
/// when there is nothing new.
pub fn batch(rows: &[FeedRow], after: Option<&str>) -> Value {
    json!({
        "messages": rows.iter().map(message).collect::<Vec<_>>(),
        "upto_event_id": rows.last().map(|r| r.event_id.as_str()).or(after),
    })
}

/// The read limit a client asked for, within bounds.
pub fn limit(asked: Option<u64>) -> usize {
    asked.map_or(DEFAULT_LIMIT, |n| (n as usize).clamp(1, MAX_LIMIT))
}

/// The tools that post as the bot: offered and run only when `SURFACE_MCP_SEND` allows.
pub const POSTING_TOOLS: [&str; 2] = ["matrix.send", "matrix.send_file"];

/// Whether a client may call `tool` on this surface: `Err` says why not.
pub fn gate(tool: &str, may_send: bool) -> Result<(), String> {
    if POSTING_TOOLS.contains(&tool) && !may_send {
        Err(format!(
            "{tool} is switched off on this surface (SURFACE_MCP_SEND)"
        ))
    } else {
        Ok(())
    }
}

/// `matrix.read_since` arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadSince {
    /// The room (`!…`).
    pub room_id: String,
    /// Messages strictly after this event; omitted: from the start of what the surface has.
    pub after_event_id: Option<String>,
    /// At most this many (default 100, at most 500).
    pub limit: Option<u64>,
}

/// `matrix.set_read_marker` arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadMarker {
    /// The room.
    pub room_id: String,
    /// The event read up to.
    pub event_id: String,
}

/// `matrix.send` arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Send {
    /// The room.
    pub room_id: String,
    /// Markdown text.
    pub text: String,
    /// Post in this thread.
    pub thread_root: Option<String>,
    /// The same key posts once, however often the call is repeated.
    pub idempotency_key: Option<String>,
}

/// `matrix.send_file` arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SendFile {
    /// The room.
    pub room_id: String,
    /// The file: a path in the workspace the room may reach (its inbox or outbox).
    pub path: String,
    /// Post in this thread.
    pub thread_root: Option<String>,
    /// The same key posts once, however often the call is repeated.
    pub idempotency_key: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(content: Option<&str>) -> FeedRow {
        FeedRow {
            ord: 3,
            event_id: "$e".into(),
            sender: "@u:hs".into(),
            sender_name: Some("U".into()),
            origin_ts: 7,
            thread_root: None,
            content: Stored::load(Some("message"), content.map(str::to_owned)),
            undecryptable: content.is_none(),
            attachments: vec![],
        }
    }

    #[test]
    fn uris() {
        let cases: &[(&str, Option<RoomUri>)] = &[
            (
                "matrix://room/!a:hs/last",
                Some(RoomUri::Last("!a:hs".into())),
            ),
            (
                "matrix://room/%21a%3Ahs/last",
                Some(RoomUri::Last("!a:hs".into())),
            ),
            (
                "matrix://room/!a:hs/since/$ev",
                Some(RoomUri::Since("!a:hs".into(), "$ev".into())),
            ),
            ("matrix://room//last", None),
            ("matrix://room/!a:hs/since/", None),
            ("matrix://room/!a:hs", None),
            ("matrix://room/!a:hs/last/x", None),
            ("file:///etc/passwd", None),
            ("matrix://room/!a:hs/first", None),
        ];
        for (uri, want) in cases {
            assert_eq!(&RoomUri::parse(uri), want, "{uri}");
        }
    }

    #[test]
    fn messages_as_clients_see_them() {
        let text = message(&row(Some(r#"{"msgtype":"m.text","body":"hi"}"#)));
        assert_eq!(text["body"], "hi");
        assert_eq!(text["event_id"], "$e");
        assert_eq!(text["display_name"], "U");
        assert!(text.get("file").is_none());

        let mut with_file = row(Some(
            r#"{"msgtype":"m.image","body":"cap","filename":"a.png","url":"mxc://hs/a","info":{"mimetype":"image/png","size":5}}"#,
        ));
        with_file.attachments = vec!["surfaces/matrix/u/r/inbox/a.png".into()];
        let m = message(&with_file);
        assert_eq!(m["file"]["name"], "a.png");
        assert_eq!(m["file"]["size"], 5);
        assert_eq!(m["attachments"][0], "surfaces/matrix/u/r/inbox/a.png");

        let lost = message(&row(None));
        assert_eq!(lost["undecryptable"], true);

        let garbage = message(&row(Some("not json")));
        assert_eq!(garbage["body"], "");
    }

    #[test]
    fn posting_is_gated() {
        for (tool, may_send, ok) in [
            ("matrix.read_since", false, true),
            ("matrix.set_read_marker", false, true),
            ("matrix.send", false, false),
            ("matrix.send_file", false, false),
            ("matrix.send", true, true),
            ("matrix.send_file", true, true),
        ] {
            assert_eq!(gate(tool, may_send).is_ok(), ok, "{tool} {may_send}");
        }
        assert!(
            gate("matrix.send", false)
                .unwrap_err()
                .contains("SURFACE_MCP_SEND")
        );
    }

    #[test]
    fn batches_and_limits() {
        assert_eq!(batch(&[], Some("$w"))["upto_event_id"], "$w");
        assert!(batch(&[], None)["upto_event_id"].is_null());
        let b = batch(&[row(Some("{}"))], Some("$w"));
        assert_eq!(b["upto_event_id"], "$e");
        assert_eq!(b["messages"].as_array().map(Vec::len), Some(1));
        for (asked, want) in [(None, 100), (Some(0), 1), (Some(7), 7), (Some(10_000), 500)] {
            assert_eq!(limit(asked), want, "{asked:?}");
        }
    }
}
