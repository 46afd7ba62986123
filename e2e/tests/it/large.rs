//! A 200 MiB file through both directions, with the surface's peak memory printed.

use std::io::Write;

use e2e::{StackOptions, eventually};
use sha2::Digest;

use crate::{Dm, TURN, body, media_content};

const MIB: u64 = 1024 * 1024;

/// Writes `size` bytes of incompressible data to `path` and returns its sha256.
fn write_noise(path: &std::path::Path, size: u64) -> String {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut hasher = sha2::Sha256::new();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut buf = vec![0u8; MIB as usize];
    for _ in 0..size / MIB {
        for chunk in buf.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes());
        }
        hasher.update(&buf);
        f.write_all(&buf).unwrap();
    }
    f.flush().unwrap();
    hex::encode(hasher.finalize())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_200_mib_file_goes_both_ways_with_flat_surface_memory() {
    let size = 200 * MIB;
    let dm = Dm::start(StackOptions {
        max_file_size: Some("300MiB".into()),
        agent_env: [("AGENT_MAX_FILE_SIZE".to_owned(), "300MiB".to_owned())].into(),
        ..Default::default()
    })
    .await;
    let baseline_kib = dm.stack.surface.peak_rss_kib().unwrap_or(0);
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("big.bin");
    let digest = write_noise(&src, size);

    // Inbound: user → surface → workspace.
    let started = std::time::Instant::now();
    let mxc = dm
        .user
        .upload_path(&src, "application/octet-stream")
        .await
        .unwrap();
    let id = dm
        .user
        .send(
            &dm.room,
            media_content(
                "m.file",
                "big.bin",
                None,
                &mxc,
                "application/octet-stream",
                size,
            ),
        )
        .await
        .unwrap();
    let reply = dm
        .wait_thread(&id, 1, "the description of the 200 MiB file")
        .await;
    let inbound = started.elapsed();
    assert!(
        body(&reply[0]).contains(&digest),
        "agent saw the exact bytes: {}",
        body(&reply[0])
    );
    let inbox = format!("{}/inbox/", dm.room_dir());
    let stored = dm
        .stack
        .files_under(&inbox)
        .into_iter()
        .find(|f| f.ends_with("-big.bin"))
        .expect("stored");
    assert_eq!(
        std::fs::metadata(dm.stack.workspace.join(&stored))
            .unwrap()
            .len(),
        size
    );

    // Outbound: agent names the file → surface uploads it → room.
    let started = std::time::Instant::now();
    let id = dm
        .user
        .send_text(&dm.room, &format!("send {stored}"))
        .await
        .unwrap();
    let media = eventually(TURN * 3, "the 200 MiB file in the room", || async {
        dm.bot_thread(&id)
            .await
            .into_iter()
            .find(|e| e["content"]["url"].is_string())
    })
    .await;
    let outbound = started.elapsed();
    let (back, len) = dm
        .user
        .download_digest(media["content"]["url"].as_str().unwrap())
        .await
        .unwrap();
    assert_eq!(
        (back.as_str(), len),
        (digest.as_str(), size),
        "the room got the exact bytes"
    );

    let peak_kib = dm.stack.surface.peak_rss_kib().expect("surface running");
    let mib = |kib: u64| kib as f64 / 1024.0;
    println!(
        "large_file file_mib=200 surface_peak_rss_mib={:.1} surface_rss_before_mib={:.1} \
         inbound_s={:.1} inbound_mib_s={:.1} outbound_s={:.1} outbound_mib_s={:.1}",
        mib(peak_kib),
        mib(baseline_kib),
        inbound.as_secs_f64(),
        200.0 / inbound.as_secs_f64(),
        outbound.as_secs_f64(),
        200.0 / outbound.as_secs_f64(),
    );
    // Memory must not grow with file size: the whole transfer must fit in well under half the file.
    assert!(
        peak_kib < size / 1024 / 2,
        "surface peak RSS {:.1} MiB for a 200 MiB file",
        mib(peak_kib)
    );
}
