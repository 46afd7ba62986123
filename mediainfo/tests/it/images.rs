//! `image()`: dimensions, thumbnails, blurhash and refusals.

use std::io::{BufReader, Cursor};
use std::time::Instant;

use mediainfo::{ImageFacts, Limits, Skipped, THUMBNAIL_MAX, image};

use crate::{Part, Synthetic, corpus};

fn facts_of(bytes: &[u8]) -> ImageFacts {
    image(Cursor::new(bytes), bytes.len() as u64, &Limits::default()).expect("facts")
}

/// The blurhash decodes, and has Element's 4x3 components: the size flag
/// `(y - 1) * 9 + (x - 1)` = 21 is `L` in base 83, and the length is `4 + 2 * x * y`.
fn assert_blurhash(facts: &ImageFacts) {
    let hash = facts.blurhash.as_deref().expect("a blurhash");
    assert_eq!(hash.len(), 4 + 2 * 4 * 3, "{hash}");
    assert!(hash.starts_with('L'), "{hash}");
    let pixels = blurhash::decode(hash, 32, 24, 1.0).expect("the blurhash decodes");
    assert_eq!(pixels.len(), 32 * 24 * 4);
}

#[test]
fn opaque_png_gets_a_jpeg_thumbnail_and_blurhash() {
    let bytes = corpus("opaque.png");
    let facts = facts_of(&bytes);
    assert_eq!((facts.width, facts.height), (1600, 1200));
    assert_eq!(facts.skipped, None);
    let thumb = facts.thumbnail.as_ref().expect("a thumbnail");
    assert_eq!(thumb.mime, "image/jpeg");
    assert_eq!((thumb.width, thumb.height), THUMBNAIL_MAX);
    assert!(thumb.bytes.starts_with(&[0xff, 0xd8, 0xff]));
    assert!(thumb.bytes.len() < bytes.len());
    let decoded = ::image::load_from_memory(&thumb.bytes).expect("the thumbnail decodes");
    assert_eq!((decoded.width(), decoded.height()), THUMBNAIL_MAX);
    assert_blurhash(&facts);
}

#[test]
fn jpeg_gets_a_jpeg_thumbnail() {
    let bytes = corpus("photo.jpg");
    let facts = facts_of(&bytes);
    assert_eq!((facts.width, facts.height), (2000, 1500));
    let thumb = facts.thumbnail.as_ref().expect("a thumbnail");
    assert_eq!(thumb.mime, "image/jpeg");
    assert_eq!((thumb.width, thumb.height), (800, 600));
    assert_blurhash(&facts);
}

#[test]
fn transparent_png_keeps_its_alpha() {
    let bytes = corpus("transparent.png");
    let facts = facts_of(&bytes);
    assert_eq!((facts.width, facts.height), (2000, 1500));
    let thumb = facts.thumbnail.as_ref().expect("a thumbnail");
    assert!(
        matches!(thumb.mime, "image/png" | "image/webp"),
        "{}",
        thumb.mime
    );
    assert_eq!((thumb.width, thumb.height), (800, 600));
    let decoded = ::image::load_from_memory(&thumb.bytes).expect("the thumbnail decodes");
    let rgba = decoded.to_rgba8();
    assert_eq!(rgba.get_pixel(0, 0).0[3], 0, "the corner stays transparent");
    assert_eq!(rgba.get_pixel(360, 150).0[3], 255, "the disc stays opaque");
    assert_blurhash(&facts);
}

#[test]
fn decompression_bomb_is_refused_from_its_header() {
    let bytes = corpus("bomb.png");
    assert!(bytes.len() < 4096);
    let facts = facts_of(&bytes);
    assert_eq!((facts.width, facts.height), (30_000, 30_000));
    assert_eq!(
        facts.skipped,
        Some(Skipped::TooLarge {
            width: 30_000,
            height: 30_000
        })
    );
    assert_eq!(facts.thumbnail, None);
    assert_eq!(facts.blurhash, None);
    assert_eq!(
        facts.skipped.expect("skipped").to_string(),
        "the image is 30000x30000 pixels, more than we decode"
    );
}

#[test]
fn every_limit_is_enforced() {
    let bytes = corpus("opaque.png");
    let defaults = Limits::default();
    for limits in [
        Limits {
            max_width: 1599,
            ..defaults
        },
        Limits {
            max_height: 1199,
            ..defaults
        },
        Limits {
            max_pixels: 1600 * 1200 - 1,
            ..defaults
        },
        Limits {
            max_alloc: 1600 * 1200 * 3 - 1,
            ..defaults
        },
    ] {
        let facts = image(Cursor::new(&bytes), bytes.len() as u64, &limits).expect("facts");
        assert_eq!(
            facts.skipped,
            Some(Skipped::TooLarge {
                width: 1600,
                height: 1200
            }),
            "{limits:?}"
        );
    }
}

#[test]
fn a_small_image_is_its_own_thumbnail() {
    let mut png = Vec::new();
    ::image::RgbImage::from_pixel(40, 30, ::image::Rgb([200, 10, 10]))
        .write_to(&mut Cursor::new(&mut png), ::image::ImageFormat::Png)
        .expect("encode");
    let facts = facts_of(&png);
    assert_eq!((facts.width, facts.height), (40, 30));
    assert_eq!(facts.thumbnail, None);
    assert_eq!(facts.skipped, Some(Skipped::NotSmaller));
    assert_blurhash(&facts);
}

#[test]
fn animated_gif_uses_its_first_frame() {
    use ::image::codecs::gif::GifEncoder;
    use ::image::{Delay, Frame, RgbaImage};
    let mut gif = Vec::new();
    {
        let mut encoder = GifEncoder::new(&mut gif);
        for shade in [30u8, 220] {
            let frame = RgbaImage::from_pixel(1000, 500, ::image::Rgba([shade, 90, 160, 255]));
            encoder
                .encode_frame(Frame::from_parts(
                    frame,
                    0,
                    0,
                    Delay::from_numer_denom_ms(100, 1),
                ))
                .expect("encode");
        }
    }
    let facts = facts_of(&gif);
    assert_eq!((facts.width, facts.height), (1000, 500));
    assert_blurhash(&facts);
}

#[test]
fn a_24_megapixel_photo_works() {
    let (w, h) = (6000u32, 4000u32);
    let photo = ::image::RgbImage::from_fn(w, h, |x, y| {
        ::image::Rgb([(x / 24) as u8, (y / 16) as u8, ((x + y) / 40) as u8])
    });
    let mut jpeg = Vec::new();
    ::image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 70)
        .encode_image(&photo)
        .expect("encode");
    drop(photo);
    let started = Instant::now();
    let facts = facts_of(&jpeg);
    eprintln!(
        "6000x4000 JPEG of {} KiB: facts in {:?}",
        jpeg.len() / 1024,
        started.elapsed()
    );
    assert_eq!((facts.width, facts.height), (w, h));
    let thumb = facts.thumbnail.as_ref().expect("a thumbnail");
    assert_eq!((thumb.width, thumb.height), (800, 533));
    assert_blurhash(&facts);
}

#[test]
fn unknown_formats_are_an_error() {
    let text = b"hello, this is not a picture";
    assert!(image(Cursor::new(text), text.len() as u64, &Limits::default()).is_err());
}

#[test]
fn a_huge_file_is_read_only_up_to_max_alloc() {
    // A real JPEG followed by 1 GiB of junk: the JPEG decoder would read it all into memory.
    let photo = corpus("photo.jpg");
    let mut file = Synthetic::new(vec![Part::Bytes(photo), Part::Zeros(1 << 30)]);
    let size = file.size();
    let limits = Limits {
        max_alloc: 16 << 20,
        ..Limits::default()
    };
    let facts = image(BufReader::new(&mut file), size, &limits).expect("facts");
    assert_eq!((facts.width, facts.height), (2000, 1500));
    assert!(
        file.bytes_read <= 17 << 20,
        "read {} bytes",
        file.bytes_read
    );
}

/// A 1000x500 JPEG growing redder to the right, whose EXIF says to show it turned 90°
/// clockwise (orientation 6).
pub fn exif_rotated_jpeg() -> Vec<u8> {
    let (w, h) = (1000u32, 500u32);
    let landscape = ::image::RgbImage::from_fn(w, h, |x, _| ::image::Rgb([(x / 4) as u8, 0, 0]));
    let mut plain = Vec::new();
    ::image::codecs::jpeg::JpegEncoder::new_with_quality(&mut plain, 90)
        .encode_image(&landscape)
        .expect("encode");
    // An APP1 segment holding a big-endian TIFF with one IFD entry: Orientation (0x0112),
    // SHORT, 1 value, 6 = rotate 90° clockwise to display.
    let mut exif = b"Exif\0\0MM\0\x2a\0\0\0\x08\0\x01".to_vec();
    exif.extend_from_slice(&[0x01, 0x12, 0, 3, 0, 0, 0, 1, 0, 6, 0, 0, 0, 0, 0, 0]);
    let mut jpeg = plain[..2].to_vec();
    jpeg.extend_from_slice(&[0xff, 0xe1]);
    jpeg.extend_from_slice(&(exif.len() as u16 + 2).to_be_bytes());
    jpeg.extend_from_slice(&exif);
    jpeg.extend_from_slice(&plain[2..]);
    jpeg
}

#[test]
fn exif_rotation_is_applied() {
    let (w, h) = (1000u32, 500u32);
    let jpeg = exif_rotated_jpeg();
    let facts = image(Cursor::new(&jpeg), 10 << 20, &Limits::default()).expect("facts");
    assert_eq!((facts.width, facts.height), (h, w));
    let thumb = facts.thumbnail.expect("a thumbnail");
    assert_eq!((thumb.width, thumb.height), (300, 600));
    let decoded = ::image::load_from_memory(&thumb.bytes)
        .expect("decodes")
        .to_rgb8();
    // The source grows redder to the right; turned clockwise, it grows redder downwards.
    assert!(decoded.get_pixel(150, 590).0[0] > decoded.get_pixel(150, 10).0[0] + 100);
}
