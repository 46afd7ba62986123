//! `video()`: size and duration from the `moov` box, skipping `mdat` with seeks.

use std::io::Cursor;
use std::time::Duration;

use mediainfo::{VideoFacts, video};

use crate::{Part, Synthetic, assert_close, corpus};

/// Splits an MP4 into its top-level boxes, as (type, bytes).
fn boxes(file: &[u8]) -> Vec<([u8; 4], Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 8 <= file.len() {
        let size = u32::from_be_bytes(file[at..at + 4].try_into().unwrap()) as usize;
        let kind: [u8; 4] = file[at + 4..at + 8].try_into().unwrap();
        out.push((kind, file[at..at + size].to_vec()));
        at += size;
    }
    out
}

#[test]
fn mp4_size_and_duration() {
    let bytes = corpus("clip.mp4");
    let facts = video(Cursor::new(&bytes), bytes.len() as u64).expect("facts");
    assert_eq!((facts.width, facts.height), (Some(320), Some(240)));
    assert_close(facts.duration, Duration::from_secs(2));
}

#[test]
fn a_1_gib_mdat_before_moov_is_skipped_not_read() {
    // The corpus clip has its moov after mdat; give it a 1 GiB mdat (64-bit size) instead.
    let clip = boxes(&corpus("clip.mp4"));
    let (ftyp, moov) = (
        &clip[0].1,
        &clip.iter().find(|(k, _)| k == b"moov").unwrap().1,
    );
    let mdat_len: u64 = 1 << 30;
    let mut mdat_head = 1u32.to_be_bytes().to_vec();
    mdat_head.extend_from_slice(b"mdat");
    mdat_head.extend_from_slice(&(mdat_len + 16).to_be_bytes());
    let mut file = Synthetic::new(vec![
        Part::Bytes(ftyp.clone()),
        Part::Bytes(mdat_head),
        Part::Zeros(mdat_len),
        Part::Bytes(moov.clone()),
    ]);
    let len = file.size();
    let facts = video(&mut file, len).expect("facts");
    assert_eq!((facts.width, facts.height), (Some(320), Some(240)));
    assert_close(facts.duration, Duration::from_secs(2));
    assert!(
        file.bytes_read < 64 * 1024,
        "read {} bytes",
        file.bytes_read
    );
}

#[test]
fn other_containers_give_no_facts() {
    let mut webm = vec![0x1a, 0x45, 0xdf, 0xa3];
    webm.extend_from_slice(&[0u8; 60]);
    let facts = video(Cursor::new(&webm), webm.len() as u64).expect("not an error");
    assert_eq!(facts, VideoFacts::default());
}

#[test]
fn mp4_without_moov_is_malformed() {
    let clip = boxes(&corpus("clip.mp4"));
    let cut: Vec<u8> = clip
        .iter()
        .filter(|(k, _)| k != b"moov")
        .flat_map(|(_, b)| b.clone())
        .collect();
    assert!(video(Cursor::new(&cut), cut.len() as u64).is_err());
}
