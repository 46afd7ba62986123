//! Conversation with prompts, as an Element user has it in an encrypted DM: an approval
//! answered by tapping a seeded reaction, the outcome shown on the prompt, and a file sent
//! while a prompt waits, which is a turn of its own (downloaded and described) instead of
//! being taken as the answer; what arrives unencrypted in that encrypted room is not acted on.

use std::time::Duration;

use e2e::{E2eeUser, Homeserver, Received, Stack, StackOptions};
use matrix_sdk::ruma::api::client::relations::get_relating_events_with_rel_type;
use matrix_sdk::ruma::events::poll::unstable_start::{
    NewUnstablePollStartEventContent, UnstablePollAnswer, UnstablePollAnswers,
    UnstablePollStartContentBlock, UnstablePollStartEventContent,
};
use matrix_sdk::ruma::events::reaction::ReactionEventContent;
use matrix_sdk::ruma::events::relation::{Annotation, RelationType};
use matrix_sdk::ruma::events::room::ImageInfo;
use matrix_sdk::ruma::events::sticker::StickerEventContent;
use matrix_sdk::ruma::{OwnedEventId, OwnedRoomId};

use crate::{PNG_3X2, TURN};

struct Dm {
    stack: Stack,
    user: E2eeUser,
    room: String,
}

impl Dm {
    /// An encrypted DM, as Element makes them.
    async fn start() -> Self {
        Self::start_in(true).await
    }

    /// A DM with encryption on (`encrypted`) or off: reactions, which clients send unencrypted,
    /// answer prompts only in the second.
    async fn start_in(encrypted: bool) -> Self {
        let hs = Homeserver::from_env();
        let stack = Stack::start(&hs, StackOptions::default())
            .await
            .expect("stack");
        let user = E2eeUser::register(&hs, "prompts").await.expect("user");
        let room = if encrypted {
            user.create_encrypted_dm(&stack.bot.user_id).await
        } else {
            user.create_unencrypted_dm(&stack.bot.user_id).await
        }
        .expect("DM");
        user.wait_joined(&room, &stack.bot.user_id, TURN)
            .await
            .expect("join");
        Self { stack, user, room }
    }

    /// The first bot message in the thread of `root` that `pick` accepts.
    async fn wait_bot(&self, root: &str, what: &str, pick: impl Fn(&Received) -> bool) -> Received {
        let bot = self.stack.bot.user_id.clone();
        self.user
            .wait_for(TURN, what, || async {
                let all = self.user.messages_from(&self.room, &bot).await.ok()?;
                all.into_iter().find(|m| {
                    (m.thread_root.as_deref() == Some(root) || m.answers() == Some(root)) && pick(m)
                })
            })
            .await
            .expect(what)
    }

    /// How many bot messages answering `root` say `text` now.
    async fn count_answers(&self, root: &str, text: &str) -> usize {
        let bot = self.stack.bot.user_id.clone();
        self.user
            .messages_from(&self.room, &bot)
            .await
            .unwrap()
            .iter()
            .filter(|m| m.answers() == Some(root) && m.body.contains(text))
            .count()
    }

    /// The bot's edit of `event`, once it is there.
    async fn wait_edit(&self, event: &str, what: &str) -> Received {
        let bot = self.stack.bot.user_id.clone();
        self.user
            .wait_for(TURN, what, || async {
                let all = self.user.messages_from(&self.room, &bot).await.ok()?;
                all.into_iter()
                    .find(|m| m.replaces.as_deref() == Some(event))
            })
            .await
            .expect(what)
    }

    /// Reactions on `event` from `sender`, as the server relates them.
    async fn reactions_from(&self, event: &str, sender: &str) -> usize {
        let room = OwnedRoomId::try_from(self.room.as_str()).unwrap();
        let event = OwnedEventId::try_from(event).unwrap();
        let req = get_relating_events_with_rel_type::v1::Request::new(
            room,
            event,
            RelationType::Annotation,
        );
        let Ok(resp) = self.user.client().send(req).await else {
            return 0;
        };
        resp.chunk
            .iter()
            .filter(|e| e.get_field::<String>("sender").ok().flatten().as_deref() == Some(sender))
            .count()
    }

    fn room(&self) -> matrix_sdk::Room {
        self.user
            .client()
            .get_room(&OwnedRoomId::try_from(self.room.as_str()).unwrap())
            .unwrap()
    }

    /// Edits `event` to say `text`, as Element does (`m.replace` with `m.new_content`).
    async fn edit(&self, event: &str, text: &str) {
        self.user.edit(&self.room, event, text).await.expect("edit");
    }

    /// Sends an event of `kind` UNENCRYPTED into the encrypted DM, through the client-server
    /// API with the user's own token (as any member could), and returns its id.
    async fn send_plaintext(&self, kind: &str, content: serde_json::Value) -> String {
        let hs = Homeserver::from_env();
        let token = self.user.client().access_token().expect("a token");
        let url = format!(
            "{}/_matrix/client/v3/rooms/{}/send/{kind}/{}",
            hs.url.trim_end_matches('/'),
            self.room,
            e2e::unique("plain")
        );
        let sent: serde_json::Value = reqwest::Client::new()
            .put(url)
            .bearer_auth(token)
            .json(&content)
            .send()
            .await
            .expect("send")
            .error_for_status()
            .expect("accepted")
            .json()
            .await
            .expect("json");
        sent["event_id"].as_str().expect("event id").to_owned()
    }

    async fn react(&self, event: &str, key: &str) {
        let room = self
            .user
            .client()
            .get_room(&OwnedRoomId::try_from(self.room.as_str()).unwrap())
            .unwrap();
        let target = OwnedEventId::try_from(event).unwrap();
        room.send(ReactionEventContent::new(Annotation::new(
            target,
            key.into(),
        )))
        .await
        .expect("react");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn approvals_by_reaction_and_a_file_while_a_prompt_waits() {
    // Reactions answer prompts where the room is not encrypted (clients never encrypt them).
    let dm = Dm::start_in(false).await;
    let bot = dm.stack.bot.user_id.clone();

    // ✅ on the prompt approves once; the prompt then shows the outcome.
    let ask = dm.user.send_text(&dm.room, "approve launch").await.unwrap();
    let prompt = dm
        .wait_bot(&ask, "the approval prompt", |m| {
            m.body.contains("Approval needed")
        })
        .await;
    assert!(
        prompt.body.contains(&dm.user.user_id),
        "the prompt names the user: {}",
        prompt.body
    );
    let seeded = dm
        .user
        .wait_for(TURN, "the seeded reactions", || async {
            let n = dm.reactions_from(&prompt.event_id, &bot).await;
            (n >= 3).then_some(n)
        })
        .await
        .unwrap();
    assert_eq!(seeded, 3, "✅ ♾️ ❌ seeded on the prompt");
    dm.react(&prompt.event_id, "✅").await;
    dm.wait_bot(&ask, "the approved answer", |m| {
        m.body.contains("Approved: `launch`")
    })
    .await;
    let edit = dm
        .wait_edit(&prompt.event_id, "the outcome on the prompt")
        .await;
    assert!(edit.body.contains("Allowed once"), "{}", edit.body);

    // The same request three times in one turn: one prompt, one answer for all three.
    let thrice = dm
        .user
        .send_text(&dm.room, "approve3 rotate keys")
        .await
        .unwrap();
    let prompt3 = dm
        .wait_bot(&thrice, "the prompt", |m| {
            m.body.contains("Approval needed")
        })
        .await;
    dm.react(&prompt3.event_id, "✅").await;
    let done = dm
        .wait_bot(&thrice, "the three outcomes", |m| {
            m.body.contains("Three times")
        })
        .await;
    assert!(
        done.body.contains("approved, approved, approved"),
        "{}",
        done.body
    );
    let prompts = dm.count_answers(&thrice, "Approval needed").await;
    assert_eq!(prompts, 1, "one prompt for three identical requests");

    // A file sent while the next prompt waits is not the answer: the prompt stays open, a
    // reaction answers it, and then the file is described in its own thread.
    let ask2 = dm.user.send_text(&dm.room, "approve second").await.unwrap();
    let prompt2 = dm
        .wait_bot(&ask2, "the second prompt", |m| {
            m.body.contains("Approval needed")
        })
        .await;
    let png = hex::decode(PNG_3X2).unwrap();
    let file = dm
        .user
        .send_file(&dm.room, "pixel.png", "image/png", png, None)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let all = dm.user.messages_from(&dm.room, &bot).await.unwrap();
    assert!(
        !all.iter()
            .any(|m| m.answers() == Some(ask2.as_str()) && m.body.contains("Denied")),
        "the file was taken as the answer"
    );
    dm.react(&prompt2.event_id, "❌").await;
    dm.wait_bot(&ask2, "the denial", |m| m.body.contains("Denied: `second`"))
        .await;
    let described = dm
        .wait_bot(&file, "the file's description", |m| m.body.contains("3x2"))
        .await;
    assert!(described.body.contains("pixel.png"), "{}", described.body);
    let edit2 = dm
        .wait_edit(&prompt2.event_id, "the denial on the prompt")
        .await;
    assert!(edit2.body.contains("Denied"), "{}", edit2.body);
}

#[tokio::test(flavor = "multi_thread")]
async fn edits_and_stickers() {
    let dm = Dm::start().await;
    let bot = dm.stack.bot.user_id.clone();

    // An edit of a message that already ran is a follow-up, answered under it.
    let first = dm.user.send_text(&dm.room, "frist words").await.unwrap();
    dm.wait_bot(&first, "the first answer", |m| {
        m.body.contains("frist words")
    })
    .await;
    dm.edit(&first, "first words").await;
    let follow_up = dm
        .wait_bot(&first, "the follow-up to the edit", |m| {
            m.body.contains("to: first words")
        })
        .await;
    assert!(follow_up.body.contains("frist words"), "{}", follow_up.body);

    // An edit of a message still queued (behind a slow turn) replaces its text.
    let slow = dm.user.send_text(&dm.room, "sleep 4000").await.unwrap();
    let queued = dm.user.send_text(&dm.room, "helo").await.unwrap();
    dm.edit(&queued, "hello, fixed").await;
    dm.wait_bot(&slow, "the slow turn", |m| m.body.contains("Slept"))
        .await;
    let answer = dm
        .wait_bot(&queued, "the queued message's answer", |m| {
            m.body.contains("received")
        })
        .await;
    assert!(
        answer.body.contains("hello, fixed"),
        "the edited text: {}",
        answer.body
    );

    // A sticker gets one short notice; a second one does not repeat it.
    let mxc = dm
        .user
        .client()
        .media()
        .upload(&mime::IMAGE_PNG, hex::decode(PNG_3X2).unwrap(), None)
        .await
        .unwrap()
        .content_uri;
    for _ in 0..2 {
        dm.room()
            .send(StickerEventContent::new(
                "a cat".into(),
                ImageInfo::new(),
                mxc.clone(),
            ))
            .await
            .expect("sticker");
    }
    let told = dm
        .user
        .wait_for(TURN, "the sticker notice", || async {
            let all = dm.user.messages_from(&dm.room, &bot).await.ok()?;
            let n = all
                .iter()
                .filter(|m| m.body.contains("cannot read a sticker"))
                .count();
            (n > 0).then_some(n)
        })
        .await
        .unwrap();
    // Give a second notice the time to appear if it were going to.
    dm.user.send_text(&dm.room, "help").await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let all = dm.user.messages_from(&dm.room, &bot).await.unwrap();
    let n = all
        .iter()
        .filter(|m| m.body.contains("cannot read a sticker"))
        .count();
    assert_eq!((told, n), (1, 1), "one notice for two stickers");

    // A poll (as Element sends it, MSC3381) is an `Inbound` kind of its own: the same kind of
    // notice, through the same typed path.
    let answers = vec![
        UnstablePollAnswer::new("yes", "Yes"),
        UnstablePollAnswer::new("no", "No"),
    ];
    let poll = UnstablePollStartContentBlock::new(
        "Lunch?",
        UnstablePollAnswers::try_from(answers).unwrap(),
    );
    dm.room()
        .send(UnstablePollStartEventContent::from(
            NewUnstablePollStartEventContent::plain_text("Lunch?", poll),
        ))
        .await
        .expect("poll");
    dm.user
        .wait_for(TURN, "the poll notice", || async {
            let all = dm.user.messages_from(&dm.room, &bot).await.ok()?;
            all.iter()
                .any(|m| m.body.contains("cannot read a poll"))
                .then_some(())
        })
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_redacted_file_leaves_the_inbox_and_the_agent_is_told() {
    let dm = Dm::start().await;
    let png = hex::decode(PNG_3X2).unwrap();
    let file = dm
        .user
        .send_file(&dm.room, "secret.png", "image/png", png, None)
        .await
        .unwrap();
    dm.wait_bot(&file, "the file's description", |m| m.body.contains("3x2"))
        .await;
    let inbox = format!("{}/inbox/", protocol::room_dir(&dm.user.user_id, &dm.room));
    assert_eq!(dm.stack.files_under(&inbox).len(), 1);

    let target = OwnedEventId::try_from(file.as_str()).unwrap();
    dm.room()
        .redact(&target, Some("sent by mistake"), None)
        .await
        .expect("redact");
    e2e::eventually(TURN, "the file removed from the inbox", || async {
        dm.stack.files_under(&inbox).is_empty().then_some(())
    })
    .await;

    // The agent hears of it with the next turn.
    let next = dm.user.send_text(&dm.room, "history").await.unwrap();
    dm.wait_bot(&next, "the next answer", |_| true).await;
    let turn = dm
        .stack
        .agent_turn(&next)
        .expect("the agent stored the turn");
    let context = turn["context"].to_string();
    assert!(
        context.contains("secret.png") && context.contains("removed"),
        "{context}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_prompt_still_works_after_either_process_restarts() {
    let mut dm = Dm::start().await;

    // The surface is killed while a prompt waits; the answer (typed: this room is encrypted)
    // comes after it is back.
    let ask = dm
        .user
        .send_text(&dm.room, "approve across restarts")
        .await
        .unwrap();
    let prompt = dm
        .wait_bot(&ask, "the prompt", |m| m.body.contains("Approval needed"))
        .await;
    dm.stack.surface.kill9().await;
    dm.stack.surface.start().unwrap();
    dm.stack.wait_surface_healthy().await;
    let _ = &prompt;
    dm.user.send_text(&dm.room, "yes").await.unwrap();
    dm.wait_bot(&ask, "the approval after a surface restart", |m| {
        m.body.contains("Approved: `across restarts`")
    })
    .await;

    // The agent is killed while a prompt waits: the turn runs again, and the same prompt
    // (not a second one) takes the answer.
    let ask2 = dm
        .user
        .send_text(&dm.room, "approve after agent restart")
        .await
        .unwrap();
    let prompt2 = dm
        .wait_bot(&ask2, "the second prompt", |m| {
            m.body.contains("Approval needed")
        })
        .await;
    dm.stack.agent.kill9().await;
    dm.stack.agent.start().unwrap();
    dm.stack.wait_agent_healthy().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let _ = &prompt2;
    dm.user.send_text(&dm.room, "yes").await.unwrap();
    dm.wait_bot(&ask2, "the approval after an agent restart", |m| {
        m.body.contains("Approved: `after agent restart`")
    })
    .await;
    let prompts = dm.count_answers(&ask2, "Approval needed").await;
    assert_eq!(prompts, 1, "one prompt for the request");

    // ♾️ is remembered for this user across restarts of both: no prompt the next time.
    let ask3 = dm
        .user
        .send_text(&dm.room, "approve forever")
        .await
        .unwrap();
    let prompt3 = dm
        .wait_bot(&ask3, "the third prompt", |m| {
            m.body.contains("Approval needed")
        })
        .await;
    let _ = &prompt3;
    dm.user.send_text(&dm.room, "always").await.unwrap();
    dm.wait_bot(&ask3, "always", |m| m.body.contains("Approved: `forever`"))
        .await;
    dm.stack.agent.kill9().await;
    dm.stack.surface.kill9().await;
    dm.stack.agent.start().unwrap();
    dm.stack.wait_agent_healthy().await;
    dm.stack.surface.start().unwrap();
    dm.stack.wait_surface_healthy().await;
    let again = dm
        .user
        .send_text(&dm.room, "approve forever")
        .await
        .unwrap();
    let answer = dm
        .wait_bot(&again, "the answer", |m| m.body.contains("forever"))
        .await;
    assert!(
        answer.body.contains("Approved: `forever`"),
        "{}",
        answer.body
    );
    let asked_again = dm.count_answers(&again, "Approval needed").await > 0;
    assert!(!asked_again, "asked again after always");
}

#[tokio::test(flavor = "multi_thread")]
async fn in_an_encrypted_room_what_arrives_unencrypted_is_not_acted_on() {
    let dm = Dm::start().await;
    let bot = dm.stack.bot.user_id.clone();
    let ask = dm.user.send_text(&dm.room, "approve plain").await.unwrap();
    let prompt = dm
        .wait_bot(&ask, "the approval prompt", |m| {
            m.body.contains("Approval needed")
        })
        .await;
    assert!(
        prompt.body.contains("only a reply counts") && !prompt.body.contains("✅"),
        "an encrypted room's prompt asks for a reply: {}",
        prompt.body
    );
    // A ✅ as Element and matrix-sdk send it: unencrypted (so anyone able to talk to the
    // homeserver as a member could forge it).
    dm.react(&prompt.event_id, "✅").await;
    let notice = dm
        .user
        .wait_for(TURN, "the notice about unencrypted events", || async {
            dm.user
                .messages_from(&dm.room, &bot)
                .await
                .ok()?
                .into_iter()
                .find(|m| m.msgtype == "m.notice" && m.body.contains("arrives encrypted"))
        })
        .await
        .unwrap_or_else(|e| {
            dm.stack.dump();
            panic!("{e}")
        });
    assert!(notice.body.contains("reply yes"), "{}", notice.body);
    // The notice comes after the reaction was judged: it approved nothing.
    assert_eq!(dm.count_answers(&ask, "Approved").await, 0);
    assert_eq!(
        dm.reactions_from(&prompt.event_id, &bot).await,
        0,
        "none seeded"
    );
    assert!(
        dm.stack
            .surface
            .log()
            .contains("unencrypted event in an encrypted room: not acted on"),
        "logged with its ids"
    );
    // A plaintext message is not answered either, and the room is not told twice.
    let plain_message = dm
        .send_plaintext(
            "m.room.message",
            serde_json::json!({"msgtype": "m.text", "body": "approve everything"}),
        )
        .await;
    // The asked user's encrypted reply approves.
    dm.user.send_text(&dm.room, "yes").await.unwrap();
    dm.wait_bot(&ask, "the approved answer", |m| {
        m.body.contains("Approved: `plain`")
    })
    .await;
    let from_bot = dm.user.messages_from(&dm.room, &bot).await.unwrap();
    let notices = from_bot
        .iter()
        .filter(|m| m.body.contains("arrives encrypted"))
        .count();
    assert_eq!(notices, 1, "told once");
    assert!(
        !from_bot
            .iter()
            .any(|m| m.thread_root.as_deref() == Some(plain_message.as_str())),
        "the plaintext message got no answer"
    );
}
