//! Socket-level attacks on the bridge's listening ports: slow request heads, idle sockets
//! from many addresses, hand-written requests.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// A TCP connection to `to` from the loopback address `from` (all of 127/8 is local on Linux).
pub async fn connect_from(from: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(IpAddr::V4(from), 0))?;
    socket.connect(to).await
}

/// Whether the server has closed `stream`, without waiting.
pub fn is_closed(stream: &TcpStream) -> bool {
    let mut buf = [0u8; 64];
    loop {
        match stream.try_read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => return e.kind() != std::io::ErrorKind::WouldBlock,
        }
    }
}

/// `n` silent connections to `to`, spread over `addresses` loopback source addresses.
pub async fn idle_sockets(to: SocketAddr, n: usize, addresses: u8) -> Vec<TcpStream> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let from = Ipv4Addr::new(127, 0, 2, 1 + (i % usize::from(addresses.max(1))) as u8);
        if let Ok(s) = connect_from(from, to).await {
            out.push(s);
        }
    }
    out
}

/// Waits until every socket in `sockets` is closed; returns how long that took, or `None`
/// when some are still open after `within`.
pub async fn all_closed(sockets: &[TcpStream], within: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < within {
        if sockets.iter().all(is_closed) {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Sends `head` one byte every `step`, never finishing in time; returns how long the server
/// took to close the connection, or `None` if it was still open after `within`.
pub async fn slow_loris(
    to: SocketAddr,
    head: &[u8],
    step: Duration,
    within: Duration,
) -> Option<Duration> {
    let mut stream = TcpStream::connect(to).await.ok()?;
    let start = Instant::now();
    for byte in head.iter().cycle() {
        if start.elapsed() > within {
            return None;
        }
        if stream.write_all(&[*byte]).await.is_err() || is_closed(&stream) {
            return Some(start.elapsed());
        }
        tokio::time::sleep(step).await;
    }
    None
}

/// Sends `request` as is and returns the status code of the answer (0 when the connection
/// closed without one).
pub async fn raw_request(to: SocketAddr, request: &[u8]) -> u16 {
    let Ok(mut stream) = TcpStream::connect(to).await else {
        return 0;
    };
    if stream.write_all(request).await.is_err() {
        return 0;
    }
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    let read = async {
        while !head.windows(2).any(|w| w == b"\r\n") {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(10), read).await;
    String::from_utf8_lossy(&head)
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}
