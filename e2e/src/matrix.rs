//! A Matrix user over the client-server API (plain HTTP, no SDK), and admin registration by
//! shared secret against the test homeserver.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use hmac::{KeyInit, Mac};
use serde_json::{Value, json};

/// The homeserver the test command started (see `scripts/synapse.sh`).
#[derive(Debug, Clone)]
pub struct Homeserver {
    /// e.g. `http://127.0.0.1:18008`.
    pub url: String,
    /// The `server_name`, e.g. `localhost`.
    pub server_name: String,
    secret: String,
    http: reqwest::Client,
}

impl Homeserver {
    /// Reads `E2E_HOMESERVER_URL`, `E2E_SERVER_NAME` and `E2E_REGISTRATION_SECRET`.
    ///
    /// Panics with instructions when they are missing: these tests need the real homeserver
    /// that `scripts/test.sh` starts, and must not pass without it.
    pub fn from_env() -> Self {
        let get = |k: &str| {
            std::env::var(k).unwrap_or_else(|_| {
                panic!("{k} is not set: run the end-to-end tests through scripts/test.sh, which starts Synapse")
            })
        };
        Self::new(
            get("E2E_HOMESERVER_URL"),
            get("E2E_SERVER_NAME"),
            get("E2E_REGISTRATION_SECRET"),
        )
    }

    /// A homeserver at `url` whose admin registration uses the shared `secret`.
    pub fn new(url: String, server_name: String, secret: String) -> Self {
        Self {
            url,
            server_name,
            secret,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(600))
                .build()
                .expect("http client"),
        }
    }

    /// Registers `localpart` through the shared-secret admin API and returns a logged-in user.
    pub async fn register(&self, localpart: &str, admin: bool) -> Result<User> {
        let endpoint = format!("{}/_synapse/admin/v1/register", self.url);
        let nonce: Value = self.http.get(&endpoint).send().await?.json().await?;
        let nonce = nonce["nonce"].as_str().context("nonce")?.to_owned();
        let password = format!("pw-{localpart}-Secret1");
        let mut mac = hmac::Hmac::<sha1::Sha1>::new_from_slice(self.secret.as_bytes())?;
        mac.update(nonce.as_bytes());
        mac.update(b"\0");
        mac.update(localpart.as_bytes());
        mac.update(b"\0");
        mac.update(password.as_bytes());
        mac.update(b"\0");
        mac.update(if admin {
            b"admin" as &[u8]
        } else {
            b"notadmin"
        });
        let digest = hex::encode(mac.finalize().into_bytes());
        let resp = self
            .http
            .post(&endpoint)
            .json(
                &json!({"nonce": nonce, "username": localpart, "password": password,
                          "admin": admin, "mac": digest}),
            )
            .send()
            .await?;
        let status = resp.status();
        let body: Value = resp.json().await?;
        if !status.is_success() {
            bail!("register {localpart}: {status} {body}");
        }
        Ok(User {
            hs: self.clone(),
            user_id: body["user_id"].as_str().context("user_id")?.to_owned(),
            device_id: body["device_id"].as_str().context("device_id")?.to_owned(),
            token: body["access_token"].as_str().context("token")?.to_owned(),
            password,
        })
    }
}

/// A logged-in Matrix user.
#[derive(Debug, Clone)]
pub struct User {
    hs: Homeserver,
    /// Full user id.
    pub user_id: String,
    /// Device id of the registration login.
    pub device_id: String,
    /// Access token (test-only account).
    pub token: String,
    /// Password (test-only account).
    pub password: String,
}

/// A room event as the client-server API returns it.
pub type Event = Value;

impl User {
    fn url(&self, path: &str) -> String {
        format!("{}/_matrix/client/v3{path}", self.hs.url)
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value> {
        // Only a request that never reached the server may be repeated when it is not
        // idempotent; a PUT carries its transaction id, so repeating it cannot post twice.
        let replay = if method == reqwest::Method::POST {
            Replay::IfUnsent
        } else {
            Replay::Always
        };
        let url = self.url(path);
        send_patiently(&format!("{method} {path}"), replay, || {
            let mut req = self
                .hs
                .http
                .request(method.clone(), &url)
                .bearer_auth(&self.token);
            if let Some(b) = &body {
                req = req.json(b);
            }
            Ok(req)
        })
        .await
    }

    /// Creates a private room, inviting `invite`; `direct` marks it as a DM.
    pub async fn create_room(&self, invite: &[&str], direct: bool) -> Result<String> {
        self.create_room_with(
            json!({"preset": "private_chat", "invite": invite, "is_direct": direct}),
        )
        .await
    }

    /// Creates a room from a full `createRoom` request body and returns its id.
    pub async fn create_room_with(&self, request: Value) -> Result<String> {
        let v = self
            .call(reqwest::Method::POST, "/createRoom", Some(request))
            .await?;
        Ok(v["room_id"].as_str().context("room_id")?.to_owned())
    }

    /// The content of a room's state event.
    pub async fn state(&self, room: &str, event_type: &str, state_key: &str) -> Result<Value> {
        self.call(
            reqwest::Method::GET,
            &format!("/rooms/{}/state/{event_type}/{}", enc(room), enc(state_key)),
            None,
        )
        .await
    }

    /// Sets a room's state event and returns its event id.
    pub async fn put_state(
        &self,
        room: &str,
        event_type: &str,
        state_key: &str,
        content: Value,
    ) -> Result<String> {
        let v = self
            .call(
                reqwest::Method::PUT,
                &format!("/rooms/{}/state/{event_type}/{}", enc(room), enc(state_key)),
                Some(content),
            )
            .await?;
        Ok(v["event_id"].as_str().context("event_id")?.to_owned())
    }

    /// Exempts `user_id` from the message rate limit (`0` means unlimited); needs an admin.
    pub async fn admin_override_ratelimit(
        &self,
        user_id: &str,
        messages_per_second: u32,
        burst_count: u32,
    ) -> Result<()> {
        let url = format!(
            "{}/_synapse/admin/v1/users/{}/override_ratelimit",
            self.hs.url,
            enc(user_id)
        );
        send_patiently("override_ratelimit", Replay::Always, || {
            Ok(self.hs.http.post(&url).bearer_auth(&self.token).json(
                &json!({"messages_per_second": messages_per_second, "burst_count": burst_count}),
            ))
        })
        .await?;
        Ok(())
    }

    /// Joined members of a room.
    pub async fn joined_members(&self, room: &str) -> Result<Vec<String>> {
        let v = self
            .call(
                reqwest::Method::GET,
                &format!("/rooms/{}/joined_members", enc(room)),
                None,
            )
            .await?;
        Ok(v["joined"]
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default())
    }

    /// Sends an `m.room.message` and returns its event id. Waits out a homeserver that is
    /// briefly down, restarting or rate limiting; every attempt carries the same transaction id,
    /// so a retry after a lost response cannot post the message twice.
    pub async fn send(&self, room: &str, content: Value) -> Result<String> {
        let txn = crate::unique("t");
        let v = self
            .call(
                reqwest::Method::PUT,
                &format!("/rooms/{}/send/m.room.message/{txn}", enc(room)),
                Some(content),
            )
            .await?;
        Ok(v["event_id"].as_str().context("event_id")?.to_owned())
    }

    /// Sends a plain text message.
    pub async fn send_text(&self, room: &str, text: &str) -> Result<String> {
        self.send(room, json!({"msgtype": "m.text", "body": text}))
            .await
    }

    /// Uploads a file from disk, streamed, and returns its `mxc://` URI. Waits out a homeserver
    /// that is briefly down (a repeated upload only leaves an unused copy behind).
    pub async fn upload_path(&self, path: &Path, content_type: &str) -> Result<String> {
        let len = std::fs::metadata(path)?.len();
        self.upload_with(len, content_type, || {
            let file = tokio::fs::File::from_std(std::fs::File::open(path)?);
            Ok(reqwest::Body::wrap_stream(
                tokio_util::io::ReaderStream::with_capacity(file, 1 << 16),
            ))
        })
        .await
    }

    /// Uploads bytes and returns the `mxc://` URI; waits out a homeserver that is briefly down.
    pub async fn upload(&self, bytes: Vec<u8>, content_type: &str) -> Result<String> {
        let len = bytes.len() as u64;
        self.upload_with(len, content_type, || Ok(bytes.clone().into()))
            .await
    }

    async fn upload_with(
        &self,
        len: u64,
        content_type: &str,
        mut body: impl FnMut() -> Result<reqwest::Body>,
    ) -> Result<String> {
        let url = format!("{}/_matrix/media/v3/upload", self.hs.url);
        let v = send_patiently("upload", Replay::Always, || {
            Ok(self
                .hs
                .http
                .post(&url)
                .bearer_auth(&self.token)
                .header("content-type", content_type)
                .header("content-length", len)
                .body(body()?))
        })
        .await?;
        Ok(v["content_uri"].as_str().context("content_uri")?.to_owned())
    }

    /// Downloads media through the authenticated endpoint into memory.
    pub async fn download(&self, mxc: &str) -> Result<Vec<u8>> {
        let resp = self.download_resp(mxc).await?;
        Ok(resp.bytes().await?.to_vec())
    }

    /// Downloads media and returns (sha256 hex, length) without holding it in memory.
    pub async fn download_digest(&self, mxc: &str) -> Result<(String, u64)> {
        use futures_util::StreamExt;
        use sha2::Digest;
        let resp = self.download_resp(mxc).await?;
        let mut hasher = sha2::Sha256::new();
        let mut len = 0u64;
        let mut stream = resp.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            len += chunk.len() as u64;
            hasher.update(&chunk);
        }
        Ok((hex::encode(hasher.finalize()), len))
    }

    async fn download_resp(&self, mxc: &str) -> Result<reqwest::Response> {
        let rest = mxc.strip_prefix("mxc://").context("not an mxc uri")?;
        let resp = self
            .hs
            .http
            .get(format!(
                "{}/_matrix/client/v1/media/download/{rest}",
                self.hs.url
            ))
            .bearer_auth(&self.token)
            .send()
            .await?;
        if !resp.status().is_success() {
            bail!("download {mxc}: {}", resp.status());
        }
        Ok(resp)
    }

    /// Deletes media from the server (requires an admin user).
    pub async fn admin_delete_media(&self, mxc: &str) -> Result<()> {
        let rest = mxc.strip_prefix("mxc://").context("not an mxc uri")?;
        let resp = self
            .hs
            .http
            .delete(format!("{}/_synapse/admin/v1/media/{rest}", self.hs.url))
            .bearer_auth(&self.token)
            .send()
            .await?;
        if !resp.status().is_success() {
            bail!("delete media {mxc}: {}", resp.status());
        }
        Ok(())
    }

    /// All `m.room.message` events of a room, oldest first.
    pub async fn messages(&self, room: &str) -> Result<Vec<Event>> {
        Ok(self
            .events(room)
            .await?
            .into_iter()
            .filter(|e| e["type"] == "m.room.message")
            .collect())
    }

    /// Every timeline event of a room (messages, reactions, state), oldest first.
    pub async fn events(&self, room: &str) -> Result<Vec<Event>> {
        let mut out = Vec::new();
        let mut from: Option<String> = None;
        loop {
            let mut path = format!("/rooms/{}/messages?dir=b&limit=100", enc(room));
            if let Some(f) = &from {
                path.push_str(&format!("&from={}", enc(f)));
            }
            let v = self.call(reqwest::Method::GET, &path, None).await?;
            let chunk = v["chunk"].as_array().cloned().unwrap_or_default();
            if chunk.is_empty() {
                break;
            }
            out.extend(chunk);
            match v["end"].as_str() {
                Some(end) => from = Some(end.to_owned()),
                None => break,
            }
        }
        out.reverse();
        Ok(out)
    }

    /// Messages in `room` sent by `sender`, oldest first.
    pub async fn messages_from(&self, room: &str, sender: &str) -> Result<Vec<Event>> {
        Ok(self
            .messages(room)
            .await?
            .into_iter()
            .filter(|e| e["sender"] == sender)
            .collect())
    }
}

/// How long a request keeps being retried while the homeserver is unreachable, restarting or
/// rate limiting: longer than a Synapse restart takes on a slow machine.
const OUTAGE_PATIENCE: Duration = Duration::from_secs(60);

/// Which failed requests [`send_patiently`] may send again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replay {
    /// Any transport failure: the request is idempotent (GET, a PUT with a transaction id) or
    /// harmless to repeat.
    Always,
    /// Only when the connection was never made, so the server cannot have seen the request.
    IfUnsent,
}

/// Sends the request `make` builds and returns its JSON answer, retrying (with a fresh request
/// from `make`) while the homeserver refuses connections, answers 502/503/504, or answers 429
/// (after its `retry_after_ms`), for up to [`OUTAGE_PATIENCE`]. Other errors fail at once.
async fn send_patiently(
    what: &str,
    replay: Replay,
    mut make: impl FnMut() -> Result<reqwest::RequestBuilder>,
) -> Result<Value> {
    let deadline = Instant::now() + OUTAGE_PATIENCE;
    let mut backoff = Duration::from_millis(200);
    loop {
        let (wait, why) = match make()?.send().await {
            Err(e) if e.is_connect() || replay == Replay::Always => (backoff, e.to_string()),
            Err(e) => return Err(e).with_context(|| what.to_owned()),
            Ok(resp) => {
                let status = resp.status();
                let bytes = resp.bytes().await;
                let v: Value = bytes
                    .as_ref()
                    .ok()
                    .and_then(|b| serde_json::from_slice(b).ok())
                    .unwrap_or(Value::Null);
                match status.as_u16() {
                    429 => (
                        Duration::from_millis(v["retry_after_ms"].as_u64().unwrap_or(500)),
                        format!("{status} {v}"),
                    ),
                    502..=504 => (backoff, format!("{status}")),
                    _ if !status.is_success() => bail!("{what}: {status} {v}"),
                    // The server did it but the answer was lost on the way.
                    _ if bytes.is_err() && replay == Replay::Always => {
                        (backoff, format!("{status}, body lost"))
                    }
                    _ => {
                        let bytes = bytes.with_context(|| format!("{what}: {status}"))?;
                        return serde_json::from_slice(&bytes)
                            .with_context(|| format!("{what}: {status}, not JSON"));
                    }
                }
            }
        };
        if Instant::now() + wait > deadline {
            bail!("{what}: homeserver still unavailable after {OUTAGE_PATIENCE:?}: {why}");
        }
        tokio::time::sleep(wait).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

/// Percent-encodes a path segment.
pub(crate) fn enc(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The event a reply relates to: `m.relates_to` thread root or `m.in_reply_to` target.
pub fn replied_to(event: &Event) -> Option<String> {
    let rel = &event["content"]["m.relates_to"];
    rel["m.in_reply_to"]["event_id"]
        .as_str()
        .or_else(|| rel["event_id"].as_str())
        .map(str::to_owned)
}

/// Whether an event is in a thread rooted at `root`.
pub fn in_thread(event: &Event, root: &str) -> bool {
    let rel = &event["content"]["m.relates_to"];
    rel["rel_type"] == "m.thread" && rel["event_id"] == root
}

#[cfg(test)]
mod tests {
    use hmac::{KeyInit, Mac};

    #[test]
    fn hmac_sha1_known_vector() {
        let mut mac = hmac::Hmac::<sha1::Sha1>::new_from_slice(b"key").unwrap();
        mac.update(b"The quick brown fox jumps over the lazy dog");
        assert_eq!(
            hex::encode(mac.finalize().into_bytes()),
            "de7c9b85b8b78aa6bc8a7a36f70a90701c9db4d9"
        );
    }
}
