//! Pictures as a vision model gets them: prepared once per file version (device, inode, size,
//! modification and change times) with `mediainfo::for_model` on a blocking thread, one decode
//! at a time, and kept in a cache bounded by bytes, so a picture shown again (history, a retry,
//! `view_image`) costs a lookup.

use std::io::BufReader;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use base64::Engine as _;
use mediainfo::{Limits, ModelImage, ModelImageError};
use protocol::WorkspacePath;
use quick_cache::Weighter;
use quick_cache::sync::Cache;
use tokio::sync::Semaphore;
use tracing::{debug, info};

use crate::confine::{ConfineError, ScopedWorkspace};

/// Bytes of prepared pictures kept (a 1536-pixel JPEG is a few hundred KiB).
const CACHE_BYTES: u64 = 64 * 1024 * 1024;

/// Identifies the content of a file without reading it: a rewritten or replaced file gets a
/// new key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Version {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    /// The long edge it was prepared for.
    edge: u32,
}

#[derive(Debug, Clone)]
struct ByBytes;

impl Weighter<Version, Arc<ModelImage>> for ByBytes {
    fn weight(&self, _: &Version, image: &Arc<ModelImage>) -> u64 {
        image.bytes.len() as u64 + 64
    }
}

/// Why a picture cannot be shown. The `Display` text is a sentence for the model.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The path is out of reach, missing, or could not be read.
    #[error(transparent)]
    Confine(#[from] ConfineError),
    /// Not a picture, refused by the decoding limits, or damaged.
    #[error("{path} cannot be shown: {reason}")]
    NotShown {
        /// The file.
        path: WorkspacePath,
        /// Why, from `mediainfo`.
        reason: ModelImageError,
    },
}

/// The prepared-picture cache and its settings. Cheap to clone.
#[derive(Clone)]
pub struct Images {
    cache: Arc<Cache<Version, Arc<ModelImage>, ByBytes>>,
    decoding: Arc<Semaphore>,
    limits: Limits,
    long_edge: u32,
}

impl std::fmt::Debug for Images {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Images")
            .field("cached", &self.cache.len())
            .field("long_edge", &self.long_edge)
            .finish()
    }
}

impl Images {
    /// Pictures scaled to fit `long_edge` pixels, decoded within `mediainfo`'s default limits.
    pub fn new(long_edge: u32) -> Self {
        Self {
            cache: Arc::new(Cache::with_weighter(1024, CACHE_BYTES, ByBytes)),
            decoding: Arc::new(Semaphore::new(1)),
            limits: Limits::default(),
            long_edge,
        }
    }

    /// The picture at `path`, prepared for a model (from the cache when this version of the
    /// file was prepared before). `inode`: the surface's word for a file it has just sent
    /// (`AttachmentInfo::inode`), which then opens without waiting for it to be still.
    pub async fn prepare(
        &self,
        ws: &ScopedWorkspace,
        path: &WorkspacePath,
        inode: Option<u64>,
    ) -> Result<Arc<ModelImage>, ImageError> {
        let opened = {
            let (ws, path) = (ws.clone(), path.clone());
            tokio::task::spawn_blocking(move || ws.open_sent(&path, inode))
        }
        .await
        .map_err(|e| internal(path, e))??;
        let meta = opened.file.metadata().map_err(|source| ConfineError::Io {
            path: path.clone(),
            source,
        })?;
        let version = Version {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
            edge: self.long_edge,
        };
        if let Some(hit) = self.cache.get(&version) {
            debug!(%path, "prepared picture from the cache");
            crate::metrics::image("cached");
            return Ok(hit);
        }
        // One decode at a time: each may take up to `Limits::max_alloc` of memory.
        let _permit = self.decoding.acquire().await;
        if let Some(hit) = self.cache.get(&version) {
            return Ok(hit);
        }
        let (limits, edge) = (self.limits, self.long_edge);
        let started = std::time::Instant::now();
        let file = opened.file;
        let prepared = tokio::task::spawn_blocking(move || {
            mediainfo::for_model(BufReader::with_capacity(1 << 16, file), &limits, edge)
        })
        .await
        .map_err(|e| internal(path, e))?
        .map_err(|reason| {
            crate::metrics::image("refused");
            ImageError::NotShown {
                path: path.clone(),
                reason,
            }
        })?;
        crate::metrics::image("ok");
        info!(
            %path,
            source = %format!("{}x{}", prepared.source_width, prepared.source_height),
            sent = %format!("{}x{}", prepared.width, prepared.height),
            mime = prepared.mime,
            bytes = prepared.bytes.len(),
            ms = started.elapsed().as_millis() as u64,
            "picture prepared for the model"
        );
        let prepared = Arc::new(prepared);
        self.cache.insert(version, prepared.clone());
        Ok(prepared)
    }
}

/// A blocking task that panicked or was cancelled, as an I/O error on `path`.
pub(crate) fn internal(path: &WorkspacePath, e: tokio::task::JoinError) -> ConfineError {
    ConfineError::Io {
        path: path.clone(),
        source: std::io::Error::other(e),
    }
}

/// The picture as a `data:` URL, as chat-completions `image_url` parts carry it.
pub fn data_url(image: &ModelImage) -> String {
    format!(
        "data:{};base64,{}",
        image.mime,
        base64::engine::general_purpose::STANDARD.encode(&image.bytes)
    )
}
