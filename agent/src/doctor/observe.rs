//! What `agent doctor` looks at: folders (with a probe file, removed again), the surface's
//! sentinels, the listening address and the model server's `GET /models`. Every observation is
//! plain data for the pure checks in [`super`]; text from outside (errors, a server's message)
//! is redacted and cleaned of control characters here, once.

use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;
use std::time::{Duration, SystemTime};

use serde::Deserialize;

use crate::config::OpenAiConfig;
use crate::server::without_userinfo;

/// How long the model server and a listening agent get to answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// The largest `GET /models` answer read.
const MAX_BODY: usize = 4 * 1024 * 1024;

/// The longest text taken from an error or a server's answer.
const MAX_TEXT: usize = 300;

/// The surface's sentinels, relative to the workspace root (`surface::workspace` writes them).
const SENTINEL_DIR: &str = "surfaces/matrix/.sentinel";

/// What the agent's database said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DbSeen {
    /// It could not be reached or asked (the error, never the URL).
    Unreachable(String),
    /// Its schema version, and the newest this agent knows.
    Schema {
        /// Applied (0: none yet; the agent applies them at start).
        found: i64,
        /// Known to this agent.
        known: i64,
    },
}

/// Asks the database for its schema version, within ten seconds.
pub async fn database(config: &crate::config::DatabaseConfig) -> DbSeen {
    let asked = async {
        let db = crate::db::Database::connect(config)?;
        db.version().await
    };
    match tokio::time::timeout(Duration::from_secs(10), asked).await {
        Ok(Ok(found)) => DbSeen::Schema {
            found,
            known: crate::db::known_version(),
        },
        Ok(Err(e)) => DbSeen::Unreachable(e.to_string()),
        Err(_) => DbSeen::Unreachable("no answer within 10 s".to_owned()),
    }
}

/// A folder the agent needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirSeen {
    /// It does not exist; whether the nearest existing folder above it takes new entries.
    Missing {
        /// A probe file could be created (and removed) there.
        parent_writable: bool,
    },
    /// Something other than a folder is there.
    NotADirectory,
    /// It cannot be looked at (the error).
    Unreadable(String),
    /// A folder in which a probe file could be created and removed.
    Writable,
    /// A folder in which the probe file could not be created (the error).
    NotWritable(String),
}

/// The surface's sentinels in the workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SentinelSeen {
    /// None there.
    None,
    /// The newest was written this long ago.
    Newest(Duration),
    /// The folder cannot be read (the error).
    Unreadable(String),
}

/// What listens on the agent's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindSeen {
    /// An agent: `GET /healthz` answered `ok`.
    Agent,
    /// Something else accepted the connection (what it did).
    Other(String),
    /// Nothing listens, and the address can be listened on.
    Free,
    /// Nothing listens, and listening there fails (the error).
    Unbindable(String),
    /// Connecting was neither accepted nor refused (the error).
    Unknown(String),
}

/// The model server's answer to `GET <base_url>/models`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelsSeen {
    /// A model list, by id.
    Listed(Vec<String>),
    /// A success without a model list (why not).
    Unlisted(String),
    /// A refusal or error status, with what the server said (redacted, shortened).
    Refused {
        /// The HTTP status.
        status: u16,
        /// The server's message; empty when it said nothing readable.
        said: String,
    },
    /// No answer (the error, without the URL).
    Unreachable(String),
}

/// The workspace root, and its `chats/` folder when that exists already.
pub fn workspace(root: &Path) -> (DirSeen, Option<DirSeen>) {
    let seen = dir(root);
    let chats = root.join("chats");
    let chats =
        (seen == DirSeen::Writable && chats.symlink_metadata().is_ok()).then(|| dir(&chats));
    (seen, chats)
}

/// Whether `path` is a folder the agent can write in.
pub fn dir(path: &Path) -> DirSeen {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => match probe(path) {
            Ok(()) => DirSeen::Writable,
            Err(e) => DirSeen::NotWritable(e.to_string()),
        },
        Ok(_) => DirSeen::NotADirectory,
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
            DirSeen::Missing {
                parent_writable: path
                    .ancestors()
                    .skip(1)
                    .find(|a| a.exists())
                    .is_some_and(|a| a.is_dir() && probe(a).is_ok()),
            }
        }
        Err(e) => DirSeen::Unreadable(e.to_string()),
    }
}

/// Creates and removes a file in `dir`.
fn probe(dir: &Path) -> std::io::Result<()> {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    let path = dir.join(format!(".mxbridge-doctor-{}-{nanos}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)?;
    std::fs::remove_file(&path)
}

/// The age of the newest sentinel the surface left in the workspace.
pub fn sentinel(root: &Path) -> SentinelSeen {
    let entries = match std::fs::read_dir(root.join(SENTINEL_DIR)) {
        Ok(entries) => entries,
        Err(e) if e.kind() == ErrorKind::NotFound => return SentinelSeen::None,
        Err(e) => return SentinelSeen::Unreadable(e.to_string()),
    };
    let now = SystemTime::now();
    entries
        .flatten()
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .filter_map(|m| m.modified().ok())
        .map(|t| now.duration_since(t).unwrap_or_default())
        .min()
        .map_or(SentinelSeen::None, SentinelSeen::Newest)
}

/// What listens on `addr` (the loopback address when it is a wildcard).
pub async fn bind(addr: SocketAddr) -> BindSeen {
    let target = SocketAddr::new(reachable(addr.ip()), addr.port());
    let connected =
        tokio::time::timeout(ANSWER_TIMEOUT, tokio::net::TcpStream::connect(target)).await;
    match connected {
        Err(_) => BindSeen::Unknown(format!("no answer within {}s", ANSWER_TIMEOUT.as_secs())),
        Ok(Err(e)) if e.kind() == ErrorKind::ConnectionRefused => {
            match std::net::TcpListener::bind(addr) {
                Ok(_) => BindSeen::Free,
                Err(e) => BindSeen::Unbindable(e.to_string()),
            }
        }
        Ok(Err(e)) => BindSeen::Unknown(e.to_string()),
        Ok(Ok(stream)) => {
            drop(stream);
            healthz(target).await
        }
    }
}

/// Where a connection to a listener on `ip` goes: the loopback of a wildcard.
fn reachable(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) if v4.is_unspecified() => Ipv4Addr::LOCALHOST.into(),
        IpAddr::V6(v6) if v6.is_unspecified() => Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    }
}

/// Asks whatever accepted a connection on `target` for the agent's `/healthz`.
async fn healthz(target: SocketAddr) -> BindSeen {
    let http = match client(ANSWER_TIMEOUT) {
        Ok(http) => http,
        Err(e) => return BindSeen::Unknown(e),
    };
    let response = match http.get(format!("http://{target}/healthz")).send().await {
        Ok(r) => r,
        Err(e) => {
            return BindSeen::Other(format!(
                "GET /healthz failed: {}",
                clean(&chain(&e.without_url()), &[])
            ));
        }
    };
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    if status.is_success() && text.trim() == "ok" {
        BindSeen::Agent
    } else {
        BindSeen::Other(format!("GET /healthz answered HTTP {}", status.as_u16()))
    }
}

#[derive(Deserialize)]
struct ModelList {
    data: Vec<ModelEntry>,
}

#[derive(Deserialize)]
struct ModelEntry {
    id: String,
}

/// `GET <base_url>/models` with the API key as bearer token.
pub async fn models(config: &OpenAiConfig) -> ModelsSeen {
    let secrets: Vec<&str> = config.api_key.iter().map(|k| k.expose()).collect();
    let scrub = |text: &str| {
        let text = text.replace(&config.base_url, &without_userinfo(&config.base_url));
        clean(&text, &secrets)
    };
    let http = match client(config.tuning.connect_timeout.min(ANSWER_TIMEOUT)) {
        Ok(http) => http,
        Err(e) => return ModelsSeen::Unreachable(e),
    };
    let mut request = http.get(format!("{}/models", config.base_url));
    if let Some(key) = &config.api_key {
        request = request.bearer_auth(key.expose());
    }
    let mut response = match request.send().await {
        Ok(r) => r,
        Err(e) if e.is_timeout() => {
            return ModelsSeen::Unreachable(format!(
                "no answer within {}s",
                ANSWER_TIMEOUT.as_secs()
            ));
        }
        Err(e) => return ModelsSeen::Unreachable(scrub(&chain(&e.without_url()))),
    };
    let status = response.status();
    let mut body = Vec::new();
    let complete = loop {
        match response.chunk().await {
            Ok(Some(chunk)) if body.len() + chunk.len() <= MAX_BODY => {
                body.extend_from_slice(&chunk);
            }
            Ok(Some(_)) => break Err("the answer is larger than 4 MiB".to_owned()),
            Ok(None) => break Ok(()),
            Err(e) => break Err(scrub(&chain(&e.without_url()))),
        }
    };
    if !status.is_success() {
        return ModelsSeen::Refused {
            status: status.as_u16(),
            said: scrub(&server_said(&body)),
        };
    }
    if let Err(why) = complete {
        return ModelsSeen::Unlisted(why);
    }
    match serde_json::from_slice::<ModelList>(&body) {
        Ok(list) => ModelsSeen::Listed(list.data.into_iter().map(|m| scrub(&m.id)).collect()),
        Err(_) => ModelsSeen::Unlisted("not an OpenAI model list".to_owned()),
    }
}

/// What the model server says about the model seeing pictures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VisionSeen {
    /// llama.cpp's `GET /props`: `modalities.vision` (true only with a multimodal projector).
    LlamaCpp(bool),
    /// Ollama's `POST /api/show`: whether `capabilities` has `vision`.
    Ollama(bool),
    /// The server says nothing about it (hosted APIs, vLLM).
    Unknown,
}

/// Asks the server at `config.base_url` (without its `/v1`) whether the model sees pictures:
/// llama.cpp's `/props`, then Ollama's `/api/show`.
pub async fn vision(config: &OpenAiConfig) -> VisionSeen {
    let Ok(http) = client(config.tuning.connect_timeout.min(ANSWER_TIMEOUT)) else {
        return VisionSeen::Unknown;
    };
    let root = config.base_url.trim_end_matches('/');
    let root = root.strip_suffix("/v1").unwrap_or(root);
    let json = |mut r: reqwest::Response| async move {
        if !r.status().is_success() {
            return None;
        }
        let mut body = Vec::new();
        while let Some(chunk) = r.chunk().await.ok()? {
            if body.len() + chunk.len() > MAX_BODY {
                return None;
            }
            body.extend_from_slice(&chunk);
        }
        serde_json::from_slice::<serde_json::Value>(&body).ok()
    };
    let mut props = http.get(format!("{root}/props"));
    if let Some(key) = &config.api_key {
        props = props.bearer_auth(key.expose());
    }
    if let Ok(r) = props.send().await
        && let Some(v) = json(r).await
        && let Some(vision) = v
            .pointer("/modalities/vision")
            .and_then(serde_json::Value::as_bool)
    {
        return VisionSeen::LlamaCpp(vision);
    }
    let show = http
        .post(format!("{root}/api/show"))
        .json(&serde_json::json!({ "model": config.model }));
    if let Ok(r) = show.send().await
        && let Some(v) = json(r).await
        && let Some(caps) = v.get("capabilities").and_then(serde_json::Value::as_array)
    {
        // Ollama says `vision`; llama-server's own `/api/show` says `multimodal`.
        return VisionSeen::Ollama(caps.iter().any(|c| c == "vision" || c == "multimodal"));
    }
    VisionSeen::Unknown
}

fn client(connect_timeout: Duration) -> Result<reqwest::Client, String> {
    reqwest::Client::builder()
        .connect_timeout(connect_timeout)
        .timeout(ANSWER_TIMEOUT)
        .user_agent(concat!("mxbridge-agent-doctor/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| chain(&e))
}

/// What a server's error body says: `error.message` (or `error`, or `message`) of JSON, else
/// the text.
fn server_said(body: &[u8]) -> String {
    let json: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let message = json.as_ref().and_then(|v| {
        let error = v.get("error");
        error
            .and_then(|e| e.get("message"))
            .or(error)
            .or_else(|| v.get("message"))
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
    });
    message.unwrap_or_else(|| String::from_utf8_lossy(body).into_owned())
}

/// An error and its causes, `: `-separated (reqwest's own message says little).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

/// `text` shortened, on one line, without control characters and without `secrets`.
fn clean(text: &str, secrets: &[&str]) -> String {
    let mut text = text.to_owned();
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        text = text.replace(secret, "[redacted]");
    }
    let text: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_TEXT)
        .collect();
    text.trim().to_owned()
}

/// `program` as the agent would run it: a path, or the first executable of that name in PATH.
pub fn program(program: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let runnable = |p: &std::path::Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let p = std::path::PathBuf::from(program);
        return runnable(&p).then_some(p);
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join(program))
        .find(|p| runnable(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_messages_are_found_and_cleaned() {
        let cases: &[(&str, &str)] = &[
            (
                r#"{"error":{"message":"Incorrect API key provided: sk-secret","type":"x"}}"#,
                "Incorrect API key provided: [redacted]",
            ),
            (r#"{"error":"model not loaded"}"#, "model not loaded"),
            (r#"{"message":"Unauthorized"}"#, "Unauthorized"),
            ("Not Found\n\u{1b}[31mred", "Not Found  [31mred"),
            ("", ""),
        ];
        for (body, want) in cases {
            assert_eq!(
                clean(&server_said(body.as_bytes()), &["sk-secret"]),
                *want,
                "{body}"
            );
        }
        assert_eq!(clean(&"x".repeat(1000), &[]).len(), MAX_TEXT);
    }

    #[test]
    fn wildcards_are_reached_on_loopback() {
        let cases = [
            ("0.0.0.0", "127.0.0.1"),
            ("::", "::1"),
            ("10.1.2.3", "10.1.2.3"),
        ];
        for (ip, want) in cases {
            assert_eq!(reachable(ip.parse().unwrap()).to_string(), want);
        }
    }

    #[test]
    fn folders() {
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(dir(tmp.path()), DirSeen::Writable);
        assert_eq!(
            std::fs::read_dir(tmp.path()).unwrap().count(),
            0,
            "the probe file is gone"
        );
        assert_eq!(
            dir(&tmp.path().join("a/b")),
            DirSeen::Missing {
                parent_writable: true
            }
        );
        let file = tmp.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        assert_eq!(dir(&file), DirSeen::NotADirectory);
        assert_eq!(
            dir(&file.join("below")),
            DirSeen::Missing {
                parent_writable: false
            }
        );
        assert_eq!(sentinel(tmp.path()), SentinelSeen::None);
        let sentinels = tmp.path().join(SENTINEL_DIR);
        std::fs::create_dir_all(&sentinels).unwrap();
        assert_eq!(sentinel(tmp.path()), SentinelSeen::None);
        std::fs::write(sentinels.join("abc"), b"abc").unwrap();
        assert!(matches!(sentinel(tmp.path()), SentinelSeen::Newest(_)));
        assert_eq!(workspace(tmp.path()).1, None, "no chats/ yet");
        std::fs::create_dir(tmp.path().join("chats")).unwrap();
        assert_eq!(workspace(tmp.path()).1, Some(DirSeen::Writable));
    }
}
