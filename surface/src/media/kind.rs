//! The one mapping between Matrix media messages and files, both ways: what an `m.image`,
//! `m.video`, `m.audio` or `m.file` message says about its file (inbound), and which message a
//! file becomes, by its MIME type (outbound).

use matrix_sdk::ruma::UInt;
use matrix_sdk::ruma::events::room::message::{
    AudioInfo, AudioMessageEventContent, FileInfo, FileMessageEventContent,
    ImageMessageEventContent, MessageType, VideoInfo, VideoMessageEventContent,
};
use matrix_sdk::ruma::events::room::{ImageInfo, MediaSource};

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
    /// Width and height, for images.
    pub dims: Option<(u32, u32)>,
}

macro_rules! read_fields {
    ($kind:expr, $c:expr, $dims:expr) => {
        MediaFields {
            kind: $kind,
            source: $c.source.clone(),
            filename: $c.filename.clone(),
            body: $c.body.clone(),
            size: $c.info.as_ref().and_then(|i| i.size).map(u64::from),
            mimetype: $c.info.as_ref().and_then(|i| i.mimetype.clone()),
            dims: $dims,
        }
    };
}

impl MediaFields {
    /// The file a message carries; `None` for messages without one (text, emotes...).
    pub fn of(msgtype: &MessageType) -> Option<Self> {
        Some(match msgtype {
            MessageType::Image(c) => {
                let dims = c.info.as_ref().and_then(|i| {
                    Some((
                        u32::try_from(u64::from(i.width?)).ok()?,
                        u32::try_from(u64::from(i.height?)).ok()?,
                    ))
                });
                read_fields!(Kind::Image, c, dims)
            }
            MessageType::Video(c) => read_fields!(Kind::Video, c, None),
            MessageType::Audio(c) => read_fields!(Kind::Audio, c, None),
            MessageType::File(c) => read_fields!(Kind::File, c, None),
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
        dims: Option<(u32, u32)>,
    ) -> Self {
        let caption = caption
            .map(str::trim)
            .filter(|c| !c.is_empty() && *c != name);
        Self {
            kind: mime::msgtype_for(mime),
            source,
            filename: Some(name.to_owned()),
            body: caption.unwrap_or(name).to_owned(),
            size: Some(size),
            mimetype: Some(mime.to_owned()),
            dims,
        }
    }

    /// The message these fields make.
    pub fn into_message(self) -> MessageType {
        let size = self.size.and_then(UInt::new);
        let (body, source, filename, mimetype) =
            (self.body, self.source, self.filename, self.mimetype);
        match self.kind {
            Kind::Image => {
                let mut info = ImageInfo::new();
                info.mimetype = mimetype;
                info.size = size;
                if let Some((w, h)) = self.dims {
                    info.width = Some(UInt::from(w));
                    info.height = Some(UInt::from(h));
                }
                let mut c = ImageMessageEventContent::new(body, source).info(Box::new(info));
                c.filename = filename;
                MessageType::Image(c)
            }
            Kind::Video => {
                let mut info = VideoInfo::new();
                info.mimetype = mimetype;
                info.size = size;
                let mut c = VideoMessageEventContent::new(body, source).info(Box::new(info));
                c.filename = filename;
                MessageType::Video(c)
            }
            Kind::Audio => {
                let mut info = AudioInfo::new();
                info.mimetype = mimetype;
                info.size = size;
                let mut c = AudioMessageEventContent::new(body, source).info(Box::new(info));
                c.filename = filename;
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
            let out = MediaFields::outgoing("a.bin", Some("look"), src.clone(), mime, 42, dims);
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
                    f.dims,
                )
            };
            assert_eq!(key(&back), key(&out), "{mime}");
            assert_eq!(back.body, "look");
            assert_eq!(back.filename.as_deref(), Some("a.bin"));
        }
        let plain = MediaFields::outgoing("a.txt", Some(" a.txt "), src, "text/plain", 1, None);
        assert_eq!(
            plain.body, "a.txt",
            "a caption that is the name is no caption"
        );
        let text = MessageType::Text(TextMessageEventContent::plain("hi"));
        assert!(MediaFields::of(&text).is_none());
    }
}
