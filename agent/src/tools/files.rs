//! File tools: list, read, describe, write (own folder only) and send, all through the
//! chat's [`ScopedWorkspace`].

use protocol::WorkspacePath;
use schemars::JsonSchema;
use serde::Deserialize;

use super::{Tool, ToolCx, ToolError, ToolOutput, blocking};
use crate::confine::ChatScope;

/// Largest text `read_file` returns.
const MAX_READ_BYTES: u64 = 64 * 1024;
/// Largest content `write_file` accepts.
const MAX_WRITE_BYTES: usize = 1024 * 1024;

/// List the chat's files.
#[derive(Debug)]
pub struct ListFiles;

/// Arguments of `list_files`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListFilesArgs {
    /// A folder to list (relative to the workspace); by default everything the chat can see:
    /// its own folder and its room's inbox and outbox.
    #[serde(default)]
    pub dir: Option<WorkspacePath>,
}

impl Tool for ListFiles {
    const NAME: &'static str = "list_files";
    const READ_ONLY: bool = true;
    const DESCRIPTION: &'static str = "List the files this chat can see (its own folder and its room's inbox/outbox) with sizes \
         and modification times.";
    type Args = ListFilesArgs;

    fn resource(args: &Self::Args, scope: &ChatScope) -> String {
        args.dir.as_ref().unwrap_or(scope.own_dir()).to_string()
    }

    async fn call(args: Self::Args, cx: &ToolCx<'_>) -> Result<ToolOutput, ToolError> {
        let ws = cx.ws.clone();
        let entries = blocking(move || match args.dir {
            Some(dir) => Ok(ws.list_dir(&dir)?),
            None => Ok(ws.list_files()),
        })
        .await?;
        if entries.is_empty() {
            return Ok("No files yet.".to_owned().into());
        }
        let lines: Vec<String> = entries
            .iter()
            .map(|e| match e.modified {
                Some(t) => format!(
                    "{} ({} bytes, modified {})",
                    e.path,
                    e.size,
                    humantime::format_rfc3339_seconds(t)
                ),
                None => format!("{} ({} bytes)", e.path, e.size),
            })
            .collect();
        Ok(lines.join("\n").into())
    }
}

/// Read a text file.
#[derive(Debug)]
pub struct ReadFile;

/// Arguments of `read_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    /// The file, relative to the workspace.
    pub path: WorkspacePath,
    /// Read at most this many bytes (default and maximum 65536).
    #[serde(default)]
    pub max_bytes: Option<u64>,
}

impl Tool for ReadFile {
    const NAME: &'static str = "read_file";
    const READ_ONLY: bool = true;
    const DESCRIPTION: &'static str = "Read a UTF-8 text file the chat can see (at most 64 KiB); for a PDF, its page count and text.";
    type Args = ReadFileArgs;

    fn resource(args: &Self::Args, _: &ChatScope) -> String {
        args.path.to_string()
    }

    async fn call(args: Self::Args, cx: &ToolCx<'_>) -> Result<ToolOutput, ToolError> {
        let ws = cx.ws.clone();
        let limit = args.max_bytes.unwrap_or(MAX_READ_BYTES).min(MAX_READ_BYTES);
        let path = args.path;
        let (bytes, cut) = {
            let (ws, path) = (ws.clone(), path.clone());
            blocking(move || Ok(ws.read_prefix(&path, limit)?)).await?
        };
        if crate::perceive::pdf::is_pdf(&bytes) {
            let pdf = cx
                .perception
                .pdfs
                .text(&ws, &path)
                .await
                .map_err(|e| ToolError::Failed(format!("{path}: {e}")))?;
            return Ok(pdf_output(&pdf, limit as usize).into());
        }
        if bytes.contains(&0) {
            return Err(ToolError::Failed(format!(
                "{path} is not a text file; use describe_file"
            )));
        }
        let mut text = String::from_utf8_lossy(&bytes).into_owned();
        if cut {
            text.push_str(&format!("\n[truncated after {limit} bytes]"));
        }
        Ok(text.into())
    }
}

/// A PDF's text as `read_file` returns it: the page count first, then the text of the pages
/// read (form feeds between pages), cut at `limit` bytes.
fn pdf_output(pdf: &crate::perceive::PdfText, limit: usize) -> String {
    let mut out = format!(
        "PDF, {} page{}; text of page{} 1–{}:\n",
        pdf.pages,
        if pdf.pages == 1 { "" } else { "s" },
        if pdf.read == 1 { "" } else { "s" },
        pdf.read
    );
    if pdf.text.trim().is_empty() {
        out.push_str("(no text found: the pages may be scanned images)");
        return out;
    }
    let mut cut = limit.min(pdf.text.len());
    while !pdf.text.is_char_boundary(cut) {
        cut -= 1;
    }
    out.push_str(&pdf.text[..cut]);
    if cut < pdf.text.len() || pdf.truncated {
        out.push_str(&format!("\n[truncated after {cut} bytes of text]"));
    }
    out
}

/// Describe a file: MIME type, size, SHA-256, image size, first lines.
#[derive(Debug)]
pub struct DescribeFile;

/// Arguments of `describe_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DescribeFileArgs {
    /// The file, relative to the workspace.
    pub path: WorkspacePath,
}

impl Tool for DescribeFile {
    const NAME: &'static str = "describe_file";
    const READ_ONLY: bool = true;
    const DESCRIPTION: &'static str =
        "Describe a file: name, MIME type, size, sha256, image dimensions, first lines of text.";
    type Args = DescribeFileArgs;

    fn resource(args: &Self::Args, _: &ChatScope) -> String {
        args.path.to_string()
    }

    async fn call(args: Self::Args, cx: &ToolCx<'_>) -> Result<ToolOutput, ToolError> {
        let ws = cx.ws.clone();
        let d = blocking(move || Ok(crate::describe::describe(&ws, &args.path)?)).await?;
        Ok(d.to_string().into())
    }
}

/// Look at a picture.
#[derive(Debug)]
pub struct ViewImage;

/// Arguments of `view_image`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ViewImageArgs {
    /// The picture (PNG, JPEG, WebP or GIF), relative to the workspace.
    pub path: WorkspacePath,
}

impl Tool for ViewImage {
    const NAME: &'static str = "view_image";
    const READ_ONLY: bool = true;
    const DESCRIPTION: &'static str = "Look at a picture the chat can see (one sent earlier, or one \
         you made): it is shown to you after the tool results.";
    type Args = ViewImageArgs;

    fn resource(args: &Self::Args, _: &ChatScope) -> String {
        args.path.to_string()
    }

    async fn call(args: Self::Args, cx: &ToolCx<'_>) -> Result<ToolOutput, ToolError> {
        let picture = cx
            .perception
            .images
            .prepare(cx.ws, &args.path, None)
            .await
            .map_err(|e| match e {
                crate::perceive::ImageError::Confine(c) => ToolError::Confine(c),
                other => ToolError::Failed(other.to_string()),
            })?;
        Ok(ToolOutput {
            text: format!(
                "{} is a {}x{} picture; it is shown to you below.",
                args.path, picture.source_width, picture.source_height
            ),
            sent_file: None,
            picture: Some(args.path),
        })
    }
}

/// Write a text file in the chat's own folder.
#[derive(Debug)]
pub struct WriteFile;

/// Arguments of `write_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileArgs {
    /// Where to write, relative to the workspace; must be below `chats/<this chat's id>/`.
    pub path: WorkspacePath,
    /// The text to write (replaces the file).
    pub content: String,
}

impl Tool for WriteFile {
    const NAME: &'static str = "write_file";
    const DESCRIPTION: &'static str =
        "Write a text file below the chat's own folder chats/<chat_id>/ (replaces it atomically).";
    type Args = WriteFileArgs;

    fn resource(args: &Self::Args, _: &ChatScope) -> String {
        args.path.to_string()
    }

    async fn call(args: Self::Args, cx: &ToolCx<'_>) -> Result<ToolOutput, ToolError> {
        if args.content.len() > MAX_WRITE_BYTES {
            return Err(ToolError::Failed(format!(
                "content is {} bytes, over the limit of {MAX_WRITE_BYTES}",
                args.content.len()
            )));
        }
        let ws = cx.ws.clone();
        let len = args.content.len();
        let path = args.path.clone();
        blocking(move || Ok(ws.write_file(&args.path, args.content.as_bytes())?)).await?;
        Ok(format!("wrote {len} bytes to {path}").into())
    }
}

/// Deliver a file to the room.
#[derive(Debug)]
pub struct SendFileTool;

/// Arguments of `send_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SendFileArgs {
    /// The file, relative to the workspace.
    pub path: WorkspacePath,
    /// Text posted with the file.
    #[serde(default)]
    pub caption: Option<String>,
    /// Post OGG/Opus audio as a voice message (other files are sent as they are).
    #[serde(default)]
    pub voice: bool,
}

impl Tool for SendFileTool {
    const NAME: &'static str = "send_file";
    const DESCRIPTION: &'static str =
        "Send a file the chat can see to the room (its own files or its room's inbox/outbox).";
    type Args = SendFileArgs;

    fn resource(args: &Self::Args, _: &ChatScope) -> String {
        args.path.to_string()
    }

    async fn call(args: Self::Args, cx: &ToolCx<'_>) -> Result<ToolOutput, ToolError> {
        // Open it here first: a file that fails confinement is never named to the surface.
        let ws = cx.ws.clone();
        let path = args.path.clone();
        let size = blocking(move || {
            let f = ws.open_file(&path)?;
            Ok::<u64, ToolError>(f.size)
        })
        .await?;
        let report = cx
            .link
            .send_file(
                cx.turn,
                format!("send-{}-{}", cx.turn, cx.step),
                args.path.clone(),
                args.caption,
                args.voice,
            )
            .await
            .map_err(|_| ToolError::Disconnected)?;
        let text = match report {
            Some(r) if r.ok => format!("sent {} ({size} bytes) to the room", args.path),
            Some(r) => {
                return Err(ToolError::Failed(format!(
                    "the room did not get {}: {}",
                    args.path,
                    r.error.as_deref().unwrap_or("delivery failed")
                )));
            }
            None => {
                return Err(ToolError::Failed(format!(
                    "no delivery report for {} in time; it may still arrive",
                    args.path
                )));
            }
        };
        Ok(ToolOutput {
            text,
            sent_file: Some(args.path),
            picture: None,
        })
    }
}
