//! The health endpoint under abuse: silent and half-sent connections are closed, and a probe
//! still gets its answer while hundreds of idle sockets from the same host are open.

use std::sync::Arc;
use std::time::Duration;

use surface::health::{self, Health, Limits};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Upper bound for things that should happen at once; a failure guard, not a timing assertion.
const PATIENCE: Duration = Duration::from_secs(20);

async fn start(limits: Limits) -> (std::net::SocketAddr, CancellationToken) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    tokio::spawn(health::serve_with(
        listener,
        Arc::new(Health::default()),
        limits,
        shutdown.clone(),
    ));
    (addr, shutdown)
}

/// A well-behaved probe, the request of the images' healthcheck: one request, the whole response.
async fn probe(addr: std::net::SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

/// Waits until the server closes `s` (EOF or reset).
async fn closed_by_server(s: &mut TcpStream) {
    let mut buf = [0u8; 64];
    loop {
        match tokio::time::timeout(PATIENCE, s.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => return,
            Ok(Ok(_)) => continue,
            Err(_) => panic!("the server kept the connection open"),
        }
    }
}

#[tokio::test]
async fn silent_and_unfinished_connections_are_closed() {
    let (addr, shutdown) = start(Limits {
        header_read_timeout: Duration::from_millis(300),
        ..Limits::default()
    })
    .await;
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: surf")
        .await
        .unwrap();
    closed_by_server(&mut silent).await;
    closed_by_server(&mut half).await;
    let answer = probe(addr).await;
    assert!(answer.starts_with("HTTP/1.0 503"), "{answer}");
    shutdown.cancel();
}

#[tokio::test]
async fn probe_is_answered_during_a_flood_of_idle_sockets() {
    // Default limits: the idle sockets would live for seconds, so only eviction of the oldest
    // lets the probe in.
    let (addr, shutdown) = start(Limits::default()).await;
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    let answer = tokio::time::timeout(PATIENCE, probe(addr))
        .await
        .expect("the probe got an answer");
    assert!(answer.starts_with("HTTP/1.0 503"), "{answer}");
    assert!(answer.contains(r#""status":"starting""#), "{answer}");
    // The first idle socket was closed to make room.
    closed_by_server(&mut idle[0]).await;
    shutdown.cancel();
}
