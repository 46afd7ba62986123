//! The MCP servers the operator configured (`AGENT_MCP_SERVERS`, `AGENT_MCP_TOKENS`,
//! `AGENT_MCP_CHATS`, `AGENT_MCP_TIMEOUT`): parsed and checked before anything starts.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use protocol::ChatId;

use super::{ConfigError, Secret, err};

/// Separates a server name from its tool's name in the registry (`demo__echo`): the
/// OpenAI-compatible servers accept only `^[a-zA-Z0-9_-]{1,64}$` as a tool name, so a dot is
/// out; server names never contain `__`, so the first `__` splits the name unambiguously.
pub const MCP_SEPARATOR: &str = "__";

/// The MCP servers whose tools the agent offers next to its own.
#[derive(Debug, Clone)]
pub struct McpConfig {
    /// The servers, by name (`AGENT_MCP_SERVERS`).
    pub servers: BTreeMap<String, McpServerConfig>,
    /// Longest wait for a server to answer one call (`AGENT_MCP_TIMEOUT`, default 30s); starting
    /// it (spawn, handshake, tool list) may take this or 30s, whichever is longer. A server
    /// that does not answer in time is restarted on the next call.
    pub timeout: Duration,
}

impl Default for McpConfig {
    fn default() -> Self {
        Self {
            servers: BTreeMap::new(),
            timeout: Duration::from_secs(30),
        }
    }
}

/// One MCP server.
#[derive(Debug, Clone)]
pub struct McpServerConfig {
    /// Its name, `[a-z0-9_-]{1,32}` without `__`: the prefix of its tools' names.
    pub name: String,
    /// How to reach it.
    pub transport: McpTransport,
    /// The chats that may use it (`AGENT_MCP_CHATS`); `None` means every chat.
    pub chats: Option<BTreeSet<ChatId>>,
}

impl McpServerConfig {
    /// Whether `chat` may use this server's tools.
    pub fn serves(&self, chat: &ChatId) -> bool {
        self.chats.as_ref().is_none_or(|c| c.contains(chat))
    }
}

/// How an MCP server is reached.
#[derive(Clone)]
pub enum McpTransport {
    /// A child process speaking MCP on its stdin and stdout (`stdio:<program> <args…>`).
    Stdio {
        /// The program (a path, or a name looked up in `PATH`).
        program: String,
        /// Its arguments (the command line split at whitespace; no quoting).
        args: Vec<String>,
    },
    /// A streamable-HTTP server (`http://…` or `https://…`).
    Http {
        /// The endpoint URL.
        url: String,
        /// The bearer token sent to it (`AGENT_MCP_TOKENS`). Never printed.
        token: Option<Secret>,
    },
}

impl fmt::Debug for McpTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Stdio { program, args } => f
                .debug_struct("Stdio")
                .field("program", program)
                .field("args", args)
                .finish(),
            Self::Http { url, token } => f
                .debug_struct("Http")
                .field("url", url)
                .field("token", token)
                .finish(),
        }
    }
}

const SERVERS: &str = "AGENT_MCP_SERVERS";
const TOKENS: &str = "AGENT_MCP_TOKENS";
const CHATS: &str = "AGENT_MCP_CHATS";

/// Whether `name` may name a server.
fn valid_name(name: &str) -> bool {
    (1..=32).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        && !name.contains(MCP_SEPARATOR)
}

/// Splits `name=value;name=value` (blank entries skipped) into checked names and values.
fn entries<'a>(
    var: &'static str,
    spec: &'a str,
) -> impl Iterator<Item = Result<(&'a str, &'a str), ConfigError>> {
    spec.split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(move |item| {
            let (name, value) = item.split_once('=').ok_or_else(|| {
                err(
                    var,
                    format!("an entry is not name=value: {:?}", short(item)),
                )
            })?;
            let name = name.trim();
            if !valid_name(name) {
                return Err(err(
                    var,
                    format!(
                        "bad server name {:?}: use 1 to 32 of a-z 0-9 _ - (no \"__\")",
                        short(name)
                    ),
                ));
            }
            Ok((name, value.trim()))
        })
}

/// The start of a value, for an error message.
fn short(s: &str) -> String {
    s.chars().take(40).collect()
}

/// Parses `AGENT_MCP_SERVERS`.
pub(super) fn parse_servers(spec: &str) -> Result<BTreeMap<String, McpServerConfig>, ConfigError> {
    let mut servers = BTreeMap::new();
    for entry in entries(SERVERS, spec) {
        let (name, target) = entry?;
        let transport = if let Some(command) = target.strip_prefix("stdio:") {
            let mut words = command.split_whitespace().map(str::to_owned);
            let program = words
                .next()
                .ok_or_else(|| err(SERVERS, format!("{name}: stdio: needs a command")))?;
            McpTransport::Stdio {
                program,
                args: words.collect(),
            }
        } else if target.starts_with("http://") || target.starts_with("https://") {
            McpTransport::Http {
                url: target.to_owned(),
                token: None,
            }
        } else {
            return Err(err(
                SERVERS,
                format!("{name}: expected stdio:<command> or an http(s):// URL"),
            ));
        };
        let server = McpServerConfig {
            name: name.to_owned(),
            transport,
            chats: None,
        };
        if servers.insert(name.to_owned(), server).is_some() {
            return Err(err(SERVERS, format!("{name} is configured twice")));
        }
    }
    Ok(servers)
}

/// Adds the bearer tokens of `AGENT_MCP_TOKENS` to the HTTP servers. Errors never quote a
/// token.
pub(super) fn add_tokens(
    servers: &mut BTreeMap<String, McpServerConfig>,
    spec: &str,
) -> Result<(), ConfigError> {
    for entry in spec.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((name, token)) = entry.split_once('=') else {
            return Err(err(TOKENS, "an entry is not name=token"));
        };
        let (name, token) = (name.trim(), token.trim());
        let Some(server) = servers.get_mut(name) else {
            return Err(err(
                TOKENS,
                format!("{:?} is not a server in {SERVERS}", short(name)),
            ));
        };
        let McpTransport::Http { token: slot, .. } = &mut server.transport else {
            return Err(err(TOKENS, format!("{name} is not an HTTP server")));
        };
        if token.is_empty() || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(err(
                TOKENS,
                format!("the token of {name} is empty or has whitespace"),
            ));
        }
        *slot = Some(Secret::new(token));
    }
    Ok(())
}

/// Adds the chat lists of `AGENT_MCP_CHATS` (`server=chat,chat;…`) to the servers.
pub(super) fn add_chats(
    servers: &mut BTreeMap<String, McpServerConfig>,
    spec: &str,
) -> Result<(), ConfigError> {
    for entry in entries(CHATS, spec) {
        let (name, list) = entry?;
        let Some(server) = servers.get_mut(name) else {
            return Err(err(CHATS, format!("{name} is not a server in {SERVERS}")));
        };
        let mut chats = BTreeSet::new();
        for chat in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let chat = ChatId::new(chat)
                .map_err(|e| err(CHATS, format!("{name}: bad chat id {:?}: {e}", short(chat))))?;
            chats.insert(chat);
        }
        if chats.is_empty() {
            return Err(err(CHATS, format!("{name}: lists no chat")));
        }
        server.chats = Some(chats);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_parse() {
        let s = parse_servers(
            " demo=stdio:python3  /srv/demo.py --flag ; web-1=https://mcp.example/mcp;",
        )
        .unwrap();
        assert_eq!(s.len(), 2);
        let McpTransport::Stdio { program, args } = &s["demo"].transport else {
            panic!("stdio")
        };
        assert_eq!(program, "python3");
        assert_eq!(args, &["/srv/demo.py", "--flag"]);
        assert!(matches!(
            &s["web-1"].transport,
            McpTransport::Http { url, token: None } if url == "https://mcp.example/mcp"
        ));
    }

    #[test]
    fn bad_servers_are_refused() {
        for (spec, expected) in [
            ("demo", "not name=value"),
            ("Demo=stdio:x", "bad server name"),
            ("a__b=stdio:x", "bad server name"),
            ("demo=stdio:", "needs a command"),
            ("demo=ftp://x", "expected stdio"),
            ("demo=stdio:a;demo=stdio:b", "configured twice"),
        ] {
            let e = parse_servers(spec).unwrap_err();
            assert_eq!(e.var, SERVERS);
            assert!(e.reason.contains(expected), "{spec}: {e}");
        }
    }

    #[test]
    fn tokens_and_chats_attach_to_servers() {
        let mut s = parse_servers("web=http://127.0.0.1:1/mcp;local=stdio:x").unwrap();
        add_tokens(&mut s, "web=s3cret-token").unwrap();
        let McpTransport::Http { token: Some(t), .. } = &s["web"].transport else {
            panic!("token")
        };
        assert_eq!(t.expose(), "s3cret-token");
        assert!(!format!("{s:?}").contains("s3cret"));
        let e = add_tokens(&mut s, "local=s3cret").unwrap_err();
        assert!(e.reason.contains("not an HTTP server"), "{e}");
        assert!(!e.to_string().contains("s3cret"));
        assert!(add_tokens(&mut s, "nope=x").is_err());

        add_chats(&mut s, "local=r-a-1, r-b-2").unwrap();
        let a = ChatId::new("r-a-1").unwrap();
        assert!(s["local"].serves(&a));
        assert!(!s["local"].serves(&ChatId::new("r-c-3").unwrap()));
        assert!(s["web"].serves(&a));
        assert!(add_chats(&mut s, "local=").is_err());
        assert!(add_chats(&mut s, "other=r-a-1").is_err());
        assert!(add_chats(&mut s, "local=../x").is_err());
    }
}
