//! Why a file's facts could not be read at all.

use std::io;

/// A failure to read facts from a file.
///
/// Most problems with a file's content are not errors: [`crate::image`] reports them as
/// [`crate::Skipped`], and [`crate::video`] and [`crate::audio`] leave the facts they could not
/// find as `None`. An error means the reader failed, or the file is not the kind it was said to be.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MediaError {
    /// Reading or seeking the underlying reader failed.
    #[error("could not read the file: {0}")]
    Io(#[from] io::Error),
    /// The bytes are not a file of the expected kind, or are damaged beyond use.
    #[error("malformed file: {0}")]
    Malformed(String),
}
