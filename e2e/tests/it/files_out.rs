//! Files the agent sends: native Matrix media with the right bytes, uploaded once per content.

use e2e::matrix::Event;
use e2e::{StackOptions, eventually, sha256_hex};

use crate::{Dm, PNG_3X2, TURN, body, media_content};

fn mxc(e: &Event) -> String {
    e["content"]["url"].as_str().unwrap_or_default().to_owned()
}

/// The first media message (one with a `url`) in a list of bot messages.
fn first_media(msgs: &[Event]) -> Option<Event> {
    msgs.iter()
        .find(|e| e["content"]["url"].is_string())
        .cloned()
}

async fn media_reply(dm: &Dm, text: &str) -> Event {
    let id = dm.user.send_text(&dm.room, text).await.unwrap();
    eventually(TURN, &format!("a file in reply to {text:?}"), || async {
        first_media(&dm.bot_thread(&id).await)
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_files_arrive_as_native_media_uploaded_once_per_content() {
    let dm = Dm::start(StackOptions::default()).await;

    // A note the agent writes into its own area and sends.
    let note = media_reply(&dm, "note out.txt first version").await;
    assert_eq!(note["content"]["msgtype"], "m.file", "{note}");
    let name = note["content"]["filename"]
        .as_str()
        .or(note["content"]["body"].as_str())
        .unwrap();
    assert_eq!(name, "out.txt");
    assert_eq!(note["content"]["info"]["mimetype"], "text/plain", "{note}");
    let bytes = dm.user.download(&mxc(&note)).await.unwrap();
    assert_eq!(bytes, b"first version");
    assert_eq!(note["content"]["info"]["size"], 13);

    // An image the user sent, sent back by path: m.image with dimensions, same bytes.
    let png = hex::decode(PNG_3X2).unwrap();
    let up = dm.user.upload(png.clone(), "image/png").await.unwrap();
    let id = dm
        .user
        .send(
            &dm.room,
            media_content(
                "m.image",
                "pic.png",
                None,
                &up,
                "image/png",
                png.len() as u64,
            ),
        )
        .await
        .unwrap();
    dm.wait_thread(&id, 1, "the image description").await;
    let inbox = format!("{}/inbox/", dm.room_dir());
    let stored = dm
        .stack
        .files_under(&inbox)
        .into_iter()
        .find(|f| f.ends_with("-pic.png"))
        .expect("stored image");
    let image = media_reply(&dm, &format!("send {stored}")).await;
    assert_eq!(image["content"]["msgtype"], "m.image", "{image}");
    assert_eq!(image["content"]["info"]["w"], 3, "{image}");
    assert_eq!(image["content"]["info"]["h"], 2, "{image}");
    assert_eq!(image["content"]["info"]["mimetype"], "image/png");
    assert_eq!(
        sha256_hex(&dm.user.download(&mxc(&image)).await.unwrap()),
        sha256_hex(&png)
    );

    // The same bytes again: no second upload (same content URI).
    let again = media_reply(&dm, &format!("send {stored}")).await;
    assert_eq!(mxc(&again), mxc(&image), "same bytes are uploaded once");

    // Changed bytes: a new upload.
    let changed = media_reply(&dm, "note out.txt second version").await;
    assert_ne!(mxc(&changed), mxc(&note), "changed bytes upload again");
    assert_eq!(
        dm.user.download(&mxc(&changed)).await.unwrap(),
        b"second version"
    );

    // A missing file: a visible message naming it, nothing uploaded.
    let id = dm
        .user
        .send_text(&dm.room, "sendraw chats/does-not-exist.txt")
        .await
        .unwrap();
    let warning = eventually(TURN, "the missing-file message", || async {
        let all = dm
            .user
            .messages_from(&dm.room, &dm.stack.bot.user_id)
            .await
            .ok()?;
        all.into_iter().find(|e| {
            body(e).contains("does-not-exist.txt") && crate::relates_to_or_unrelated(e, &id)
        })
    })
    .await;
    assert!(
        warning["content"]["url"].is_null(),
        "no media for a missing file: {warning}"
    );
    assert!(body(&warning).to_lowercase().contains("not"), "{warning}");
}

#[tokio::test(flavor = "multi_thread")]
async fn outbox_file_is_posted_once() {
    let dm = Dm::start(StackOptions::default()).await;
    // Make sure the surface knows the room before dropping the file.
    dm.ask("hello").await;
    let outbox = dm.stack.workspace.join(dm.room_dir()).join("outbox");
    std::fs::create_dir_all(&outbox).unwrap();
    // Written elsewhere, then renamed in complete.
    let tmp = dm.stack.workspace.join("report.tmp");
    std::fs::write(&tmp, b"outbox report").unwrap();
    std::fs::rename(&tmp, outbox.join("report.txt")).unwrap();

    let posted = eventually(TURN, "the outbox file in the room", || async {
        let all = dm
            .user
            .messages_from(&dm.room, &dm.stack.bot.user_id)
            .await
            .ok()?;
        let hits: Vec<Event> = all
            .into_iter()
            .filter(|e| e["content"]["url"].is_string())
            .collect();
        (!hits.is_empty()).then_some(hits)
    })
    .await;
    assert_eq!(
        dm.user.download(&mxc(&posted[0])).await.unwrap(),
        b"outbox report"
    );

    // A full round trip later, it was still posted exactly once.
    dm.ask("still there?").await;
    let all = dm
        .user
        .messages_from(&dm.room, &dm.stack.bot.user_id)
        .await
        .unwrap();
    let count = all
        .iter()
        .filter(|e| e["content"]["url"].is_string())
        .count();
    assert_eq!(count, 1, "outbox file posted once");
    assert!(
        !outbox.join("report.txt").exists(),
        "the posted file was moved aside"
    );
}
