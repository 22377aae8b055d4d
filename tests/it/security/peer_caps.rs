//! One peer cannot take every connection of a gateway exposed without a load balancer: past
//! `FILAMENT_MAX_CONNECTIONS_PER_PEER` its connections are closed as they are accepted (counted
//! in `/metrics`), and other peers are served.

use std::net::SocketAddr;
use std::time::Duration;

use reqwest::StatusCode;
use tokio::io::AsyncReadExt as _;
use tokio::net::{TcpSocket, TcpStream};

use crate::support::{GatewayOptions, eventually};

/// A connection to `gateway` from `source` (another loopback address: another peer).
async fn connect_from(source: &str, gateway: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    socket.connect(gateway).await.unwrap()
}

/// Whether the gateway closed `stream` within `patience` (end of stream or a reset).
async fn closed_within(stream: &mut TcpStream, patience: Duration) -> bool {
    let mut byte = [0u8; 1];
    matches!(tokio::time::timeout(patience, stream.read(&mut byte)).await, Ok(Ok(0) | Err(_)))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_peer_past_its_connection_cap_is_refused_at_accept_and_others_are_served() {
    const PER_PEER: usize = 4;
    const OPENED: usize = 10;
    let gw = GatewayOptions::new()
        .env("FILAMENT_MAX_CONNECTIONS_PER_PEER", &PER_PEER.to_string())
        .env("FILAMENT_MAX_CONNECTIONS", "64")
        .spawn()
        .await;
    let address: SocketAddr = gw.base_url.trim_start_matches("http://").parse().unwrap();
    let mut flood = Vec::new();
    for _ in 0..OPENED {
        flood.push(connect_from("127.0.0.2", address).await);
    }
    let mut refused = 0;
    for stream in &mut flood {
        if closed_within(stream, Duration::from_millis(500)).await {
            refused += 1;
        }
    }
    assert_eq!(refused, OPENED - PER_PEER, "the peer's connections beyond its cap");
    let response = reqwest::get(gw.url("/healthz")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK, "another peer (127.0.0.1) is served");
    let counted = gw.metric(r#"filament_http_connections_refused_total{reason="per_peer_limit"}"#).await;
    assert_eq!(counted, Some((OPENED - PER_PEER) as f64));
    // A place the peer gives back is its again, once the gateway saw it closed.
    drop(flood);
    eventually(Duration::from_secs(10), "a place under the peer's cap again", || async {
        let mut again = connect_from("127.0.0.2", address).await;
        (!closed_within(&mut again, Duration::from_millis(500)).await).then_some(())
    })
    .await;
}

/// The listen backlog holds as many connections as the gateway serves at once (tokio's default
/// of 1,024 was below the 2,048 served by default: a larger burst overflows it).
/// `ss` shows a listening socket's backlog as its send queue; the kernel caps it at somaxconn.
#[tokio::test(flavor = "multi_thread")]
async fn the_listen_backlog_is_as_large_as_the_connections_served() {
    const MAX_CONNECTIONS: u32 = 3000;
    let gw = GatewayOptions::new().env("FILAMENT_MAX_CONNECTIONS", &MAX_CONNECTIONS.to_string()).spawn().await;
    let somaxconn: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn").unwrap().trim().parse().unwrap();
    // The gateway inherits this process's open-files limit, and serves at most that less 256.
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
    let open_files = limits.lines().find(|line| line.starts_with("Max open files")).unwrap();
    let open_files: u32 = open_files.split_whitespace().nth(3).unwrap().parse().unwrap_or(u32::MAX);
    let served = MAX_CONNECTIONS.min(open_files.saturating_sub(256).max(1));
    let port = gw.base_url.rsplit(':').next().unwrap().trim_end_matches('/').to_string();
    let listed = std::process::Command::new("ss").args(["-Hltn", &format!("sport = :{port}")]).output().unwrap();
    let listed = String::from_utf8(listed.stdout).unwrap();
    let backlog: u32 =
        listed.split_whitespace().nth(2).unwrap_or_else(|| panic!("a listening socket: {listed:?}")).parse().unwrap();
    assert_eq!(backlog, served.max(1024).min(somaxconn), "{listed}");
}
