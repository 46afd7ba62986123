//! Garbage and truncated files: every function returns, with an error or partial facts.

use std::io::Cursor;

use mediainfo::{Limits, audio, for_model, image, video};

use crate::{corpus, noise};

const CORPUS: [&str; 8] = [
    "opaque.png",
    "photo.jpg",
    "transparent.png",
    "bomb.png",
    "clip.mp4",
    "voice.ogg",
    "tone.wav",
    "tone.flac",
];

fn run_all(bytes: &[u8]) {
    let len = bytes.len() as u64;
    let _ = image(Cursor::new(bytes), len, &Limits::default());
    let _ = for_model(Cursor::new(bytes), &Limits::default(), 1536);
    let _ = video(Cursor::new(bytes), len);
    for mime in ["audio/ogg", "audio/wav", "application/octet-stream"] {
        let _ = audio(Cursor::new(bytes), mime, len);
    }
}

#[test]
fn random_bytes() {
    for (i, len) in [0usize, 1, 4, 8, 12, 27, 100, 4096, 70_000]
        .into_iter()
        .enumerate()
    {
        run_all(&noise(len, i as u64 + 1));
    }
    // Garbage behind each format's magic, to get past the first check.
    for magic in [
        &b"\x89PNG\r\n\x1a\n"[..],
        b"\xff\xd8\xff\xe0",
        b"GIF89a",
        b"RIFF\x00\x00\x00\x00WEBPVP8 ",
        b"\x00\x00\x00\x18ftypisom",
        b"OggS\x00\x02",
        b"RIFF\xff\xff\xff\xffWAVEfmt ",
        b"fLaC\x00\x00\x00\x22",
    ] {
        for seed in 1..5 {
            let mut bytes = magic.to_vec();
            bytes.extend(noise(2000, seed));
            run_all(&bytes);
        }
    }
}

#[test]
fn truncated_corpus_files() {
    for name in CORPUS {
        let bytes = corpus(name);
        // Every cut inside the headers, then a few through the data (each of those decodes
        // most of an image, which is slow in a debug build).
        let mut cuts: Vec<usize> = (0..64).collect();
        cuts.extend((1..8).map(|i| bytes.len() * i / 8));
        for cut in cuts.into_iter().filter(|&c| c < bytes.len()) {
            run_all(&bytes[..cut]);
        }
    }
}

#[test]
fn corrupted_corpus_files() {
    for (n, name) in CORPUS.into_iter().enumerate() {
        let mut bytes = corpus(name);
        // Overwrite a run of bytes at a few places past the headers.
        for (i, at) in [bytes.len() / 7, bytes.len() / 3, bytes.len() / 2]
            .into_iter()
            .enumerate()
        {
            let junk = noise(64, (n * 10 + i) as u64 + 1);
            let end = (at + junk.len()).min(bytes.len());
            bytes[at..end].copy_from_slice(&junk[..end - at]);
            run_all(&bytes);
        }
    }
}
