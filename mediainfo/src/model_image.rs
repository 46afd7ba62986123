//! Pictures for a vision model: the first frame, upright, scaled to fit a long edge and
//! re-encoded as JPEG (PNG when any pixel is transparent), within the same [`Limits`] as
//! thumbnails.

use std::io::{BufRead, Seek};

use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::{CompressionType, FilterType as PngFilter, PngEncoder};
use image::{ExtendedColorType, ImageEncoder};

use crate::MediaError;
use crate::picture::{Limits, Skipped, decode, downscale};

/// JPEG quality of pictures for a model: a little above the thumbnails', since the model reads
/// text and detail in them.
const JPEG_QUALITY: u8 = 85;

/// A picture ready to be sent to a model.
#[derive(Clone, PartialEq, Eq)]
pub struct ModelImage {
    /// The encoded picture.
    pub bytes: Vec<u8>,
    /// `image/jpeg` or `image/png`.
    pub mime: &'static str,
    /// Width as encoded, in pixels.
    pub width: u32,
    /// Height as encoded, in pixels.
    pub height: u32,
    /// Width of the original as displayed (EXIF rotation applied).
    pub source_width: u32,
    /// Height of the original as displayed.
    pub source_height: u32,
}

impl std::fmt::Debug for ModelImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelImage")
            .field("bytes", &self.bytes.len())
            .field("mime", &self.mime)
            .field("width", &self.width)
            .field("height", &self.height)
            .field("source_width", &self.source_width)
            .field("source_height", &self.source_height)
            .finish()
    }
}

/// Why a picture could not be prepared. The `Display` text is a short sentence fit for a
/// model or a log line.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelImageError {
    /// The reader failed, or the bytes are not a PNG, JPEG, WebP or GIF picture.
    #[error(transparent)]
    Media(#[from] MediaError),
    /// A recognised picture refused by [`Limits`] (nothing was decoded) or damaged.
    #[error(transparent)]
    Skipped(#[from] Skipped),
}

/// Prepares the picture in `reader` for a vision model: decoded within `limits` (refused on its
/// header's dimensions before any pixel buffer exists), the first frame of an animation, the
/// EXIF orientation applied, scaled (never up) so that neither side exceeds `long_edge`, and
/// encoded as JPEG, or as PNG when any pixel is transparent.
pub fn for_model<R: BufRead + Seek>(
    reader: R,
    limits: &Limits,
    long_edge: u32,
) -> Result<ModelImage, ModelImageError> {
    let decoded = decode(reader, limits)?.map_err(|(_, _, skipped)| skipped)?;
    let (source_width, source_height) = decoded.upright_size();
    let long_edge = long_edge.max(1);
    let small = downscale(&decoded.pixels, decoded.orientation, (long_edge, long_edge));
    drop(decoded);
    let (width, height) = (small.width(), small.height());
    let encode_error = |e: image::ImageError| Skipped::EncodeFailed(e.to_string());
    let mut bytes = Vec::new();
    let rgba = small.color().has_alpha().then(|| small.to_rgba8());
    let mime = match rgba.filter(|px| px.pixels().any(|p| p.0[3] < u8::MAX)) {
        Some(rgba) => {
            PngEncoder::new_with_quality(&mut bytes, CompressionType::Fast, PngFilter::Adaptive)
                .write_image(rgba.as_raw(), width, height, ExtendedColorType::Rgba8)
                .map_err(encode_error)?;
            "image/png"
        }
        None => {
            let rgb = small.to_rgb8();
            JpegEncoder::new_with_quality(&mut bytes, JPEG_QUALITY)
                .encode(rgb.as_raw(), width, height, ExtendedColorType::Rgb8)
                .map_err(encode_error)?;
            "image/jpeg"
        }
    };
    Ok(ModelImage {
        bytes,
        mime,
        width,
        height,
        source_width,
        source_height,
    })
}
