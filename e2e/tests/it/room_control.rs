//! The room steers the bot, as an Element user in an encrypted DM does it, against the OpenAI
//! brain and a model server that streams slowly: `!stop` ends a streamed answer (the model's
//! stream is closed, the text so far is kept and marked, the turn ends cancelled in both
//! journals, the message queued behind it is answered next); the bot introduces itself on
//! joining and describes its commands in the room's state (MSC4391), and `!help` lists them; a
//! long streamed answer is edited at most 50 times, carrying MSC4357's live marker until its
//! final edit. In a plain group room, moderators set the room's model, instructions and tool
//! policies (a room makes a tool stricter, never looser), and nobody else can.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use base64::Engine;
use e2e::{E2eeUser, Homeserver, Received, Stack, StackOptions, metric};
use matrix_sdk::deserialized_responses::RawAnySyncOrStrippedState;
use matrix_sdk::ruma::events::StateEventType;
use matrix_sdk::ruma::{Int, OwnedUserId, RoomId};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::TURN;
use crate::group::Group;
use crate::streaming::{Model, call, own_dir, start_model, text_delta};

/// MSC4357's unstable marker of a message still being written.
const LIVE: &str = "org.matrix.msc4357.live";

/// A completion streaming `chunks` words of `len` characters, `pause` apart.
fn words(chunks: usize, len: usize, pause: Duration) -> Vec<(Duration, serde_json::Value)> {
    (0..chunks)
        .map(|i| {
            let word = format!("{:<width$}", format!("w{i}"), width = len - 1) + " ";
            let finish = (i + 1 == chunks).then_some("stop");
            (pause, text_delta(&word, finish))
        })
        .collect()
}

fn full_text(chunks: usize, len: usize) -> String {
    words(chunks, len, Duration::ZERO)
        .iter()
        .map(|(_, v)| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect::<String>()
        .trim()
        .to_owned()
}

/// The content of `bot`'s MSC4391 description of `word` in `room`, as `user`'s client has it.
async fn description(user: &E2eeUser, room: &str, word: &str, bot: &str) -> Option<Value> {
    let key = base64::engine::general_purpose::STANDARD
        .encode(Sha256::digest(format!("{word}{bot}").as_bytes()));
    let room = user.client().get_room(&RoomId::parse(room).ok()?)?;
    let raw = room
        .get_state_event(
            StateEventType::from("org.matrix.msc4391.command_description"),
            &key,
        )
        .await
        .ok()??;
    let event: Value = match raw {
        RawAnySyncOrStrippedState::Sync(r) => r.deserialize_as_unchecked().ok()?,
        RawAnySyncOrStrippedState::Stripped(r) => r.deserialize_as_unchecked().ok()?,
    };
    (event["sender"] == bot).then(|| event["content"].clone())
}

#[tokio::test(flavor = "multi_thread")]
async fn stop_ends_a_streamed_answer_and_a_long_answer_is_edited_at_most_fifty_times() {
    // Long enough in time for more than 50 edits at the fastest pace (200 ms): 15 s.
    const LONG: (usize, usize) = (150, 12);
    let model = Model::default();
    {
        let mut s = model.scripts.lock().unwrap();
        // A slow story (80 words over 24 s), stopped a few seconds in.
        s.push_back(Box::new(|_| words(80, 8, Duration::from_millis(300))));
        // The message queued behind it.
        s.push_back(Box::new(|_| {
            vec![(
                Duration::from_millis(50),
                text_delta("Queued answer.", Some("stop")),
            )]
        }));
        // A story whose message is edited while it is written, then the edited one's answer.
        s.push_back(Box::new(|_| words(60, 8, Duration::from_millis(300))));
        s.push_back(Box::new(|r| {
            let asked = r["messages"].to_string();
            let text = if asked.contains("tunnels") {
                "Edited answer: tunnels."
            } else {
                "Edited answer without the edit."
            };
            vec![(Duration::from_millis(50), text_delta(text, Some("stop")))]
        }));
        // A long answer, written slowly: 1,800 characters over 15 s.
        s.push_back(Box::new(|_| {
            words(LONG.0, LONG.1, Duration::from_millis(100))
        }));
    }
    let base = start_model(model.clone()).await;
    let hs = Homeserver::from_env();
    let mut opts = StackOptions::default();
    opts.agent_env.extend([
        ("AGENT_BRAIN".to_owned(), "openai".to_owned()),
        ("OPENAI_BASE_URL".to_owned(), base),
        ("OPENAI_MODEL".to_owned(), "scripted".to_owned()),
    ]);
    opts.surface_env
        .insert("SURFACE_STREAM_EDITS".into(), "200ms".into());
    opts.surface_env
        .insert("SURFACE_JOIN_INTRO".into(), "on".into());
    let stack = Stack::start(&hs, opts).await.expect("stack");
    let bot = stack.bot.user_id.clone();
    let user = E2eeUser::register(&hs, "steer").await.expect("user");
    let room = user.create_encrypted_dm(&bot).await.expect("DM");
    user.wait_joined(&room, &bot, TURN).await.expect("join");
    let bot_messages = || async { user.messages_from(&room, &bot).await.unwrap_or_default() };
    let edits_of = |all: &[Received], id: &str| -> Vec<Received> {
        all.iter()
            .filter(|m| m.replaces.as_deref() == Some(id))
            .cloned()
            .collect()
    };

    // On joining: one introduction, and the commands described in the room's state, under the
    // key MSC4391 clients check.
    let intro = user
        .wait_for(TURN, "the introduction", || async {
            bot_messages()
                .await
                .into_iter()
                .find(|m| m.msgtype == "m.notice" && m.thread_root.is_none())
        })
        .await
        .expect("intro");
    assert!(intro.body.contains("`!help`"), "{}", intro.body);
    let described = user
        .wait_for(TURN, "the command descriptions", || async {
            let mut all = Vec::new();
            for word in ["stop", "mode", "help"] {
                all.push(description(&user, &room, word, &bot).await?);
            }
            Some(all)
        })
        .await
        .expect("descriptions");
    assert_eq!(described[0]["command"], "stop");
    assert_eq!(
        described[1]["parameters"][0]["schema"]["variants"][0]["value"],
        "all"
    );

    // `!help` lists the commands.
    let help = user.send_text(&room, "!help").await.expect("send");
    let listed = user
        .wait_for(TURN, "the command list", || async {
            bot_messages()
                .await
                .into_iter()
                .find(|m| m.thread_root.as_deref() == Some(help.as_str()))
        })
        .await
        .expect("help");
    assert!(
        listed.body.contains("`!stop`") && listed.body.contains("`!mode all`"),
        "{}",
        listed.body
    );

    // A slow story, shown while written; a second message waits behind it.
    let story = user
        .send_text(&room, "tell me a slow story")
        .await
        .expect("send");
    let live = user
        .wait_for(TURN, "the story shown while written", || async {
            bot_messages()
                .await
                .into_iter()
                .find(|m| m.thread_root.as_deref() == Some(story.as_str()) && m.replaces.is_none())
        })
        .await
        .expect("live message");
    assert_eq!(
        live.content[LIVE],
        json!({}),
        "marked live: {}",
        live.content
    );
    let queued = user.send_text(&room, "and then?").await.expect("send");
    tokio::time::sleep(Duration::from_secs(2)).await;

    // `!stop`: the story's message ends on what was said so far, marked stopped.
    let asked = Instant::now();
    user.send_text(&room, "!stop").await.expect("send");
    let last = user
        .wait_for(TURN, "the stopped answer", || async {
            let all = bot_messages().await;
            edits_of(&all, &live.event_id).into_iter().find(|e| {
                e.new_body
                    .as_deref()
                    .is_some_and(|b| b.contains("Stopped."))
            })
        })
        .await
        .expect("stopped");
    let stop_latency = asked.elapsed();
    let kept = last.new_body.clone().unwrap_or_default();
    assert!(kept.starts_with("w0"), "the text so far is kept: {kept:?}");
    assert!(
        !kept.contains("w79"),
        "the story did not run to its end: {kept:?}"
    );
    assert!(
        last.content["m.new_content"].get(LIVE).is_none() && last.content.get(LIVE).is_none(),
        "the final edit is not live: {}",
        last.content
    );

    // The queued message is answered next; nothing more happened to the stopped one.
    user.wait_for(TURN, "the queued message's answer", || async {
        bot_messages().await.into_iter().find(|m| {
            m.thread_root.as_deref() == Some(queued.as_str()) && m.body.contains("Queued answer.")
        })
    })
    .await
    .expect("queued answer");
    let edits_after_stop = {
        let all = bot_messages().await;
        let edits = edits_of(&all, &live.event_id);
        let at = edits
            .iter()
            .position(|e| e.event_id == last.event_id)
            .unwrap();
        edits.len() - at - 1
    };
    assert_eq!(edits_after_stop, 0, "no edit after the stopped one");
    assert_eq!(
        model.cut.load(Ordering::SeqCst),
        1,
        "the model's stream was closed"
    );
    assert_eq!(
        stack.agent_turn(&story).map(|t| t["status"].clone()),
        Some(json!("cancelled")),
        "the agent's journal"
    );
    let metrics = stack.surface_metrics().await.expect("metrics");
    assert_eq!(
        metric(
            &metrics,
            "mxbridge_surface_turns_total",
            &[("outcome", "stopped")]
        ),
        1.0,
        "the surface's journal"
    );

    // The message being answered is edited: the edit waits, stopping is offered; `!stop`
    // ends the first answer and the edited message is answered at once.
    let bridges = user
        .send_text(&room, "tell me about bridges")
        .await
        .expect("send");
    let live2 = user
        .wait_for(TURN, "the second story shown while written", || async {
            bot_messages().await.into_iter().find(|m| {
                m.thread_root.as_deref() == Some(bridges.as_str()) && m.replaces.is_none()
            })
        })
        .await
        .expect("live");
    let edit = user
        .edit(&room, &bridges, "tell me about tunnels")
        .await
        .expect("edit");
    user.wait_for(TURN, "the offer", || async {
        bot_messages().await.into_iter().find(|m| {
            m.thread_root.as_deref() == Some(bridges.as_str())
                && m.body.contains("You edited the message I am answering")
        })
    })
    .await
    .expect("offer");
    user.send_in_thread(&room, &bridges, "!stop")
        .await
        .expect("send");
    user.wait_for(TURN, "the second story stopped", || async {
        let all = bot_messages().await;
        edits_of(&all, &live2.event_id).into_iter().find(|e| {
            e.new_body
                .as_deref()
                .is_some_and(|b| b.contains("Stopped."))
        })
    })
    .await
    .expect("stopped");
    user.wait_for(TURN, "the edited message's answer", || async {
        bot_messages().await.into_iter().find(|m| {
            m.thread_root.as_deref() == Some(bridges.as_str())
                && m.body.contains("Edited answer: tunnels.")
        })
    })
    .await
    .expect("edited answer");
    let follow_up = stack.agent_turn(&edit).expect("the edit is a turn");
    assert!(
        follow_up["text"].to_string().contains("tunnels"),
        "{follow_up}"
    );

    // A long answer: edited while written, never more than 50 times, then shown whole.
    let long = user
        .send_text(&room, "write at length")
        .await
        .expect("send");
    let text = full_text(LONG.0, LONG.1);
    let (first, edits) = user
        .wait_for(TURN, "the long answer's final edit", || async {
            let all = bot_messages().await;
            let first = all.iter().find(|m| {
                m.thread_root.as_deref() == Some(long.as_str()) && m.replaces.is_none()
            })?;
            let edits = edits_of(&all, &first.event_id);
            (edits.last()?.new_body.as_deref() == Some(text.as_str()))
                .then(|| (first.clone(), edits))
        })
        .await
        .expect("long answer");
    let (during, final_edit) = edits.split_at(edits.len() - 1);
    assert!(during.len() <= 50, "{} edits while written", during.len());
    assert!(
        during.len() >= 10,
        "shown while written: {} edits",
        during.len()
    );
    assert_eq!(first.content[LIVE], json!({}));
    assert!(
        during
            .iter()
            .all(|e| e.content["m.new_content"][LIVE] == json!({})),
        "every edit while written is live"
    );
    assert!(final_edit[0].content["m.new_content"].get(LIVE).is_none());
    println!(
        "room control: stop_latency_ms={} long_answer_chars={} edits_while_written={} \
         edits_total={}",
        stop_latency.as_millis(),
        text.chars().count(),
        during.len(),
        edits.len()
    );
}

fn says(text: &str) -> Vec<(Duration, Value)> {
    vec![(Duration::from_millis(20), text_delta(text, Some("stop")))]
}

#[tokio::test(flavor = "multi_thread")]
async fn moderators_set_the_rooms_model_instructions_and_tools_and_nobody_else_does() {
    let model = Model::default();
    {
        let mut s = model.scripts.lock().unwrap();
        s.push_back(Box::new(|_| says("Hello.")));
        s.push_back(Box::new(|_| says("Bonjour.")));
        s.push_back(Box::new(|r| {
            call(
                "w1",
                "write_file",
                json!({"path": format!("{}/notes.txt", own_dir(r)), "content": "x"}),
            )
        }));
        s.push_back(Box::new(|_| says("Not written.")));
        s.push_back(Box::new(|_| {
            call("d1", "dangerous_action", json!({"action": "deploy"}))
        }));
        s.push_back(Box::new(|_| says("Not done.")));
    }
    let base = start_model(model.clone()).await;
    let mut opts = StackOptions::default();
    opts.agent_env.extend([
        ("AGENT_BRAIN".to_owned(), "openai".to_owned()),
        ("OPENAI_BASE_URL".to_owned(), base),
        ("OPENAI_MODEL".to_owned(), "scripted".to_owned()),
        ("OPENAI_MODELS".to_owned(), "scripted, big-model".to_owned()),
        (
            "AGENT_TOOL_POLICY".to_owned(),
            "dangerous_action=ask".to_owned(),
        ),
    ]);
    let g = Group::start_with(false, opts).await;
    let bot = g.stack.bot.user_id.clone();
    // Alice, who made the room, lets the bot keep its settings there (moderator).
    let bot_id = OwnedUserId::try_from(bot.as_str()).unwrap();
    g.room_of(&g.alice)
        .update_power_levels(vec![(&bot_id, Int::from(50))])
        .await
        .expect("power levels");

    let hello = g.mention(&g.alice, "hello").await;
    g.answer(&hello, "the first answer", |m| m.body.contains("Hello."))
        .await;
    assert_eq!(model.models.lock().unwrap().last().unwrap(), "scripted");

    // Bob, no moderator, may not; an unknown model is refused with the list.
    let refused = g.mention(&g.bob, "!set model big-model").await;
    g.answer(&refused, "the refusal", |m| {
        m.body.contains("Only the room's moderators")
    })
    .await;
    let unknown = g.mention(&g.alice, "!set model nope").await;
    let listed = g
        .answer(&unknown, "the list", |m| m.body.contains("Unknown model"))
        .await;
    assert!(
        listed.body.contains("`scripted`, `big-model`"),
        "{}",
        listed.body
    );

    // Alice sets the model and instructions: the model server gets both.
    let set = g.mention(&g.alice, "!set model big-model").await;
    g.answer(&set, "the model set", |m| {
        m.body.contains("Model set to `big-model`")
    })
    .await;
    let instructed = g
        .mention(&g.alice, "!set instructions Answer in French.")
        .await;
    g.answer(&instructed, "the instructions set", |m| {
        m.body.contains("Instructions set")
    })
    .await;
    let asked = g.mention(&g.alice, "hello again").await;
    g.answer(&asked, "the answer with the room's model", |m| {
        m.body.contains("Bonjour.")
    })
    .await;
    assert_eq!(model.models.lock().unwrap().last().unwrap(), "big-model");
    let state = g
        .stack
        .agent_turn(&asked)
        .expect("the agent stored the turn");
    assert_eq!(state["settings"]["model"], "big-model", "{state}");
    assert_eq!(state["settings"]["instructions"], "Answer in French.");

    // The room makes write_file ask: a prompt appears (the operator allows it outright).
    let strict = g.mention(&g.alice, "!set tool write_file ask").await;
    g.answer(&strict, "the tool set", |m| {
        m.body.contains("`write_file`: ask")
    })
    .await;
    let write = g.mention(&g.alice, "write notes").await;
    g.answer(&write, "a prompt for write_file", |m| {
        m.body.contains("Approval needed")
    })
    .await;
    g.in_thread(&g.alice, &write, "no").await;
    g.answer(&write, "the answer after the denial", |m| {
        m.body.contains("Not written.")
    })
    .await;

    // The room cannot loosen what the operator asks for: dangerous_action still asks.
    let loose = g
        .mention(&g.alice, "!set tool dangerous_action allow")
        .await;
    g.answer(&loose, "the tool set", |m| m.body.contains("never looser"))
        .await;
    // With `approvers: moderators`, Alice decides the prompt Bob's message brought.
    let approvers = g.mention(&g.alice, "!set approvers moderators").await;
    g.answer(&approvers, "the approvers set", |m| {
        m.body.contains("Moderators may decide")
    })
    .await;
    let danger = g.mention(&g.bob, "do the dangerous thing").await;
    g.answer(&danger, "a prompt for dangerous_action", |m| {
        m.body.contains("Approval needed")
    })
    .await;
    g.in_thread(&g.alice, &danger, "no").await;
    g.answer(&danger, "the answer after the denial", |m| {
        m.body.contains("Not done.")
    })
    .await;

    // `!settings` shows them; the state event is the room's, readable by any client.
    let shown = g.mention(&g.bob, "!settings").await;
    let settings = g
        .answer(&shown, "the settings", |m| m.body.contains("settings:"))
        .await;
    assert!(
        settings.body.contains("`big-model`") && settings.body.contains("`write_file`: ask"),
        "{}",
        settings.body
    );
    let reset = g.mention(&g.alice, "!reset").await;
    g.answer(&reset, "the reset", |m| m.body.contains("back to"))
        .await;
    println!(
        "room settings: models_requested={:?}",
        model.models.lock().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_homeserver_tells_the_room_when_the_surface_dies_mid_answer_and_queued_messages_collect()
 {
    let hs = Homeserver::from_env();
    let mut opts = StackOptions::default();
    opts.surface_env
        .insert("SURFACE_INTERRUPTED_NOTICE".into(), "6s".into());
    let mut stack = Stack::start(&hs, opts).await.expect("stack");
    let bot = stack.bot.user_id.clone();
    let user = E2eeUser::register(&hs, "held").await.expect("user");
    let room = user.create_encrypted_dm(&bot).await.expect("DM");
    user.wait_joined(&room, &bot, TURN).await.expect("join");
    let bot_messages = || async { user.messages_from(&room, &bot).await.unwrap_or_default() };

    // A 30 s answer; the surface dies once the homeserver holds the notice (after 3 s).
    let slow = user.send_text(&room, "sleep 30000").await.expect("send");
    tokio::time::sleep(Duration::from_secs(6)).await;
    stack.surface.kill9().await;
    let killed = Instant::now();
    let notice = user
        .wait_for(TURN, "the homeserver's notice", || async {
            bot_messages().await.into_iter().find(|m| {
                m.thread_root.as_deref() == Some(slow.as_str()) && m.body.contains("interrupted")
            })
        })
        .await
        .expect("notice");
    let posted_after = killed.elapsed();
    assert_eq!(notice.msgtype, "m.notice");
    assert_eq!(notice.content["org.mxbridge.interrupted"], slow.as_str());

    // Back: the answer comes, and the notice says the bot is back.
    stack.surface.start().unwrap();
    user.wait_for(TURN, "the answer", || async {
        bot_messages().await.into_iter().find(|m| {
            m.thread_root.as_deref() == Some(slow.as_str()) && m.body.contains("Slept 30000 ms")
        })
    })
    .await
    .expect("answer");
    user.wait_for(TURN, "the notice edited", || async {
        bot_messages().await.into_iter().find(|m| {
            m.replaces.as_deref() == Some(notice.event_id.as_str())
                && m.new_body
                    .as_deref()
                    .is_some_and(|b| b.contains("I am back"))
        })
    })
    .await
    .expect("edited");
    let notices = bot_messages()
        .await
        .into_iter()
        .filter(|m| m.body.contains("interrupted") && m.replaces.is_none())
        .count();
    assert_eq!(notices, 1, "one notice");
    println!(
        "interrupted notice: posted_after_kill_ms={} (delay 6s, restarted every 2s)",
        posted_after.as_millis()
    );

    // `queue: collect` (set from the encrypted DM): three messages sent during a slow answer
    // become one next turn, the last with the two before it as context.
    let set = user
        .send_text(&room, "!set queue collect")
        .await
        .expect("send");
    user.wait_for(TURN, "the setting", || async {
        bot_messages().await.into_iter().find(|m| {
            m.thread_root.as_deref() == Some(set.as_str()) && m.body.contains("collected")
        })
    })
    .await
    .expect("set");
    let busy = user.send_text(&room, "sleep 4000").await.expect("send");
    let mut sent = Vec::new();
    for text in ["one", "two", "three"] {
        sent.push(user.send_text(&room, text).await.expect("send"));
    }
    user.wait_for(TURN, "the collected answer", || async {
        bot_messages()
            .await
            .into_iter()
            .find(|m| m.thread_root.as_deref() == Some(sent[2].as_str()))
    })
    .await
    .expect("answer");
    let turn = stack
        .agent_turn(&sent[2])
        .expect("the agent stored the turn");
    let context: Vec<&str> = turn["context"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["text"].as_str())
        .collect();
    assert_eq!(context, ["one", "two"], "{turn}");
    assert!(stack.agent_turn(&sent[0]).is_none() && stack.agent_turn(&sent[1]).is_none());
    assert!(stack.agent_turn(&busy).is_some());
    let answered_alone = bot_messages()
        .await
        .into_iter()
        .filter(|m| {
            m.thread_root.as_deref() == Some(sent[0].as_str())
                || m.thread_root.as_deref() == Some(sent[1].as_str())
        })
        .count();
    assert_eq!(
        answered_alone, 0,
        "collected messages get no answer of their own"
    );
}
