//! A Matrix user speaking end-to-end encryption through matrix-sdk itself, as Element users do:
//! its own device and crypto store, encrypted DMs, and a record of every message it sees after
//! decryption (and of the typing notices).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use matrix_sdk::attachment::AttachmentConfig;
use matrix_sdk::authentication::matrix::MatrixSession;
use matrix_sdk::config::SyncSettings;
use matrix_sdk::deserialized_responses::{EncryptionInfo, TimelineEventKind};
use matrix_sdk::media::{MediaFormat, MediaRequestParameters};
use matrix_sdk::room::MessagesOptions;
use matrix_sdk::ruma::api::client::filter::FilterDefinition;
use matrix_sdk::ruma::api::client::room::create_room::v3::{
    Request as CreateRoomRequest, RoomPreset,
};
use matrix_sdk::ruma::api::client::sync::sync_events::v3::Filter;
use matrix_sdk::ruma::events::receipt::{ReceiptThread, ReceiptType};
use matrix_sdk::ruma::events::relation::Thread;
use matrix_sdk::ruma::events::room::encrypted::SyncRoomEncryptedEvent;
use matrix_sdk::ruma::events::room::encryption::RoomEncryptionEventContent;
use matrix_sdk::ruma::events::room::member::MembershipState;
use matrix_sdk::ruma::events::room::message::{
    FileInfo, FileMessageEventContent, FormattedBody, MessageType, OriginalSyncRoomMessageEvent,
    Relation, RoomMessageEventContent, TextMessageEventContent,
};
use matrix_sdk::ruma::events::room::{EncryptedFile, MediaSource};
use matrix_sdk::ruma::events::typing::SyncTypingEvent;
use matrix_sdk::ruma::events::{AnySyncMessageLikeEvent, AnySyncTimelineEvent, InitialStateEvent};
use matrix_sdk::ruma::{EventEncryptionAlgorithm, EventId, RoomId, UInt, UserId};
use matrix_sdk::store::RoomLoadSettings;
use matrix_sdk::{Client, Room};
use serde_json::Value;

use crate::{Homeserver, User};

/// A message as this user's client shows it: decrypted, with its relations and media.
#[derive(Debug, Clone)]
pub struct Received {
    /// Event id.
    pub event_id: String,
    /// Sender's user id.
    pub sender: String,
    /// `m.text`, `m.notice`, `m.image`, `m.file`, `m.audio`, `m.video`, ...
    pub msgtype: String,
    /// The plain `body` (the caption or file name for media).
    pub body: String,
    /// The `formatted_body`, if any.
    pub formatted: Option<String>,
    /// The thread root, for an event in a thread.
    pub thread_root: Option<String>,
    /// The `m.in_reply_to` target (also inside a thread).
    pub in_reply_to: Option<String>,
    /// The event this one edits (`m.replace`).
    pub replaces: Option<String>,
    /// For an edit: the new `body` (`m.new_content`), what the client shows from then on.
    pub new_body: Option<String>,
    /// Where the media is, for media messages: [`MediaSource::Encrypted`] in an encrypted room.
    pub source: Option<MediaSource>,
    /// The media's `filename`, if the sender set one.
    pub filename: Option<String>,
    /// The media's declared MIME type.
    pub mimetype: Option<String>,
    /// The media's declared size in bytes.
    pub size: Option<u64>,
    /// Whether the event reached this client encrypted (and was decrypted by it).
    pub was_encrypted: bool,
    /// The whole (decrypted) content, for fields the others do not cover.
    pub content: Value,
}

/// The `content` of an event's JSON.
fn raw_content(json: &str) -> Option<Value> {
    serde_json::from_str::<Value>(json)
        .ok()?
        .get_mut("content")
        .map(Value::take)
}

impl Received {
    fn from_event(
        ev: &OriginalSyncRoomMessageEvent,
        raw_content: Option<Value>,
        was_encrypted: bool,
    ) -> Self {
        let new_body = match &ev.content.relates_to {
            Some(Relation::Replacement(r)) => Some(r.new_content.msgtype.body().to_owned()),
            _ => None,
        };
        let (thread_root, in_reply_to, replaces) = match &ev.content.relates_to {
            Some(Relation::Thread(t)) => (
                Some(t.event_id.to_string()),
                t.in_reply_to.as_ref().map(|r| r.event_id.to_string()),
                None,
            ),
            Some(Relation::Reply(r)) => (None, Some(r.in_reply_to.event_id.to_string()), None),
            Some(Relation::Replacement(r)) => (None, None, Some(r.event_id.to_string())),
            _ => (None, None, None),
        };
        let html = |f: &Option<FormattedBody>| f.as_ref().map(|f| f.body.clone());
        let mut me = Self {
            event_id: ev.event_id.to_string(),
            sender: ev.sender.to_string(),
            msgtype: ev.content.msgtype().to_owned(),
            body: ev.content.body().to_owned(),
            formatted: None,
            thread_root,
            in_reply_to,
            replaces,
            new_body,
            source: None,
            filename: None,
            mimetype: None,
            size: None,
            was_encrypted,
            content: serde_json::to_value(&ev.content).unwrap_or_default(),
        };
        if let Some(content) = raw_content {
            // As sent, with the keys the typed content has no field for.
            me.content = content;
        }
        let size = |s: Option<UInt>| s.map(u64::from);
        // The four media kinds have the same fields in different ruma types.
        macro_rules! media {
            ($c:expr) => {{
                me.formatted = html(&$c.formatted);
                me.source = Some($c.source.clone());
                me.filename = $c.filename.clone();
                me.mimetype = $c.info.as_ref().and_then(|i| i.mimetype.clone());
                me.size = size($c.info.as_ref().and_then(|i| i.size));
            }};
        }
        match &ev.content.msgtype {
            MessageType::Text(c) => me.formatted = html(&c.formatted),
            MessageType::Notice(c) => me.formatted = html(&c.formatted),
            MessageType::Emote(c) => me.formatted = html(&c.formatted),
            MessageType::Image(c) => media!(c),
            MessageType::File(c) => media!(c),
            MessageType::Audio(c) => media!(c),
            MessageType::Video(c) => media!(c),
            _ => {}
        }
        me
    }

    /// The file name a client would show: `filename`, else the body.
    pub fn file_name(&self) -> &str {
        self.filename.as_deref().unwrap_or(&self.body)
    }

    /// The event this message answers: its `m.in_reply_to` target, else its thread root.
    pub fn answers(&self) -> Option<&str> {
        self.in_reply_to.as_deref().or(self.thread_root.as_deref())
    }
}

/// One timeline message event the sync delivered, in arrival order.
#[derive(Debug, Clone)]
enum Seen {
    Message(Box<Received>),
    /// Still encrypted: its room key has not reached this device (yet).
    Undecryptable {
        event_id: String,
        sender: String,
    },
}

/// Every message event the sync delivered, per room, in timeline order.
#[derive(Debug, Default)]
struct Recorder {
    rooms: std::collections::BTreeMap<String, Vec<Seen>>,
    /// How many undecryptable events the sync ever delivered (also those decrypted later).
    undecryptable_seen: usize,
    /// Per room, every typing notice the sync delivered: who was typing, in arrival order.
    typing: std::collections::BTreeMap<String, Vec<Vec<String>>>,
}

/// Aborts the sync task when dropped.
#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A user logged in with a new matrix-sdk device (its own sqlite crypto store), syncing in the
/// background until dropped.
#[derive(Debug)]
pub struct E2eeUser {
    /// Full user id.
    pub user_id: String,
    /// The device this login created.
    pub device_id: String,
    client: Client,
    recorder: Arc<Mutex<Recorder>>,
    /// The homeserver itself (not a proxy in front of it), for reading events as stored.
    hs: Homeserver,
    http: reqwest::Client,
    // Field order matters: the sync task stops before the store directory goes away.
    _sync: AbortOnDrop,
    /// The temporary store folder, removed with the user (`None`: the caller keeps it).
    _store: Option<tempfile::TempDir>,
}

/// A matrix-sdk client on `url` with its sqlite store at `store`.
async fn build_client(url: &str, store: &Path) -> Result<Client> {
    Client::builder()
        .homeserver_url(url)
        // Keep talking to `url` (a proxy, or a published port), whatever the login says.
        .respect_login_well_known(false)
        .sqlite_store(store, None)
        .build()
        .await
        .context("build matrix-sdk client")
}

impl E2eeUser {
    /// Registers a new account on `hs` (its localpart `prefix` plus a unique suffix) and logs
    /// it in with a new device.
    pub async fn register(hs: &Homeserver, prefix: &str) -> Result<Self> {
        let account = hs.register(&crate::unique(prefix), false).await?;
        Self::login(hs, &account).await
    }

    /// Logs `user` in on `hs` with a new device (see [`E2eeUser::login_at`]).
    pub async fn login(hs: &Homeserver, user: &User) -> Result<Self> {
        Self::login_at(hs, &hs.url, user).await
    }

    /// Logs `user` in with a new device, its client talking to `url` (the homeserver, or a
    /// proxy in front of it). Returns once the device's keys are uploaded and the first sync is
    /// done; a background task keeps syncing.
    pub async fn login_at(hs: &Homeserver, url: &str, user: &User) -> Result<Self> {
        let store = tempfile::Builder::new()
            .prefix("mxbridge-e2ee-")
            .tempdir()?;
        let client = build_client(url, store.path()).await?;
        let login = client
            .matrix_auth()
            .login_username(&user.user_id, &user.password)
            .initial_device_display_name("e2e test user")
            .send()
            .await
            .with_context(|| format!("log {} in", user.user_id))?;
        let (user_id, device_id) = (login.user_id.to_string(), login.device_id.to_string());
        Self::start(hs, client, user_id, device_id, Some(store)).await
    }

    /// The same device across processes: its crypto store and session live in `dir`. The first
    /// call logs `user_id` in with `password`; later calls restore that device.
    pub async fn persistent(
        hs: &Homeserver,
        user_id: &str,
        password: &str,
        dir: &Path,
    ) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let client = build_client(&hs.url, &dir.join("store")).await?;
        let session_file = dir.join("session.json");
        let session: MatrixSession = match std::fs::read(&session_file) {
            Ok(bytes) => {
                let session: MatrixSession = serde_json::from_slice(&bytes)?;
                client
                    .matrix_auth()
                    .restore_session(session.clone(), RoomLoadSettings::default())
                    .await?;
                session
            }
            Err(_) => {
                let login = client
                    .matrix_auth()
                    .login_username(user_id, password)
                    .initial_device_display_name("e2e test user")
                    .send()
                    .await
                    .with_context(|| format!("log {user_id} in"))?;
                let session = MatrixSession::from(&login);
                std::fs::write(&session_file, serde_json::to_vec(&session)?)?;
                session
            }
        };
        let (user_id, device_id) = (
            session.meta.user_id.to_string(),
            session.meta.device_id.to_string(),
        );
        Self::start(hs, client, user_id, device_id, None).await
    }

    /// Registers the recorder, runs the first sync (which uploads the device keys) and starts
    /// the background sync.
    async fn start(
        hs: &Homeserver,
        client: Client,
        user_id: String,
        device_id: String,
        store: Option<tempfile::TempDir>,
    ) -> Result<Self> {
        let recorder = Arc::new(Mutex::new(Recorder::default()));
        let rec = recorder.clone();
        client.add_event_handler(
            move |ev: OriginalSyncRoomMessageEvent,
                  room: Room,
                  encryption: Option<EncryptionInfo>,
                  raw: matrix_sdk::event_handler::RawEvent| {
                let rec = rec.clone();
                async move {
                    let msg =
                        Received::from_event(&ev, raw_content(raw.get()), encryption.is_some());
                    let mut r = rec.lock().expect("recorder lock");
                    let seen = r.rooms.entry(room.room_id().to_string()).or_default();
                    // A late key may already have turned a recorded placeholder into this.
                    if !seen
                        .iter()
                        .any(|s| matches!(s, Seen::Message(m) if m.event_id == msg.event_id))
                    {
                        seen.push(Seen::Message(Box::new(msg)));
                    }
                }
            },
        );
        let rec = recorder.clone();
        client.add_event_handler(move |ev: SyncRoomEncryptedEvent, room: Room| {
            let rec = rec.clone();
            async move {
                let mut r = rec.lock().expect("recorder lock");
                r.undecryptable_seen += 1;
                r.rooms
                    .entry(room.room_id().to_string())
                    .or_default()
                    .push(Seen::Undecryptable {
                        event_id: ev.event_id().to_string(),
                        sender: ev.sender().to_string(),
                    });
            }
        });

        let rec = recorder.clone();
        client.add_event_handler(move |ev: SyncTypingEvent, room: Room| {
            let rec = rec.clone();
            async move {
                let who = ev.content.user_ids.iter().map(|u| u.to_string()).collect();
                let mut r = rec.lock().expect("recorder lock");
                r.typing
                    .entry(room.room_id().to_string())
                    .or_default()
                    .push(who);
            }
        });

        // A generous timeline limit, so a burst between two syncs is not cut into a gap the
        // recorder would never see.
        let mut filter = FilterDefinition::default();
        filter.room.timeline.limit = Some(UInt::from(200u32));
        let settings = SyncSettings::default()
            .filter(Filter::FilterDefinition(filter))
            .timeout(Duration::from_secs(5));
        // The first sync uploads the device keys (and one-time keys) before anyone shares a
        // room key with this device.
        let first = client
            .sync_once(settings.clone())
            .await
            .context("first sync")?;
        let sync_client = client.clone();
        let sync = tokio::spawn(async move {
            let mut settings = settings.token(first.next_batch);
            loop {
                match sync_client.sync_once(settings.clone()).await {
                    Ok(r) => settings = settings.token(r.next_batch),
                    // The homeserver may be restarting; keep going.
                    Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
                }
            }
        });
        Ok(Self {
            user_id,
            device_id,
            client,
            recorder,
            hs: hs.clone(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()?,
            _sync: AbortOnDrop(sync),
            _store: store,
        })
    }

    /// The matrix-sdk client, for what this type does not wrap.
    pub fn client(&self) -> &Client {
        &self.client
    }

    fn room(&self, room: &str) -> Result<Room> {
        let id = RoomId::parse(room)?;
        self.client
            .get_room(&id)
            .with_context(|| format!("{} does not know room {room}", self.user_id))
    }

    /// Creates an encrypted direct chat with `bot` as Element does (`trusted_private_chat`
    /// preset, `is_direct`, the invite, `m.room.encryption` megolm in the initial state, the
    /// room added to `m.direct`) and returns its id without waiting for the bot.
    ///
    /// History visibility stays the preset's `shared`, so the SDK shares room keys with invited
    /// members too: messages sent before the bot joins are readable by it.
    pub async fn create_encrypted_dm(&self, bot: &str) -> Result<String> {
        let bot = UserId::parse(bot)?;
        let mut req = CreateRoomRequest::new();
        req.invite = vec![bot];
        req.is_direct = true;
        req.preset = Some(RoomPreset::TrustedPrivateChat);
        req.initial_state = vec![
            InitialStateEvent::with_empty_state_key(RoomEncryptionEventContent::new(
                EventEncryptionAlgorithm::MegolmV1AesSha2,
            ))
            .to_raw_any(),
        ];
        // The SDK also records the room in `m.direct` account data for an `is_direct` request.
        let room = self.client.create_room(req).await.context("create room")?;
        Ok(room.room_id().to_string())
    }

    /// A direct chat with `bot` without end-to-end encryption (as a client with encryption
    /// turned off creates one); returns its id without waiting for the bot.
    pub async fn create_unencrypted_dm(&self, bot: &str) -> Result<String> {
        let mut req = CreateRoomRequest::new();
        req.invite = vec![UserId::parse(bot)?];
        req.is_direct = true;
        req.preset = Some(RoomPreset::TrustedPrivateChat);
        let room = self.client.create_room(req).await.context("create room")?;
        Ok(room.room_id().to_string())
    }

    /// Element's flow for a new chat: create the encrypted DM and send `text` at once, before
    /// the bot has joined. Returns the room id and the message's event id.
    pub async fn start_dm_with_first_message(
        &self,
        bot: &str,
        text: &str,
    ) -> Result<(String, String)> {
        let room = self.create_encrypted_dm(bot).await?;
        let event = self.send_text(&room, text).await?;
        Ok((room, event))
    }

    /// Waits until this client's sync shows `member` joined to `room`.
    pub async fn wait_joined(&self, room: &str, member: &str, timeout: Duration) -> Result<()> {
        let member = UserId::parse(member)?;
        let deadline = Instant::now() + timeout;
        loop {
            let r = self.room(room)?;
            if let Ok(Some(m)) = r.get_member_no_sync(&member).await
                && *m.membership() == MembershipState::Join
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{member} did not join {room} within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Sets this user's display name and waits until this client's sync shows it in `room`:
    /// the homeserver updates the user's membership in each room on its own time, so a message
    /// sent before that is, rightly, still sent under the old name.
    pub async fn rename(&self, room: &str, name: &str, timeout: Duration) -> Result<()> {
        self.client
            .account()
            .set_display_name(Some(name))
            .await
            .context("set display name")?;
        let me = UserId::parse(&self.user_id)?;
        let what = format!("the name {name:?} in {room}");
        self.wait_for(timeout, &what, || async {
            let member = self.room(room).ok()?.get_member_no_sync(&me).await.ok()??;
            (member.display_name() == Some(name)).then_some(())
        })
        .await
    }

    /// Sends a plain text message (encrypted in an encrypted room) and returns its event id.
    pub async fn send_text(&self, room: &str, text: &str) -> Result<String> {
        let r = self.room(room)?;
        let sent = r
            .send(RoomMessageEventContent::text_plain(text))
            .await
            .with_context(|| format!("send text to {room}"))?;
        Ok(sent.response.event_id.to_string())
    }

    /// Sends a plain text message in the thread of `root` (as Element's thread panel does)
    /// and returns its event id.
    pub async fn send_in_thread(&self, room: &str, root: &str, text: &str) -> Result<String> {
        let root = EventId::parse(root)?;
        let mut content = RoomMessageEventContent::text_plain(text);
        content.relates_to = Some(Relation::Thread(Thread::plain(root.clone(), root)));
        let sent = self
            .room(room)?
            .send(content)
            .await
            .with_context(|| format!("send text to a thread in {room}"))?;
        Ok(sent.response.event_id.to_string())
    }

    /// Edits `event` to say `text`, as Element does (`m.replace` with `m.new_content`), and
    /// returns the edit's event id.
    pub async fn edit(&self, room: &str, event: &str, text: &str) -> Result<String> {
        let content = RoomMessageEventContent::text_plain(text).make_replacement(
            matrix_sdk::ruma::events::room::message::ReplacementMetadata::new(
                EventId::parse(event)?,
                None,
            ),
        );
        let sent = self
            .room(room)?
            .send(content)
            .await
            .with_context(|| format!("edit a message in {room}"))?;
        Ok(sent.response.event_id.to_string())
    }

    /// Sends `bytes` as an attachment (encrypted upload and event in an encrypted room) and
    /// returns the event id. The SDK picks the message type from `mime`: `image/*` → `m.image`,
    /// `audio/*` → `m.audio`, `video/*` → `m.video`, anything else → `m.file`. With a
    /// `caption` the body is the caption and `filename` the file name, as Element sends it.
    pub async fn send_file(
        &self,
        room: &str,
        filename: &str,
        mime: &str,
        bytes: Vec<u8>,
        caption: Option<&str>,
    ) -> Result<String> {
        let r = self.room(room)?;
        let mime: mime::Mime = mime.parse().with_context(|| format!("MIME type {mime}"))?;
        let config = AttachmentConfig::new().caption(caption.map(TextMessageEventContent::plain));
        let resp = r
            .send_attachment(filename, &mime, bytes, config)
            .await
            .with_context(|| format!("send {filename} to {room}"))?;
        Ok(resp.event_id.to_string())
    }

    /// Uploads `bytes` encrypted, as [`Self::send_file`] does before its event, and returns what
    /// the event describes; [`Self::send_encrypted_file`] sends it. Apart, a benchmark can time
    /// what the event sets off without the upload before it.
    pub async fn upload_encrypted(&self, bytes: &[u8]) -> Result<EncryptedFile> {
        let mut reader = bytes;
        self.client()
            .upload_encrypted_file(&mut reader)
            .await
            .context("upload an encrypted file")
    }

    /// Sends an `m.file` event (encrypted, in an encrypted room) for a `file` of `size` bytes
    /// uploaded by [`Self::upload_encrypted`]; returns the event id.
    pub async fn send_encrypted_file(
        &self,
        room: &str,
        filename: &str,
        mime: &str,
        size: u64,
        file: EncryptedFile,
    ) -> Result<String> {
        let r = self.room(room)?;
        let mut info = FileInfo::new();
        info.mimetype = Some(mime.to_owned());
        info.size = UInt::new(size);
        let content = FileMessageEventContent::encrypted(filename.to_owned(), file)
            .info(Some(Box::new(info)));
        let sent = r
            .send(RoomMessageEventContent::new(MessageType::File(content)))
            .await
            .with_context(|| format!("send {filename} to {room}"))?;
        Ok(sent.response.event_id.to_string())
    }

    /// Sends OGG/Opus `bytes` as a voice message, as Element records one (`m.audio` with the
    /// MSC3245 voice flag, duration and a waveform); returns the event id.
    pub async fn send_voice(
        &self,
        room: &str,
        filename: &str,
        bytes: Vec<u8>,
        duration: Duration,
    ) -> Result<String> {
        let r = self.room(room)?;
        let info = matrix_sdk::attachment::BaseAudioInfo {
            duration: Some(duration),
            size: UInt::new(bytes.len() as u64),
            waveform: Some(vec![0.1, 0.5, 0.9, 0.5, 0.1]),
        };
        let config =
            AttachmentConfig::new().info(matrix_sdk::attachment::AttachmentInfo::Voice(info));
        let resp = r
            .send_attachment(filename, &"audio/ogg".parse()?, bytes, config)
            .await
            .with_context(|| format!("send {filename} to {room}"))?;
        Ok(resp.event_id.to_string())
    }

    /// Every message this client has seen in `room` from `sender`, decrypted, in timeline
    /// order. Events still undecryptable are tried again first (their key may have arrived
    /// since), and left out while they stay undecryptable.
    pub async fn messages_from(&self, room: &str, sender: &str) -> Result<Vec<Received>> {
        self.retry_undecryptable(room).await?;
        let r = self.recorder.lock().expect("recorder lock");
        Ok(r.rooms
            .get(room)
            .into_iter()
            .flatten()
            .filter_map(|s| match s {
                Seen::Message(m) if m.sender == sender => Some(Received::clone(m)),
                _ => None,
            })
            .collect())
    }

    /// Every message this client has seen in `room`, from anyone.
    pub async fn messages(&self, room: &str) -> Result<Vec<Received>> {
        self.retry_undecryptable(room).await?;
        let r = self.recorder.lock().expect("recorder lock");
        Ok(r.rooms
            .get(room)
            .into_iter()
            .flatten()
            .filter_map(|s| match s {
                Seen::Message(m) => Some(Received::clone(m)),
                Seen::Undecryptable { .. } => None,
            })
            .collect())
    }

    /// Waits until this client has seen at least `n` messages from `sender` in `room`.
    pub async fn wait_messages_from(
        &self,
        room: &str,
        sender: &str,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<Received>> {
        self.wait_for(timeout, &format!("{n} messages from {sender}"), || async {
            let msgs = self.messages_from(room, sender).await.ok()?;
            (msgs.len() >= n).then_some(msgs)
        })
        .await
    }

    /// Polls `f` until it returns `Some`, failing with `what` after `timeout`.
    pub async fn wait_for<T, F, Fut>(&self, timeout: Duration, what: &str, mut f: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Option<T>>,
    {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(v) = f().await {
                return Ok(v);
            }
            if Instant::now() > deadline {
                bail!(
                    "{}: timed out after {timeout:?} waiting for {what}",
                    self.user_id
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Events in `room` this device could not decrypt (so far), as (event id, sender).
    pub fn undecryptable(&self, room: &str) -> Vec<(String, String)> {
        let r = self.recorder.lock().expect("recorder lock");
        r.rooms
            .get(room)
            .into_iter()
            .flatten()
            .filter_map(|s| match s {
                Seen::Undecryptable { event_id, sender } => {
                    Some((event_id.clone(), sender.clone()))
                }
                Seen::Message(_) => None,
            })
            .collect()
    }

    /// Every typing notice this user's sync delivered for `room`, oldest first: the users
    /// typing at that moment (an empty list: nobody).
    pub fn typing_seen(&self, room: &str) -> Vec<Vec<String>> {
        let r = self.recorder.lock().expect("recorder lock");
        r.typing.get(room).cloned().unwrap_or_default()
    }

    /// The event `user`'s read receipt in `room` points at, as this user's client knows it.
    pub async fn read_receipt_of(&self, room: &str, user: &str) -> Result<Option<String>> {
        let user = UserId::parse(user)?;
        let receipt = self
            .room(room)?
            .load_user_receipt(ReceiptType::Read, ReceiptThread::Unthreaded, &user)
            .await?;
        Ok(receipt.map(|(event_id, _)| event_id.to_string()))
    }

    /// How many undecryptable events the sync ever delivered, in any room (also those whose
    /// key arrived later).
    pub fn undecryptable_seen(&self) -> usize {
        self.recorder
            .lock()
            .expect("recorder lock")
            .undecryptable_seen
    }

    /// Fetches the undecryptable events of `room` again and records those that decrypt now.
    async fn retry_undecryptable(&self, room: &str) -> Result<()> {
        let pending: Vec<String> = self
            .undecryptable(room)
            .into_iter()
            .map(|(e, _)| e)
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        let r = self.room(room)?;
        for id in pending {
            let Ok(ev) = r.event(&EventId::parse(&id)?, None).await else {
                continue;
            };
            let TimelineEventKind::Decrypted(_) = &ev.kind else {
                continue;
            };
            let Ok(AnySyncTimelineEvent::MessageLike(AnySyncMessageLikeEvent::RoomMessage(m))) =
                ev.raw().deserialize()
            else {
                continue;
            };
            let Some(original) = m.as_original() else {
                continue;
            };
            let msg = Received::from_event(original, raw_content(ev.raw().json().get()), true);
            let mut rec = self.recorder.lock().expect("recorder lock");
            if let Some(seen) = rec.rooms.get_mut(room) {
                for s in seen.iter_mut() {
                    if matches!(s, Seen::Undecryptable { event_id, .. } if *event_id == id) {
                        *s = Seen::Message(Box::new(msg.clone()));
                    }
                }
            }
        }
        Ok(())
    }

    /// The last messages of `room` (up to 200) as the homeserver has them, decrypted where this
    /// device has the keys, oldest first: what a client shows after a restart, also messages
    /// that arrived while this process was not running.
    pub async fn history(&self, room: &str) -> Result<Vec<Received>> {
        let r = self.room(room)?;
        let mut options = MessagesOptions::backward();
        options.limit = UInt::from(200u32);
        let page = r.messages(options).await.context("room history")?;
        let mut out = Vec::new();
        for ev in page.chunk.iter().rev() {
            let was_encrypted = matches!(ev.kind, TimelineEventKind::Decrypted(_));
            if let Ok(AnySyncTimelineEvent::MessageLike(AnySyncMessageLikeEvent::RoomMessage(m))) =
                ev.raw().deserialize()
                && let Some(original) = m.as_original()
            {
                out.push(Received::from_event(
                    original,
                    raw_content(ev.raw().json().get()),
                    was_encrypted,
                ));
            }
        }
        Ok(out)
    }

    /// Downloads media, decrypting it when the source is encrypted.
    pub async fn download(&self, source: &MediaSource) -> Result<Vec<u8>> {
        let request = MediaRequestParameters {
            source: source.clone(),
            format: MediaFormat::File,
        };
        self.client
            .media()
            .get_media_content(&request, false)
            .await
            .context("download media")
    }

    /// The event as the homeserver stores it (no decryption), fetched directly from the
    /// homeserver with this device's access token.
    pub async fn wire_event(&self, room: &str, event_id: &str) -> Result<Value> {
        let token = self.client.access_token().context("not logged in")?;
        let url = format!(
            "{}/_matrix/client/v3/rooms/{}/event/{}",
            self.hs.url,
            crate::matrix::enc(room),
            crate::matrix::enc(event_id)
        );
        let resp = self.http.get(&url).bearer_auth(token).send().await?;
        let status = resp.status();
        let v: Value = resp.json().await?;
        if !status.is_success() {
            bail!("GET event {event_id}: {status} {v}");
        }
        Ok(v)
    }

    /// The `type` of the event as the homeserver stores it: `m.room.encrypted` for a message
    /// in an encrypted room.
    pub async fn wire_type(&self, room: &str, event_id: &str) -> Result<String> {
        let v = self.wire_event(room, event_id).await?;
        Ok(v["type"].as_str().context("event type")?.to_owned())
    }
}
