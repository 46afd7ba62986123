//! Audio: duration, whether it is an Ogg/Opus voice note, and a waveform (MSC3246).
//!
//! Formats are recognised by their first bytes, not by the declared type: Ogg/Opus (duration
//! and waveform), WAV (both), FLAC (duration, from `STREAMINFO`) and M4A (duration, through the
//! MP4 path of [`crate::video`]). Anything else, MP3 included, gives facts that are all `None`.

use std::io::{BufReader, Read, Seek, SeekFrom};
use std::time::Duration;

use crate::MediaError;
use crate::ogg::{self, FLAG_BOS, PacketReader};
use crate::waveform::Slices;

/// Opus always counts granule positions at 48 kHz, whatever the input rate was.
const OPUS_RATE: u32 = 48_000;
/// Rate the Opus waveform is decoded at: Opus's own, so nothing is resampled (a lower rate
/// measured no faster).
const WAVEFORM_RATE: u32 = 48_000;
/// Longest Opus file that gets a waveform: decoding is the one cost here that grows with the
/// file (about 1 s of CPU per 10 minutes of audio in a release build), and voice notes are
/// short.
const WAVEFORM_MAX_DURATION: Duration = Duration::from_secs(15 * 60);
/// At most this many WAV frames are read per waveform slice: longer files are sampled, so a
/// 1 GiB recording costs the same as a 100-second one.
const WAV_FRAMES_PER_SLICE: u32 = 48_000;

/// What a Matrix `m.audio` event carries about its sound.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AudioFacts {
    /// Playing time; `None` when the format is not understood or does not say.
    pub duration: Option<Duration>,
    /// The file is Ogg whose first packet is an `OpusHead`: Element shows such files as voice
    /// messages (`org.matrix.msc3245.voice`).
    pub is_ogg_opus: bool,
    /// `org.matrix.msc1767.audio` waveform: [`crate::WAVEFORM_LEN`] values in `0..=1024`,
    /// the loudness (RMS) of each slice of the recording, scaled so the loudest slice is 1024.
    pub waveform: Option<Vec<u16>>,
}

/// Reads an audio file's facts. `mime` is the declared type; the content decides the format,
/// and the declared type only decides whether an unrecognised content is an error (the file
/// claims to be Ogg, WAV or FLAC but is not) or just a format we do not read (facts all `None`).
pub fn audio<R: Read + Seek>(
    reader: R,
    mime: &str,
    file_size: u64,
) -> Result<AudioFacts, MediaError> {
    facts(reader, mime, file_size, true)
}

/// How long an audio file plays, as [`audio`] finds it but without decoding any sound for a
/// waveform: the headers and, for Ogg, the last page only.
pub fn audio_length<R: Read + Seek>(
    reader: R,
    mime: &str,
    file_size: u64,
) -> Result<Option<Duration>, MediaError> {
    Ok(facts(reader, mime, file_size, false)?.duration)
}

fn facts<R: Read + Seek>(
    reader: R,
    mime: &str,
    file_size: u64,
    waveform: bool,
) -> Result<AudioFacts, MediaError> {
    let mut reader = BufReader::new(reader);
    let mut magic = Vec::with_capacity(12);
    reader.seek(SeekFrom::Start(0))?;
    reader.by_ref().take(12).read_to_end(&mut magic)?;
    reader.seek(SeekFrom::Start(0))?;
    if magic.starts_with(b"OggS") {
        ogg_opus(reader, file_size, waveform)
    } else if magic.starts_with(b"RIFF") && magic.get(8..12) == Some(b"WAVE") {
        wav(reader, waveform)
    } else if magic.starts_with(b"fLaC") {
        flac(reader)
    } else if magic.get(4..8) == Some(b"ftyp") {
        let facts = crate::video(reader, file_size)?;
        Ok(AudioFacts {
            duration: facts.duration,
            ..AudioFacts::default()
        })
    } else if claims_supported(mime) {
        Err(MediaError::Malformed(format!("the content is not {mime}")))
    } else {
        Ok(AudioFacts::default())
    }
}

fn claims_supported(mime: &str) -> bool {
    let essence = mime
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    matches!(
        essence.as_str(),
        "audio/ogg" | "audio/opus" | "audio/wav" | "audio/x-wav" | "audio/wave" | "audio/flac"
    )
}

/// The fields of an `OpusHead` packet (RFC 7845 §5.1) used here.
struct OpusHead {
    channels: u8,
    pre_skip: u16,
    mapping_family: u8,
}

fn parse_opus_head(packet: &[u8]) -> Option<OpusHead> {
    if packet.len() < 19 || !packet.starts_with(b"OpusHead") || packet[8] >> 4 != 0 {
        return None;
    }
    Some(OpusHead {
        channels: packet[9],
        pre_skip: u16::from_le_bytes([packet[10], packet[11]]),
        mapping_family: packet[18],
    })
}

fn ogg_opus<R: Read + Seek>(
    mut reader: R,
    file_size: u64,
    with_waveform: bool,
) -> Result<AudioFacts, MediaError> {
    let (head, serial) = {
        let mut packets = PacketReader::new(&mut reader);
        let first = packets.next_packet()?.and_then(parse_opus_head);
        let bos = packets
            .first_page()
            .filter(|page| page.flags & FLAG_BOS != 0);
        match (first, bos) {
            (Some(head), Some(page)) => (head, page.serial),
            // Ogg, but Vorbis, FLAC, Speex or damaged: a voice note it is not.
            _ => return Ok(AudioFacts::default()),
        }
    };
    let duration = ogg::last_granule(&mut reader, file_size, serial)?
        .and_then(|granule| granule.checked_sub(i64::from(head.pre_skip)))
        .and_then(|samples| u64::try_from(samples).ok())
        .map(|samples| samples_to_duration(samples, OPUS_RATE));
    // Channel mapping family 0 is mono or stereo, one Opus stream; the others (surround,
    // ambisonics) need a multistream decoder and are not voice notes anyway.
    let decodable = with_waveform && head.mapping_family == 0 && matches!(head.channels, 1 | 2);
    let waveform = match duration {
        Some(d) if decodable && d <= WAVEFORM_MAX_DURATION && d > Duration::ZERO => {
            reader.seek(SeekFrom::Start(0))?;
            crate::waveform::opus(&mut reader, head.pre_skip, d, WAVEFORM_RATE)?
        }
        _ => None,
    };
    Ok(AudioFacts {
        duration,
        is_ogg_opus: true,
        waveform,
    })
}

fn wav<R: Read + Seek>(reader: R, with_waveform: bool) -> Result<AudioFacts, MediaError> {
    let mut wav = hound::WavReader::new(reader).map_err(wav_error)?;
    let spec = wav.spec();
    let frames = wav.duration();
    if spec.sample_rate == 0 || spec.channels == 0 {
        return Err(MediaError::Malformed(
            "WAV header declares no samples".into(),
        ));
    }
    let duration = samples_to_duration(u64::from(frames), spec.sample_rate);
    let waveform = if frames == 0 || !with_waveform {
        None
    } else {
        wav_waveform(&mut wav, frames)?
    };
    Ok(AudioFacts {
        duration: Some(duration),
        is_ogg_opus: false,
        waveform,
    })
}

/// Each slice reads up to [`WAV_FRAMES_PER_SLICE`] frames from its start, seeking in between.
/// A damaged or cut-off data chunk ends the waveform early; what was read still counts.
fn wav_waveform<R: Read + Seek>(
    wav: &mut hound::WavReader<R>,
    frames: u32,
) -> Result<Option<Vec<u16>>, MediaError> {
    let spec = wav.spec();
    let channels = u32::from(spec.channels);
    let mut slices = Slices::new();
    let count = crate::WAVEFORM_LEN as u64;
    'slices: for slice in 0..crate::WAVEFORM_LEN {
        let start = u64::from(frames) * slice as u64 / count;
        let end = (u64::from(frames) * (slice as u64 + 1) / count).max(start + 1);
        let take = (end - start).min(u64::from(WAV_FRAMES_PER_SLICE));
        // `start` < `frames`, a u32.
        wav.seek(u32::try_from(start).unwrap_or(u32::MAX))?;
        let samples = take * u64::from(channels);
        match (spec.sample_format, spec.bits_per_sample) {
            (hound::SampleFormat::Float, _) => {
                for sample in wav.samples::<f32>().take(samples as usize) {
                    let Ok(sample) = sample else { break 'slices };
                    slices.add(slice, sample);
                }
            }
            (hound::SampleFormat::Int, bits) => {
                let scale = 1.0 / (1u64 << bits.clamp(1, 32).saturating_sub(1)) as f32;
                for sample in wav.samples::<i32>().take(samples as usize) {
                    let Ok(sample) = sample else { break 'slices };
                    slices.add(slice, sample as f32 * scale);
                }
            }
        }
    }
    Ok(slices.finish())
}

fn wav_error(error: hound::Error) -> MediaError {
    match error {
        hound::Error::IoError(io) => MediaError::Io(io),
        other => MediaError::Malformed(format!("WAV: {other}")),
    }
}

/// FLAC's `STREAMINFO` block (always first) holds the sample rate and the total sample count.
fn flac<R: Read>(mut reader: R) -> Result<AudioFacts, MediaError> {
    let mut head = [0u8; 4 + 4 + 34];
    reader
        .read_exact(&mut head)
        .map_err(|_| MediaError::Malformed("FLAC file cut off in its header".into()))?;
    // Block type 0 (STREAMINFO), length 34.
    if head[4] & 0x7f != 0 || head[5..8] != [0, 0, 34] {
        return Err(MediaError::Malformed("FLAC file without STREAMINFO".into()));
    }
    let info = &head[8..];
    let rate =
        (u32::from(info[10]) << 12) | (u32::from(info[11]) << 4) | (u32::from(info[12]) >> 4);
    let total = (u64::from(info[13] & 0x0f) << 32)
        | u64::from(u32::from_be_bytes([info[14], info[15], info[16], info[17]]));
    let duration = (rate != 0 && total != 0).then(|| samples_to_duration(total, rate));
    Ok(AudioFacts {
        duration,
        ..AudioFacts::default()
    })
}

fn samples_to_duration(samples: u64, rate: u32) -> Duration {
    let rate = u64::from(rate.max(1));
    let nanos = u128::from(samples % rate) * 1_000_000_000 / u128::from(rate);
    // `nanos` < 1e9 since the remainder is below `rate`.
    Duration::new(samples / rate, u32::try_from(nanos).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_type_decides_between_error_and_unknown() {
        let mp3ish = std::io::Cursor::new(b"ID3\x04\x00\x00\x00\x00\x00\x00garbage".to_vec());
        let facts = audio(mp3ish, "audio/mpeg", 17).expect("MP3 is not read, not an error");
        assert_eq!(facts, AudioFacts::default());
        let fake = std::io::Cursor::new(b"not an ogg file at all".to_vec());
        assert!(audio(fake, "audio/ogg; codecs=opus", 22).is_err());
    }

    #[test]
    fn samples_to_duration_is_exact() {
        assert_eq!(
            samples_to_duration(72_000, 48_000),
            Duration::from_millis(1500)
        );
        assert_eq!(samples_to_duration(u64::MAX, 1).as_secs(), u64::MAX);
    }
}
