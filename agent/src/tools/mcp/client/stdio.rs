//! A stdio MCP server's process as an rmcp transport. The agent spawns it itself (a cleared
//! environment, stderr drained into the log) and stands between its stdout and rmcp: rmcp
//! drops a line that is not JSON without a word, so a server answering `tools/list` with
//! garbage would hold its start until the start's time limit. Here the first such line ends
//! the connection, and [`Spoiled`] says why.

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use rmcp::RoleClient;
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::transport::async_rw::{AsyncRwTransport, DEFAULT_MAX_LINE_LENGTH};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::process::{Child, ChildStdin};
use tracing::debug;

use super::shown_within;

/// Environment variables a stdio server gets from the agent; nothing else (the agent's own
/// environment holds its secrets).
const PASSED_ENV: &[&str] = &[
    "PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "USER",
];

/// Bytes of a stdio server's stderr kept (the last ones) for the error when it fails to start.
const STDERR_TAIL: usize = 8 * 1024;

/// Lines of that tail quoted in the error.
const STDERR_WORDS: usize = 3;

/// Bytes read from a stdio server's stdout or stderr at a time.
const CHUNK: usize = 4 * 1024;

/// Bytes of a stderr line logged; the rest of a longer line is left out.
const STDERR_LINE: usize = 1024;

/// Longest stdout line (one JSON-RPC message) passed on: what rmcp itself accepts. A longer
/// line ends the connection rather than being held in memory.
const MAX_LINE: usize = DEFAULT_MAX_LINE_LENGTH;

/// Bytes between the stdout reader and rmcp; the reader waits while rmcp has not read them.
const PIPE: usize = 64 * 1024;

/// Characters of a line that is not JSON quoted in the error.
const QUOTED: usize = 120;

/// How long a closed server may take to exit before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(3);

/// Why the agent stopped reading a server's stdout, once it did: set before rmcp sees the
/// stream end, so whoever finds the connection closed can name the cause.
pub(super) type Spoiled = Arc<OnceLock<String>>;

/// The last bytes of a server's stderr.
pub(super) type Tail = Arc<Mutex<VecDeque<u8>>>;

/// A running stdio server: rmcp reads its stdout through [`pump`] and writes its stdin.
pub(super) struct ChildTransport {
    child: Child,
    rw: AsyncRwTransport<RoleClient, DuplexStream, ChildStdin>,
}

/// What a spawned server gives its client: the transport for rmcp, why its stdout was cut off
/// (once it is), and its stderr's last bytes with the task that reads them.
pub(super) struct Spawned {
    pub(super) transport: ChildTransport,
    pub(super) spoiled: Spoiled,
    pub(super) tail: Tail,
    pub(super) stderr: tokio::task::JoinHandle<()>,
}

/// Runs `program args` as the server `name`.
pub(super) fn spawn(name: &str, program: &str, args: &[String]) -> Result<Spawned, String> {
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for var in PASSED_ENV {
        if let Some(value) = std::env::var_os(var) {
            command.env(var, value);
        }
    }
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(format!("cannot run {program}: its pipes are missing"));
    };
    let (to_rmcp, from_pump) = tokio::io::duplex(PIPE);
    let spoiled = Spoiled::default();
    tokio::spawn(pump(stdout, to_rmcp, spoiled.clone()));
    // The server's own log goes to ours (RUST_LOG=agent=debug), line by line, cut short; its
    // last bytes explain a server that fails to start (a missing module, a bad flag).
    let tail = Tail::new(Mutex::new(VecDeque::with_capacity(STDERR_TAIL)));
    let stderr = tokio::spawn(drain_stderr(name.to_owned(), stderr, tail.clone()));
    Ok(Spawned {
        transport: ChildTransport {
            child,
            rw: AsyncRwTransport::new(from_pump, stdin),
        },
        spoiled,
        tail,
        stderr,
    })
}

impl Transport<RoleClient> for ChildTransport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.rw.send(item)
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        self.rw.receive()
    }

    /// The MCP stdio shutdown: close its stdin, give it [`EXIT_GRACE`] to exit, then kill it.
    async fn close(&mut self) -> Result<(), Self::Error> {
        self.rw.close().await?;
        if tokio::time::timeout(EXIT_GRACE, self.child.wait())
            .await
            .is_err()
        {
            self.child.kill().await?;
        }
        Ok(())
    }
}

/// Passes `stdout` on to rmcp line by line, each checked by [`verdict`]; at the first line
/// that fails, or one longer than [`MAX_LINE`], it records why in `spoiled` and ends the
/// stream rmcp reads, which closes the connection.
async fn pump(
    mut stdout: impl AsyncRead + Unpin,
    mut to_rmcp: impl AsyncWrite + Unpin,
    spoiled: Spoiled,
) {
    let mut chunk = vec![0; CHUNK];
    let mut line = Vec::new();
    loop {
        let n = match stdout.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        for piece in chunk[..n].split_inclusive(|&b| b == b'\n') {
            if line.len() + piece.len() > MAX_LINE {
                let _ = spoiled.set(format!(
                    "it wrote a line longer than {MAX_LINE} bytes on stdout"
                ));
                return;
            }
            line.extend_from_slice(piece);
            if !line.ends_with(b"\n") {
                continue;
            }
            if let Err(why) = verdict(&line) {
                let _ = spoiled.set(why);
                return;
            }
            if to_rmcp.write_all(&line).await.is_err() {
                return;
            }
            line.clear();
        }
    }
}

/// Whether a stdout `line` may go to rmcp: JSON (after a byte order mark, as rmcp reads it),
/// or blank. Whether it is an MCP message is rmcp's to judge. The error quotes the line,
/// escaped and cut short.
fn verdict(line: &[u8]) -> Result<(), String> {
    let json = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    if json.iter().all(u8::is_ascii_whitespace)
        || serde_json::from_slice::<serde::de::IgnoredAny>(json).is_ok()
    {
        return Ok(());
    }
    let text = String::from_utf8_lossy(line.strip_suffix(b"\n").unwrap_or(line));
    Err(format!(
        "it wrote a line that is not JSON on stdout: {}",
        shown_within(&text, QUOTED)
    ))
}

/// Reads a stdio server's stderr to its end in chunks of [`CHUNK`] bytes: each line logged at
/// debug (escaped, the first [`STDERR_LINE`] bytes of it), the last [`STDERR_TAIL`] bytes kept
/// in `tail`.
async fn drain_stderr(server: String, mut stderr: impl AsyncRead + Unpin, tail: Tail) {
    let mut chunk = vec![0; CHUNK];
    let mut line = Vec::with_capacity(STDERR_LINE);
    let mut cut = false;
    let log = |line: &[u8], cut: bool| {
        let text = String::from_utf8_lossy(line);
        let more = if cut { " … (cut)" } else { "" };
        debug!(server = %server, "{}{more}", shown_within(&text, STDERR_LINE));
    };
    loop {
        let n = match stderr.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let bytes = &chunk[..n];
        {
            let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
            let keep = &bytes[bytes.len().saturating_sub(STDERR_TAIL)..];
            let over = (tail.len() + keep.len()).saturating_sub(STDERR_TAIL);
            tail.drain(..over);
            tail.extend(keep);
        }
        for &byte in bytes {
            if byte == b'\n' {
                log(&line, cut);
                line.clear();
                cut = false;
            } else if line.len() < STDERR_LINE {
                line.push(byte);
            } else {
                cut = true;
            }
        }
    }
    if !line.is_empty() {
        log(&line, cut);
    }
}

/// The last few lines of a server's stderr `tail`, escaped and cut short, for an error
/// message; `None` when it said nothing.
pub(super) fn last_words(tail: &Tail) -> Option<String> {
    let tail = tail.lock().unwrap_or_else(|e| e.into_inner());
    let bytes: Vec<u8> = tail.iter().copied().collect();
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .rev()
        .take(STDERR_WORDS)
        .map(|l| shown_within(l, 200))
        .collect();
    if lines.is_empty() {
        return None;
    }
    let lines: Vec<String> = lines.into_iter().rev().collect();
    Some(lines.join(" | "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_blank_lines_pass_anything_else_is_quoted_escaped() {
        assert!(verdict(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n").is_ok());
        assert!(verdict(b"{\"a\":1}\r\n").is_ok());
        assert!(verdict(b"\xEF\xBB\xBF{\"a\":1}\n").is_ok());
        assert!(verdict(b"  \r\n").is_ok());
        // JSON that is no MCP message is rmcp's to refuse.
        assert!(verdict(b"42\n").is_ok());
        let why = verdict(b"tools: echo\x1b[31m FORGED\n").unwrap_err();
        assert_eq!(
            why,
            r"it wrote a line that is not JSON on stdout: tools: echo\u{1b}[31m FORGED"
        );
        let long = verdict(format!("{}\n", "x".repeat(500)).as_bytes()).unwrap_err();
        assert!(long.ends_with("x…"), "{long}");
        assert!(long.len() < 200, "{long}");
    }

    #[tokio::test]
    async fn the_first_line_that_is_not_json_ends_the_stream() {
        let (mut server, stdout) = tokio::io::duplex(1024);
        let (to_rmcp, mut rmcp) = tokio::io::duplex(1024);
        let spoiled = Spoiled::default();
        let pump = tokio::spawn(pump(stdout, to_rmcp, spoiled.clone()));
        // A line may arrive in pieces.
        server.write_all(b"{\"id\":").await.unwrap();
        server
            .write_all(b"1}\n\n<html>\n{\"id\":2}\n")
            .await
            .unwrap();
        pump.await.unwrap();
        let mut passed = String::new();
        rmcp.read_to_string(&mut passed).await.unwrap();
        assert_eq!(passed, "{\"id\":1}\n\n");
        assert_eq!(
            spoiled.get().map(String::as_str),
            Some("it wrote a line that is not JSON on stdout: <html>")
        );
    }
}
