//! Clients that stop reading hold no connection past the write window: as many stalled
//! readers as `FILAMENT_MAX_CONNECTIONS` (HTTP/1.1 clients pipelining requests they never read
//! the answers of, HTTP/2 peers holding their flow-control window at zero) lock a normal client
//! out only until the window (`FILAMENT_WRITE_TIMEOUT_SECS`) closes them for their rate; more
//! never-reading clients than connections, whose answers all fit their kernel's buffers (idle
//! connections to the gateway), make room for a normal client as it arrives; and shutdown waits
//! for open connections at most `FILAMENT_SHUTDOWN_CONNECTION_WAIT_SECS`.

use std::time::Duration;

use http_body_util::Empty;
use hyper_util::rt::{TokioExecutor, TokioIo};
use reqwest::StatusCode;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

use crate::support::{Gateway, GatewayOptions};

/// What keeps a stalled reader's connection open: its socket, or its HTTP/2 request sender.
type Stalled = Box<dyn std::any::Any + Send>;

fn address(gw: &Gateway) -> String {
    gw.base_url.trim_start_matches("http://").to_string()
}

/// An HTTP/1.1 client with a tiny receive buffer that pipelines 200 requests for the OpenAPI
/// document (about 110 KB each) and reads one byte of the first answer: served, then stalled.
async fn pipelining_reader(address: &str) -> Stalled {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(address.parse().unwrap()).await.unwrap();
    let request = format!("GET /openapi.json HTTP/1.1\r\nHost: {address}\r\n\r\n");
    stream.write_all(request.repeat(200).as_bytes()).await.unwrap();
    let mut first = [0u8; 1];
    tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut first)).await.unwrap().unwrap();
    Box::new(stream)
}

/// An HTTP/2 peer whose streams' flow-control window is zero: it receives the answer's
/// headers, and the gateway can never send its body.
async fn zero_window_reader(address: &str) -> Stalled {
    let stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let (mut sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(0)
        .handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
    let request =
        hyper::Request::get(format!("http://{address}/openapi.json")).body(Empty::<bytes::Bytes>::new()).unwrap();
    let response = tokio::time::timeout(Duration::from_secs(10), sender.send_request(request)).await.unwrap();
    assert_eq!(response.unwrap().status(), hyper::StatusCode::OK, "served: its headers arrived");
    Box::new(sender)
}

/// Which way a reader stalls.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Pipelining,
    ZeroWindow,
}

/// Fills every connection of the gateway with stalled readers of `kind`.
async fn stall_every_connection(gw: &Gateway, connections: usize, kind: Kind) -> Vec<Stalled> {
    let address = address(gw);
    let mut stalled = Vec::new();
    for _ in 0..connections {
        stalled.push(match kind {
            Kind::Pipelining => pipelining_reader(&address).await,
            Kind::ZeroWindow => zero_window_reader(&address).await,
        });
    }
    stalled
}

/// `GET /healthz` on a new connection, giving up after `patience`.
async fn healthz(gw: &Gateway, patience: Duration) -> Option<StatusCode> {
    let client = reqwest::Client::builder().timeout(patience).build().unwrap();
    client.get(gw.url("/healthz")).send().await.ok().map(|response| response.status())
}

/// As many stalled readers of `kind` as the gateway takes connections: a normal client is
/// locked out (its request waits in the listen backlog) until the write deadline closes them.
///
/// An HTTP/2 peer holding its window at zero keeps a stream open, so its connection is never
/// idle: the lock-out is probed. An HTTP/1.1 pipeliner is answered one request after another,
/// and between two answers, everything written, its connection is idle by the gateway's rule
/// (`http/server.rs`): a newcomer at capacity may close it for its place at once (under the
/// full suite the probe once got in that way). So for it the lock-out is not probed: the
/// client is served within the write deadline, and by then every reader was closed, for its
/// sending or (the one the client's place took) as idle.
async fn stalled_readers_lock_a_client_out_only_until_the_write_deadline(kind: Kind) {
    const CONNECTIONS: usize = 4;
    // Long enough that the first reader is still held after the last one stalls on a loaded
    // machine (3 s was once not: the lock-out probe got in).
    const WRITE_TIMEOUT_SECS: u64 = 6;
    let gw = GatewayOptions::new()
        .env("FILAMENT_MAX_CONNECTIONS", &CONNECTIONS.to_string())
        .env("FILAMENT_WRITE_TIMEOUT_SECS", &WRITE_TIMEOUT_SECS.to_string())
        .spawn()
        .await;
    let _stalled = stall_every_connection(&gw, CONNECTIONS, kind).await;
    let stalled_at = Instant::now();
    if let Kind::ZeroWindow = kind {
        assert_eq!(healthz(&gw, Duration::from_millis(500)).await, None, "{kind:?}: every connection is held");
    }
    assert_eq!(healthz(&gw, Duration::from_secs(30)).await, Some(StatusCode::OK), "{kind:?}");
    let waited = stalled_at.elapsed();
    assert!(
        waited < Duration::from_secs(WRITE_TIMEOUT_SECS + 5),
        "{kind:?}: served {waited:?} after the stall, the write deadline is {WRITE_TIMEOUT_SECS} s"
    );
    // The probe took at most one place from an idle pipeliner; every other stalled reader is
    // closed by the write deadline (from its stall, with room for a loaded machine).
    tokio::time::sleep_until(stalled_at + Duration::from_secs(WRITE_TIMEOUT_SECS + 4)).await;
    let metrics = gw.metrics().await;
    let closed_for = |reason: &str| {
        let series = format!(r#"filament_http_connections_closed_total{{reason="{reason}"}} "#);
        metrics.lines().find_map(|line| line.strip_prefix(&series)?.trim().parse::<f64>().ok()).unwrap_or_default()
    };
    let closed = match kind {
        Kind::ZeroWindow => closed_for("send_rate"),
        Kind::Pipelining => closed_for("send_rate") + closed_for("idle_at_capacity"),
    };
    assert!(closed >= CONNECTIONS as f64, "{kind:?}: closed for their sending (or as idle), {closed}");
}

#[tokio::test(flavor = "multi_thread")]
async fn http1_clients_pipelining_requests_they_never_read_are_closed_at_the_write_deadline() {
    stalled_readers_lock_a_client_out_only_until_the_write_deadline(Kind::Pipelining).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn http2_peers_holding_a_zero_window_are_closed_at_the_write_deadline() {
    stalled_readers_lock_a_client_out_only_until_the_write_deadline(Kind::ZeroWindow).await;
}

/// An HTTP/1.1 client that pipelines `requests` requests for the OpenAPI document and reads
/// nothing, with the kernel's default buffers.
async fn never_reading_pipeliner(address: &str, requests: usize) -> tokio::net::TcpStream {
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let request = format!("GET /openapi.json HTTP/1.1\r\nHost: {address}\r\n\r\n");
    stream.write_all(request.repeat(requests).as_bytes()).await.unwrap();
    stream
}

/// More never-reading clients than the gateway takes connections (those beyond wait in the
/// listen backlog, to be accepted as the first are closed): a normal client behind them all is
/// served within the write deadline and 10 s.
#[tokio::test(flavor = "multi_thread")]
async fn more_never_reading_http1_clients_than_connections_lock_others_out_only_until_the_write_deadline() {
    const CONNECTIONS: usize = 24;
    const CLIENTS: usize = 28;
    const WRITE_TIMEOUT_SECS: u64 = 10;
    let gw = GatewayOptions::new()
        .env("FILAMENT_MAX_CONNECTIONS", &CONNECTIONS.to_string())
        .env("FILAMENT_WRITE_TIMEOUT_SECS", &WRITE_TIMEOUT_SECS.to_string())
        .spawn()
        .await;
    let address = address(&gw);
    let mut stalled = Vec::new();
    for _ in 0..CLIENTS {
        stalled.push(never_reading_pipeliner(&address, 40).await);
    }
    let stalled_at = Instant::now();
    let patience = Duration::from_secs(WRITE_TIMEOUT_SECS + 10);
    let served = healthz(&gw, patience + Duration::from_secs(60)).await;
    let waited = stalled_at.elapsed();
    assert_eq!(served, Some(StatusCode::OK));
    assert!(waited < patience, "served {waited:?} after the stall, the write deadline is {WRITE_TIMEOUT_SECS} s");
    // Their answers all sat in the kernel's buffers: idle connections, closed to make room.
    let made_room = gw.metric(r#"filament_http_connections_closed_total{reason="idle_at_capacity"}"#).await;
    assert!(made_room.is_some_and(|closed| closed >= 1.0), "{made_room:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_ends_the_process_within_the_connection_wait_despite_stalled_readers() {
    const CONNECTIONS: usize = 4;
    let mut gw = GatewayOptions::new()
        .env("FILAMENT_MAX_CONNECTIONS", &CONNECTIONS.to_string())
        .env("FILAMENT_WRITE_TIMEOUT_SECS", "600")
        .env("FILAMENT_SHUTDOWN_CONNECTION_WAIT_SECS", "2")
        .spawn()
        .await;
    let mut stalled = stall_every_connection(&gw, CONNECTIONS / 2, Kind::Pipelining).await;
    stalled.extend(stall_every_connection(&gw, CONNECTIONS / 2, Kind::ZeroWindow).await);
    let signalled = Instant::now();
    gw.signal_terminate();
    let status = gw.terminate().await;
    let took = signalled.elapsed();
    assert!(status.success(), "{status:?}");
    assert!(took < Duration::from_secs(20), "the process took {took:?} to end after SIGTERM");
    assert!(gw.logs().contains("connections still open were closed"), "{}", gw.logs());
}
