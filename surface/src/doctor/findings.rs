//! From observations to findings: pure, table-tested. Each finding is one line an operator
//! reads top to bottom; the first `FAIL` is usually the answer to "why no reply?".

use crate::config::Config;
use crate::decide::{self, Decision, Facts, IgnoreReason};
use crate::journal::RoomView;
pub use settings::{Finding, Level};

pub use super::login::{Login, WaysIn};

/// The bot's cross-signing state, per `/keys/query`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrossSigning {
    /// A master key is published.
    pub master: bool,
    /// This device carries the self-signing key's signature.
    pub device_signed: bool,
}

/// A room the doctor was asked about.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoomObservation {
    /// The room id asked about.
    pub room_id: String,
    /// The bot is joined.
    pub joined: bool,
    /// Its canonical alias, if any (the allowlist may name it).
    pub alias: Option<String>,
    /// Joined members (when joined).
    pub members: Vec<String>,
    /// `m.room.encryption` is set.
    pub encrypted: bool,
    /// The sender asked about (`--sender`, or the first member who is not the bot).
    pub sender: Option<String>,
    /// The journal's view (when there is a journal).
    pub journal: Option<RoomView>,
}

/// Everything the doctor gathered.
#[derive(Debug, Clone)]
pub struct Observations {
    /// `/versions`: the spec versions, or why the homeserver is unreachable.
    pub homeserver: Result<Vec<String>, String>,
    /// Who we are.
    pub login: Login,
    /// How the homeserver lets clients log in (when it answered).
    pub ways_in: Option<WaysIn>,
    /// Joined rooms, when logged in.
    pub joined_rooms: Option<Vec<String>>,
    /// Cross-signing, when logged in.
    pub cross_signing: Option<CrossSigning>,
    /// The server-side key backup version (`Ok(None)`: none), when logged in.
    pub backup: Option<Result<Option<String>, String>>,
    /// The handshake with each agent of `AGENT_URL` (token, protocol version, both workspace
    /// sentinels), by URL.
    pub agent: Vec<(String, Result<(), String>)>,
    /// The workspace root is usable (a file can be created and removed).
    pub workspace: Result<(), String>,
    /// A running surface's `/healthz`: `Ok(body)` when 200, `Err(why)` otherwise.
    pub surface: Result<String, String>,
    /// With `SURFACE_MCP_BIND`: what an MCP request without a token got (`Ok(status)`), or why
    /// nothing answered.
    pub mcp: Option<Result<u16, String>>,
    /// The journal: (unhandled, waiting for keys, parked), or why it cannot be read.
    pub journal: Result<Option<(u64, u64, u64)>, String>,
    /// The longest delay of a delayed event (MSC4140; `Ok(None)`: none offered), when logged in.
    pub delayed_events: Option<Result<Option<std::time::Duration>, String>>,
    /// The room asked about.
    pub room: Option<RoomObservation>,
}

/// Every finding, in reading order.
pub fn findings(config: &Config, o: &Observations) -> Vec<Finding> {
    let mut out = vec![
        configured(config),
        homeserver(o),
        super::login::login(config, &o.login),
    ];
    out.extend(super::login::ways_in(config, o.ways_in));
    out.extend(rooms(config, o));
    out.push(allowlists(config));
    out.extend(encryption(config, o));
    out.extend(agents(o));
    out.push(workspace(config, o));
    out.push(surface(config, o));
    out.extend(mcp(config, o));
    out.push(journal(o));
    out.extend(interrupted(config, o));
    if let Some(room) = &o.room {
        out.extend(room_findings(config, o, room));
    }
    out
}

/// The `interrupted` line (none when not logged in: nothing could be asked).
fn interrupted(config: &Config, o: &Observations) -> Option<Finding> {
    let check = "interrupted";
    let Some(delay) = config.interrupted_notice else {
        return Some(Finding::new(
            Level::Ok,
            check,
            "off (SURFACE_INTERRUPTED_NOTICE=off): a room hears nothing if the surface dies \
             mid-answer",
        ));
    };
    Some(match o.delayed_events.as_ref()? {
        Ok(Some(max)) if delay <= *max => Finding::new(
            Level::Ok,
            check,
            format!(
                "the homeserver holds a notice for each running answer and posts it if the \
                 surface is silent for {} (MSC4140)",
                humantime::format_duration(delay)
            ),
        ),
        Ok(Some(max)) => Finding::new(
            Level::Warn,
            check,
            format!(
                "SURFACE_INTERRUPTED_NOTICE is {}, the homeserver allows at most {}: that is used",
                humantime::format_duration(delay),
                humantime::format_duration(*max)
            ),
        ),
        Ok(None) => Finding::new(
            Level::Warn,
            check,
            "the homeserver offers no delayed events (MSC4140), so a room hears nothing if the \
             surface dies mid-answer (Synapse: set max_event_delay_duration, e.g. 24h)",
        ),
        Err(e) => Finding::new(
            Level::Warn,
            check,
            format!("could not ask the homeserver about delayed events: {e}"),
        ),
    })
}

fn configured(config: &Config) -> Finding {
    Finding::new(
        Level::Ok,
        "config",
        format!(
            "valid; bot {} on {}",
            config.user_id,
            config.homeserver_url.as_str()
        ),
    )
}

fn homeserver(o: &Observations) -> Finding {
    match &o.homeserver {
        Ok(v) => Finding::new(
            Level::Ok,
            "homeserver",
            format!(
                "reachable (spec {})",
                v.last().map_or("unknown", String::as_str)
            ),
        ),
        Err(e) => Finding::new(Level::Fail, "homeserver", format!("unreachable: {e}")),
    }
}

fn rooms(config: &Config, o: &Observations) -> Option<Finding> {
    let rooms = o.joined_rooms.as_ref()?;
    let allowed = rooms
        .iter()
        .filter(|r| config.is_room_allowed(r, std::iter::empty()))
        .count();
    let level = if rooms.is_empty() {
        Level::Warn
    } else {
        Level::Ok
    };
    let mut text = format!(
        "joined {} rooms, {allowed} of them allowed by SURFACE_ALLOWED_ROOMS (by id; aliases \
         are checked per room)",
        rooms.len()
    );
    if rooms.is_empty() {
        text.push_str(": invite the bot to a room (it joins when an allowed user invites it)");
    }
    Some(Finding::new(level, "rooms", text))
}

fn allowlists(config: &Config) -> Finding {
    Finding::new(
        Level::Ok,
        "allowlists",
        format!(
            "users {}; rooms {}{}",
            config.allowed_users.join(", "),
            config.allowed_rooms.join(", "),
            if config.bot_users.is_empty() {
                String::new()
            } else {
                format!("; bots {}", config.bot_users.join(", "))
            }
        ),
    )
}

/// One finding per agent of `AGENT_URL`: a failed one fails only when no other answered.
fn agents(o: &Observations) -> Vec<Finding> {
    use Level::{Fail, Ok, Warn};
    let any_up = o.agent.iter().any(|(_, r)| r.is_ok());
    o.agent
        .iter()
        .map(|(url, r)| match r {
            Result::Ok(()) => Finding::new(
                Ok,
                "agent",
                format!(
                    "{url} answered the handshake: token, protocol version and shared workspace verified"
                ),
            ),
            Err(e) if any_up => Finding::new(
                Warn,
                "agent",
                format!("{url}: {e}; its chats go to the other agents until it is fixed"),
            ),
            Err(e) => Finding::new(
                Fail,
                "agent",
                format!("{url}: {e}; turns wait in the journal until it is fixed"),
            ),
        })
        .collect()
}

fn workspace(config: &Config, o: &Observations) -> Finding {
    match &o.workspace {
        Ok(()) => Finding::new(
            Level::Ok,
            "workspace",
            format!("{} is writable", config.workspace_root.display()),
        ),
        Err(e) => Finding::new(
            Level::Fail,
            "workspace",
            format!("{}: {e}", config.workspace_root.display()),
        ),
    }
}

fn surface(config: &Config, o: &Observations) -> Finding {
    match &o.surface {
        Ok(_) => Finding::new(
            Level::Ok,
            "surface",
            format!("running and healthy on {}", config.health_bind),
        ),
        Err(e) => Finding::new(Level::Warn, "surface", e.clone()),
    }
}

fn mcp(config: &Config, o: &Observations) -> Option<Finding> {
    let (Some(m), Some(seen)) = (&config.mcp, &o.mcp) else {
        return None;
    };
    let url = format!("http://{}/mcp", m.bind);
    let posting = if m.send { "may post" } else { "read only" };
    Some(match seen {
        Ok(401) => Finding::new(
            Level::Ok,
            "mcp",
            format!("{url} answers and refuses requests without the token; clients {posting}"),
        ),
        Ok(status) => Finding::new(
            Level::Fail,
            "mcp",
            format!(
                "{url} answered HTTP {status} without a token (expected 401): is it this surface?"
            ),
        ),
        Err(e) => Finding::new(Level::Warn, "mcp", format!("{url}: {e}")),
    })
}

fn journal(o: &Observations) -> Finding {
    match &o.journal {
        Ok(None) => Finding::new(
            Level::Warn,
            "journal",
            "none yet (the surface never ran here)",
        ),
        Ok(Some((unhandled, waiting, parked))) => {
            let level = if *parked > 0 || *waiting > 0 {
                Level::Warn
            } else {
                Level::Ok
            };
            Finding::new(
                level,
                "journal",
                format!(
                    "{unhandled} messages not handled yet, {waiting} waiting for room keys, \
                     {parked} parked sends"
                ),
            )
        }
        Err(e) => Finding::new(Level::Fail, "journal", e.clone()),
    }
}

fn encryption(config: &Config, o: &Observations) -> Vec<Finding> {
    use Level::{Ok, Warn};
    let mut out = Vec::new();
    match o.cross_signing {
        Some(CrossSigning {
            master: true,
            device_signed: true,
        }) => out.push(Finding::new(
            Ok,
            "cross-signing",
            "set up; this device is signed",
        )),
        Some(CrossSigning { master: true, .. }) => out.push(Finding::new(
            Warn,
            "cross-signing",
            "set up, but this device is not signed by it: users see an unverified device",
        )),
        Some(_) => out.push(Finding::new(
            Warn,
            "cross-signing",
            "no cross-signing keys: users see the bot's device as unverified",
        )),
        None => {}
    }
    match (&o.backup, config.recovery_key.is_some()) {
        (Some(Result::Ok(Some(v))), true) => out.push(Finding::new(
            Ok,
            "key backup",
            format!("version {v}; MATRIX_RECOVERY_KEY is set"),
        )),
        (Some(Result::Ok(Some(v))), false) => out.push(Finding::new(
            Warn,
            "key backup",
            format!(
                "version {v} exists but MATRIX_RECOVERY_KEY is not set: a new state directory \
                 could not read earlier encrypted messages"
            ),
        )),
        (Some(Result::Ok(None)), _) => out.push(Finding::new(
            Warn,
            "key backup",
            "none on the server: losing the state directory loses the room keys",
        )),
        (Some(Err(e)), _) => out.push(Finding::new(Warn, "key backup", e.clone())),
        (None, _) => {}
    }
    out
}

/// What the room asked about says: whether the bot may and does read it, its backlog, and
/// what would become of a message from the sender asked about.
fn room_findings(config: &Config, o: &Observations, room: &RoomObservation) -> Vec<Finding> {
    use Level::{Fail, Ok, Warn};
    let id = &room.room_id;
    let mut out = Vec::new();
    let room_allowed = config.is_room_allowed(id, room.alias.as_deref());
    if !room_allowed {
        out.push(Finding::new(
            Fail,
            "room",
            format!("{id} is not allowed by SURFACE_ALLOWED_ROOMS: its messages are ignored"),
        ));
    }
    if !room.joined {
        out.push(Finding::new(
            Fail,
            "room",
            format!("the bot is not in {id}: invite it (it joins when an allowed user invites it)"),
        ));
        return out;
    }
    out.push(Finding::new(
        Ok,
        "room",
        format!(
            "{id}: joined, {} members, {}",
            room.members.len(),
            if room.encrypted {
                "encrypted"
            } else {
                "not encrypted"
            }
        ),
    ));
    let journal = room.journal.clone().unwrap_or_default();
    out.extend(backlog(&journal));
    let Some(sender) = &room.sender else {
        out.push(Finding::new(
            Warn,
            "room",
            "nobody but the bot is in the room",
        ));
        return out;
    };
    if !room.members.iter().any(|m| m == sender) {
        out.push(Finding::new(
            Warn,
            "sender",
            format!("{sender} is not a member of {id}"),
        ));
    }
    out.push(verdict(config, o, room, sender, room_allowed, &journal));
    out
}

/// What waits in the journal for the room: messages without their keys, parked answers,
/// queued turns.
fn backlog(journal: &RoomView) -> Vec<Finding> {
    let mut out = Vec::new();
    if journal.waiting_for_keys > 0 {
        out.push(Finding::new(
            Level::Warn,
            "room",
            format!(
                "{} messages here wait for their room keys: the sender's device has not shared \
                 them with the bot (they arrive when that device comes online)",
                journal.waiting_for_keys
            ),
        ));
    }
    if journal.parked > 0 {
        out.push(Finding::new(
            Level::Warn,
            "room",
            format!(
                "{} answers here were refused by the homeserver and parked (see the surface log \
                 for 'send parked')",
                journal.parked
            ),
        ));
    }
    if journal.pending > 0 {
        out.push(Finding::new(
            Level::Warn,
            "room",
            format!("{} messages here are queued for the agent", journal.pending),
        ));
    }
    out
}

/// What `decide` would make of a plain message from `sender` in the room, without and with a
/// mention of the bot.
fn verdict(
    config: &Config,
    o: &Observations,
    room: &RoomObservation,
    sender: &str,
    room_allowed: bool,
    journal: &RoomView,
) -> Finding {
    use Level::{Fail, Ok, Warn};
    let verdict = |mentions_bot: bool| {
        decide::decide(&Facts {
            bot_user_id: config.user_id.as_str(),
            sender,
            sender_allowed: config.is_allowed(sender),
            room_allowed,
            sender_is_bot: config.is_known_bot(sender),
            max_bot_turns: config.max_bot_turns,
            is_message: true,
            body: "hello",
            mentions_bot,
            direct_chat: room.members.len() <= 2,
            every_message: journal.every_message,
            ..Facts::default()
        })
    };
    let agent_down = !o.agent.iter().any(|(_, r)| r.is_ok());
    match (verdict(false), verdict(true)) {
        (Decision::Trigger, _) if agent_down => Finding::new(
            Fail,
            "verdict",
            format!(
                "a message from {sender} would be journaled, but answered only once the agent is reachable"
            ),
        ),
        (Decision::Trigger, _) => Finding::new(
            Ok,
            "verdict",
            format!("a message from {sender} would be answered"),
        ),
        (Decision::Context, Decision::Trigger) => Finding::new(
            Warn,
            "verdict",
            format!(
                "a message from {sender} is answered only when it mentions or replies to the \
                 bot (a group room; a moderator can send `!mode all`)"
            ),
        ),
        (Decision::Ignore(reason), _) => Finding::new(
            Fail,
            "verdict",
            format!(
                "a message from {sender} would be ignored: {}",
                ignored(reason)
            ),
        ),
        (other, _) => Finding::new(
            Warn,
            "verdict",
            format!("a message from {sender} would be handled as {other:?}"),
        ),
    }
}

fn ignored(reason: IgnoreReason) -> &'static str {
    match reason {
        IgnoreReason::NotAllowed => "the sender is not allowed by SURFACE_ALLOWED_USERS",
        IgnoreReason::RoomNotAllowed => "the room is not allowed by SURFACE_ALLOWED_ROOMS",
        IgnoreReason::OwnEvent => "it is the bot itself",
        IgnoreReason::BotLoop => "the sender is a bot (SURFACE_BOT_USERS) past its turn limit",
        IgnoreReason::Notice => "bots' notices are never answered",
        IgnoreReason::NotAMessage | IgnoreReason::Edit | IgnoreReason::Reaction => {
            "it is not a new message"
        }
    }
}

/// The exit code: 0 when nothing failed, 1 otherwise.
pub fn exit_code(findings: &[Finding]) -> u8 {
    u8::from(findings.iter().any(|f| f.level == Level::Fail))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn config(extra: &[(&str, &str)]) -> Config {
        let mut env: Vec<(&str, &str)> = vec![
            ("MATRIX_HOMESERVER_URL", "http://127.0.0.1:8008"),
            ("MATRIX_USER_ID", "@bot:hs"),
            ("MATRIX_PASSWORD", "pw"),
            ("AGENT_URL", "ws://127.0.0.1:8700"),
            ("AGENT_TOKEN", "0123456789abcdef"),
        ];
        env.extend_from_slice(extra);
        Config::from_pairs(&env).unwrap()
    }

    fn healthy() -> Observations {
        Observations {
            homeserver: Ok(vec!["v1.11".into()]),
            login: Login::As {
                user_id: "@bot:hs".into(),
                device_id: Some("DEV".into()),
            },
            ways_in: Some(WaysIn {
                password: true,
                oauth: false,
            }),
            joined_rooms: Some(vec!["!dm:hs".into()]),
            cross_signing: Some(CrossSigning {
                master: true,
                device_signed: true,
            }),
            backup: Some(Ok(Some("1".into()))),
            agent: vec![("ws://127.0.0.1:8700/".into(), Ok(()))],
            workspace: Ok(()),
            surface: Ok("{}".into()),
            mcp: None,
            journal: Ok(Some((0, 0, 0))),
            delayed_events: Some(Ok(Some(std::time::Duration::from_secs(86_400)))),
            room: Some(RoomObservation {
                room_id: "!dm:hs".into(),
                joined: true,
                members: vec!["@bot:hs".into(), "@alice:hs".into()],
                encrypted: true,
                sender: Some("@alice:hs".into()),
                ..RoomObservation::default()
            }),
        }
    }

    /// The first finding at `level` whose check is `check`.
    fn find(fs: &[Finding], level: Level, check: &str) -> Option<String> {
        fs.iter()
            .find(|f| f.level == level && f.check == check)
            .map(|f| f.text.clone())
    }

    #[test]
    fn each_cause_of_silence_is_named() {
        type Change = fn(&mut Observations);
        // (what is wrong, level, check, words the line must contain)
        let cases: &[(Change, Level, &str, &str)] = &[
            (|_| {}, Level::Ok, "verdict", "@alice:hs would be answered"),
            (
                |o| o.homeserver = Err("connection refused".into()),
                Level::Fail,
                "homeserver",
                "connection refused",
            ),
            (
                |o| o.login = Login::Refused("HTTP 401 M_UNKNOWN_TOKEN".into()),
                Level::Fail,
                "login",
                "M_UNKNOWN_TOKEN",
            ),
            (
                |o| {
                    o.login = Login::As {
                        user_id: "@other:hs".into(),
                        device_id: None,
                    }
                },
                Level::Fail,
                "login",
                "belongs to @other:hs",
            ),
            (
                |o| o.room.as_mut().unwrap().joined = false,
                Level::Fail,
                "room",
                "not in !dm:hs",
            ),
            (
                |o| o.room.as_mut().unwrap().sender = Some("@eve:evil".into()),
                Level::Fail,
                "verdict",
                "SURFACE_ALLOWED_USERS",
            ),
            (
                |o| o.agent[0].1 = Err("HTTP 401".into()),
                Level::Fail,
                "verdict",
                "once the agent is reachable",
            ),
            (
                |o| o.agent[0].1 = Err("HTTP 401".into()),
                Level::Fail,
                "agent",
                "HTTP 401",
            ),
            (
                |o| {
                    let r = o.room.as_mut().unwrap();
                    r.members.push("@carol:hs".into());
                },
                Level::Warn,
                "verdict",
                "mentions or replies to the bot",
            ),
            (
                |o| {
                    o.room.as_mut().unwrap().journal = Some(RoomView {
                        waiting_for_keys: 2,
                        ..RoomView::default()
                    })
                },
                Level::Warn,
                "room",
                "2 messages here wait for their room keys",
            ),
            (
                |o| {
                    o.room.as_mut().unwrap().journal = Some(RoomView {
                        parked: 1,
                        ..RoomView::default()
                    })
                },
                Level::Warn,
                "room",
                "parked",
            ),
            (
                |o| {
                    o.cross_signing = Some(CrossSigning {
                        master: false,
                        device_signed: false,
                    })
                },
                Level::Warn,
                "cross-signing",
                "unverified",
            ),
            (
                |o| o.backup = Some(Ok(None)),
                Level::Warn,
                "key backup",
                "none on the server",
            ),
            (
                |o| o.workspace = Err("not writable".into()),
                Level::Fail,
                "workspace",
                "not writable",
            ),
        ];
        for (i, (change, level, check, words)) in cases.iter().enumerate() {
            let mut o = healthy();
            change(&mut o);
            let fs = findings(&config(&[("MATRIX_RECOVERY_KEY", "k")]), &o);
            let text = find(&fs, *level, check)
                .unwrap_or_else(|| panic!("case {i}: no {level:?} {check}: {fs:#?}"));
            assert!(text.contains(words), "case {i}: {text}");
            assert_eq!(exit_code(&fs), u8::from(*level == Level::Fail), "case {i}");
        }
    }

    #[test]
    fn the_interrupted_notice_needs_delayed_events() {
        let mut o = healthy();
        let on = config(&[]);
        assert!(find(&findings(&on, &o), Level::Ok, "interrupted").is_some());
        o.delayed_events = Some(Ok(None));
        let line = find(&findings(&on, &o), Level::Warn, "interrupted").expect("warn line");
        assert!(line.contains("max_event_delay_duration"), "{line}");
        let off = config(&[("SURFACE_INTERRUPTED_NOTICE", "off")]);
        assert!(find(&findings(&off, &o), Level::Ok, "interrupted").is_some());
        o.delayed_events = None;
        assert!(find(&findings(&on, &o), Level::Ok, "interrupted").is_none());
    }

    #[test]
    fn the_mcp_server_is_checked_when_configured() {
        let off = config(&[]);
        let on = config(&[
            ("SURFACE_MCP_BIND", "8702"),
            ("SURFACE_MCP_TOKEN", "mcp-token-0123456789"),
        ]);
        let mut o = healthy();
        o.mcp = Some(Ok(401));
        assert!(
            find(&findings(&off, &o), Level::Ok, "mcp").is_none(),
            "off: no line"
        );
        let line = find(&findings(&on, &o), Level::Ok, "mcp").expect("ok line");
        assert!(
            line.contains("http://127.0.0.1:8702/mcp") && line.contains("read only"),
            "{line}"
        );
        o.mcp = Some(Ok(200));
        assert!(find(&findings(&on, &o), Level::Fail, "mcp").is_some_and(|l| l.contains("401")));
        o.mcp = Some(Err("nothing answers".into()));
        assert!(find(&findings(&on, &o), Level::Warn, "mcp").is_some());
    }

    #[test]
    fn a_room_outside_the_allowlist_and_a_mode_all_group_are_told_apart() {
        let c = config(&[("SURFACE_ALLOWED_ROOMS", "#ops:hs")]);
        let mut o = healthy();
        let fs = findings(&c, &o);
        assert!(
            find(&fs, Level::Fail, "room")
                .unwrap()
                .contains("SURFACE_ALLOWED_ROOMS")
        );
        o.room.as_mut().unwrap().alias = Some("#ops:hs".into());
        assert_eq!(exit_code(&findings(&c, &o)), 0, "allowed by its alias");

        let mut o = healthy();
        let room = o.room.as_mut().unwrap();
        room.members.push("@carol:hs".into());
        room.journal = Some(RoomView {
            every_message: true,
            ..RoomView::default()
        });
        let fs = findings(&config(&[]), &o);
        assert!(find(&fs, Level::Ok, "verdict").is_some(), "{fs:#?}");
        let line = fs.last().unwrap().to_string();
        assert!(line.starts_with("ok    verdict: "), "{line}");
    }
}
