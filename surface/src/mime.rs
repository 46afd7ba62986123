//! Decides the MIME type of a file from its first bytes, what the sender declared, and its name.
//!
//! The type recorded for the agent comes from here, never from a model: content sniffing first
//! (magic numbers cannot be faked by renaming), then the sender's declaration, then the name.

/// How much of a file's head is worth reading for [`reconcile`] and [`image_size`].
///
/// `infer` needs a few KiB for container formats; image headers (even JPEG with EXIF ahead of
/// the frame header) are usually well within 64 KiB.
pub const HEAD_BYTES: usize = 64 * 1024;

/// The type used when nothing better is known.
pub const OCTET_STREAM: &str = "application/octet-stream";

/// Which Matrix message type a file is sent as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `m.image`
    Image,
    /// `m.video`
    Video,
    /// `m.audio`
    Audio,
    /// `m.file`
    File,
}

/// The MIME type of a file: sniffed from `head` when the content has a known signature,
/// otherwise the `declared` type when it is well-formed, otherwise a guess from `name`'s
/// extension, otherwise `application/octet-stream`.
///
/// A declared `application/octet-stream` counts as no declaration.
/// A sniffed type wins over a declared one that disagrees (callers may log the disagreement:
/// see [`disagrees`]), except that a generic container (`application/zip`, OLE) does not
/// override a declared type built on that container (`.docx`, `.odt`, `.epub`, `.xls`, ...).
/// The result is lowercased and has no parameters.
pub fn reconcile(declared: Option<&str>, head: &[u8], name: &str) -> String {
    let declared = declared.and_then(essence);
    if let Some(kind) = infer::get(head) {
        let sniffed = canonical(kind.mime_type());
        return match declared {
            Some(d) if is_generic_container(sniffed) && is_container_based(&d) => d,
            _ => sniffed.to_owned(),
        };
    }
    // `application/octet-stream` declares nothing: clients send it for anything they do not
    // recognize, so the name's extension says more.
    if let Some(d) = declared.filter(|d| d != OCTET_STREAM) {
        return d;
    }
    mime_guess::from_path(name)
        .first_raw()
        .unwrap_or(OCTET_STREAM)
        .to_owned()
}

/// Whether the sender's `declared` type disagrees with what [`reconcile`] decided
/// (worth a log line: it may be a client bug or a disguised file).
pub fn disagrees(declared: Option<&str>, decided: &str) -> bool {
    declared
        .and_then(essence)
        .is_some_and(|d| d != OCTET_STREAM && canonical(&d) != canonical(decided))
}

/// The usual spelling of a type that goes by several names (what Element and browsers send),
/// so aliases neither count as a mismatch nor reach a room in a spelling clients do not know.
/// Ogg audio is `audio/ogg` whatever its codec: Element's voice messages are `audio/ogg`.
pub fn canonical(mime: &str) -> &str {
    match mime {
        "audio/x-wav" | "audio/wave" | "audio/vnd.wave" | "audio/x-pn-wav" => "audio/wav",
        "audio/opus" | "audio/x-opus+ogg" | "application/ogg" | "audio/x-ogg" => "audio/ogg",
        "audio/mp3" | "audio/x-mp3" | "audio/mpeg3" | "audio/x-mpeg" => "audio/mpeg",
        "audio/x-m4a" | "audio/m4a" | "audio/x-mp4" => "audio/mp4",
        "audio/x-flac" => "audio/flac",
        "audio/x-aac" | "audio/aacp" => "audio/aac",
        "image/jpg" | "image/pjpeg" => "image/jpeg",
        "image/x-png" => "image/png",
        "image/vnd.microsoft.icon" => "image/x-icon",
        "video/x-m4v" => "video/mp4",
        other => other,
    }
}

/// Width and height of an image from its first bytes, when the format is known.
pub fn image_size(head: &[u8]) -> Option<(u32, u32)> {
    let size = imagesize::blob_size(head).ok()?;
    let w = u32::try_from(size.width).ok()?;
    let h = u32::try_from(size.height).ok()?;
    (w > 0 && h > 0).then_some((w, h))
}

/// The Matrix message type for a file of type `mime`.
///
/// SVG is sent as a file: clients render `m.image` SVGs inconsistently and it can carry script.
pub fn msgtype_for(mime: &str) -> Kind {
    let mime = mime.to_ascii_lowercase();
    match mime.split('/').next().unwrap_or_default() {
        "image" if !mime.starts_with("image/svg") => Kind::Image,
        "video" => Kind::Video,
        "audio" => Kind::Audio,
        _ => Kind::File,
    }
}

/// `type/subtype` of a well-formed MIME type, lowercased, without parameters.
fn essence(s: &str) -> Option<String> {
    let main = s.split(';').next()?.trim();
    let (ty, sub) = main.split_once('/')?;
    let token = |t: &str| {
        !t.is_empty()
            && t.len() <= 127
            && t.bytes().all(|b| {
                b.is_ascii_alphanumeric()
                    || matches!(
                        b,
                        b'!' | b'#' | b'$' | b'&' | b'-' | b'^' | b'_' | b'.' | b'+'
                    )
            })
    };
    (token(ty) && token(sub)).then(|| main.to_ascii_lowercase())
}

fn is_generic_container(sniffed: &str) -> bool {
    matches!(
        sniffed,
        "application/zip" | "application/x-ole-storage" | "application/vnd.ms-cab-compressed"
    )
}

/// Types whose files are zip or OLE containers, which `infer` may only see as the container.
fn is_container_based(declared: &str) -> bool {
    declared.ends_with("+zip")
        || [
            "openxmlformats",
            "opendocument",
            "epub",
            "java-archive",
            "android.package",
            "msword",
            "ms-excel",
            "ms-powerpoint",
            "ms-outlook",
            "visio",
            "x-msi",
        ]
        .iter()
        .any(|k| declared.contains(k))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PNG_1X1: &[u8] = &[
        0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0x00, 0x00, 0x00, 0x0D, 0x49, 0x48, 0x44,
        0x52, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x02, 0x08, 0x06, 0x00, 0x00, 0x00, 0x9D,
        0x74, 0x66, 0x1A,
    ];
    const PDF: &[u8] = b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj";
    const ZIP: &[u8] = b"PK\x03\x04\x14\x00\x00\x00\x08\x00";

    #[test]
    fn reconcile_table() {
        let cases: &[(Option<&str>, &[u8], &str, &str)] = &[
            // Sniffed content wins over a wrong declaration and a wrong name.
            (Some("text/plain"), PNG_1X1, "x.txt", "image/png"),
            (None, PNG_1X1, "noext", "image/png"),
            (Some("image/png"), PDF, "a.png", "application/pdf"),
            // A zip container does not override the specific type built on it.
            (
                Some("application/vnd.openxmlformats-officedocument.wordprocessingml.document"),
                ZIP,
                "a.docx",
                "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
            ),
            (Some("image/png"), ZIP, "a.png", "application/zip"),
            // Nothing sniffable: declared, normalized.
            (
                Some("Text/Plain; charset=utf-8"),
                b"hello",
                "a.bin",
                "text/plain",
            ),
            // Malformed declaration: guess from the name.
            (Some("not a mime"), b"hello", "notes.md", "text/markdown"),
            (Some(""), b"a,b\n1,2", "t.csv", "text/csv"),
            (None, b"hello", "a.txt", "text/plain"),
            (
                Some("application/octet-stream"),
                b"hello",
                "a.txt",
                "text/plain",
            ),
            (
                Some("application/octet-stream"),
                b"hello",
                "noext",
                OCTET_STREAM,
            ),
            (None, b"hello", "noext", OCTET_STREAM),
            (None, b"", "", OCTET_STREAM),
        ];
        for (declared, head, name, expected) in cases {
            assert_eq!(
                reconcile(*declared, head, name),
                *expected,
                "{declared:?} {name:?}"
            );
        }
    }

    #[test]
    fn disagreement() {
        assert!(disagrees(Some("text/plain"), "image/png"));
        assert!(!disagrees(Some("IMAGE/PNG"), "image/png"));
        assert!(!disagrees(None, "image/png"));
        assert!(!disagrees(Some("garbage"), "image/png"));
        assert!(!disagrees(Some("application/octet-stream"), "text/plain"));
        // Aliases (Element's spelling against the sniffer's) are not a disagreement.
        for (declared, sniffed) in [
            ("audio/wav", "audio/x-wav"),
            ("audio/x-wav", "audio/wav"),
            ("audio/ogg", "audio/opus"),
            ("audio/ogg; codecs=opus", "audio/ogg"),
            ("image/jpg", "image/jpeg"),
            ("audio/mp3", "audio/mpeg"),
        ] {
            assert!(!disagrees(Some(declared), sniffed), "{declared} {sniffed}");
        }
        assert!(disagrees(Some("audio/ogg"), "audio/wav"));
        assert!(disagrees(Some("video/ogg"), "audio/ogg"));
    }

    #[test]
    fn sniffed_aliases_come_out_in_the_usual_spelling() {
        const OGG_OPUS: &[u8] = b"OggS\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x01\x13OpusHead\x01\x01";
        const WAV: &[u8] = b"RIFF\x24\x00\x00\x00WAVEfmt \x10\x00\x00\x00";
        assert_eq!(reconcile(None, OGG_OPUS, "memo.ogg"), "audio/ogg");
        assert_eq!(reconcile(Some("audio/x-wav"), WAV, "a.wav"), "audio/wav");
    }

    #[test]
    fn image_sizes() {
        assert_eq!(image_size(PNG_1X1), Some((3, 2)));
        assert_eq!(image_size(b"hello"), None);
        assert_eq!(image_size(&PNG_1X1[..10]), None);
    }

    #[test]
    fn msgtypes() {
        let cases = [
            ("image/png", Kind::Image),
            ("IMAGE/JPEG", Kind::Image),
            ("image/svg+xml", Kind::File),
            ("video/mp4", Kind::Video),
            ("audio/ogg", Kind::Audio),
            ("application/pdf", Kind::File),
            ("text/plain", Kind::File),
            ("", Kind::File),
        ];
        for (mime, kind) in cases {
            assert_eq!(msgtype_for(mime), kind, "{mime}");
        }
    }
}
