//! JSON as PostgreSQL's `jsonb` can hold it. `jsonb` refuses the character U+0000 (so does
//! `text`), which a room member may type, a PDF's text may hold and a model may write. Refused,
//! a message could never be admitted and its chat would wait behind it for good; so PostgreSQL
//! keeps U+FFFD (the replacement character) in its place. The file store keeps it as it is.

use std::error::Error;

use bytes::{BufMut, BytesMut};
use serde::Serialize;
use serde_json::Value;
use tokio_postgres::types::{IsNull, ToSql, Type, to_sql_checked};

use super::StoreError;

/// What replaces U+0000.
const REPLACEMENT: char = '\u{FFFD}';

/// A value as a `jsonb` (or `json`) parameter, encoded once, U+0000 replaced.
pub(super) struct PgJson {
    json: Vec<u8>,
    scrubbed: bool,
}

impl PgJson {
    /// `value` as it will be stored.
    pub fn new<T: Serialize>(value: &T) -> Result<Self, StoreError> {
        let bad =
            |e: serde_json::Error| StoreError::Database(format!("cannot encode a record: {e}"));
        let json = serde_json::to_vec(value).map_err(bad)?;
        // Serialized once; the rare text holding the escape is serialized again, scrubbed (a
        // typed backslash followed by "u0000" matches too, and is written as it was).
        if !holds_nul_escape(&json) {
            return Ok(Self {
                json,
                scrubbed: false,
            });
        }
        let mut value = serde_json::to_value(value).map_err(bad)?;
        let scrubbed = scrub(&mut value);
        Ok(Self {
            json: serde_json::to_vec(&value).map_err(bad)?,
            scrubbed,
        })
    }

    /// Whether something was replaced: what is stored differs from the value given.
    pub fn scrubbed(&self) -> bool {
        self.scrubbed
    }
}

impl std::fmt::Debug for PgJson {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PgJson({} bytes)", self.json.len())
    }
}

impl ToSql for PgJson {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn Error + Sync + Send>> {
        if *ty == Type::JSONB {
            // The binary format's version.
            out.put_u8(1);
        }
        out.put_slice(&self.json);
        Ok(IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        matches!(*ty, Type::JSON | Type::JSONB)
    }

    to_sql_checked!();
}

/// Whether serialized JSON may hold U+0000 (serde_json writes it as `\u0000`).
fn holds_nul_escape(json: &[u8]) -> bool {
    json.windows(6).any(|w| w == br"\u0000")
}

/// `value` with every U+0000 in its strings and keys replaced; whether there was one.
fn scrub(value: &mut Value) -> bool {
    match value {
        Value::String(s) => replace_nul(s),
        Value::Array(items) => items.iter_mut().fold(false, |any, item| scrub(item) | any),
        Value::Object(map) => {
            let mut any = false;
            for (mut key, mut item) in std::mem::take(map) {
                any |= replace_nul(&mut key) | scrub(&mut item);
                map.insert(key, item);
            }
            any
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

fn replace_nul(s: &mut String) -> bool {
    if !s.contains('\0') {
        return false;
    }
    *s = s.replace('\0', &REPLACEMENT.to_string());
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn written(value: &Value) -> (String, bool) {
        let stored = PgJson::new(value).unwrap();
        let mut out = BytesMut::new();
        stored.to_sql(&Type::JSON, &mut out).unwrap();
        (String::from_utf8(out.to_vec()).unwrap(), stored.scrubbed())
    }

    #[test]
    fn nul_is_replaced_in_strings_and_keys_and_nothing_else_changes() {
        let cases = [
            (json!({"text": "plain"}), json!({"text": "plain"})),
            (json!({"text": "a\u{0}b"}), json!({"text": "a\u{FFFD}b"})),
            (
                json!(["\u{0}", {"k\u{0}": ["\u{0}\u{0}"]}]),
                json!(["\u{FFFD}", {"k\u{FFFD}": ["\u{FFFD}\u{FFFD}"]}]),
            ),
            // Typed as text, not the character: kept.
            (json!({"text": "\\u0000"}), json!({"text": "\\u0000"})),
            (json!({"n": 0, "b": null}), json!({"n": 0, "b": null})),
        ];
        for (given, stored) in cases {
            let (text, scrubbed) = written(&given);
            assert_eq!(
                serde_json::from_str::<Value>(&text).unwrap(),
                stored,
                "{given}"
            );
            assert_eq!(scrubbed, given != stored, "{given}");
        }
    }

    #[test]
    fn jsonb_gets_its_version_byte() {
        let mut out = BytesMut::new();
        PgJson::new(&"x")
            .unwrap()
            .to_sql(&Type::JSONB, &mut out)
            .unwrap();
        assert_eq!(&out[..], b"\x01\"x\"");
    }
}
