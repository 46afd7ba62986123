//! Memory tools: `remember`, `recall` and `forget`, over the agent's durable fact store
//! ([`crate::memory`]). A turn reaches two scopes: the memory of the user who started it and
//! that of the chat's Matrix room (the room, not the chat: a thread sees its room's facts).

use schemars::JsonSchema;
use serde::Deserialize;
use tracing::warn;

use super::{Tool, ToolCx, ToolError, ToolOutput, shorten};
use crate::confine::ChatScope;
use crate::memory::{Fact, MemoryError, Remembered, Scope, ScopeKind, matches, parse_id};

/// Most facts `recall` lists; more are counted, not shown.
const MAX_RECALLED: usize = 50;

/// Longest excerpt of a fact in an approval prompt.
const SUMMARY_CHARS: usize = 200;

/// Whose memory a fact goes to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum MemoryScope {
    // No doc comments on the variants: they would turn the schema's plain `enum` into a
    // `oneOf`, which some providers reject.
    #[default]
    User,
    Room,
}

impl MemoryScope {
    fn kind(self) -> ScopeKind {
        match self {
            Self::User => ScopeKind::User,
            Self::Room => ScopeKind::Room,
        }
    }
}

/// The approval resource of a scope: its kind, never its content.
fn resource_of(kind: ScopeKind) -> String {
    match kind {
        ScopeKind::User => "memory:user".to_owned(),
        ScopeKind::Room => "memory:room".to_owned(),
    }
}

/// The scope of `kind` this turn reaches: its user's, or its room's.
fn scope_for(kind: ScopeKind, cx: &ToolCx<'_>) -> Result<Scope, ToolError> {
    match kind {
        ScopeKind::User => Ok(Scope::User(cx.user.to_owned())),
        ScopeKind::Room => cx
            .ws
            .scope
            .room_id()
            .map(|room| Scope::Room(room.to_owned()))
            .ok_or_else(|| {
                ToolError::Failed("this chat's room is not known, so it has no room memory".into())
            }),
    }
}

/// A refusal is told as it is; a failing store is logged in full and told in general terms
/// (its message names the state directory).
fn tool_error(e: MemoryError) -> ToolError {
    if e.is_refusal() {
        ToolError::Failed(e.to_string())
    } else {
        warn!(error = %e, "memory store failed");
        ToolError::Failed("the memory store failed; the agent's log has the details".into())
    }
}

/// Remember a fact.
#[derive(Debug)]
pub struct Remember;

/// Arguments of `remember`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RememberArgs {
    /// The fact: one line of at most 1000 characters.
    pub fact: String,
    /// `user` (default): a fact about or for the person who sent the message, recalled only in
    /// their turns; `room`: a fact for everyone in this room.
    #[serde(default)]
    pub scope: MemoryScope,
}

impl Tool for Remember {
    const NAME: &'static str = "remember";
    const DESCRIPTION: &'static str = "Remember a fact durably, for the user who sent the message \
         (scope `user`, the default) or for everyone in this room (scope `room`). Returns the \
         fact's id (like `u3` or `r1`).";
    type Args = RememberArgs;

    fn resource(args: &Self::Args, _: &ChatScope) -> String {
        resource_of(args.scope.kind())
    }

    fn summary(args: &Self::Args, _: &ChatScope) -> String {
        let whose = match args.scope {
            MemoryScope::User => "your memory",
            MemoryScope::Room => "this room's memory",
        };
        format!(
            "The agent wants to keep in {whose}: {}",
            shorten(args.fact.trim(), SUMMARY_CHARS)
        )
    }

    async fn call(args: Self::Args, cx: &ToolCx<'_>) -> Result<ToolOutput, ToolError> {
        let scope = scope_for(args.scope.kind(), cx)?;
        let outcome = cx
            .memory
            .remember(&scope, &args.fact)
            .await
            .map_err(tool_error)?;
        Ok(match outcome {
            Remembered::New(id) => format!("Remembered as {id}."),
            Remembered::Already(id) => format!("Already remembered as {id}."),
        }
        .into())
    }
}

/// List remembered facts.
#[derive(Debug)]
pub struct Recall;

/// Arguments of `recall`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecallArgs {
    /// Only facts containing this text (case-insensitive); every fact when omitted.
    #[serde(default)]
    pub query: Option<String>,
}

impl Tool for Recall {
    const NAME: &'static str = "recall";
    const DESCRIPTION: &'static str = "List the remembered facts of the user who sent the message \
         and of this room, one per line as `<id> (<scope>): <fact>`, optionally only those \
         containing a text.";
    const READ_ONLY: bool = true;
    type Args = RecallArgs;

    fn resource(_: &Self::Args, _: &ChatScope) -> String {
        "memory:user+room".to_owned()
    }

    fn summary(_: &Self::Args, _: &ChatScope) -> String {
        "The agent wants to read your and this room's memory".to_owned()
    }

    async fn call(args: Self::Args, cx: &ToolCx<'_>) -> Result<ToolOutput, ToolError> {
        let user = scope_for(ScopeKind::User, cx)?;
        // A chat whose room is unknown has no room memory to read; its user's is still there.
        let room = scope_for(ScopeKind::Room, cx).ok();
        let user_facts = cx.memory.facts(&user).await.map_err(tool_error)?;
        let room_facts = match room {
            Some(room) => cx.memory.facts(&room).await.map_err(tool_error)?,
            None => Vec::new(),
        };
        let query = args.query.unwrap_or_default();
        Ok(recall_text(cx.user, &user_facts, &room_facts, &query).into())
    }
}

/// The lines `recall` answers with: the user's facts, then the room's, those matching `query`.
fn recall_text(user: &str, user_facts: &[Fact], room_facts: &[Fact], query: &str) -> String {
    let user_label = format!("user {user}");
    let found: Vec<String> = user_facts
        .iter()
        .map(|f| (user_label.as_str(), f))
        .chain(room_facts.iter().map(|f| ("room", f)))
        .filter(|(_, f)| matches(&f.text, query))
        .map(|(label, f)| format!("{} ({label}): {}", f.id, f.text))
        .collect();
    if found.is_empty() {
        return if query.trim().is_empty() {
            "No facts remembered.".to_owned()
        } else {
            format!("No remembered fact contains {:?}.", query.trim())
        };
    }
    let more = found.len().saturating_sub(MAX_RECALLED);
    let mut lines: Vec<String> = found.into_iter().take(MAX_RECALLED).collect();
    if more > 0 {
        lines.push(format!(
            "({more} more; recall with a query to narrow the list)"
        ));
    }
    lines.join("\n")
}

/// Forget a remembered fact.
#[derive(Debug)]
pub struct Forget;

/// Arguments of `forget`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForgetArgs {
    /// The fact's id, as `remember` or `recall` gave it (like `u3` or `r1`).
    pub id: String,
}

impl Tool for Forget {
    const NAME: &'static str = "forget";
    const DESCRIPTION: &'static str = "Forget a remembered fact of the user who sent the message \
         (ids `u…`) or of this room (ids `r…`) by its id.";
    type Args = ForgetArgs;

    fn resource(args: &Self::Args, _: &ChatScope) -> String {
        match parse_id(&args.id) {
            Some((kind, _)) => resource_of(kind),
            None => "memory".to_owned(),
        }
    }

    fn summary(args: &Self::Args, scope: &ChatScope) -> String {
        format!(
            "The agent wants to forget fact {} ({})",
            shorten(&args.id, 40),
            Self::resource(args, scope)
        )
    }

    async fn call(args: Self::Args, cx: &ToolCx<'_>) -> Result<ToolOutput, ToolError> {
        let Some((kind, _)) = parse_id(&args.id) else {
            return Err(tool_error(MemoryError::UnknownId(shorten(&args.id, 40))));
        };
        let scope = scope_for(kind, cx)?;
        let id = args.id;
        let fact = cx.memory.forget(&scope, &id).await.map_err(tool_error)?;
        Ok(format!("Forgot {id}: {}", fact.text).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fact(id: &str, text: &str) -> Fact {
        Fact {
            id: id.into(),
            text: text.into(),
            created_ms: 0,
        }
    }

    #[test]
    fn recall_text_table() {
        let user = [fact("u1", "likes green tea"), fact("u2", "lives in Berlin")];
        let room = [fact("r1", "standup at ten")];
        let cases: &[(&[Fact], &[Fact], &str, &str)] = &[
            (
                &user,
                &room,
                "",
                "u1 (user @a:x): likes green tea\nu2 (user @a:x): lives in Berlin\n\
                 r1 (room): standup at ten",
            ),
            (&user, &room, "TEA", "u1 (user @a:x): likes green tea"),
            (&user, &room, " ten ", "r1 (room): standup at ten"),
            (
                &user,
                &room,
                "coffee",
                "No remembered fact contains \"coffee\".",
            ),
            (&[], &[], "", "No facts remembered."),
            (&[], &[], "  ", "No facts remembered."),
        ];
        for (u, r, query, expected) in cases {
            assert_eq!(recall_text("@a:x", u, r, query), *expected, "{query:?}");
        }
    }

    #[test]
    fn long_recalls_are_cut() {
        let many: Vec<Fact> = (1..=MAX_RECALLED + 3)
            .map(|i| fact(&format!("u{i}"), "x"))
            .collect();
        let text = recall_text("@a:x", &many, &[], "");
        assert_eq!(text.lines().count(), MAX_RECALLED + 1);
        assert!(text.ends_with("(3 more; recall with a query to narrow the list)"));
    }

    #[test]
    fn resources_name_the_scope_only() {
        let scope = ChatScope::new(protocol::ChatId::for_conversation("!r:x", None), "!r:x");
        let remember = |fact: &str, s| {
            Remember::resource(
                &RememberArgs {
                    fact: fact.into(),
                    scope: s,
                },
                &scope,
            )
        };
        assert_eq!(remember("my secret", MemoryScope::User), "memory:user");
        assert_eq!(remember("my secret", MemoryScope::Room), "memory:room");
        let forget = |id: &str| Forget::resource(&ForgetArgs { id: id.into() }, &scope);
        assert_eq!(forget("u3"), "memory:user");
        assert_eq!(forget("r1"), "memory:room");
        assert_eq!(forget("../x"), "memory");
        assert_eq!(
            Recall::resource(&RecallArgs { query: None }, &scope),
            "memory:user+room"
        );
    }
}
