//! A video's poster: its first frame, decoded by `ffmpeg` (when the operator has one: the
//! surface does not decode video itself), scaled to fit 800x600 in the child process, then
//! thumbnailed and blurhashed like any image. The child reads the file through `/dev/stdin`
//! (its own open of the same inode, so nothing else's position moves), runs at most
//! [`TIMEOUT`], and at most [`MAX_OUTPUT`] bytes of its answer are read.

use std::io::{self, Cursor};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use mediainfo::{ImageFacts, Limits};
use tokio::io::AsyncReadExt;
use tokio::process::Command;

use crate::workspace::OpenedFile;

/// Longest a poster may take (a hostile file must not hold a send up for long).
pub const TIMEOUT: Duration = Duration::from_secs(20);
/// Largest poster read back: an 800x600 PNG is far smaller.
pub const MAX_OUTPUT: u64 = 4 * 1024 * 1024;

/// The first frame of `opened` as image facts (thumbnail and blurhash), made by `ffmpeg`.
pub async fn first_frame(ffmpeg: &Path, opened: &OpenedFile) -> io::Result<ImageFacts> {
    let mut child = Command::new(ffmpeg)
        .args(["-hide_banner", "-loglevel", "error", "-nostats"])
        .args(["-i", "/dev/stdin", "-map", "0:v:0", "-frames:v", "1"])
        .args([
            "-vf",
            "scale=w=800:h=600:force_original_aspect_ratio=decrease",
        ])
        .args(["-f", "image2pipe", "-c:v", "png", "pipe:1"])
        .stdin(Stdio::from(opened.handle()?))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let mut stdout = child
        .stdout
        .take()
        .ok_or_else(|| io::Error::other("no stdout"))?;
    let run = async {
        let mut png = Vec::new();
        (&mut stdout).take(MAX_OUTPUT).read_to_end(&mut png).await?;
        let status = child.wait().await?;
        if !status.success() || png.is_empty() {
            return Err(io::Error::other(format!("ffmpeg failed ({status})")));
        }
        Ok(png)
    };
    let png = tokio::time::timeout(TIMEOUT, run)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "ffmpeg took too long"))??;
    tokio::task::spawn_blocking(move || {
        // Always re-encoded (as JPEG, a frame being opaque): "smaller than the original"
        // compares with nothing here.
        mediainfo::image(Cursor::new(png), u64::MAX, &Limits::default())
    })
    .await
    .map_err(io::Error::other)?
    .map_err(io::Error::other)
}
