//! Gathering what the doctor looks at: plain client-server requests with the bot's token
//! (never matrix-sdk's client, which would open the running surface's crypto store or upload
//! keys for this device), the agent handshake, the workspace, the surface's health port and
//! its journal (read-only). Every call has a deadline; nothing here changes the bot's state
//! beyond the sentinel files a handshake writes anyway.

use std::sync::Arc;
use std::time::Duration;

use protocol::{ChatId, Secret};
use serde_json::{Value, json};

use super::findings::{CrossSigning, Login, Observations, RoomObservation, WaysIn};
use crate::agent_link::{self, AgentEndpoint};
use crate::config::Config;
use crate::context::WorkspaceSentinels;
use crate::health::Health;
use crate::journal::Journal;
use crate::session;
use crate::session::access::{self, Access, Observed};
use crate::workspace::Workspace;

/// Deadline of each request.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The chat id of the doctor's handshake (the agent never sees a turn on it).
const PROBE_CHAT: &str = "mxbridge-doctor";

/// The client-server API with the bot's token.
struct Cs {
    http: reqwest::Client,
    base: String,
    token: Option<Secret>,
}

impl Cs {
    async fn get(&self, path: &str) -> Result<Value, String> {
        self.send(self.http.get(format!("{}{path}", self.base)))
            .await
    }

    async fn post(&self, path: &str, body: &Value) -> Result<Value, String> {
        self.send(self.http.post(format!("{}{path}", self.base)).json(body))
            .await
    }

    async fn send(&self, mut req: reqwest::RequestBuilder) -> Result<Value, String> {
        if let Some(t) = &self.token {
            req = req.bearer_auth(t.expose());
        }
        let resp = req.timeout(TIMEOUT).send().await.map_err(|e| {
            // reqwest errors name the URL, never the token.
            e.without_url().to_string()
        })?;
        let status = resp.status();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        if status.is_success() {
            Ok(body)
        } else {
            let code = body["errcode"].as_str().unwrap_or("");
            Err(format!("HTTP {} {code}", status.as_u16()).trim().to_owned())
        }
    }
}

/// The strings of a JSON array (none when it is not one).
fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Path segment encoding for ids (`!room:hs`, `@user:hs`).
fn seg(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

/// Gathers every observation; `room` and `sender` narrow the room checks.
pub async fn observe(config: &Config, room: Option<&str>, sender: Option<&str>) -> Observations {
    let http = reqwest::Client::builder()
        .timeout(TIMEOUT)
        .build()
        .unwrap_or_default();
    let base = config
        .homeserver_url
        .as_str()
        .trim_end_matches('/')
        .to_owned();
    let session = session_token(config);
    let cs = Cs {
        http: http.clone(),
        base,
        token: session.as_ref().map(|(t, _)| t.clone()),
    };
    let homeserver = cs
        .get("/_matrix/client/versions")
        .await
        .map(|v| strings(&v["versions"]));
    let refreshable = session.is_some_and(|(_, r)| r);
    let login = login(&cs, homeserver.is_ok(), refreshable).await;
    let ways_in = match homeserver.is_ok() {
        true => ways_in(&cs).await,
        false => None,
    };
    let logged_in = matches!(login, Login::As { .. });
    let joined_rooms = if logged_in {
        cs.get("/_matrix/client/v3/joined_rooms")
            .await
            .ok()
            .map(|v| strings(&v["joined_rooms"]))
    } else {
        None
    };
    let (cross_signing, backup) = if let Login::As { user_id, device_id } = &login {
        (
            cross_signing(&cs, user_id, device_id.as_deref()).await,
            Some(backup(&cs).await),
        )
    } else {
        (None, None)
    };
    let journal_path = config.state_dir.join("journal.sqlite");
    let journal = Journal::open_read_only(&journal_path)
        .map_err(|e| format!("{}: {e}", journal_path.display()));
    let journal_counts = journal_counts(&journal, &journal_path);
    let room = match room {
        Some(room_id) => Some(
            observe_room(
                &cs,
                config,
                room_id,
                sender,
                joined_rooms.as_deref().unwrap_or_default(),
                journal.as_ref().ok().and_then(Option::as_ref),
            )
            .await,
        ),
        None => None,
    };
    Observations {
        homeserver,
        login,
        ways_in,
        joined_rooms,
        cross_signing,
        backup,
        agent: agents(config).await,
        workspace: workspace(config),
        surface: surface_health(&http, config).await,
        mcp: match &config.mcp {
            Some(m) => Some(mcp_guarded(&http, m.bind).await),
            None => None,
        },
        journal: journal_counts,
        delayed_events: match logged_in {
            true => Some(
                cs.get("/_matrix/client/v3/capabilities")
                    .await
                    .map(|c| crate::capabilities::max_delay(&c)),
            ),
            false => None,
        },
        room,
    }
}

/// The journal's (unhandled, waiting for keys, parked) counts, or why they cannot be read.
fn journal_counts(
    journal: &Result<Option<Journal>, String>,
    path: &std::path::Path,
) -> Result<Option<(u64, u64, u64)>, String> {
    match journal {
        Ok(Some(j)) => j
            .backlog()
            .and_then(|b| Ok((b.unhandled, b.waiting_for_keys, j.parked_count()?)))
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display())),
        Ok(None) => Ok(None),
        Err(e) => Err(e.clone()),
    }
}

/// Who the token belongs to, when the homeserver is `reachable` and there is a token. A
/// refusal is judged as the surface judges it; the doctor never refreshes (a refresh token is
/// single-use, and the running surface owns it).
async fn login(cs: &Cs, reachable: bool, refreshable: bool) -> Login {
    match (reachable, &cs.token) {
        (false, _) => Login::Unknown,
        (true, None) => Login::NoSession,
        (true, Some(t)) => {
            let url = format!("{}/_matrix/client/v3/account/whoami", cs.base);
            let resp = match cs.http.get(url).bearer_auth(t.expose()).send().await {
                Ok(r) => r,
                Err(e) => return Login::Refused(e.without_url().to_string()),
            };
            let status = resp.status();
            let v: Value = resp.json().await.unwrap_or(Value::Null);
            if status.is_success() {
                return Login::As {
                    user_id: v["user_id"].as_str().unwrap_or_default().to_owned(),
                    device_id: v["device_id"].as_str().map(str::to_owned),
                };
            }
            let seen = Observed {
                errcode: v["errcode"].as_str().map(str::to_owned),
                soft_logout: v["soft_logout"].as_bool().unwrap_or(false),
                refreshing: false,
            };
            match access::judge(&seen) {
                Access::Out(out) => Login::Out { out, refreshable },
                Access::Unsettled => Login::Refused(
                    format!(
                        "HTTP {} {}",
                        status.as_u16(),
                        seen.errcode.as_deref().unwrap_or("")
                    )
                    .trim()
                    .to_owned(),
                ),
            }
        }
    }
}

/// How the homeserver lets clients log in (`None` when `/login` does not answer).
async fn ways_in(cs: &Cs) -> Option<WaysIn> {
    let flows = cs.http.get(format!("{}/_matrix/client/v3/login", cs.base));
    let flows: Value = flows.send().await.ok()?.json().await.ok()?;
    let password = flows["flows"]
        .as_array()?
        .iter()
        .any(|f| f["type"] == "m.login.password");
    let mut oauth = false;
    for path in [
        "/_matrix/client/v1/auth_metadata",
        "/_matrix/client/unstable/org.matrix.msc2965/auth_metadata",
    ] {
        let answer = cs.http.get(format!("{}{path}", cs.base)).send().await;
        if let Ok(r) = answer
            && r.status().is_success()
            && let Ok(v) = r.json::<Value>().await
            && v["issuer"].is_string()
        {
            oauth = true;
            break;
        }
    }
    Some(WaysIn { password, oauth })
}

/// The access token the surface would use (the same pick it makes, [`session::saved::pick`]),
/// and whether a refresh token comes with it.
fn session_token(config: &Config) -> Option<(Secret, bool)> {
    let saved = session::saved::load(&session::session_path(&config.state_dir))
        .ok()
        .flatten();
    let s = session::saved::pick(&config.user_id, config.auth.token.as_ref(), saved)?;
    let refreshable = s.session.tokens.refresh_token.is_some();
    Some((Secret::new(s.session.tokens.access_token), refreshable))
}

async fn cross_signing(cs: &Cs, user_id: &str, device_id: Option<&str>) -> Option<CrossSigning> {
    let v = cs
        .post(
            "/_matrix/client/v3/keys/query",
            &json!({ "device_keys": { user_id: [] } }),
        )
        .await
        .ok()?;
    let master = v["master_keys"][user_id].is_object();
    let self_signing: Vec<String> = v["self_signing_keys"][user_id]["keys"]
        .as_object()
        .map(|k| k.keys().cloned().collect())
        .unwrap_or_default();
    let device_signed = device_id.is_some_and(|d| {
        let sigs = &v["device_keys"][user_id][d]["signatures"][user_id];
        self_signing.iter().any(|k| sigs[k].is_string())
    });
    Some(CrossSigning {
        master,
        device_signed,
    })
}

async fn backup(cs: &Cs) -> Result<Option<String>, String> {
    match cs.get("/_matrix/client/v3/room_keys/version").await {
        Ok(v) => Ok(v["version"].as_str().map(str::to_owned)),
        Err(e) if e.contains("M_NOT_FOUND") => Ok(None),
        Err(e) => Err(format!("cannot read the backup version: {e}")),
    }
}

async fn observe_room(
    cs: &Cs,
    config: &Config,
    room_id: &str,
    sender: Option<&str>,
    joined: &[String],
    journal: Option<&Journal>,
) -> RoomObservation {
    let mut room = RoomObservation {
        room_id: room_id.to_owned(),
        joined: joined.iter().any(|r| r == room_id),
        sender: sender.map(str::to_owned),
        journal: journal.and_then(|j| j.room_view(room_id).ok()),
        ..RoomObservation::default()
    };
    if !room.joined {
        return room;
    }
    let r = seg(room_id);
    if let Ok(v) = cs
        .get(&format!("/_matrix/client/v3/rooms/{r}/joined_members"))
        .await
    {
        room.members = v["joined"]
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
    }
    room.encrypted = cs
        .get(&format!(
            "/_matrix/client/v3/rooms/{r}/state/m.room.encryption/"
        ))
        .await
        .is_ok();
    room.alias = cs
        .get(&format!(
            "/_matrix/client/v3/rooms/{r}/state/m.room.canonical_alias/"
        ))
        .await
        .ok()
        .and_then(|v| v["alias"].as_str().map(str::to_owned));
    if room.sender.is_none() {
        room.sender = room
            .members
            .iter()
            .find(|m| *m != config.user_id.as_str())
            .cloned();
    }
    room
}

/// The real handshake: proves the URL, the token, the protocol version and that both
/// processes see the same workspace.
async fn agents(config: &Config) -> Vec<(String, Result<(), String>)> {
    let mut out = Vec::new();
    for url in &config.agent_urls {
        out.push((url.to_string(), agent(config, url).await));
    }
    out
}

async fn agent(config: &Config, url: &url::Url) -> Result<(), String> {
    let workspace = Workspace::open(&config.workspace_root).map_err(|e| e.to_string())?;
    let endpoint = AgentEndpoint {
        urls: config.agent_urls.clone(),
        token: config.agent_token.clone(),
        proof: Arc::new(WorkspaceSentinels(workspace)),
        health: Arc::new(Health::default()),
    };
    let chat = ChatId::new(PROBE_CHAT).map_err(|e| e.to_string())?;
    match tokio::time::timeout(TIMEOUT, agent_link::handshake(&endpoint, url, &chat)).await {
        Err(_) => Err("no answer within 10 s".into()),
        Ok(Err(e)) => Err(e.to_string()),
        Ok(Ok((conn, _))) => {
            conn.close().await;
            Ok(())
        }
    }
}

fn workspace(config: &Config) -> Result<(), String> {
    let root = &config.workspace_root;
    if !root.is_dir() {
        return Err("does not exist or is not a directory".into());
    }
    tempfile::Builder::new()
        .prefix(".doctor-")
        .tempfile_in(root)
        .map(drop)
        .map_err(|e| format!("not writable: {e}"))
}

/// An MCP request without a token: a running surface's MCP server answers 401.
async fn mcp_guarded(http: &reqwest::Client, bind: std::net::SocketAddr) -> Result<u16, String> {
    let mut addr = bind;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    http.post(format!("http://{addr}/mcp"))
        .timeout(TIMEOUT)
        .send()
        .await
        .map(|r| r.status().as_u16())
        .map_err(|_| "nothing answers (is the surface running here?)".into())
}

async fn surface_health(http: &reqwest::Client, config: &Config) -> Result<String, String> {
    let mut addr = config.health_bind;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let url = format!("http://{addr}/healthz");
    match http.get(&url).timeout(TIMEOUT).send().await {
        Err(_) => Err(format!(
            "no surface answers on {addr} (not running here, or SURFACE_HEALTH_BIND differs); \
             the checks above were made without it"
        )),
        Ok(r) if r.status().is_success() => Ok(r.text().await.unwrap_or_default()),
        Ok(r) => {
            let status = r.status().as_u16();
            let body = r.text().await.unwrap_or_default();
            Err(format!(
                "running on {addr} but not ready (HTTP {status}): {}",
                body.chars().take(1_000).collect::<String>()
            ))
        }
    }
}
