//! Encrypted rooms, with a user on matrix-sdk as on Element: text and every media kind both
//! ways, senders' names through a rename, and a surface killed between messages. (A first message before the bot's join is in
//! `first_sight`, room keys that come late in `late_keys`.)

use e2e::check::{self, BotMessage, RoomTimeline};
use e2e::{E2eeUser, Homeserver, Received, Stack, StackOptions, sha256_hex};
use matrix_sdk::ruma::events::room::MediaSource;

use crate::{PNG_3X2, TURN};

/// A started stack plus an E2EE user in an encrypted direct chat with its bot.
struct EncryptedDm {
    stack: Stack,
    user: E2eeUser,
    room: String,
}

impl EncryptedDm {
    async fn start() -> Self {
        let hs = Homeserver::from_env();
        let stack = Stack::start(&hs, StackOptions::default())
            .await
            .expect("stack starts");
        let user = E2eeUser::register(&hs, "euser")
            .await
            .expect("register and log in");
        let room = user
            .create_encrypted_dm(&stack.bot.user_id)
            .await
            .expect("create encrypted DM");
        user.wait_joined(&room, &stack.bot.user_id, TURN)
            .await
            .expect("the bot joins");
        Self { stack, user, room }
    }

    fn bot(&self) -> &str {
        &self.stack.bot.user_id
    }

    /// `surfaces/matrix/<user>/<room>/inbox/` of this DM.
    fn inbox(&self) -> String {
        format!(
            "{}/inbox/",
            protocol::room_dir(&self.user.user_id, &self.room)
        )
    }

    /// The bot's messages (decrypted) in the thread of `root`.
    async fn bot_thread(&self, root: &str) -> Vec<Received> {
        self.user
            .messages_from(&self.room, self.bot())
            .await
            .expect("messages")
            .into_iter()
            .filter(|m| m.thread_root.as_deref() == Some(root))
            .collect()
    }

    /// Waits for the first bot message in the thread of `root` that `pick` accepts.
    async fn wait_in_thread(
        &self,
        root: &str,
        what: &str,
        pick: impl Fn(&Received) -> bool,
    ) -> Received {
        self.user
            .wait_for(TURN, what, || async {
                self.bot_thread(root).await.into_iter().find(|m| pick(m))
            })
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Sends `text` and waits for the first text reply in its thread.
    async fn ask(&self, text: &str) -> (String, Received) {
        let id = self.user.send_text(&self.room, text).await.expect("send");
        let reply = self
            .wait_in_thread(&id, &format!("a reply to {text:?}"), |m| {
                m.msgtype == "m.text"
            })
            .await;
        (id, reply)
    }

    /// The user's own message `id` as its client decrypted it.
    async fn own(&self, id: &str) -> Received {
        self.user
            .wait_for(TURN, &format!("own message {id}"), || async {
                self.user
                    .messages_from(&self.room, &self.user.user_id)
                    .await
                    .ok()?
                    .into_iter()
                    .find(|m| m.event_id == id)
            })
            .await
            .unwrap()
    }

    async fn assert_encrypted_on_the_wire(&self, id: &str, what: &str) {
        assert_eq!(
            self.user.wire_type(&self.room, id).await.unwrap(),
            "m.room.encrypted",
            "{what} is stored encrypted"
        );
    }
}

fn is_encrypted(source: &Option<MediaSource>) -> bool {
    matches!(source, Some(MediaSource::Encrypted(_)))
}

struct Case {
    msgtype: &'static str,
    mime: &'static str,
    filename: &'static str,
    caption: Option<&'static str>,
    bytes: Vec<u8>,
}

#[tokio::test(flavor = "multi_thread")]
async fn an_encrypted_dm_carries_text_and_files_both_ways() {
    let dm = EncryptedDm::start().await;

    // Text: a threaded reply the user's client decrypts; both are ciphertext on the server.
    let text = "hello in private, 12345";
    let (id, reply) = dm.ask(text).await;
    assert!(
        reply.body.contains(text),
        "reply quotes the text: {reply:?}"
    );
    assert!(reply.was_encrypted, "{reply:?}");
    assert_eq!(reply.thread_root.as_deref(), Some(id.as_str()), "{reply:?}");
    assert_eq!(reply.in_reply_to.as_deref(), Some(id.as_str()), "{reply:?}");
    dm.assert_encrypted_on_the_wire(&id, "the user's text")
        .await;
    dm.assert_encrypted_on_the_wire(&reply.event_id, "the bot's reply")
        .await;

    // Each media kind: encrypted upload, exact bytes in the inbox, the agent gets the path.
    let cases = vec![
        Case {
            msgtype: "m.image",
            mime: "image/png",
            filename: "cat.png",
            caption: None,
            bytes: hex::decode(PNG_3X2).unwrap(),
        },
        Case {
            msgtype: "m.file",
            mime: "text/plain",
            filename: "notes.txt",
            caption: Some("my notes"),
            bytes: b"line one\nline two\n".to_vec(),
        },
        Case {
            msgtype: "m.audio",
            mime: "audio/ogg",
            filename: "voice.ogg",
            caption: None,
            bytes: b"OggS\0\x02fake-audio-bytes".to_vec(),
        },
        Case {
            msgtype: "m.video",
            mime: "video/mp4",
            filename: "clip.mp4",
            caption: Some("a clip"),
            bytes: b"\0\0\0\x18ftypmp42fake-video".to_vec(),
        },
    ];
    let inbox = dm.inbox();
    for case in cases {
        let id = dm
            .user
            .send_file(
                &dm.room,
                case.filename,
                case.mime,
                case.bytes.clone(),
                case.caption,
            )
            .await
            .unwrap();
        let sent = dm.own(&id).await;
        assert_eq!(sent.msgtype, case.msgtype, "{sent:?}");
        assert!(
            is_encrypted(&sent.source),
            "encrypted upload: {:?}",
            sent.source
        );
        dm.assert_encrypted_on_the_wire(&id, case.filename).await;

        let reply = dm
            .wait_in_thread(&id, &format!("a reply to {}", case.filename), |m| {
                m.msgtype == "m.text"
            })
            .await;
        let digest = sha256_hex(&case.bytes);
        let stored: Vec<String> = dm
            .stack
            .files_under(&inbox)
            .into_iter()
            .filter(|f| f.ends_with(&format!("-{}", case.filename)))
            .collect();
        assert_eq!(
            stored.len(),
            1,
            "{}: one stored copy in {inbox}: {stored:?}",
            case.filename
        );
        let rel = &stored[0];
        assert_eq!(
            sha256_hex(&std::fs::read(dm.stack.workspace.join(rel)).unwrap()),
            digest,
            "{rel} holds the decrypted bytes"
        );
        assert!(
            !reply.body.contains("surfaces/matrix"),
            "no workspace path in a reply to people: {}",
            reply.body
        );
        assert!(
            reply.body.contains(&digest),
            "reply has the agent's sha256 of the plaintext: {}",
            reply.body
        );
        let turn = dm.stack.agent_turn(&id).expect("the agent stored the turn");
        assert_eq!(turn["attachments"], serde_json::json!([rel]), "{turn}");
        assert_eq!(
            turn["text"],
            case.caption.unwrap_or("User sent one or more attachments."),
            "{turn}"
        );
    }

    // A file from the agent: encrypted media the user's client decrypts to the exact bytes.
    let id = dm
        .user
        .send_text(&dm.room, "note hello.txt some text")
        .await
        .unwrap();
    let note = dm
        .wait_in_thread(&id, "the note as a file", |m| m.source.is_some())
        .await;
    assert_eq!(note.msgtype, "m.file", "{note:?}");
    assert_eq!(note.file_name(), "hello.txt", "{note:?}");
    assert!(
        is_encrypted(&note.source),
        "encrypted upload: {:?}",
        note.source
    );
    let bytes = dm
        .user
        .download(note.source.as_ref().unwrap())
        .await
        .unwrap();
    assert_eq!(bytes, b"some text");
    dm.assert_encrypted_on_the_wire(&note.event_id, "the bot's file")
        .await;

    // Names: each turn carries the display name its sender had when writing it, a rename in
    // between included (the surface remembers names per room and must forget them then), and
    // the agent shows it beside the user id.
    let mut said = Vec::new();
    for name in ["Ada One", "Ada Two"] {
        dm.user.rename(&dm.room, name, TURN).await.expect("rename");
        let text = format!("written as {name}");
        let (id, _) = dm.ask(&text).await;
        let turn = dm.stack.agent_turn(&id).expect("the agent stored the turn");
        assert_eq!(turn["sender"]["display_name"], name, "{turn}");
        said.push(format!("{name} ({}): {text}", dm.user.user_id));
    }
    let (_, history) = dm.ask("history").await;
    for line in &said {
        assert!(
            history.body.contains(line.as_str()),
            "{line:?} in the history: {}",
            history.body
        );
    }
    assert_eq!(
        dm.user.undecryptable(&dm.room),
        Vec::<(String, String)>::new(),
        "the user could decrypt everything"
    );
}

/// Each trigger has exactly one text reply, in order (see [`check::check`]).
async fn assert_answered_once_in_order(dm: &EncryptedDm, triggers: &[String]) {
    let bot = dm
        .user
        .messages_from(&dm.room, dm.bot())
        .await
        .unwrap()
        .iter()
        .map(|m| BotMessage {
            event_id: m.event_id.clone(),
            answers: m.answers().map(str::to_owned),
            is_text: m.msgtype == "m.text",
        })
        .collect();
    let report = check::check(&[RoomTimeline {
        triggers: triggers.to_vec(),
        bot,
    }]);
    assert!(report.is_clean(), "{report:?}");
}

/// Waits until every trigger has a text reply.
async fn wait_all_answered(dm: &EncryptedDm, triggers: &[String]) {
    dm.user
        .wait_for(TURN * 2, "a reply to every message", || async {
            let msgs = dm.user.messages_from(&dm.room, dm.bot()).await.ok()?;
            triggers
                .iter()
                .all(|t| {
                    msgs.iter()
                        .any(|m| m.msgtype == "m.text" && m.answers() == Some(t.as_str()))
                })
                .then_some(())
        })
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_surface_sigkill_in_an_encrypted_room_loses_nothing() {
    let mut dm = EncryptedDm::start().await;
    let mut triggers = Vec::new();
    let send = |k: usize| format!("encrypted message {k}");

    // Answered before the first kill: the bot's crypto state has something to lose.
    let (first, _) = dm.ask(&send(0)).await;
    triggers.push(first);
    triggers.push(dm.user.send_text(&dm.room, &send(1)).await.unwrap());
    dm.stack.surface.kill9().await;
    // Sent while the surface is down: its room key waits in the bot's to-device queue.
    triggers.push(dm.user.send_text(&dm.room, &send(2)).await.unwrap());
    triggers.push(dm.user.send_text(&dm.room, &send(3)).await.unwrap());
    dm.stack.surface.start().unwrap();
    dm.stack.wait_surface_healthy().await;
    triggers.push(dm.user.send_text(&dm.room, &send(4)).await.unwrap());
    // Killed again right after a message, likely in the middle of its turn.
    dm.stack.surface.kill9().await;
    dm.stack.surface.start().unwrap();
    dm.stack.wait_surface_healthy().await;
    triggers.push(dm.user.send_text(&dm.room, &send(5)).await.unwrap());

    wait_all_answered(&dm, &triggers).await;
    // One more full round trip, so a late duplicate of any earlier reply would show.
    let (last, _) = dm.ask(&send(6)).await;
    triggers.push(last);
    assert_answered_once_in_order(&dm, &triggers).await;
    assert_eq!(
        dm.user.undecryptable(&dm.room),
        Vec::<(String, String)>::new(),
        "the user could decrypt every reply"
    );
}
