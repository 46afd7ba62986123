//! Files users send: they land in the inbox with their exact bytes and the agent gets the path.

use e2e::{StackOptions, sha256_hex};

use crate::{Dm, PNG_3X2, body, media_content};

struct Case {
    msgtype: &'static str,
    mime: &'static str,
    filename: &'static str,
    caption: Option<&'static str>,
    bytes: Vec<u8>,
    /// What the stored name must end with.
    stored_suffix: &'static str,
}

#[tokio::test(flavor = "multi_thread")]
async fn each_media_kind_lands_in_the_inbox_and_the_agent_gets_its_path() {
    let dm = Dm::start(StackOptions::default()).await;
    let png = hex::decode(PNG_3X2).unwrap();
    let cases = vec![
        Case {
            msgtype: "m.image",
            mime: "image/png",
            filename: "cat.png",
            caption: None,
            bytes: png.clone(),
            stored_suffix: "-cat.png",
        },
        Case {
            msgtype: "m.image",
            mime: "image/png",
            filename: "dog.png",
            caption: Some("look at my dog"),
            bytes: png,
            stored_suffix: "-dog.png",
        },
        Case {
            msgtype: "m.file",
            mime: "text/plain",
            filename: "notes.txt",
            caption: Some("my notes"),
            bytes: b"line one\nline two\n".to_vec(),
            stored_suffix: "-notes.txt",
        },
        Case {
            msgtype: "m.file",
            mime: "text/plain",
            filename: "../../etc/passwd",
            caption: None,
            bytes: b"root:x:0:0\n".to_vec(),
            stored_suffix: "passwd",
        },
        Case {
            msgtype: "m.file",
            mime: "application/octet-stream",
            filename: "\u{202e}gnp.exe",
            caption: Some("bidi trick"),
            bytes: vec![7u8; 1000],
            stored_suffix: "gnp.exe",
        },
        Case {
            msgtype: "m.audio",
            mime: "audio/ogg",
            filename: "voice.ogg",
            caption: None,
            bytes: b"OggS\0\x02fake-audio-bytes".to_vec(),
            stored_suffix: "-voice.ogg",
        },
        Case {
            msgtype: "m.video",
            mime: "video/mp4",
            filename: "clip.mp4",
            caption: Some("a clip"),
            bytes: b"\0\0\0\x18ftypmp42fake-video".to_vec(),
            stored_suffix: "-clip.mp4",
        },
    ];
    let inbox = format!("{}/inbox/", dm.room_dir());
    let (total, count): (usize, usize) = (cases.iter().map(|c| c.bytes.len()).sum(), cases.len());
    for case in cases {
        let mxc = dm.user.upload(case.bytes.clone(), case.mime).await.unwrap();
        let body_text = case.caption.unwrap_or(case.filename);
        let filename = case.caption.map(|_| case.filename);
        let content = media_content(
            case.msgtype,
            body_text,
            filename,
            &mxc,
            case.mime,
            case.bytes.len() as u64,
        );
        let id = dm.user.send(&dm.room, content).await.unwrap();
        let reply = dm
            .wait_thread(&id, 1, &format!("a reply to {}", case.filename))
            .await;
        let text = body(&reply[0]);
        let digest = sha256_hex(&case.bytes);

        // The exact bytes are in the room's inbox, under a sanitized name.
        let stored: Vec<String> = dm
            .stack
            .files_under(&inbox)
            .into_iter()
            .filter(|f| {
                std::fs::read(dm.stack.workspace.join(f))
                    .map(|b| sha256_hex(&b) == digest)
                    .unwrap_or(false)
            })
            .filter(|f| f.ends_with(case.stored_suffix))
            .collect();
        assert_eq!(
            stored.len(),
            1,
            "{}: one stored copy in {inbox}: {stored:?}",
            case.filename
        );
        let rel = &stored[0];
        let name = rel.rsplit('/').next().unwrap();
        assert!(
            !name.starts_with('.') && !name.contains('\u{202e}'),
            "sanitized name {name:?}"
        );
        assert!(
            rel.starts_with(&inbox) && !rel.split('/').any(|c| c == ".." || c == "."),
            "{rel}"
        );

        // The reply names the file as its sender did, not by its workspace path.
        let shown = protocol::original_name(name);
        assert!(
            text.contains(&format!("File: {shown}")) && !text.contains("surfaces/matrix"),
            "reply names {shown} and no path: {text}"
        );
        assert!(
            text.contains(&digest),
            "reply has the agent's sha256 of the file: {text}"
        );
        let turn = dm.stack.agent_turn(&id).expect("the agent stored the turn");
        let expected_text = case.caption.unwrap_or("User sent one or more attachments.");
        assert_eq!(
            turn["text"], expected_text,
            "text passed on unchanged or synthetic"
        );
        assert_eq!(
            turn["attachments"],
            serde_json::json!([rel]),
            "exactly the relative path"
        );
        let info = &turn["attachment_info"][rel.as_str()];
        assert_eq!(info["size"], case.bytes.len(), "{info}");
        if case.msgtype == "m.image" {
            assert!(text.contains("3x2"), "image dimensions: {text}");
        }
    }
    // The surface's metrics moved as the files came in; the agent's, as the turns ended.
    let m = dm.stack.surface_metrics().await.expect("surface /metrics");
    let bytes_in = e2e::metric(
        &m,
        "mxbridge_surface_media_bytes_total",
        &[("direction", "in")],
    );
    assert!(
        bytes_in >= total as f64,
        "media bytes in {bytes_in} < {total}:\n{m}"
    );
    let media = e2e::metric(
        &m,
        "mxbridge_surface_events_total",
        &[("kind", "media"), ("outcome", "trigger")],
    );
    assert!(media >= count as f64, "media events {media}:\n{m}");
    assert_eq!(
        e2e::metric(&m, "mxbridge_surface_agent_up", &[]),
        1.0,
        "{m}"
    );
    assert!(e2e::metric(&m, "mxbridge_surface_sync_last_success_age_seconds", &[]) < 120.0);
    let a = dm.stack.agent_metrics().await.expect("agent /metrics");
    let turns = e2e::metric(
        &a,
        "mxbridge_agent_turns_total",
        &[("outcome", "completed")],
    );
    assert!(turns >= count as f64, "turns {turns}:\n{a}");
    println!(
        "metrics after files in: media_bytes_in={bytes_in} media_events={media} agent_turns={turns}"
    );

    // No partial files anywhere.
    let all = dm.stack.files_under("surfaces");
    assert!(
        all.iter()
            .all(|f| !f.rsplit('/').next().unwrap().starts_with(".partial")),
        "{all:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn failed_downloads_are_reported_in_the_room_and_send_no_path() {
    let dm = Dm::start(StackOptions {
        max_file_size: Some("1MiB".into()),
        ..Default::default()
    })
    .await;
    let inbox = format!("{}/inbox/", dm.room_dir());

    // Media deleted on the server before the bot could fetch it.
    let mxc = dm
        .user
        .upload(b"soon gone".to_vec(), "text/plain")
        .await
        .unwrap();
    dm.user.admin_delete_media(&mxc).await.unwrap();
    let gone = dm
        .user
        .send(
            &dm.room,
            media_content("m.file", "gone.txt", None, &mxc, "text/plain", 9),
        )
        .await
        .unwrap();

    // Declared size over the limit.
    let big = vec![1u8; 2 * 1024 * 1024];
    let mxc = dm
        .user
        .upload(big.clone(), "application/octet-stream")
        .await
        .unwrap();
    let declared = dm
        .user
        .send(
            &dm.room,
            media_content(
                "m.file",
                "big.bin",
                None,
                &mxc,
                "application/octet-stream",
                big.len() as u64,
            ),
        )
        .await
        .unwrap();

    // Declared size lies: the limit is enforced while streaming.
    let liar = dm
        .user
        .send(
            &dm.room,
            media_content(
                "m.file",
                "liar.bin",
                None,
                &mxc,
                "application/octet-stream",
                10,
            ),
        )
        .await
        .unwrap();

    for (id, name) in [
        (gone, "gone.txt"),
        (declared, "big.bin"),
        (liar, "liar.bin"),
    ] {
        let msgs = e2e::eventually(
            crate::TURN,
            &format!("an error message naming {name}"),
            || async {
                let all = dm
                    .user
                    .messages_from(&dm.room, &dm.stack.bot.user_id)
                    .await
                    .ok()?;
                all.into_iter()
                    .find(|e| body(e).contains(name) && crate::relates_to_or_unrelated(e, &id))
            },
        )
        .await;
        let text = body(&msgs).to_lowercase();
        assert!(
            text.contains("could not") || text.contains("couldn't") || text.contains("failed"),
            "clear error: {text}"
        );
    }
    // Nothing (partial or complete) reached the inbox, so no path could have been sent.
    assert_eq!(dm.stack.files_under(&inbox), Vec::<String>::new());
}
