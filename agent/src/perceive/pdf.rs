//! Text of PDFs for `read_file` and the model: lopdf, run in a child process of the agent's own
//! binary (`agent __pdf-text`) under memory and CPU limits it sets itself, with a deadline and
//! a size bound on both sides. A hostile PDF can make lopdf allocate without bound (a page tree
//! claiming 2^40 pages, object streams that inflate to gigabytes) or recurse; in a thread that
//! would abort or stall the agent, in the child it is one clear "could not read this PDF".
//!
//! The extraction itself ([`extract`]) walks the page tree with `page_iter` (bounded by the
//! objects in the file, cycles included; never `get_pages`, which trusts `/Count`) and reads
//! the text-showing operators of each page's content one at a time, up to a byte budget.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use protocol::WorkspacePath;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;
use tracing::{info, warn};

use crate::confine::{ConfineError, ScopedWorkspace};

/// The argument that makes the agent binary the PDF helper.
pub const HELPER_ARG: &str = "__pdf-text";
/// Largest PDF read.
pub const MAX_PDF_BYTES: u64 = 16 * 1024 * 1024;
/// Pages whose text is read; the page count covers all.
pub const MAX_PAGES: usize = 200;
/// Bytes of text kept.
pub const MAX_TEXT: usize = 256 * 1024;
/// Most bytes one stream may inflate to.
const MAX_STREAM: usize = 8 * 1024 * 1024;
/// The child's address space (`RLIMIT_AS`).
const CHILD_MEMORY: u64 = 1024 * 1024 * 1024;
/// The child's CPU time (`RLIMIT_CPU`), seconds.
const CHILD_CPU_SECS: u64 = 10;
/// The parent's deadline for the child.
const DEADLINE: Duration = Duration::from_secs(15);
/// Helpers running at once.
const AT_ONCE: usize = 2;

/// What a PDF says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PdfText {
    /// Pages in the document (walked, not as the file claims).
    pub pages: usize,
    /// Pages whose text was read.
    pub read: usize,
    /// The text, pages separated by form feeds.
    pub text: String,
    /// The text was cut at [`MAX_TEXT`] or [`MAX_PAGES`].
    pub truncated: bool,
}

/// Why a PDF gave no text. The `Display` text is a sentence for the model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum PdfError {
    /// Encrypted with a password.
    #[error("the PDF is encrypted with a password")]
    Encrypted,
    /// Not a PDF lopdf could make sense of.
    #[error("the PDF is damaged or not a PDF: {0}")]
    Malformed(String),
    /// No pages.
    #[error("the PDF has no pages")]
    NoPages,
    /// Larger than [`MAX_PDF_BYTES`].
    #[error("the PDF is {0} bytes, more than the {MAX_PDF_BYTES} I read")]
    TooLarge(u64),
    /// The helper ran out of time or memory, or crashed.
    #[error("the PDF could not be read within my time and memory limits")]
    Limits,
    /// The file could not be opened.
    #[error("{0}")]
    Unreadable(String),
}

impl From<ConfineError> for PdfError {
    fn from(e: ConfineError) -> Self {
        Self::Unreadable(e.to_string())
    }
}

/// Whether the bytes at the start of a file make it a PDF (`%PDF-` within the first KiB, as
/// readers accept it).
pub fn is_pdf(head: &[u8]) -> bool {
    head[..head.len().min(1024)]
        .windows(5)
        .any(|w| w == b"%PDF-")
}

/// Extracts the text of a PDF in memory. Runs in the helper process only: lopdf's worst cases
/// are bounded there by the process's limits, not here.
pub fn extract(bytes: &[u8]) -> Result<PdfText, PdfError> {
    let options = lopdf::LoadOptions {
        max_decompressed_size: Some(MAX_STREAM),
        ..Default::default()
    };
    let doc = lopdf::Document::load_mem_with_options(bytes, options).map_err(|e| match e {
        lopdf::Error::InvalidPassword => PdfError::Encrypted,
        other => PdfError::Malformed(short(&other.to_string())),
    })?;
    if doc.is_encrypted() {
        return Err(PdfError::Encrypted);
    }
    let mut pages = 0usize;
    let mut first = Vec::new();
    for id in doc.page_iter() {
        pages += 1;
        if first.len() < MAX_PAGES {
            first.push(id);
        }
    }
    if pages == 0 {
        return Err(PdfError::NoPages);
    }
    let mut text = String::new();
    let mut read = 0;
    for id in &first {
        if text.len() >= MAX_TEXT {
            break;
        }
        if read > 0 {
            text.push('\u{c}');
        }
        // A damaged page leaves a gap, not a failure.
        let _ = page_text(&doc, *id, &mut text);
        read += 1;
    }
    let truncated = text.len() >= MAX_TEXT || read < pages;
    if text.len() > MAX_TEXT {
        let mut cut = MAX_TEXT;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
    }
    Ok(PdfText {
        pages,
        read,
        text,
        truncated,
    })
}

/// Appends the text one page shows, operator by operator, until the budget is spent.
fn page_text(doc: &lopdf::Document, page: lopdf::ObjectId, out: &mut String) -> lopdf::Result<()> {
    use lopdf::content::Content;
    use lopdf::{Encoding, Object};

    fn show(encoding: &Encoding, operands: &[Object], out: &mut String) {
        for operand in operands {
            match operand {
                Object::String(bytes, _) => {
                    let _ = encoding.write_to_string(bytes, out);
                }
                // The content parser bounds nesting (100).
                Object::Array(items) => show(encoding, items, out),
                // A large negative kerning in `TJ` is a space between words.
                Object::Integer(i) if *i < -100 => out.push(' '),
                Object::Real(r) if *r < -100.0 => out.push(' '),
                _ => {}
            }
        }
    }

    let mut encodings: BTreeMap<Vec<u8>, Encoding> = BTreeMap::new();
    for (name, font) in doc.get_page_fonts(page)? {
        if let Ok(encoding) = font.get_font_encoding_with_limit(doc, MAX_STREAM) {
            encodings.insert(name, encoding);
        }
    }
    let content = doc.get_page_content_with_limit(page, MAX_STREAM)?;
    let mut current: Option<&Encoding> = None;
    for op in Content::decode_iter(&content) {
        let op = op?;
        if out.len() >= MAX_TEXT {
            break;
        }
        match op.operator.as_str() {
            "Tf" => {
                current = op
                    .operands
                    .first()
                    .and_then(|o| o.as_name().ok())
                    .and_then(|n| encodings.get(n));
            }
            "Tj" | "TJ" => {
                if let Some(e) = current {
                    show(e, &op.operands, out);
                }
            }
            "'" | "\"" => {
                if let Some(e) = current {
                    out.push('\n');
                    let skip = if op.operator == "'" { 0 } else { 2 };
                    show(e, op.operands.get(skip..).unwrap_or(&[]), out);
                }
            }
            "T*" | "Td" | "TD" | "ET" if !out.is_empty() && !out.ends_with('\n') => {
                out.push('\n');
            }
            _ => {}
        }
    }
    Ok(())
}

fn short(s: &str) -> String {
    s.chars().filter(|c| !c.is_control()).take(200).collect()
}

/// The helper's answer on its stdout.
#[derive(Debug, Serialize, Deserialize)]
enum Answer {
    Text(PdfText),
    Refused(PdfError),
}

/// The helper process: limits itself, reads a PDF from stdin, writes its [`Answer`] as JSON to
/// stdout. Exit code 0 whenever an answer was written.
pub fn helper_main() -> std::process::ExitCode {
    use rustix::process::{Resource, Rlimit, setrlimit};
    let limit = |bytes| Rlimit {
        current: Some(bytes),
        maximum: Some(bytes),
    };
    if setrlimit(Resource::As, limit(CHILD_MEMORY)).is_err()
        || setrlimit(Resource::Cpu, limit(CHILD_CPU_SECS)).is_err()
    {
        return std::process::ExitCode::from(3);
    }
    let mut bytes = Vec::new();
    if std::io::stdin()
        .take(MAX_PDF_BYTES + 1)
        .read_to_end(&mut bytes)
        .is_err()
    {
        return std::process::ExitCode::from(4);
    }
    let answer = if bytes.len() as u64 > MAX_PDF_BYTES {
        Answer::Refused(PdfError::TooLarge(bytes.len() as u64))
    } else {
        match extract(&bytes) {
            Ok(text) => Answer::Text(text),
            Err(e) => Answer::Refused(e),
        }
    };
    let mut stdout = std::io::stdout().lock();
    let written = serde_json::to_writer(&mut stdout, &answer).is_ok() && stdout.flush().is_ok();
    if written {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(5)
    }
}

/// Reads PDFs through the helper. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Pdfs {
    helper: PathBuf,
    at_once: Arc<Semaphore>,
}

impl Pdfs {
    /// PDFs read by running `helper` (the agent binary) with [`HELPER_ARG`].
    pub fn new(helper: PathBuf) -> Self {
        Self {
            helper,
            at_once: Arc::new(Semaphore::new(AT_ONCE)),
        }
    }

    /// The text of the PDF at `path`.
    pub async fn text(
        &self,
        ws: &ScopedWorkspace,
        path: &WorkspacePath,
    ) -> Result<PdfText, PdfError> {
        let opened = {
            let (ws, path) = (ws.clone(), path.clone());
            tokio::task::spawn_blocking(move || ws.open_file(&path))
        }
        .await
        .map_err(|e| PdfError::Unreadable(e.to_string()))??;
        if opened.size > MAX_PDF_BYTES {
            return Err(PdfError::TooLarge(opened.size));
        }
        let started = std::time::Instant::now();
        let result = self.run(tokio::fs::File::from_std(opened.file)).await;
        match &result {
            Ok(t) => {
                info!(%path, pages = t.pages, read = t.read, chars = t.text.len(), ms = started.elapsed().as_millis() as u64, "PDF read")
            }
            Err(e) => warn!(%path, error = %e, "PDF not read"),
        }
        result
    }

    /// The text of a PDF given as bytes (the fuzz target's way in).
    pub async fn text_of(&self, bytes: &[u8]) -> Result<PdfText, PdfError> {
        self.run(std::io::Cursor::new(bytes.to_vec())).await
    }

    async fn run(
        &self,
        mut input: impl tokio::io::AsyncRead + Unpin + Send,
    ) -> Result<PdfText, PdfError> {
        let _permit = self.at_once.acquire().await;
        let mut child = tokio::process::Command::new(&self.helper)
            .arg(HELPER_ARG)
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                warn!(helper = %self.helper.display(), error = %e, "cannot start the PDF helper");
                PdfError::Limits
            })?;
        let mut stdin = child.stdin.take().ok_or(PdfError::Limits)?;
        let mut stdout = child.stdout.take().ok_or(PdfError::Limits)?;
        let work = async {
            let feed = async {
                // The child may stop reading early (it refuses what it does not need).
                let _ = tokio::io::copy(&mut input, &mut stdin).await;
                let _ = stdin.shutdown().await;
                drop(stdin);
            };
            let mut answer = Vec::new();
            let mut bounded = (&mut stdout).take(2 * MAX_TEXT as u64 + 64 * 1024);
            let collect = bounded.read_to_end(&mut answer);
            let ((), read) = tokio::join!(feed, collect);
            read.map_err(|_| PdfError::Limits)?;
            let status = child.wait().await.map_err(|_| PdfError::Limits)?;
            if !status.success() {
                return Err(PdfError::Limits);
            }
            match serde_json::from_slice::<Answer>(&answer) {
                Ok(Answer::Text(t)) => Ok(t),
                Ok(Answer::Refused(e)) => Err(e),
                Err(_) => Err(PdfError::Limits),
            }
        };
        tokio::time::timeout(DEADLINE, work)
            .await
            .unwrap_or(Err(PdfError::Limits))
    }
}
