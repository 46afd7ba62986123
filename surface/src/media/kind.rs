//! The one mapping between Matrix media messages and files, both ways: what an `m.image`,
//! `m.video`, `m.audio` or `m.file` message says about its file (inbound), and which message a
//! file becomes, by its MIME type (outbound).

use std::time::Duration;

use matrix_sdk::ruma::UInt;
use matrix_sdk::ruma::events::room::message::{
    AudioInfo, AudioMessageEventContent, FileInfo, FileMessageEventContent,
    ImageMessageEventContent, MessageType, UnstableAmplitude, UnstableAudioDetailsContentBlock,
    UnstableVoiceContentBlock, VideoInfo, VideoMessageEventContent,
};
use matrix_sdk::ruma::events::room::{ImageInfo, MediaSource, ThumbnailInfo};

use crate::mime::{self, Kind};

/// What a media message carries about its file.
#[derive(Debug, Clone)]
pub struct MediaFields {
    /// The message type.
    pub kind: Kind,
    /// Where the bytes are (plain or encrypted).
    pub source: MediaSource,
    /// `filename`, when the sender set one (then `body` is a caption).
    pub filename: Option<String>,
    /// `body`: the file name, or the caption.
    pub body: String,
    /// Declared size in bytes.
    pub size: Option<u64>,
    /// Declared MIME type.
    pub mimetype: Option<String>,
    /// How it is presented: dimensions, duration, thumbnail, voice.
    pub look: Look,
}

/// What makes media look native in clients (Element's fields): all optional.
#[derive(Debug, Clone, Default)]
pub struct Look {
    /// Width and height (images, videos).
    pub dims: Option<(u32, u32)>,
    /// Play length (audio, video).
    pub duration: Option<Duration>,
    /// `xyz.amorgan.blurhash` (images, videos).
    pub blurhash: Option<String>,
    /// A smaller picture to show first (images, videos).
    pub thumbnail: Option<Thumb>,
    /// A voice message (MSC3245), with its waveform (each value 0..=1024; may be empty).
    pub voice: Option<Vec<u16>>,
    /// Send it as a plain file (`m.file`) whatever its type: an image too large to decode or
    /// damaged, which clients would fail to show (or try to decode, a decompression bomb).
    pub as_file: bool,
}

/// An uploaded thumbnail.
#[derive(Debug, Clone)]
pub struct Thumb {
    /// Where it is (encrypted in encrypted rooms).
    pub source: MediaSource,
    /// Its MIME type.
    pub mime: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its width and height.
    pub dims: (u32, u32),
}

impl Thumb {
    fn info(&self) -> Box<ThumbnailInfo> {
        let mut info = ThumbnailInfo::new();
        info.width = Some(UInt::from(self.dims.0));
        info.height = Some(UInt::from(self.dims.1));
        info.mimetype = Some(self.mime.clone());
        info.size = UInt::new(self.size);
        Box::new(info)
    }
}

macro_rules! read_fields {
    ($kind:expr, $c:expr, $look:expr) => {
        MediaFields {
            kind: $kind,
            source: $c.source.clone(),
            filename: $c.filename.clone(),
            body: $c.body.clone(),
            size: $c.info.as_ref().and_then(|i| i.size).map(u64::from),
            mimetype: $c.info.as_ref().and_then(|i| i.mimetype.clone()),
            look: $look,
        }
    };
}

fn dims_of(w: Option<UInt>, h: Option<UInt>) -> Option<(u32, u32)> {
    Some((
        u32::try_from(u64::from(w?)).ok()?,
        u32::try_from(u64::from(h?)).ok()?,
    ))
}

impl MediaFields {
    /// The file a message carries; `None` for messages without one (text, emotes...).
    pub fn of(msgtype: &MessageType) -> Option<Self> {
        Some(match msgtype {
            MessageType::Image(c) => {
                let look = Look {
                    dims: c.info.as_ref().and_then(|i| dims_of(i.width, i.height)),
                    ..Look::default()
                };
                read_fields!(Kind::Image, c, look)
            }
            MessageType::Video(c) => {
                let look = Look {
                    dims: c.info.as_ref().and_then(|i| dims_of(i.width, i.height)),
                    duration: c.info.as_ref().and_then(|i| i.duration),
                    ..Look::default()
                };
                read_fields!(Kind::Video, c, look)
            }
            MessageType::Audio(c) => {
                let look = Look {
                    duration: c
                        .info
                        .as_ref()
                        .and_then(|i| i.duration)
                        .or_else(|| c.audio.as_ref().map(|a| a.duration)),
                    voice: c.voice.as_ref().map(|_| {
                        c.audio
                            .as_ref()
                            .map(|a| {
                                let max = u64::from(UnstableAmplitude::MAX);
                                a.waveform
                                    .iter()
                                    .map(|v| u64::from(v.get()).min(max) as u16)
                                    .collect()
                            })
                            .unwrap_or_default()
                    }),
                    ..Look::default()
                };
                read_fields!(Kind::Audio, c, look)
            }
            MessageType::File(c) => read_fields!(Kind::File, c, Look::default()),
            _ => return None,
        })
    }

    /// The fields of a file about to be sent: its kind follows its MIME type; `body` is the
    /// caption when there is one (other than the name itself), else the name.
    pub fn outgoing(
        name: &str,
        caption: Option<&str>,
        source: MediaSource,
        mime: &str,
        size: u64,
        look: Look,
    ) -> Self {
        let caption = caption
            .map(str::trim)
            .filter(|c| !c.is_empty() && *c != name);
        Self {
            kind: if look.as_file {
                Kind::File
            } else {
                mime::msgtype_for(mime)
            },
            source,
            filename: Some(name.to_owned()),
            body: caption.unwrap_or(name).to_owned(),
            size: Some(size),
            mimetype: Some(mime.to_owned()),
            look,
        }
    }

    /// The message these fields make.
    pub fn into_message(self) -> MessageType {
        let size = self.size.and_then(UInt::new);
        let (body, source, filename, mimetype, look) = (
            self.body,
            self.source,
            self.filename,
            self.mimetype,
            self.look,
        );
        match self.kind {
            Kind::Image => {
                let mut info = ImageInfo::new();
                info.mimetype = mimetype;
                info.size = size;
                if let Some((w, h)) = look.dims {
                    info.width = Some(UInt::from(w));
                    info.height = Some(UInt::from(h));
                }
                info.blurhash = look.blurhash;
                if let Some(t) = look.thumbnail {
                    info.thumbnail_info = Some(t.info());
                    info.thumbnail_source = Some(t.source);
                }
                let mut c = ImageMessageEventContent::new(body, source).info(Box::new(info));
                c.filename = filename;
                MessageType::Image(c)
            }
            Kind::Video => {
                let mut info = VideoInfo::new();
                info.mimetype = mimetype;
                info.size = size;
                if let Some((w, h)) = look.dims {
                    info.width = Some(UInt::from(w));
                    info.height = Some(UInt::from(h));
                }
                info.duration = look.duration;
                info.blurhash = look.blurhash;
                if let Some(t) = look.thumbnail {
                    info.thumbnail_info = Some(t.info());
                    info.thumbnail_source = Some(t.source);
                }
                let mut c = VideoMessageEventContent::new(body, source).info(Box::new(info));
                c.filename = filename;
                MessageType::Video(c)
            }
            Kind::Audio => {
                let mut info = AudioInfo::new();
                info.mimetype = mimetype;
                info.size = size;
                info.duration = look.duration;
                let mut c = AudioMessageEventContent::new(body, source).info(Box::new(info));
                c.filename = filename;
                if let Some(waveform) = look.voice {
                    // Element shows a voice message only with both blocks (MSC3245 v1).
                    let waveform = waveform.into_iter().map(UnstableAmplitude::new).collect();
                    c.audio = Some(UnstableAudioDetailsContentBlock::new(
                        look.duration.unwrap_or_default(),
                        waveform,
                    ));
                    c.voice = Some(UnstableVoiceContentBlock::new());
                }
                MessageType::Audio(c)
            }
            Kind::File => {
                let mut info = FileInfo::new();
                info.mimetype = mimetype;
                info.size = size;
                let mut c = FileMessageEventContent::new(body, source).info(Box::new(info));
                c.filename = filename;
                MessageType::File(c)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use matrix_sdk::ruma::events::room::message::TextMessageEventContent;
    use matrix_sdk::ruma::owned_mxc_uri;

    use super::*;

    #[test]
    fn every_kind_reads_back_what_was_written() {
        let src = MediaSource::Plain(owned_mxc_uri!("mxc://hs/abc"));
        let table = [
            ("image/png", Kind::Image, Some((3, 2))),
            ("video/mp4", Kind::Video, None),
            ("audio/ogg", Kind::Audio, None),
            ("application/pdf", Kind::File, None),
            ("image/svg+xml", Kind::File, None),
        ];
        for (mime, kind, dims) in table {
            let look = Look {
                dims,
                ..Look::default()
            };
            let out = MediaFields::outgoing("a.bin", Some("look"), src.clone(), mime, 42, look);
            assert_eq!(out.kind, kind, "{mime}");
            let back = MediaFields::of(&out.clone().into_message()).expect(mime);
            let key = |f: &MediaFields| {
                let source = serde_json::to_value(&f.source).unwrap();
                (
                    f.kind,
                    source,
                    f.filename.clone(),
                    f.body.clone(),
                    f.size,
                    f.mimetype.clone(),
                    f.look.dims,
                )
            };
            assert_eq!(key(&back), key(&out), "{mime}");
            assert_eq!(back.body, "look");
            assert_eq!(back.filename.as_deref(), Some("a.bin"));
        }
        let plain = MediaFields::outgoing(
            "a.txt",
            Some(" a.txt "),
            src,
            "text/plain",
            1,
            Look::default(),
        );
        assert_eq!(
            plain.body, "a.txt",
            "a caption that is the name is no caption"
        );
        let text = MessageType::Text(TextMessageEventContent::plain("hi"));
        assert!(MediaFields::of(&text).is_none());
    }

    #[test]
    fn a_voice_message_with_duration_waveform_and_thumbnails_reads_back() {
        let src = MediaSource::Plain(owned_mxc_uri!("mxc://hs/abc"));
        let look = Look {
            duration: Some(Duration::from_millis(3_040)),
            voice: Some(vec![0, 512, 1024, 2000]),
            ..Look::default()
        };
        let out = MediaFields::outgoing("memo.ogg", None, src.clone(), "audio/ogg", 9, look);
        let json = serde_json::to_value(out.clone().into_message()).unwrap();
        assert_eq!(json["info"]["duration"], 3040);
        assert_eq!(json["org.matrix.msc1767.audio"]["duration"], 3040);
        assert_eq!(
            json["org.matrix.msc1767.audio"]["waveform"],
            serde_json::json!([0, 512, 1024, 1024]),
            "amplitudes are capped at 1024"
        );
        assert_eq!(json["org.matrix.msc3245.voice"], serde_json::json!({}));
        let back = MediaFields::of(&out.into_message()).unwrap();
        assert_eq!(back.look.voice, Some(vec![0, 512, 1024, 1024]));
        assert_eq!(back.look.duration, Some(Duration::from_millis(3_040)));

        let thumb = Thumb {
            source: MediaSource::Plain(owned_mxc_uri!("mxc://hs/thumb")),
            mime: "image/jpeg".into(),
            size: 1234,
            dims: (800, 450),
        };
        let look = Look {
            dims: Some((1920, 1080)),
            duration: Some(Duration::from_secs(2)),
            blurhash: Some("LEHV6nWB2yk8pyo0adR*.7kCMdnj".into()),
            thumbnail: Some(thumb),
            voice: None,
            as_file: false,
        };
        let video = MediaFields::outgoing("clip.mp4", None, src, "video/mp4", 99, look);
        let json = serde_json::to_value(video.clone().into_message()).unwrap();
        let info = &json["info"];
        assert_eq!(
            (info["w"].clone(), info["h"].clone()),
            (1920.into(), 1080.into())
        );
        assert_eq!(info["duration"], 2000);
        assert_eq!(info["thumbnail_url"], "mxc://hs/thumb");
        assert_eq!(info["thumbnail_info"]["w"], 800);
        assert_eq!(info["thumbnail_info"]["mimetype"], "image/jpeg");
        assert_eq!(info["xyz.amorgan.blurhash"], "LEHV6nWB2yk8pyo0adR*.7kCMdnj");
        let back = MediaFields::of(&video.into_message()).unwrap();
        assert_eq!(back.look.dims, Some((1920, 1080)));
        assert!(back.look.voice.is_none());
    }
}
