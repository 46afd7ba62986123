//! What makes a sent file look native in clients, as Element does it: dimensions, play length,
//! a thumbnail and a blurhash for images, a voice message's waveform. The facts are read from
//! the file on a blocking thread with bounded decoding (`mediainfo`); whatever cannot be worked
//! out is left out, and the file is sent anyway.

use std::io::{self, BufReader};
use std::path::Path;

use bytes::Bytes;
use mediainfo::{AudioFacts, ImageFacts, Limits, Skipped, VideoFacts};
use tracing::{info, warn};

use super::kind::{Look, Thumb};
use super::{MediaApi, UploadCache, poster, small};
use crate::mime::{self, Kind};
use crate::workspace::OpenedFile;

/// What was read from a file, by kind.
#[derive(Debug)]
pub enum Facts {
    /// An image, maybe with a thumbnail to upload.
    Image(ImageFacts),
    /// A video, and its poster (first frame) when a decoder made one.
    Video(VideoFacts, Option<ImageFacts>),
    /// Audio.
    Audio(AudioFacts),
    /// Nothing to read (a plain file) or nothing could be read.
    None,
}

/// A decided look, and the thumbnail (bytes) that still has to be uploaded for it.
#[derive(Debug)]
pub struct Decided {
    /// Everything but the thumbnail's location.
    pub look: Look,
    /// The thumbnail to upload: bytes, MIME type, width and height.
    pub thumbnail: Option<(Bytes, &'static str, (u32, u32))>,
    /// Voice was asked for but the file is not OGG/Opus (it goes as plain audio).
    pub voice_refused: bool,
}

/// How `facts` present the file (pure): image facts give dimensions, blurhash and thumbnail
/// (an image too large to decode, or damaged, goes as a plain file);
/// video facts dimensions and duration; audio facts duration, and a voice message with its
/// waveform when `voice` was asked for and the audio is OGG/Opus (what Element records and
/// plays as voice).
pub fn decide(facts: Facts, voice: bool) -> Decided {
    let mut decided = Decided {
        look: Look::default(),
        thumbnail: None,
        voice_refused: false,
    };
    match facts {
        Facts::Image(f) => {
            decided.look.as_file = matches!(
                f.skipped,
                Some(Skipped::TooLarge { .. } | Skipped::Undecodable(_))
            );
            decided.look.dims = Some((f.width, f.height)).filter(|(w, h)| *w > 0 && *h > 0);
            decided.look.blurhash = f.blurhash;
            decided.thumbnail = f
                .thumbnail
                .map(|t| (Bytes::from(t.bytes), t.mime, (t.width, t.height)));
        }
        Facts::Video(f, poster) => {
            decided.look.dims = f.width.zip(f.height).filter(|(w, h)| *w > 0 && *h > 0);
            decided.look.duration = f.duration;
            if let Some(p) = poster {
                decided.look.blurhash = p.blurhash;
                decided.thumbnail = p
                    .thumbnail
                    .map(|t| (Bytes::from(t.bytes), t.mime, (t.width, t.height)));
            }
        }
        Facts::Audio(f) => {
            decided.look.duration = f.duration;
            if voice && f.is_ogg_opus {
                decided.look.voice = Some(f.waveform.unwrap_or_default());
            }
        }
        Facts::None => {}
    }
    decided.voice_refused = voice && decided.look.voice.is_none();
    decided
}

/// Image decodes at a time: each may take up to [`Limits::max_alloc`] (256 MiB for a 64
/// megapixel photo), so the surface's peak memory is bounded by one, not by the number of
/// rooms sending pictures at once.
static DECODES: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// Reads the facts of `opened` (of type `mime`) on a blocking thread.
async fn read_facts(opened: &OpenedFile, mime: &str) -> io::Result<Facts> {
    let kind = mime::msgtype_for(mime);
    if kind == Kind::File {
        return Ok(Facts::None);
    }
    let _turn = match kind {
        Kind::Image => Some(DECODES.acquire().await.map_err(io::Error::other)?),
        _ => None,
    };
    let file = opened.std_reader()?;
    let (size, mime) = (opened.size, mime.to_owned());
    tokio::task::spawn_blocking(move || {
        let reader = BufReader::new(file);
        let facts = match kind {
            Kind::Image => Facts::Image(mediainfo::image(reader, size, &Limits::default())?),
            Kind::Video => Facts::Video(mediainfo::video(reader, size)?, None),
            Kind::Audio => Facts::Audio(mediainfo::audio(reader, &mime, size)?),
            Kind::File => Facts::None,
        };
        Ok::<_, mediainfo::MediaError>(facts)
    })
    .await
    .map_err(io::Error::other)?
    .map_err(io::Error::other)
}

/// The look of `opened`, its thumbnail uploaded (encrypted when `encrypt`, deduplicated by
/// content). Never fails: what cannot be read or uploaded is logged and left out.
pub async fn look(
    api: &MediaApi,
    opened: &OpenedFile,
    mime: &str,
    voice: bool,
    encrypt: bool,
    cache: &UploadCache,
    ffmpeg: Option<&Path>,
) -> Look {
    let mut facts = match read_facts(opened, mime).await {
        Ok(f) => f,
        Err(e) => {
            warn!(path = %opened.path, mime, error = %e, "could not read the media's details; sending it without them");
            Facts::None
        }
    };
    if let (Facts::Video(_, poster), Some(ffmpeg)) = (&mut facts, ffmpeg) {
        match poster::first_frame(ffmpeg, opened).await {
            Ok(p) => *poster = Some(p),
            Err(e) => info!(path = %opened.path, error = %e, "no poster for this video"),
        }
    }
    if let Facts::Image(ImageFacts {
        skipped: Some(why), ..
    }) = &facts
    {
        info!(path = %opened.path, reason = %why, "no thumbnail for this image");
    }
    let decided = decide(facts, voice);
    if decided.voice_refused {
        info!(path = %opened.path, mime, "voice message asked for, but only OGG/Opus audio can be one; sending it as audio");
    }
    let mut look = decided.look;
    if let Some((bytes, thumb_mime, dims)) = decided.thumbnail {
        let size = bytes.len() as u64;
        match small::upload_bytes(api, bytes, thumb_mime, encrypt, cache).await {
            Ok(source) => {
                look.thumbnail = Some(Thumb {
                    source,
                    mime: thumb_mime.to_owned(),
                    size,
                    dims,
                })
            }
            Err(e) => {
                warn!(path = %opened.path, error = %e, "thumbnail upload failed; sending the image without it")
            }
        }
    }
    look
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn image(thumb: bool) -> ImageFacts {
        ImageFacts {
            width: 1600,
            height: 1200,
            blurhash: Some("LKO2?U%2Tw=w]~RBVZRi};RPxuwH".into()),
            thumbnail: thumb.then(|| mediainfo::Thumbnail {
                bytes: vec![1, 2, 3],
                mime: "image/jpeg",
                width: 800,
                height: 600,
            }),
            skipped: None,
        }
    }

    fn audio(opus: bool) -> AudioFacts {
        AudioFacts {
            duration: Some(Duration::from_millis(3000)),
            is_ogg_opus: opus,
            waveform: opus.then(|| vec![0, 100, 1024]),
        }
    }

    #[test]
    fn decisions() {
        let d = decide(Facts::Image(image(true)), false);
        assert_eq!(d.look.dims, Some((1600, 1200)));
        assert!(d.look.blurhash.is_some());
        let (bytes, mime, dims) = d.thumbnail.unwrap();
        assert_eq!(
            (&bytes[..], mime, dims),
            (&[1u8, 2, 3][..], "image/jpeg", (800, 600))
        );

        let d = decide(Facts::Image(image(false)), true);
        assert!(d.thumbnail.is_none());
        assert!(!d.look.as_file);
        assert!(d.voice_refused, "an image cannot be a voice message");
        for (skipped, as_file) in [
            (
                Skipped::TooLarge {
                    width: 30_000,
                    height: 30_000,
                },
                true,
            ),
            (Skipped::Undecodable("bad".into()), true),
            (Skipped::NotSmaller, false),
        ] {
            let mut f = image(false);
            f.skipped = Some(skipped.clone());
            assert_eq!(
                decide(Facts::Image(f), false).look.as_file,
                as_file,
                "{skipped:?}"
            );
        }

        let d = decide(
            Facts::Video(
                VideoFacts {
                    width: Some(320),
                    height: Some(240),
                    duration: Some(Duration::from_secs(2)),
                },
                Some(image(true)),
            ),
            false,
        );
        assert_eq!(
            d.look.dims,
            Some((320, 240)),
            "the video's size, not the poster's"
        );
        assert_eq!(d.look.duration, Some(Duration::from_secs(2)));
        assert!(
            d.look.blurhash.is_some() && d.thumbnail.is_some(),
            "the poster"
        );
        let d = decide(
            Facts::Video(
                VideoFacts {
                    width: Some(0),
                    height: Some(240),
                    duration: None,
                },
                None,
            ),
            false,
        );
        assert_eq!(d.look.dims, None, "a zero dimension is no dimension");
        assert!(d.thumbnail.is_none());

        let d = decide(Facts::Audio(audio(true)), true);
        assert_eq!(d.look.voice, Some(vec![0, 100, 1024]));
        assert!(!d.voice_refused);
        let d = decide(Facts::Audio(audio(true)), false);
        assert_eq!(d.look.voice, None, "voice only when asked for");
        assert_eq!(d.look.duration, Some(Duration::from_millis(3000)));
        let d = decide(Facts::Audio(audio(false)), true);
        assert_eq!(d.look.voice, None);
        assert!(d.voice_refused, "a WAV is sent as audio");

        let d = decide(Facts::None, false);
        assert!(d.look.dims.is_none() && d.thumbnail.is_none() && !d.voice_refused);
    }
}
