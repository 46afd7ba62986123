//! What Matrix clients need to make outbound media look native, as Element sends it: image
//! dimensions, a thumbnail and a blurhash; video size and duration; audio duration, whether a
//! file is an Ogg/Opus voice note, and its waveform; and pictures prepared for vision models.
//!
//! Pure and synchronous: functions over `std::io` readers, no async runtime, no Matrix types.
//! Every input is treated as hostile: files are streamed or sought through (the one decoder
//! that buffers a whole file, `image`'s JPEG, is cut at [`Limits::max_alloc`]), decoding is
//! bounded by [`Limits`] checked on the header before any pixel buffer exists, and garbage
//! yields an error or partial facts, never a panic.
//!
//! Crates used, and why:
//! * `image` (PNG, JPEG, WebP, GIF codecs only): header-first decoding with allocation limits,
//!   resizing and the thumbnail encoders. Its integer area-averaging `thumbnail` reads each
//!   source pixel once, so `fast_image_resize` (SIMD, unsafe code, another dependency) would
//!   save little next to the decode itself.
//! * `blurhash`: the reference algorithm behind `xyz.amorgan.blurhash`.
//! * `mp4parse` (Mozilla, fuzzed, used by Firefox): parses the `moov` box. It only takes
//!   `Read` and would read through `mdat` to reach a `moov` stored after it, so the
//!   top-level boxes are walked here with seeks and only `moov` is handed over.
//! * `hound`: WAV headers and samples, with seeking for the waveform.
//! * `opus-pure`: a pure-Rust Opus decoder (no C library to install or link, no build
//!   script, no dependencies), for the waveform only. It decodes at libopus's speed (10
//!   minutes of audio in about a second, release build) and is fuzzed and checked against
//!   libopus upstream; like libopus it uses unsafe code internally (SIMD), and a panic in it
//!   is caught and costs only the waveform. `opus-decoder` (no unsafe code at all) was tried
//!   first and gave the same waveforms, but decoded barely 5x faster than real time. Bindings to libopus would need
//!   `cmake` (the `opus` crate builds it) or `libopus-dev`/`libopus0` on every machine.
//!   Ogg pages are parsed here, in a few bounded lines, rather than with the `ogg` crate (see
//!   the `ogg` module).

mod audio;
mod bounded;
mod error;
mod model_image;
mod ogg;
mod picture;
mod video;
mod waveform;

pub use audio::{AudioFacts, audio, audio_length};
pub use error::MediaError;
pub use model_image::{ModelImage, ModelImageError, for_model};
pub use picture::{ImageFacts, Limits, Skipped, THUMBNAIL_MAX, Thumbnail, image};
pub use video::{VideoFacts, video};

/// Number of values in a waveform (MSC3246 suggests about 100).
pub const WAVEFORM_LEN: usize = 100;
