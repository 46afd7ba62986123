//! What a user sees of a turn before its answer, in an encrypted DM with matrix-sdk as the
//! client: a slow turn marks the message read and shows the bot typing, and takes the notice
//! down when it is done; a quick turn whose answer waits behind a slow homeserver shows
//! neither (under a burst, those three requests per message cost a fifth of the throughput,
//! and the answer says the message was read), and neither does a turn waiting for the user's
//! answer to its question. A file that is slow to download shows the bot at work too: the
//! user's wait starts when the message arrives. The surface talks to Synapse through a proxy
//! that can slow room sends and downloads and counts the surface's requests.

use std::time::Duration;

use e2e::e2ee::E2eeUser;
use e2e::{Homeserver, KeyProxy, Stack, StackOptions};

use crate::TURN;
use crate::first_sight::reply_in_thread;

/// What the proxy saw the surface send: typing notices and read receipts.
fn signals(proxy: &KeyProxy) -> (usize, usize) {
    (
        proxy.requests("PUT", "/typing/"),
        proxy.requests("POST", "/receipt/"),
    )
}

/// A stack whose surface talks to Synapse through a proxy, and a user (matrix-sdk) in an
/// encrypted DM with the bot.
struct Behind {
    proxy: KeyProxy,
    stack: Stack,
    bot: String,
    user: E2eeUser,
    room: String,
}

impl Behind {
    async fn start(prefix: &str) -> Self {
        let hs = Homeserver::from_env();
        let proxy = KeyProxy::start(&hs.url).await.expect("proxy");
        let mut opts = StackOptions::default();
        opts.surface_env
            .insert("MATRIX_HOMESERVER_URL".into(), proxy.url().to_owned());
        let stack = Stack::start(&hs, opts).await.expect("stack starts");
        let bot = stack.bot.user_id.clone();
        let user = E2eeUser::register(&hs, prefix).await.unwrap();
        let room = user.create_encrypted_dm(&bot).await.unwrap();
        user.wait_joined(&room, &bot, TURN).await.unwrap();
        Self {
            proxy,
            stack,
            bot,
            user,
            room,
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_slow_turn_shows_typing_and_a_quick_one_behind_a_slow_homeserver_does_not() {
    let Behind {
        proxy,
        stack,
        bot,
        user,
        room,
    } = Behind::start("progress").await;
    let hello = user.send_text(&room, "hello").await.unwrap();
    reply_in_thread(&user, &room, &bot, &hello).await;
    assert_eq!(signals(&proxy), (0, 0), "a quick turn shows nothing");

    // The homeserver is slow to take messages: the answer takes 2 s to post, far past the
    // 700 ms after which a turn shows progress. Posting is not the agent's silence.
    proxy.delay_sends(Duration::from_secs(2));
    let quick = user.send_text(&room, "quick one").await.unwrap();
    let reply = reply_in_thread(&user, &room, &bot, &quick).await;
    proxy.delay_sends(Duration::ZERO);
    assert!(reply.was_encrypted, "{reply:?}");
    assert_eq!(
        signals(&proxy),
        (0, 0),
        "an answer waiting behind the homeserver is not announced by typing or a receipt"
    );

    // A slow agent: the user sees the message read and the bot typing, then not typing.
    let slow = user.send_text(&room, "sleep 3000").await.unwrap();
    reply_in_thread(&user, &room, &bot, &slow).await;
    let seen = typing_shown_then_taken_down(&user, &room, &bot).await;
    let read = read_receipt_at(&user, &room, &bot, &slow).await;
    let slow_turn = signals(&proxy);

    // A question: while the turn waits for the user's answer, the bot is not typing.
    let asked = user
        .send_text(&room, "ask favourite colour?")
        .await
        .unwrap();
    let question = reply_in_thread(&user, &room, &bot, &asked).await;
    assert!(question.body.contains("Question"), "{question:?}");
    // Not synchronisation: a window in which a notice would have gone out (quiet for 700 ms).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        signals(&proxy),
        slow_turn,
        "no typing notice (and no receipt) while the bot waits for the user"
    );
    user.send_in_thread(&room, &asked, "blue").await.unwrap();
    user.wait_for(TURN, "the echoed answer", || async {
        let all = user.messages_from(&room, &bot).await.ok()?;
        all.into_iter()
            .find(|m| m.answers() == Some(asked.as_str()) && m.body.contains("You answered"))
    })
    .await
    .unwrap();
    assert_eq!(
        signals(&proxy),
        slow_turn,
        "answered quickly: nothing shown"
    );

    let (typing, receipts) = slow_turn;
    // The surface counts what it sent (the benchmark's receipts+typing figure reads this).
    let metrics = stack.surface_metrics().await.unwrap();
    let counted = |kind| {
        e2e::metric(
            &metrics,
            "mxbridge_surface_progress_signals_total",
            &[("kind", kind)],
        ) as usize
    };
    assert_eq!(
        (counted("typing"), counted("read_receipt")),
        (typing, receipts),
        "the surface's metrics count the requests the proxy saw"
    );
    println!(
        "progress: quick_turn_behind_slow_sends typing=0 receipts=0; slow_turn typing_requests={typing} \
         receipts={receipts} typing_states_seen={seen} read_at_trigger={read}; question_wait typing=0"
    );
    assert!(typing >= 2, "typing shown and taken down: {typing}");
    assert_eq!(receipts, 1, "one read receipt, for the slow turn");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_file_slow_to_download_shows_the_bot_reading_and_typing() {
    let Behind {
        proxy,
        stack: _stack,
        bot,
        user,
        room,
    } = Behind::start("slowfile").await;

    // The file takes 3 s to come from the homeserver; the agent's answer then comes at once.
    // Before, progress started with the turn, after the download: the user saw nothing for 3 s.
    proxy.delay_downloads(Duration::from_secs(3));
    let sent = user
        .send_file(
            &room,
            "notes.txt",
            "text/plain",
            b"slow but sure\n".to_vec(),
            None,
        )
        .await
        .unwrap();
    let reply = reply_in_thread(&user, &room, &bot, &sent).await;
    proxy.delay_downloads(Duration::ZERO);
    assert!(reply.was_encrypted, "{reply:?}");
    assert!(
        proxy.requests("GET", "/media/download/") >= 1,
        "the download went through the proxy"
    );
    let seen = typing_shown_then_taken_down(&user, &room, &bot).await;
    let read = read_receipt_at(&user, &room, &bot, &sent).await;
    let (typing, receipts) = signals(&proxy);
    println!(
        "progress: slow_download typing_requests={typing} receipts={receipts} \
         typing_states_seen={seen} read_at_file={read}"
    );
    assert!(typing >= 2, "typing shown and taken down: {typing}");
    assert_eq!(
        receipts, 1,
        "the file's message marked read while it downloaded"
    );
}

/// Waits until `user` has seen `bot` typing in `room` and then no longer typing; returns how
/// many typing states the user's sync delivered.
pub async fn typing_shown_then_taken_down(user: &E2eeUser, room: &str, bot: &str) -> usize {
    let bot = bot.to_owned();
    user.wait_for(TURN, "the bot typing, then no longer typing", || async {
        let seen = user.typing_seen(room);
        let shown = seen.iter().position(|who| who.contains(&bot))?;
        let down = seen[shown..].iter().any(|who| !who.contains(&bot))
            && seen.last().is_some_and(|who| !who.contains(&bot));
        down.then_some(seen.len())
    })
    .await
    .unwrap()
}

/// Waits until `user`'s client has `bot`'s read receipt at `event`.
pub async fn read_receipt_at(user: &E2eeUser, room: &str, bot: &str, event: &str) -> bool {
    user.wait_for(
        TURN,
        &format!("the bot's read receipt at {event}"),
        || async {
            let at = user.read_receipt_of(room, bot).await.ok().flatten()?;
            (at == event).then_some(true)
        },
    )
    .await
    .unwrap()
}
