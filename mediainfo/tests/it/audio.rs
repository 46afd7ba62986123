//! `audio()`: durations, the voice-note test and waveforms.

use std::io::Cursor;
use std::time::Duration;

use mediainfo::{WAVEFORM_LEN, audio};

use crate::{Part, Synthetic, assert_close, corpus};

fn assert_waveform(wave: &[u16]) {
    assert_eq!(wave.len(), WAVEFORM_LEN);
    assert!(wave.iter().all(|&v| v <= 1024), "{wave:?}");
    assert_eq!(wave.iter().max(), Some(&1024), "{wave:?}");
}

#[test]
fn ogg_opus_voice_note() {
    let bytes = corpus("voice.ogg");
    let facts = audio(Cursor::new(&bytes), "audio/ogg", bytes.len() as u64).expect("facts");
    assert!(facts.is_ogg_opus);
    assert_close(facts.duration, Duration::from_secs(3));
    let wave = facts.waveform.expect("a waveform");
    assert_waveform(&wave);
    // The corpus note's loudness follows |sin(πt/1.5)|: quiet at 0 s and 1.5 s, loud at 0.75 s.
    assert!(wave[25] > 2 * wave[1], "{wave:?}");
    assert!(wave[25] > 2 * wave[50], "{wave:?}");
}

#[test]
fn wav_duration_and_waveform() {
    let bytes = corpus("tone.wav");
    let facts = audio(Cursor::new(&bytes), "audio/wav", bytes.len() as u64).expect("facts");
    assert!(!facts.is_ogg_opus);
    assert_close(facts.duration, Duration::from_millis(1500));
    let wave = facts.waveform.expect("a waveform");
    assert_waveform(&wave);
    // A fade-in: each slice is louder than the one ten before it.
    assert!(wave.windows(11).all(|w| w[10] > w[0]), "{wave:?}");
}

#[test]
fn flac_and_m4a_durations() {
    let flac = corpus("tone.flac");
    let facts = audio(Cursor::new(&flac), "audio/flac", flac.len() as u64).expect("facts");
    assert_close(facts.duration, Duration::from_millis(1250));
    assert!(!facts.is_ogg_opus);
    let m4a = corpus("clip.mp4");
    let facts = audio(Cursor::new(&m4a), "audio/mp4", m4a.len() as u64).expect("facts");
    assert_close(facts.duration, Duration::from_secs(2));
}

#[test]
fn a_1_gib_wav_is_sampled_not_read() {
    let real = corpus("tone.wav");
    // Keep the 44-byte header, and declare a data chunk of 1 GiB of silence.
    let data_len: u32 = 1 << 30;
    let mut header = real[..44].to_vec();
    assert_eq!(&header[36..40], b"data");
    header[40..44].copy_from_slice(&data_len.to_le_bytes());
    header[4..8].copy_from_slice(&(data_len + 36).to_le_bytes());
    let mut file = Synthetic::new(vec![Part::Bytes(header), Part::Zeros(u64::from(data_len))]);
    let len = file.size();
    let facts = audio(&mut file, "audio/wav", len).expect("facts");
    // 8 kHz mono 16-bit: 2^30 / 16000 bytes per second.
    assert_close(
        facts.duration,
        Duration::from_secs_f64(f64::from(data_len) / 16_000.0),
    );
    assert_eq!(facts.waveform, Some(vec![0; WAVEFORM_LEN]));
    assert!(file.bytes_read < 16 << 20, "read {} bytes", file.bytes_read);
}

#[test]
fn a_1_gib_ogg_reads_only_its_ends() {
    // The voice note's pages, 1 GiB of junk, then its last page again: the duration comes from
    // the tail, and the waveform decode stops at the junk.
    let real = corpus("voice.ogg");
    let last_page = real.windows(4).rposition(|w| w == b"OggS").unwrap();
    let mut file = Synthetic::new(vec![
        Part::Bytes(real[..last_page].to_vec()),
        Part::Zeros(1 << 30),
        Part::Bytes(real[last_page..].to_vec()),
    ]);
    let len = file.size();
    let facts = audio(&mut file, "audio/ogg", len).expect("facts");
    assert!(facts.is_ogg_opus);
    assert_close(facts.duration, Duration::from_secs(3));
    assert!(file.bytes_read < 1 << 20, "read {} bytes", file.bytes_read);
}

#[test]
fn ogg_that_is_not_opus_is_not_a_voice_note() {
    let mut ogg = corpus("voice.ogg");
    // Rename the OpusHead packet: the CRC no longer matches either.
    let at = ogg.windows(8).position(|w| w == b"OpusHead").unwrap();
    ogg[at..at + 8].copy_from_slice(b"OpusHexd");
    let facts = audio(Cursor::new(&ogg), "audio/ogg", ogg.len() as u64).expect("facts");
    assert!(!facts.is_ogg_opus);
    assert_eq!(facts.duration, None);
}
