//! The log's line format (one JSON object per line: header, room, turn, end, allow), the
//! old single-record format it replaces, and the file primitives: reading a line at an offset,
//! atomic writes and durable removal.

use super::*;

/// One line of the log.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum Entry {
    Header {
        version: u32,
        chat_id: ChatId,
    },
    Room {
        room_id: String,
        #[serde(default)]
        thread_root: Option<String>,
    },
    Turn(TurnRecord),
    End(TurnEnd),
    /// `allow_always` for `(tool, resource)`, by `user` (lines from before per-user grants have
    /// no user and count for the whole chat).
    Allow {
        tool: String,
        resource: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
    },
    /// Step `n` of pending turn `turn` completed.
    Step {
        turn: String,
        n: u32,
        step: Step,
    },
}

/// A line as loading reads it: the texts are skipped, not kept.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(super) enum Probe {
    Header {
        version: u32,
    },
    Room {
        room_id: String,
        #[serde(default)]
        thread_root: Option<String>,
    },
    Turn {
        id: String,
        seq: u64,
        status: TurnStatus,
        #[serde(default)]
        attachments: Vec<IgnoredAny>,
        #[serde(default)]
        context: Vec<ProbeContext>,
    },
    End {
        id: String,
        status: TurnStatus,
    },
    Allow {
        tool: String,
        resource: String,
        #[serde(default)]
        user: Option<String>,
    },
    Step {
        turn: String,
        n: u32,
    },
}

#[derive(Deserialize)]
pub(super) struct ProbeContext {
    #[serde(default)]
    pub(super) attachments: Vec<IgnoredAny>,
}

/// A chat as agents before the log stored it: one JSON document rewritten on every change.
/// Read only to convert it.
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct LegacyRecord {
    #[serde(default)]
    pub(super) room_id: Option<String>,
    #[serde(default)]
    pub(super) thread_root: Option<String>,
    pub(super) turns: Vec<TurnRecord>,
    #[serde(default)]
    pub(super) always_allowed: BTreeSet<(String, String)>,
}

pub(super) fn push_line(out: &mut Vec<u8>, entry: &Entry) {
    // Serializing these types cannot fail: every map key is a string.
    if serde_json::to_writer(&mut *out, entry).is_ok() {
        out.push(b'\n');
    }
}

/// The line starting at `at`, without its newline.
pub(super) fn read_line_at(file: &File, at: u64) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    let mut chunk = vec![0; 4096];
    loop {
        let n = file.read_at(&mut chunk, at + line.len() as u64)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "log line without its end",
            ));
        }
        if let Some(end) = chunk[..n].iter().position(|&b| b == b'\n') {
            line.extend_from_slice(&chunk[..end]);
            return Ok(line);
        }
        line.extend_from_slice(&chunk[..n]);
        if chunk.len() < 1 << 20 {
            chunk.resize(chunk.len() * 2, 0);
        }
    }
}

pub(super) fn read_entry(file: &File, at: u64) -> io::Result<Entry> {
    serde_json::from_slice(&read_line_at(file, at)?)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

pub(super) fn unexpected(at: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("unexpected kind of line at offset {at}"),
    )
}

pub(super) fn turn_id_at(file: &File, at: u64) -> io::Result<String> {
    #[derive(Deserialize)]
    struct Id {
        id: String,
    }
    serde_json::from_slice::<Id>(&read_line_at(file, at)?)
        .map(|i| i.id)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Writes `bytes` to `path` so that a crash leaves either no file or the whole content.
pub(super) fn write_atomic(dir: &Path, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension(format!("tmp-{:016x}", rand::random::<u64>()));
    let result = (|| {
        let mut file = File::options().write(true).create_new(true).open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&tmp, path)?;
        File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

pub(super) fn remove_durably(dir: &Path, path: &Path) -> io::Result<()> {
    std::fs::remove_file(path)?;
    File::open(dir)?.sync_all()
}
