//! `for_model()`: pictures prepared for vision models.

use std::io::Cursor;

use mediainfo::{Limits, ModelImageError, Skipped, for_model};

use crate::corpus;
use crate::images::exif_rotated_jpeg;

const EDGE: u32 = 1536;

#[test]
fn a_photo_is_scaled_to_the_long_edge_as_jpeg() {
    // 2000x1500 → 1536x1152.
    let bytes = corpus("photo.jpg");
    let prepared = for_model(Cursor::new(&bytes), &Limits::default(), EDGE).expect("prepared");
    assert_eq!(prepared.mime, "image/jpeg");
    assert_eq!((prepared.width, prepared.height), (1536, 1152));
    assert_eq!(
        (prepared.source_width, prepared.source_height),
        (2000, 1500)
    );
    let decoded = ::image::load_from_memory(&prepared.bytes).expect("decodes");
    assert_eq!((decoded.width(), decoded.height()), (1536, 1152));
}

#[test]
fn a_small_picture_is_never_scaled_up() {
    let mut png = Vec::new();
    ::image::RgbImage::from_pixel(40, 30, ::image::Rgb([200, 10, 10]))
        .write_to(&mut Cursor::new(&mut png), ::image::ImageFormat::Png)
        .expect("encode");
    let prepared = for_model(Cursor::new(&png), &Limits::default(), EDGE).expect("prepared");
    assert_eq!((prepared.width, prepared.height), (40, 30));
    assert_eq!(prepared.mime, "image/jpeg", "an opaque PNG becomes a JPEG");
}

#[test]
fn exif_rotation_arrives_upright() {
    let jpeg = exif_rotated_jpeg();
    let prepared = for_model(Cursor::new(&jpeg), &Limits::default(), 800).expect("prepared");
    assert_eq!((prepared.width, prepared.height), (400, 800));
    let decoded = ::image::load_from_memory(&prepared.bytes)
        .expect("decodes")
        .to_rgb8();
    // The source grows redder to the right; turned clockwise, it grows redder downwards.
    assert!(decoded.get_pixel(200, 790).0[0] > decoded.get_pixel(200, 10).0[0] + 100);
}

#[test]
fn transparency_stays_png() {
    let bytes = corpus("transparent.png");
    let prepared = for_model(Cursor::new(&bytes), &Limits::default(), EDGE).expect("prepared");
    assert_eq!(prepared.mime, "image/png");
    assert_eq!((prepared.width, prepared.height), (1536, 1152));
    let decoded = ::image::load_from_memory(&prepared.bytes)
        .expect("decodes")
        .to_rgba8();
    assert!(decoded.pixels().any(|p| p.0[3] == 0), "still transparent");
}

#[test]
fn a_decompression_bomb_is_refused_before_decoding() {
    let bytes = corpus("bomb.png");
    let error = for_model(Cursor::new(&bytes), &Limits::default(), EDGE).unwrap_err();
    assert!(
        matches!(
            error,
            ModelImageError::Skipped(Skipped::TooLarge {
                width: 30_000,
                height: 30_000
            })
        ),
        "{error:?}"
    );
}

#[test]
fn an_animation_gives_its_first_frame() {
    use ::image::codecs::gif::GifEncoder;
    use ::image::{Delay, Frame, RgbaImage};
    let mut gif = Vec::new();
    {
        let mut encoder = GifEncoder::new(&mut gif);
        for shade in [30u8, 220] {
            let frame = RgbaImage::from_pixel(100, 50, ::image::Rgba([shade, 90, 160, 255]));
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
    let prepared = for_model(Cursor::new(&gif), &Limits::default(), EDGE).expect("prepared");
    let decoded = ::image::load_from_memory(&prepared.bytes)
        .expect("decodes")
        .to_rgb8();
    let red = decoded.get_pixel(50, 25).0[0];
    assert!(
        red < 80,
        "the first frame (dark), not the second: red {red}"
    );
}

#[test]
fn garbage_is_an_error_not_a_panic() {
    for bytes in [
        b"not a picture at all".to_vec(),
        corpus("photo.jpg")[..2000].to_vec(),
    ] {
        let _ = for_model(Cursor::new(&bytes), &Limits::default(), EDGE);
    }
    assert!(for_model(Cursor::new(b"text"), &Limits::default(), EDGE).is_err());
}
