//! Strangers on the port: slow or silent connections are closed, one peer cannot hold many
//! places, a flood does not keep the surface out, and the test hooks are off by default.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use protocol::EndStatus;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::support::{DEADLINE, TestAgent, chat, message};

const HEAD_TIMEOUT: Duration = Duration::from_millis(800);
/// Scheduling slack on a busy test machine; the point is "closed", not "closed on the dot".
const MARGIN: Duration = Duration::from_secs(3);

/// Reads until the peer closes (EOF or reset); returns how long that took from `since`.
async fn until_closed(stream: &mut TcpStream, since: Instant, within: Duration) -> Duration {
    let mut buf = [0u8; 1024];
    let wait = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return since.elapsed(),
                Ok(_) => continue,
            }
        }
    };
    tokio::time::timeout(within, wait)
        .await
        .expect("the agent closed the connection")
}

/// Whether the agent has closed `stream`, without waiting.
fn is_closed(stream: &TcpStream) -> bool {
    let mut buf = [0u8; 1];
    match stream.try_read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

/// A TCP connection to `to` from the loopback address `from` (all of 127/8 is local on Linux).
async fn connect_from(from: Ipv4Addr, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(IpAddr::V4(from), 0)).unwrap();
    socket.connect(to).await.unwrap()
}

#[tokio::test]
async fn slow_and_silent_request_heads_are_closed() {
    let agent = TestAgent::start_with(|c| c.limits.head_timeout = HEAD_TIMEOUT).await;

    // Slow-loris: one byte of a valid head every 100ms, never finishing in time.
    let mut slow = TcpStream::connect(agent.addr).await.unwrap();
    let start = Instant::now();
    let (mut read, mut write) = slow.split();
    let head =
        b"GET /healthz HTTP/1.1\r\nHost: agent\r\nX-Padding: aaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let trickle = async {
        for byte in head {
            if write.write_all(&[*byte]).await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        std::future::pending::<()>().await;
    };
    let mut buf = [0u8; 256];
    let closed = tokio::select! {
        () = trickle => unreachable!(),
        _ = tokio::time::timeout(HEAD_TIMEOUT + MARGIN, async {
            while let Ok(n) = read.read(&mut buf).await && n > 0 {}
        }) => start.elapsed(),
    };
    assert!(
        closed < HEAD_TIMEOUT + MARGIN,
        "slow head still open after {closed:?}"
    );

    // Silent: connects and sends nothing.
    let mut silent = TcpStream::connect(agent.addr).await.unwrap();
    until_closed(&mut silent, Instant::now(), HEAD_TIMEOUT + MARGIN).await;

    // A prompt client is served.
    let mut ok = TcpStream::connect(agent.addr).await.unwrap();
    ok.write_all(b"GET /healthz HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    tokio::time::timeout(DEADLINE, ok.read_to_string(&mut response))
        .await
        .unwrap()
        .unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
}

#[tokio::test]
async fn one_peer_cannot_hold_more_than_its_share() {
    const CAP: usize = 4;
    const OPENED: usize = 10;
    let agent = TestAgent::start_with(|c| {
        c.limits.max_pending_per_ip = CAP;
        // Long enough that nothing here is closed by the deadline.
        c.limits.head_timeout = Duration::from_secs(60);
    })
    .await;
    let peer = Ipv4Addr::new(127, 0, 0, 3);
    let mut idle = Vec::new();
    for _ in 0..OPENED {
        idle.push(connect_from(peer, agent.addr).await);
    }
    // Everything beyond the cap is closed at once; poll until it has been.
    let deadline = Instant::now() + DEADLINE;
    loop {
        let closed = idle.iter().filter(|s| is_closed(s)).count();
        if closed == OPENED - CAP {
            break;
        }
        assert!(closed <= OPENED - CAP, "{closed} closed, cap {CAP}");
        assert!(Instant::now() < deadline, "only {closed} closed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The others' places come back when they go: the peer is served again.
    idle.clear();
    let deadline = Instant::now() + DEADLINE;
    loop {
        let mut s = connect_from(peer, agent.addr).await;
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n")
            .await
            .ok();
        let mut response = String::new();
        let _ = tokio::time::timeout(DEADLINE, s.read_to_string(&mut response)).await;
        if response.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(Instant::now() < deadline, "the peer stays locked out");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_flood_of_idle_sockets_does_not_keep_the_surface_out() {
    // Default limits and deadline: 200 silent sockets from 20 addresses, more than every
    // place there is, and more than one address may hold.
    let agent = TestAgent::start().await;
    let mut flood = Vec::new();
    for i in 0..200u8 {
        let from = Ipv4Addr::new(127, 0, 1, 1 + i % 20);
        flood.push(connect_from(from, agent.addr).await);
    }
    let start = Instant::now();
    let (mut c, _) = agent.connect(&chat()).await;
    let t = c.turn(message(1, "$m1", "help")).await;
    assert_eq!(t.end().status, EndStatus::Completed);
    println!(
        "connect + handshake + turn beside 200 idle sockets: {} ms",
        start.elapsed().as_millis()
    );
    // The established session outlives the deadline that closes the flood.
    let deadline = Instant::now() + DEADLINE;
    while !flood.iter().all(is_closed) {
        assert!(Instant::now() < deadline, "idle sockets stay open");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let t = c.turn(message(2, "$m2", "history")).await;
    assert_eq!(t.end().status, EndStatus::Completed);
}

#[tokio::test]
async fn idle_sockets_from_many_addresses_do_not_keep_handshakes_out() {
    // The probe's attack: 200 addresses holding one silent socket each. Every place is taken,
    // no address holds more than one, and yet each new surface connection gets in (the oldest
    // waiting socket gives way).
    let agent = TestAgent::start_with(|c| c.limits.head_timeout = Duration::from_secs(60)).await;
    let mut flood = Vec::new();
    for i in 0..200u8 {
        flood.push(connect_from(Ipv4Addr::new(127, 0, 2, 1 + i), agent.addr).await);
    }
    let mut served = 0;
    for n in 1..=10u64 {
        let (mut c, _) = agent.connect(&chat()).await;
        let t = c.turn(message(n, &format!("$many{n}"), "help")).await;
        if t.end().status == EndStatus::Completed {
            served += 1;
        }
    }
    assert_eq!(served, 10, "every handshake beside 200 silent addresses");
    let open = flood.iter().filter(|s| !is_closed(s)).count();
    println!("handshakes beside 200 one-socket addresses: {served}/10, {open} idle sockets left");
}

#[tokio::test]
async fn test_hooks_are_unknown_commands_by_default() {
    let agent = TestAgent::start_with(|c| c.test_hooks = false).await;
    let (mut c, _) = agent.connect(&chat()).await;
    let help = c.turn(message(1, "$m1", "help")).await;
    assert!(!help.text().contains("sleep"), "{}", help.text());
    assert!(!help.text().contains("sendraw"), "{}", help.text());
    let raw = c
        .turn(message(2, "$m2", "sendraw chats/x/missing.bin"))
        .await;
    assert!(raw.sent_files().is_empty(), "{raw:?}");
    assert!(raw.text().contains("Say `help`"), "{}", raw.text());
    let sleep = c.turn(message(3, "$m3", "sleep 60000")).await;
    assert_eq!(sleep.end().status, EndStatus::Completed);
    assert!(sleep.text().contains("Say `help`"), "{}", sleep.text());
}
