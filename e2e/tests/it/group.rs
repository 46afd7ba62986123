//! A group room as Element makes one (encrypted, three members): the bot answers only when
//! mentioned, gets the earlier messages (a file among them) as context and the text without
//! the mention, treats a thread as a conversation of its own, and takes the answer to a
//! question only from the user it asked.

use std::time::Duration;

use e2e::{E2eeUser, Homeserver, Received, Stack, StackOptions};
use matrix_sdk::ruma::api::client::room::create_room::v3::{
    Request as CreateRoomRequest, RoomPreset,
};
use matrix_sdk::ruma::events::reaction::ReactionEventContent;
use matrix_sdk::ruma::events::relation::Annotation;
use matrix_sdk::ruma::events::room::encryption::RoomEncryptionEventContent;
use matrix_sdk::ruma::events::room::message::RoomMessageEventContent;
use matrix_sdk::ruma::events::{InitialStateEvent, Mentions};
use matrix_sdk::ruma::{EventEncryptionAlgorithm, OwnedEventId, OwnedRoomId, OwnedUserId};

use crate::TURN;

pub(crate) struct Group {
    pub stack: Stack,
    pub alice: E2eeUser,
    pub bob: E2eeUser,
    pub room: String,
}

impl Group {
    /// A room with Alice, Bob and the bot; end-to-end encrypted when `encrypted`.
    async fn start(encrypted: bool) -> Self {
        Self::start_with(encrypted, StackOptions::default()).await
    }

    /// As [`Group::start`], the stack started with `opts`.
    pub(crate) async fn start_with(encrypted: bool, opts: StackOptions) -> Self {
        let hs = Homeserver::from_env();
        let stack = Stack::start(&hs, opts).await.expect("stack");
        let alice = E2eeUser::register(&hs, "alice").await.expect("alice");
        let bob = E2eeUser::register(&hs, "bob").await.expect("bob");
        let mut req = CreateRoomRequest::new();
        req.invite = vec![
            OwnedUserId::try_from(stack.bot.user_id.as_str()).unwrap(),
            OwnedUserId::try_from(bob.user_id.as_str()).unwrap(),
        ];
        req.preset = Some(RoomPreset::PrivateChat);
        if encrypted {
            req.initial_state = vec![
                InitialStateEvent::with_empty_state_key(RoomEncryptionEventContent::new(
                    EventEncryptionAlgorithm::MegolmV1AesSha2,
                ))
                .to_raw_any(),
            ];
        }
        let room = alice.client().create_room(req).await.expect("create room");
        let room = room.room_id().to_string();
        let id = OwnedRoomId::try_from(room.as_str()).unwrap();
        bob.wait_for(TURN, "the invite", || async {
            bob.client().join_room_by_id(&id).await.ok().map(|_| ())
        })
        .await
        .expect("bob joins");
        alice
            .wait_joined(&room, &stack.bot.user_id, TURN)
            .await
            .expect("the bot joins");
        alice
            .wait_joined(&room, &bob.user_id, TURN)
            .await
            .expect("bob joined");
        Self {
            stack,
            alice,
            bob,
            room,
        }
    }

    pub(crate) fn room_of(&self, user: &E2eeUser) -> matrix_sdk::Room {
        user.client()
            .get_room(&OwnedRoomId::try_from(self.room.as_str()).unwrap())
            .unwrap()
    }

    /// `text` from `user`, mentioning the bot as Element does (`m.mentions`, name first).
    pub(crate) async fn mention(&self, user: &E2eeUser, text: &str) -> String {
        let bot = OwnedUserId::try_from(self.stack.bot.user_id.as_str()).unwrap();
        let body = format!("{}: {text}", bot.localpart());
        let content =
            RoomMessageEventContent::text_plain(body).add_mentions(Mentions::with_user_ids([bot]));
        let sent = self.room_of(user).send(content).await.expect("send");
        sent.response.event_id.to_string()
    }

    /// `text` from `user` in the thread of `root`.
    pub(crate) async fn in_thread(&self, user: &E2eeUser, root: &str, text: &str) -> String {
        user.send_in_thread(&self.room, root, text)
            .await
            .expect("send")
    }

    /// The first bot message answering `id` (in its thread) that `pick` accepts.
    pub(crate) async fn answer(
        &self,
        id: &str,
        what: &str,
        pick: impl Fn(&Received) -> bool,
    ) -> Received {
        let bot = self.stack.bot.user_id.clone();
        self.alice
            .wait_for(TURN, what, || async {
                let all = self.alice.messages_from(&self.room, &bot).await.ok()?;
                all.into_iter().find(|m| m.answers() == Some(id) && pick(m))
            })
            .await
            .expect(what)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn encrypted_group_room_mentions_context_threads_and_the_asked_user() {
    group_room(true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn plain_group_room_mentions_context_threads_and_the_asked_user() {
    group_room(false).await;
}

async fn group_room(encrypted: bool) {
    let g = Group::start(encrypted).await;
    let bot = g.stack.bot.user_id.clone();

    // Without a mention: nothing is answered; the messages (a file too) become context.
    let chatter = g
        .alice
        .send_text(&g.room, "Location: Berlin")
        .await
        .unwrap();
    g.bob
        .send_file(
            &g.room,
            "notes.txt",
            "text/plain",
            b"line one\n".to_vec(),
            None,
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let all = g.alice.messages_from(&g.room, &bot).await.unwrap();
    assert!(
        !all.iter().any(|m| m.answers() == Some(chatter.as_str())),
        "answered without a mention"
    );

    // With a mention: answered; the agent got the text without the mention, and the context.
    let asked = g.mention(&g.alice, "history").await;
    g.answer(&asked, "the answer to the mention", |_| true)
        .await;
    let turn = g
        .stack
        .agent_turn(&asked)
        .expect("the agent stored the turn");
    assert_eq!(turn["text"], "history", "the mention is removed: {turn}");
    let context = turn["context"].to_string();
    assert!(
        context.contains("Location: Berlin"),
        "a `Word: ` prefix is kept: {context}"
    );
    assert!(
        context.contains("/inbox/") && context.contains("notes.txt"),
        "{context}"
    );

    // A thread under the bot's answer is a conversation of its own.
    let threaded = g.in_thread(&g.alice, &asked, "history").await;
    let reply = g
        .answer(&threaded, "the answer in the thread", |_| true)
        .await;
    assert_eq!(
        reply.thread_root.as_deref(),
        Some(asked.as_str()),
        "answered in the thread"
    );
    assert!(
        reply.body.contains("0 earlier turn"),
        "its own history: {}",
        reply.body
    );

    // A question for Alice: Bob's reply is not the answer, Alice's is.
    let question = g.mention(&g.alice, "ask favourite colour?").await;
    g.answer(&question, "the question", |m| m.body.contains("Question"))
        .await;
    g.in_thread(&g.bob, &question, "red").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    g.in_thread(&g.alice, &question, "blue").await;
    let answered = g
        .answer(&question, "the echoed answer", |m| {
            m.body.contains("You answered")
        })
        .await;
    assert!(answered.body.contains("`blue`"), "{}", answered.body);

    // Room modes: Bob (no power) may not switch the bot to every message; Alice (the room's
    // creator) may, and then plain messages are answered.
    let refused = g.mention(&g.bob, "!mode all").await;
    g.answer(&refused, "the refusal", |m| {
        m.body.contains("Only the room's moderators")
    })
    .await;
    let mode = g.mention(&g.alice, "!mode all").await;
    g.answer(&mode, "the confirmation", |m| {
        m.body.contains("every message")
    })
    .await;
    let plain = g.alice.send_text(&g.room, "approve deploy").await.unwrap();
    let prompt = g
        .answer(&plain, "a prompt without a mention", |m| {
            m.body.contains("Approval needed")
        })
        .await;

    // Bob's ✅ on Alice's prompt decides nothing; Alice's "yes" in the thread does.
    let room = g.room_of(&g.bob);
    let target = OwnedEventId::try_from(prompt.event_id.as_str()).unwrap();
    room.send(ReactionEventContent::new(Annotation::new(
        target,
        "✅".into(),
    )))
    .await
    .expect("react");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let all = g.alice.messages_from(&g.room, &bot).await.unwrap();
    assert!(
        !all.iter()
            .any(|m| m.answers() == Some(plain.as_str()) && m.body.contains("Approved")),
        "another user's reaction approved"
    );
    g.in_thread(&g.alice, &plain, "yes").await;
    g.answer(&plain, "the approval by text", |m| {
        m.body.contains("Approved: `deploy`")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_bots_mentioned_together_stop_answering_each_other() {
    let hs = Homeserver::from_env();
    let mut opts = StackOptions::default();
    opts.surface_env
        .insert("SURFACE_BOT_USERS".into(), "@bot*:*".into());
    opts.surface_env
        .insert("SURFACE_MAX_BOT_TURNS".into(), "2".into());
    let a = Stack::start(&hs, opts.clone()).await.expect("stack a");
    let b = Stack::start(&hs, opts).await.expect("stack b");
    let user = E2eeUser::register(&hs, "host").await.expect("user");
    let mut req = CreateRoomRequest::new();
    let ids: Vec<OwnedUserId> = [&a.bot.user_id, &b.bot.user_id]
        .iter()
        .map(|u| OwnedUserId::try_from(u.as_str()).unwrap())
        .collect();
    req.invite = ids.clone();
    req.preset = Some(RoomPreset::PrivateChat);
    let room = user.client().create_room(req).await.expect("create room");
    let room_id = room.room_id().to_string();
    for bot in [&a.bot.user_id, &b.bot.user_id] {
        user.wait_joined(&room_id, bot, TURN)
            .await
            .expect("a bot joins");
    }
    let body = format!("{} {}: help", ids[0].localpart(), ids[1].localpart());
    let content =
        RoomMessageEventContent::text_plain(body).add_mentions(Mentions::with_user_ids(ids));
    let root = room
        .send(content)
        .await
        .expect("send")
        .response
        .event_id
        .to_string();

    // Each bot answers the person, then at most 2 turns of the other bot, then says it stops.
    let counts = || async {
        let mut n = Vec::new();
        for bot in [&a.bot.user_id, &b.bot.user_id] {
            let msgs = user.messages_from(&room_id, bot).await.unwrap_or_default();
            let in_thread: Vec<Received> = msgs
                .into_iter()
                .filter(|m| m.thread_root.as_deref() == Some(root.as_str()))
                .collect();
            let stops = in_thread
                .iter()
                .filter(|m| m.body.contains("I stop answering"))
                .count();
            n.push((in_thread.len(), stops));
        }
        n
    };
    user.wait_for(TURN, "a bot to stop", || async {
        let n = counts().await;
        n.iter().any(|(_, stops)| *stops > 0).then_some(())
    })
    .await
    .expect("the breaker trips");
    // Then the room stays quiet.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let settled = counts().await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let later = counts().await;
    println!("bot_loop: per_bot_messages_and_stop_notices={later:?}");
    assert_eq!(settled, later, "the bots went on answering each other");
    for (messages, stops) in later {
        assert!(stops <= 1, "one stop notice at most");
        assert!(messages <= 1 + 2 + 1, "{messages} messages from one bot");
    }
}
