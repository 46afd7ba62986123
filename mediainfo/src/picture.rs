//! Images: dimensions from the header, then (within [`Limits`]) a thumbnail and a blurhash.

use std::io::{BufRead, Seek};

use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::{CompressionType, FilterType as PngFilter, PngEncoder};
use image::codecs::webp::WebPEncoder;
use image::imageops::FilterType;
use image::metadata::Orientation;
use image::{DynamicImage, ExtendedColorType, ImageDecoder, ImageEncoder, ImageError, ImageReader};

use crate::MediaError;
use crate::bounded::Bounded;

/// The box a thumbnail must fit in, as Element draws it (`THUMBNAIL_WIDTH`/`HEIGHT` there).
pub const THUMBNAIL_MAX: (u32, u32) = (800, 600);
/// JPEG quality of opaque thumbnails; Element uses 0.8 with the browser's encoder.
const JPEG_QUALITY: u8 = 80;
/// Longest side of the image the blurhash is computed from: the hash keeps only 4x3 cosine
/// components, so more pixels add time and nothing visible.
const BLURHASH_SOURCE: u32 = 32;
/// Components of the blurhash, horizontal and vertical (Element's choice).
const BLURHASH_COMPONENTS: (u32, u32) = (4, 3);

/// Bounds on decoding. Anything bigger is refused for thumbnailing (the file itself is still
/// sent by the caller); the check happens on the header's dimensions, before any pixel buffer
/// is allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Widest image decoded, in pixels.
    pub max_width: u32,
    /// Tallest image decoded, in pixels.
    pub max_height: u32,
    /// Most pixels (width × height) decoded.
    pub max_pixels: u64,
    /// Most bytes the decoder may hold at once, the decoded image included. Passed on to the
    /// `image` crate's own limits, which bound its decoders' internal buffers too. Also the
    /// most bytes of the file read: a longer file is decoded as if cut there. Peak memory is
    /// thus at most twice this (a JPEG's compressed bytes and its pixels).
    pub max_alloc: u64,
}

impl Default for Limits {
    /// 12,000 pixels a side, 64 megapixels (a 9248x6936 camera picture passes) and 256 MiB:
    /// a 64-megapixel image decoded to 8-bit RGBA takes exactly that, so a 16-bit one of the
    /// same size is refused rather than doubling the process's peak memory.
    fn default() -> Self {
        Limits {
            max_width: 12_000,
            max_height: 12_000,
            max_pixels: 64_000_000,
            max_alloc: 256 * 1024 * 1024,
        }
    }
}

/// An encoded preview of an image (`info.thumbnail_info` and `info.thumbnail_file` in Matrix).
#[derive(Clone, PartialEq, Eq)]
pub struct Thumbnail {
    /// The encoded thumbnail.
    pub bytes: Vec<u8>,
    /// `image/jpeg`, `image/png` or `image/webp`.
    pub mime: &'static str,
    /// Width in pixels, at most [`THUMBNAIL_MAX`]`.0`.
    pub width: u32,
    /// Height in pixels, at most [`THUMBNAIL_MAX`]`.1`.
    pub height: u32,
}

impl std::fmt::Debug for Thumbnail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Thumbnail")
            .field("bytes", &self.bytes.len())
            .field("mime", &self.mime)
            .field("width", &self.width)
            .field("height", &self.height)
            .finish()
    }
}

/// What a Matrix `m.image` event carries about its picture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageFacts {
    /// Width as displayed, in pixels (EXIF rotation applied).
    pub width: u32,
    /// Height as displayed, in pixels (EXIF rotation applied).
    pub height: u32,
    /// `xyz.amorgan.blurhash`: 4x3 components, `None` when the image was not decoded.
    pub blurhash: Option<String>,
    /// `None` when not decoded, or when it would not be smaller than the original.
    pub thumbnail: Option<Thumbnail>,
    /// Why there is no thumbnail (and perhaps no blurhash); `None` when there is one.
    pub skipped: Option<Skipped>,
}

/// Why an image got no thumbnail. The `Display` text is a short sentence for a log line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Skipped {
    /// The header declares more pixels than [`Limits`] allow; nothing was decoded.
    #[error("the image is {width}x{height} pixels, more than we decode")]
    TooLarge {
        /// Declared width.
        width: u32,
        /// Declared height.
        height: u32,
    },
    /// The header was read, but the pixels could not be decoded (damaged or unsupported).
    #[error("the image could not be decoded: {0}")]
    Undecodable(String),
    /// A thumbnail would not be smaller than the original file, so the original serves as its
    /// own thumbnail (the blurhash is still there).
    #[error("a thumbnail would not be smaller than the image itself")]
    NotSmaller,
    /// Encoding the thumbnail failed.
    #[error("the thumbnail could not be encoded: {0}")]
    EncodeFailed(String),
}

/// Reads an image's dimensions, blurhash and thumbnail.
///
/// `file_size` is the original's size in bytes: a thumbnail at least that big is dropped.
/// Returns an error only when the reader fails or the format is not recognised (PNG, JPEG,
/// WebP and GIF are); a recognised image that cannot be decoded yields facts with
/// [`ImageFacts::skipped`] set.
pub fn image<R: BufRead + Seek>(
    reader: R,
    file_size: u64,
    limits: &Limits,
) -> Result<ImageFacts, MediaError> {
    let decoded = match decode(reader, limits)? {
        Ok(decoded) => decoded,
        Err((width, height, skipped)) => {
            return Ok(ImageFacts {
                width,
                height,
                blurhash: None,
                thumbnail: None,
                skipped: Some(skipped),
            });
        }
    };
    let (width, height) = decoded.upright_size();
    let small = downscale(&decoded.pixels, decoded.orientation, THUMBNAIL_MAX);
    drop(decoded);
    let blurhash = blurhash_of(&small);
    let (thumbnail, skipped) = match encode_thumbnail(&small) {
        Ok(thumb) if (thumb.bytes.len() as u64) < file_size => (Some(thumb), None),
        Ok(_) => (None, Some(Skipped::NotSmaller)),
        Err(error) => (None, Some(Skipped::EncodeFailed(error.to_string()))),
    };
    Ok(ImageFacts {
        width,
        height,
        blurhash,
        thumbnail,
        skipped,
    })
}

/// A decoded picture (its first frame) and the EXIF orientation it is to be shown in.
pub(crate) struct Decoded {
    pub(crate) pixels: DynamicImage,
    pub(crate) orientation: Orientation,
}

impl Decoded {
    /// Width and height as displayed (EXIF rotation applied).
    pub(crate) fn upright_size(&self) -> (u32, u32) {
        upright(self.pixels.width(), self.pixels.height(), self.orientation)
    }
}

/// Why a recognised picture was not decoded: its upright size (as far as the header told it)
/// and the reason.
pub(crate) type NotDecoded = (u32, u32, Skipped);

/// Decodes the first frame of a PNG, JPEG, WebP or GIF within `limits`: the header's
/// dimensions are checked before any pixel buffer exists. The outer error means the reader
/// failed or the format is unknown; the inner one that the picture was refused or damaged.
pub(crate) fn decode<R: BufRead + Seek>(
    reader: R,
    limits: &Limits,
) -> Result<Result<Decoded, NotDecoded>, MediaError> {
    // The JPEG decoder reads the whole file into memory: it gets at most `max_alloc` bytes,
    // so a huge file costs no more than its decoded pixels may (a real photo is far smaller).
    let reader = Bounded::new(reader, limits.max_alloc)?;
    let mut reader = ImageReader::new(reader).with_guessed_format()?;
    if reader.format().is_none() {
        return Err(MediaError::Malformed(
            "not a PNG, JPEG, WebP or GIF image".into(),
        ));
    }
    // Dimensions are checked by us, below, so that a refusal can still say how big the image
    // is; the allocation bound holds for everything the decoder does from here on.
    let mut decoder_limits = image::Limits::default();
    decoder_limits.max_alloc = Some(limits.max_alloc);
    reader.limits(decoder_limits);
    let mut decoder = reader.into_decoder().map_err(header_error)?;

    let (raw_width, raw_height) = decoder.dimensions();
    // A missing or broken EXIF block is no reason to give up on the picture.
    let orientation = decoder.orientation().unwrap_or(Orientation::NoTransforms);
    let (width, height) = upright(raw_width, raw_height, orientation);
    let too_large = || Ok(Err((width, height, Skipped::TooLarge { width, height })));
    if raw_width == 0 || raw_height == 0 {
        return Err(MediaError::Malformed("the image has no pixels".into()));
    }
    if raw_width > limits.max_width
        || raw_height > limits.max_height
        || u64::from(raw_width) * u64::from(raw_height) > limits.max_pixels
        || decoder.total_bytes() > limits.max_alloc
    {
        return too_large();
    }
    // Animated GIF and WebP decoders give their first frame here.
    match DynamicImage::from_decoder(decoder) {
        Ok(pixels) => Ok(Ok(Decoded {
            pixels,
            orientation,
        })),
        Err(ImageError::Limits(_)) => too_large(),
        Err(error) => Ok(Err((
            width,
            height,
            Skipped::Undecodable(error.to_string()),
        ))),
    }
}

fn upright(width: u32, height: u32, orientation: Orientation) -> (u32, u32) {
    if swaps_axes(orientation) {
        (height, width)
    } else {
        (width, height)
    }
}

/// A failure before the dimensions are known is a failure to read the file at all.
fn header_error(error: ImageError) -> MediaError {
    match error {
        ImageError::IoError(io) => MediaError::Io(io),
        other => MediaError::Malformed(other.to_string()),
    }
}

fn swaps_axes(orientation: Orientation) -> bool {
    matches!(
        orientation,
        Orientation::Rotate90
            | Orientation::Rotate270
            | Orientation::Rotate90FlipH
            | Orientation::Rotate270FlipH
    )
}

/// Scales into `bounds` as displayed (never up) and applies the EXIF orientation to the small
/// result rather than to the full-size image, which would copy it once more.
pub(crate) fn downscale(
    full: &DynamicImage,
    orientation: Orientation,
    bounds: (u32, u32),
) -> DynamicImage {
    let (max_w, max_h) = if swaps_axes(orientation) {
        (bounds.1, bounds.0)
    } else {
        bounds
    };
    let (w, h) = fit(full.width(), full.height(), max_w, max_h);
    let mut small = if (w, h) == (full.width(), full.height()) {
        full.clone()
    } else if full.width() >= 2 * w {
        // Area averaging: one pass over the source, each pixel read once. Good for the large
        // ratios that matter for speed (a 6000x4000 photo); it aliases near 1:1.
        full.thumbnail_exact(w, h)
    } else {
        // Near 1:1 a real filter looks better, and the source is small enough for it.
        full.resize_exact(w, h, FilterType::Triangle)
    };
    small.apply_orientation(orientation);
    small
}

/// The largest size with the aspect ratio of `width`x`height` inside `max_w`x`max_h`, never
/// larger than the original and never zero.
pub(crate) fn fit(width: u32, height: u32, max_w: u32, max_h: u32) -> (u32, u32) {
    if width <= max_w && height <= max_h {
        return (width, height);
    }
    let (w, h, mw, mh) = (
        u64::from(width),
        u64::from(height),
        u64::from(max_w),
        u64::from(max_h),
    );
    // Compare w/mw with h/mh without floats: the more constrained side decides.
    let (new_w, new_h) = if w * mh >= h * mw {
        (mw, (h * mw + w / 2) / w)
    } else {
        ((w * mh + h / 2) / h, mh)
    };
    let clamp = |v: u64| u32::try_from(v.max(1)).unwrap_or(u32::MAX);
    (clamp(new_w), clamp(new_h))
}

fn blurhash_of(small: &DynamicImage) -> Option<String> {
    let tiny = small.thumbnail(BLURHASH_SOURCE, BLURHASH_SOURCE).to_rgba8();
    let (w, h) = tiny.dimensions();
    blurhash::encode(
        BLURHASH_COMPONENTS.0,
        BLURHASH_COMPONENTS.1,
        w,
        h,
        tiny.as_raw(),
    )
    .ok()
}

/// JPEG when every pixel is opaque; otherwise the smaller of PNG and lossless WebP.
fn encode_thumbnail(small: &DynamicImage) -> Result<Thumbnail, ImageError> {
    let (width, height) = (small.width(), small.height());
    let rgba = small.color().has_alpha().then(|| small.to_rgba8());
    let Some(rgba) = rgba.filter(|px| px.pixels().any(|p| p.0[3] < u8::MAX)) else {
        let rgb = small.to_rgb8();
        let mut bytes = Vec::new();
        JpegEncoder::new_with_quality(&mut bytes, JPEG_QUALITY).encode(
            rgb.as_raw(),
            width,
            height,
            ExtendedColorType::Rgb8,
        )?;
        return Ok(Thumbnail {
            bytes,
            mime: "image/jpeg",
            width,
            height,
        });
    };
    let mut png = Vec::new();
    PngEncoder::new_with_quality(&mut png, CompressionType::Best, PngFilter::Adaptive)
        .write_image(rgba.as_raw(), width, height, ExtendedColorType::Rgba8)?;
    let mut webp = Vec::new();
    let webp_ok = WebPEncoder::new_lossless(&mut webp)
        .encode(rgba.as_raw(), width, height, ExtendedColorType::Rgba8)
        .is_ok();
    let (bytes, mime) = if webp_ok && webp.len() < png.len() {
        (webp, "image/webp")
    } else {
        (png, "image/png")
    };
    Ok(Thumbnail {
        bytes,
        mime,
        width,
        height,
    })
}

#[cfg(test)]
mod tests {
    use super::fit;

    #[test]
    fn fit_keeps_aspect_and_never_upscales() {
        assert_eq!(fit(1600, 1200, 800, 600), (800, 600));
        assert_eq!(fit(6000, 4000, 800, 600), (800, 533));
        assert_eq!(fit(4000, 6000, 800, 600), (400, 600));
        assert_eq!(fit(300, 200, 800, 600), (300, 200));
        assert_eq!(fit(30_000, 1, 800, 600), (800, 1));
        assert_eq!(fit(1, 30_000, 800, 600), (1, 600));
    }
}
