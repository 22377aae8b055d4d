//! HTTP/2 peers that take their answers a byte at a time cost the gateway neither its memory
//! nor its connections: 400 peers, each with 20 streams open under a window of 1 that it widens
//! by one byte per stream every 2 s (`WINDOW_UPDATE` of 1: progress on the connection every
//! 100 ms), leave the gateway's peak resident memory within 128 MiB of where it was and a
//! normal client served within 5 s, although they are as many as the connections it takes; so
//! do the same peers when their preface reaches the gateway in two reads.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use reqwest::StatusCode;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::support::{Gateway, GatewayOptions};

/// The client preface (RFC 9113, section 3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How much more resident memory the attack may cost the gateway.
const MAX_RSS_GROWTH_KIB: u64 = 128 * 1024;

/// What the trickling peers do.
#[derive(Debug, Clone, Copy)]
struct Trickle {
    peers: usize,
    streams_per_peer: usize,
    /// What every stream asks for: a rendered answer larger than its window.
    path: &'static str,
    /// The preface's first two bytes go alone, then the rest with the first frames.
    split_preface: bool,
    /// How long a stream waits before it widens its window by the byte it received.
    every: Duration,
}

/// A resident-memory figure of the gateway, in KiB (`VmRSS`, or `VmHWM`: the peak so far).
fn memory_kib(gw: &Gateway, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", gw.pid())).expect("the gateway's status");
    let line = status.lines().find(|l| l.starts_with(field)).unwrap_or_else(|| panic!("{field} in the status"));
    line.split_whitespace().nth(1).and_then(|kib| kib.parse().ok()).expect("a figure in kB")
}

/// The connection as h2 sees it: its first `skip` bytes written are swallowed (the test wrote
/// them itself, in a read of their own on the gateway's side).
#[derive(Debug)]
struct SplitPreface {
    inner: TcpStream,
    skip: usize,
}

impl AsyncRead for SplitPreface {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for SplitPreface {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if self.skip > 0 {
            let skipped = self.skip.min(buf.len());
            self.skip -= skipped;
            return std::task::Poll::Ready(Ok(skipped));
        }
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Connects, with the preface split when `trickle` says so.
async fn connect(address: &str, trickle: Trickle) -> std::io::Result<SplitPreface> {
    let mut stream = TcpStream::connect(address).await?;
    stream.set_nodelay(true)?;
    if !trickle.split_preface {
        return Ok(SplitPreface { inner: stream, skip: 0 });
    }
    stream.write_all(&PREFACE[..2]).await?;
    tokio::time::sleep(Duration::from_millis(100)).await;
    Ok(SplitPreface { inner: stream, skip: 2 })
}

/// Peers connecting at once, at most: a burst beyond the listen backlog makes the kernel answer
/// with SYN cookies, and a connection established from the cookie in the segment after the
/// preface's first two bytes loses them (seen as a connection refused for `I * HTTP/2.0`).
const CONNECTING_AT_ONCE: usize = 32;

/// One trickling peer, until the gateway closes its connection or `until`. It holds its place
/// among the peers connecting (`connecting`) until its first answer's head arrives. Its streams'
/// errors (the gateway closed them) end them; nothing else is expected of the gateway here.
async fn trickling_peer(
    address: String,
    trickle: Trickle,
    connecting: Arc<Semaphore>,
    until: Instant,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut connecting = Some(connecting.acquire_owned().await?);
    let io = connect(&address, trickle).await?;
    let (client, connection) = h2::client::Builder::new().initial_window_size(1).handshake::<_, Bytes>(io).await?;
    let mut tasks = JoinSet::new();
    tasks.spawn(async move {
        let _ = connection.await;
    });
    for _ in 0..trickle.streams_per_peer {
        let mut client = client.clone().ready().await?;
        let request = hyper::Request::get(format!("http://{address}{}", trickle.path)).body(())?;
        let (response, _) = client.send_request(request, true)?;
        let connected = connecting.take();
        tasks.spawn(async move {
            let response = response.await;
            drop(connected);
            let Ok(response) = response else { return };
            let mut body = response.into_body();
            while let Some(Ok(chunk)) = body.data().await {
                tokio::time::sleep(trickle.every).await;
                let _ = body.flow_control().release_capacity(chunk.len());
            }
        });
    }
    // The connection task ends first when the gateway closes the connection.
    let _ = tokio::time::timeout_at(until, tasks.join_next()).await;
    Ok(())
}

/// `GET /healthz` on a new connection, within `patience`.
async fn healthz(gw: &Gateway, patience: Duration) -> Option<StatusCode> {
    let client = reqwest::Client::builder().timeout(patience).build().unwrap();
    client.get(gw.url("/healthz")).send().await.ok().map(|response| response.status())
}

/// Runs `trickle` against a gateway taking as many connections as there are peers (so a peer
/// holding its connection locks a client out): once the peers have trickled for two write
/// windows, a normal client is served within 5 s, and the gateway's peak resident memory stays
/// within [`MAX_RSS_GROWTH_KIB`] of what it was before.
async fn trickling_peers_leave_memory_bounded_and_others_served(trickle: Trickle) {
    const WRITE_TIMEOUT_SECS: u64 = 3;
    let gw = GatewayOptions::new()
        .env("FILAMENT_MAX_CONNECTIONS", &trickle.peers.to_string())
        .env("FILAMENT_WRITE_TIMEOUT_SECS", &WRITE_TIMEOUT_SECS.to_string())
        // Longer than the test: a connection taken for HTTP/1 is not saved by a slow-head close.
        .env("FILAMENT_HEADER_READ_TIMEOUT_SECS", "60")
        .spawn()
        .await;
    assert_eq!(healthz(&gw, Duration::from_secs(5)).await, Some(StatusCode::OK));
    let before_kib = memory_kib(&gw, "VmRSS:");
    let address = gw.base_url.trim_start_matches("http://").to_string();
    let until = Instant::now() + Duration::from_secs(4 * WRITE_TIMEOUT_SECS);
    let connecting = Arc::new(Semaphore::new(CONNECTING_AT_ONCE));
    let mut peers = JoinSet::new();
    for _ in 0..trickle.peers {
        peers.spawn(trickling_peer(address.clone(), trickle, Arc::clone(&connecting), until));
    }
    tokio::time::sleep(Duration::from_secs(2 * WRITE_TIMEOUT_SECS)).await;
    let asked = Instant::now();
    let served = healthz(&gw, Duration::from_secs(5)).await;
    let waited = asked.elapsed();
    while let Some(peer) = peers.join_next().await {
        peer.expect("a trickling peer panicked").ok();
    }
    let peak_kib = memory_kib(&gw, "VmHWM:");
    assert!(
        peak_kib.saturating_sub(before_kib) < MAX_RSS_GROWTH_KIB,
        "{trickle:?}: the gateway's resident memory grew from {before_kib} KiB to a peak of {peak_kib} KiB"
    );
    assert_eq!(served, Some(StatusCode::OK), "{trickle:?}: a normal client waited {waited:?}");
}

/// Each stream holds the largest answer a caller without a credential gets (the OpenAPI
/// document, 66 KB): the connection holds its allowance of unsent bytes after four and is
/// closed at its fifth.
#[tokio::test(flavor = "multi_thread")]
async fn http2_peers_trickling_window_updates_leave_memory_bounded_and_others_served() {
    trickling_peers_leave_memory_bounded_and_others_served(Trickle {
        peers: 400,
        streams_per_peer: 20,
        path: "/openapi.json",
        split_preface: false,
        every: Duration::from_secs(2),
    })
    .await;
}

/// Small answers (`/metrics` of a fresh gateway, under 1 KB) never reach the allowance: the
/// rate closes these connections, which it can only if they are known to speak HTTP/2 (their
/// DATA counted) although the preface came in two reads.
#[tokio::test(flavor = "multi_thread")]
async fn http2_peers_whose_preface_arrives_in_two_reads_are_judged_as_http2() {
    trickling_peers_leave_memory_bounded_and_others_served(Trickle {
        peers: 400,
        streams_per_peer: 20,
        path: "/metrics",
        split_preface: true,
        every: Duration::from_secs(2),
    })
    .await;
}
