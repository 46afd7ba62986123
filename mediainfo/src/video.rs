//! Videos: the display size of the first video track and the duration, from an MP4/MOV `moov`.

use std::io::{self, Read, Seek, SeekFrom};
use std::time::Duration;

use mp4parse::{MediaContext, SampleEntry, Track, TrackType};

use crate::MediaError;

/// Largest `moov` box handed to the parser. Its sample tables grow with the length of the
/// video (a few MB for hours of footage); a bigger one is not worth the memory, and the
/// facts are then left out rather than refusing the file.
const MAX_MOOV: u64 = 64 * 1024 * 1024;

/// Top-level box types that may open an ISO BMFF (MP4, MOV, 3GP) file.
const FIRST_BOXES: [&[u8; 4]; 8] = [
    b"ftyp", b"moov", b"mdat", b"free", b"skip", b"wide", b"pnot", b"uuid",
];

/// What a Matrix `m.video` event carries about its video.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct VideoFacts {
    /// Display width of the first video track, in pixels (rotation applied).
    pub width: Option<u32>,
    /// Display height of the first video track, in pixels (rotation applied).
    pub height: Option<u32>,
    /// Length of the longest audio or video track.
    pub duration: Option<Duration>,
}

/// Reads a video's size and duration. MP4 and MOV (ISO BMFF) are understood; other
/// containers (WebM, MKV, AVI...) give facts that are all `None`, not an error.
///
/// Only the `moov` box is read: the top-level boxes before it, `mdat` with the media data
/// included, are skipped with a seek, so the cost does not grow with the file's size.
/// `file_size` is where the walk stops.
pub fn video<R: Read + Seek>(mut reader: R, file_size: u64) -> Result<VideoFacts, MediaError> {
    reader.seek(SeekFrom::Start(0))?;
    let Some(moov_len) = find_moov(&mut reader, file_size)? else {
        return Ok(VideoFacts::default());
    };
    if moov_len > MAX_MOOV {
        return Ok(VideoFacts::default());
    }
    let mut moov = (&mut reader).take(moov_len);
    let context = match mp4parse::read_mp4(&mut moov) {
        Ok(context) => context,
        Err(mp4parse::Error::Io(error)) => return Err(MediaError::Io(error)),
        Err(error) => return Err(MediaError::Malformed(format!("MP4 movie header: {error}"))),
    };
    Ok(facts(&context))
}

/// Walks the top-level boxes and leaves the reader at the start of `moov`, returning its
/// size; `None` when the file is not ISO BMFF. A file that is, but has no `moov` (cut off
/// during upload, say), is malformed.
fn find_moov<R: Read + Seek>(reader: &mut R, file_size: u64) -> Result<Option<u64>, MediaError> {
    let mut pos = 0u64;
    while pos < file_size {
        let mut head = [0u8; 8];
        if !read_full(reader, &mut head)? {
            break;
        }
        let kind: [u8; 4] = [head[4], head[5], head[6], head[7]];
        if pos == 0 && !FIRST_BOXES.contains(&&kind) {
            return Ok(None);
        }
        let size32 = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        let (size, header_len) = match size32 {
            0 => (file_size - pos, 8),
            1 => {
                let mut large = [0u8; 8];
                if !read_full(reader, &mut large)? {
                    break;
                }
                (u64::from_be_bytes(large), 16)
            }
            n => (u64::from(n), 8),
        };
        if size < header_len {
            return Err(MediaError::Malformed(format!(
                "MP4 box {} declares {size} bytes",
                String::from_utf8_lossy(&kind)
            )));
        }
        if &kind == b"moov" {
            reader.seek(SeekFrom::Start(pos))?;
            return Ok(Some(size));
        }
        pos = pos.saturating_add(size);
        reader.seek(SeekFrom::Start(pos))?;
    }
    Err(MediaError::Malformed(
        "MP4 file without a movie header (moov)".into(),
    ))
}

/// Fills `buf`; false on a clean or partial end of file (a truncated box header).
fn read_full<R: Read>(reader: &mut R, buf: &mut [u8]) -> io::Result<bool> {
    match reader.read_exact(buf) {
        Ok(()) => Ok(true),
        Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(error) => Err(error),
    }
}

fn facts(context: &MediaContext) -> VideoFacts {
    let video = context
        .tracks
        .iter()
        .find(|t| t.track_type == TrackType::Video);
    let (width, height) = video.and_then(display_size).unzip();
    let track_duration = context
        .tracks
        .iter()
        .filter(|t| matches!(t.track_type, TrackType::Video | TrackType::Audio))
        .filter_map(track_duration)
        .max();
    // Fragmented MP4 keeps the total in `mehd`, in the movie's timescale.
    let fragment_duration = || {
        let total = context.mvex.as_ref()?.fragment_duration?.0;
        scaled(total, context.timescale?.0)
    };
    VideoFacts {
        width,
        height,
        duration: track_duration.or_else(fragment_duration),
    }
}

fn display_size(track: &Track) -> Option<(u32, u32)> {
    let tkhd = track.tkhd.as_ref();
    // `tkhd` holds the presentation size in 16.16 fixed point; the sample entry holds the
    // coded size, the fallback when a muxer left `tkhd` at zero.
    let from_tkhd = tkhd
        .map(|h| (h.width >> 16, h.height >> 16))
        .filter(|&(w, h)| w > 0 && h > 0);
    let from_stsd = || {
        track
            .stsd
            .as_ref()?
            .descriptions
            .iter()
            .find_map(|entry| match entry {
                SampleEntry::Video(v) if v.width > 0 && v.height > 0 => {
                    Some((u32::from(v.width), u32::from(v.height)))
                }
                _ => None,
            })
    };
    let (w, h) = from_tkhd.or_else(from_stsd)?;
    // A phone recording held upright is stored sideways with a 90° rotation matrix:
    // a = d = 0 and b, c = ±1. Players show it rotated, so report it that way.
    let rotated = tkhd.is_some_and(|h| h.matrix.a == 0 && h.matrix.d == 0 && h.matrix.b != 0);
    Some(if rotated { (h, w) } else { (w, h) })
}

fn track_duration(track: &Track) -> Option<Duration> {
    let duration = track.duration?.0;
    let timescale = track.timescale?.0;
    // All ones means "unknown" in `mdhd`.
    if duration == u64::MAX || duration == u64::from(u32::MAX) {
        return None;
    }
    scaled(duration, timescale)
}

/// `units / per_second` as a `Duration`, exact and without overflow.
fn scaled(units: u64, per_second: u64) -> Option<Duration> {
    if per_second == 0 {
        return None;
    }
    let secs = units / per_second;
    let rest = u128::from(units % per_second) * 1_000_000_000 / u128::from(per_second);
    Some(Duration::new(secs, u32::try_from(rest).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaled_is_exact_and_refuses_zero_timescale() {
        assert_eq!(scaled(3, 2), Some(Duration::from_millis(1500)));
        assert_eq!(scaled(90_000 * 2, 90_000), Some(Duration::from_secs(2)));
        assert_eq!(scaled(5, 0), None);
        assert!(scaled(u64::MAX - 1, 1).is_some());
    }

    #[test]
    fn other_containers_are_not_an_error() {
        // The start of a WebM (EBML) file.
        let webm = [0x1a, 0x45, 0xdf, 0xa3, 0x9f, 0x42, 0x86, 0x81, 0x01, 0x42];
        let facts = video(io::Cursor::new(webm), webm.len() as u64).expect("not an error");
        assert_eq!(facts, VideoFacts::default());
    }
}
