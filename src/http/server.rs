//! Serves the router over HTTP/1.1 and HTTP/2 (hyper-util's auto connection builder), with a
//! graceful stop: once `shutdown` completes no connection is accepted, and open connections
//! finish their requests and close.
//!
//! Unlike `axum::serve`, this bounds what connections can hold ([`ConnectionLimits`]):
//! - at most `max_connections` at once: beyond them the gateway stops accepting, and new
//!   connections wait in the kernel's listen backlog ([`listen`]: as long as `max_connections`)
//!   until one closes; one that arrives while every place is taken makes the connection idle
//!   the longest close (`server/connections.rs`), so idle connections (keep-alive clients, or
//!   clients whose answers all sit unread in their kernel's buffers) cannot lock others out;
//! - at most `max_connections_per_peer` from one peer (an IPv4 address, an IPv6 /64), when set:
//!   more are closed as they are accepted;
//! - a connection that has started a request head must complete it within
//!   `header_read_timeout` (a slowloris client trickling its headers is closed); before its
//!   first request this holds for HTTP/2 too (its preface and settings are that head);
//! - a connection with no request open and none started is closed after `idle_timeout`
//!   (HTTP/1.1 keep-alive and HTTP/2 alike; HTTP/2 pings do not count as requests);
//! - what a connection's answers hold unsent is bounded and must leave at a minimum rate
//!   (`sending`, `server/send_backlog.rs`): a connection that already holds
//!   `max_unsent_bytes` may not start another answer, and one whose answers leave slower
//!   than `min_rate_bytes_per_sec` over a `window` (or whose response body hyper does not ask
//!   for during one: an HTTP/2 window held at zero) is dropped at once. A client that stops
//!   reading, or takes a byte now and then, holds a connection for about one window;
//! - HTTP/2's limits are explicit: concurrent streams, flow-control windows, the header list
//!   (the gateway's header limit), the send buffer per stream;
//! - on shutdown, open connections get `shutdown_wait` to finish, then are closed.
//! - each HTTP/1 connection's read buffer is capped ([`http1_read_buffer_bytes`]): hyper grows
//!   a connection's buffer up to about 400 KiB while it reads a large body and keeps it for the
//!   connection's life (a thousand extractors on keep-alive connections each posting a 1 MiB
//!   body held 400 MiB of idle buffers). A request head larger than that buffer is refused by
//!   hyper itself with a bare 431 (the gateway cannot add a problem document there).
//!
//! hyper's own HTTP/1 header timeout also runs while a keep-alive connection waits for its next
//! request, so it cannot tell an idle client from a slow one; [`Activity`] does both here,
//! from the bytes the connection reads and the requests it has open. The protocol is the one
//! hyper reads the requests in, never guessed from the first bytes read. Every close for a
//! limit, and every refusal, is counted in `/metrics` by reason (`telemetry`).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::telemetry;

mod activity;
mod connections;
mod send_backlog;
mod tracked;

use activity::{Activity, CloseReason};
use connections::{Admitted, OpenConnections};
pub(crate) use send_backlog::SendLimits;
use tracked::{TrackedRouter, TrackedStream};

/// The smallest read buffer given to a connection: reads of this size keep the loopback and
/// the network busy (the benchmark's K=8 figures stayed within 5% of those with 400 KiB).
const MIN_HTTP1_READ_BUFFER_BYTES: usize = 64 * 1024;

/// The read buffer of an HTTP/1 connection: room for a request head at the configured URI and
/// header limits (so those limits answer with a problem document, not hyper's bare 431), and
/// never below [`MIN_HTTP1_READ_BUFFER_BYTES`].
pub(crate) fn http1_read_buffer_bytes(max_uri_bytes: usize, max_header_bytes: usize) -> usize {
    (max_uri_bytes + max_header_bytes).saturating_mul(2).max(MIN_HTTP1_READ_BUFFER_BYTES)
}

/// Connections the kernel may hold completed but not yet accepted, at least: tokio's (and
/// std's) default. The kernel caps it at `net.core.somaxconn`.
const MIN_LISTEN_BACKLOG: u32 = 1024;

/// Listens on `address` with a backlog of `max_connections` (at least [`MIN_LISTEN_BACKLOG`]).
/// The backlog is where connections wait while every place is taken, and where a burst of them
/// waits to be accepted. tokio's 1,024 was below the 2,048 connections served by default: a
/// burst larger than the backlog overflows it, and the kernel drops the handshake's last packet
/// (the client's connection stalls until retransmissions get it in).
pub(crate) fn listen(address: SocketAddr, max_connections: usize) -> std::io::Result<TcpListener> {
    let socket = if address.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    // As std's and tokio's `bind` do on Unix: a restarted gateway rebinds at once.
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    let backlog = u32::try_from(max_connections).unwrap_or(u32::MAX).max(MIN_LISTEN_BACKLOG);
    socket.listen(backlog)
}

/// The soft limit on open files of this process (`ulimit -n`), from `/proc/self/limits`.
pub(crate) fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|line| line.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// The fewest header fields hyper's HTTP/1 parser takes in one head: far beyond what a client
/// sends, so a head over the gateway's own count limit is answered with its problem document.
/// hyper makes room for all of them at every head it parses (64 bytes a field: 64 KiB here;
/// a head of the read buffer's own worst case, `read_buffer_bytes / 4` fields, cost 1 MiB at
/// every request, 1% of the gateway's CPU at K=8).
const MIN_HTTP1_HEADER_FIELDS_PARSED: usize = 1024;

/// The header fields hyper's HTTP/1 parser takes in one head: at least one beyond the gateway's
/// count limit (which then answers with `headers_too_large`), and never below
/// [`MIN_HTTP1_HEADER_FIELDS_PARSED`]. A head with more gets hyper's bare 431.
pub(crate) fn http1_header_fields_parsed(max_header_count: usize) -> usize {
    max_header_count.saturating_add(1).max(MIN_HTTP1_HEADER_FIELDS_PARSED)
}

/// How long a connection that was asked to close may take to finish before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// HTTP/2 streams one connection may have open at once (RFC 9113 recommends no fewer than 100).
const HTTP2_MAX_CONCURRENT_STREAMS: u32 = 100;
/// HTTP/2 flow-control windows the gateway grants a peer: per stream, and per connection.
const HTTP2_STREAM_WINDOW_BYTES: u32 = 1024 * 1024;
const HTTP2_CONNECTION_WINDOW_BYTES: u32 = 4 * 1024 * 1024;
/// Response bytes HTTP/2 buffers per stream before the body waits.
const HTTP2_MAX_SEND_BUFFER_BYTES: usize = 1024 * 1024;

/// What one connection may hold, and how many there may be.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnectionLimits {
    pub(crate) read_buffer_bytes: usize,
    /// The header fields an HTTP/1 head may have before hyper refuses it itself.
    pub(crate) http1_header_fields_parsed: usize,
    pub(crate) max_connections: usize,
    /// Connections one peer may have open at once (`None`: no cap).
    pub(crate) max_connections_per_peer: Option<usize>,
    pub(crate) header_read_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    /// What a connection's answers may hold unsent, and how fast they must leave.
    pub(crate) sending: SendLimits,
    /// How long open connections get to finish on shutdown.
    pub(crate) shutdown_wait: Duration,
    /// The largest header list an HTTP/2 peer may send (the gateway's header limit).
    pub(crate) max_header_list_bytes: usize,
}

/// The limits the unit tests run under: 30 s windows of 1 KiB/s, 256 KiB unsent, 2 per peer.
#[cfg(test)]
fn test_limits() -> ConnectionLimits {
    ConnectionLimits {
        read_buffer_bytes: MIN_HTTP1_READ_BUFFER_BYTES,
        http1_header_fields_parsed: MIN_HTTP1_HEADER_FIELDS_PARSED,
        max_connections: 4,
        max_connections_per_peer: Some(2),
        header_read_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(60),
        sending: SendLimits {
            max_unsent_bytes: 256 * 1024,
            min_rate_bytes_per_sec: 1024,
            window: Duration::from_secs(30),
        },
        shutdown_wait: Duration::from_secs(30),
        max_header_list_bytes: 16 * 1024,
    }
}

/// Serves `router` on `listener` until `shutdown` completes, then waits for open connections.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    tls: Option<TlsAcceptor>,
    shutdown: impl Future<Output = ()>,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // Every head that fits the buffer, with no more fields than the parser takes, reaches the
    // gateway's own limits (`api::protect`), whose answers are problem documents.
    builder.http1().max_buf_size(limits.read_buffer_bytes).max_headers(limits.http1_header_fields_parsed);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(HTTP2_MAX_CONCURRENT_STREAMS)
        .initial_stream_window_size(HTTP2_STREAM_WINDOW_BYTES)
        .initial_connection_window_size(HTTP2_CONNECTION_WINDOW_BYTES)
        .max_header_list_size(u32::try_from(limits.max_header_list_bytes).unwrap_or(u32::MAX))
        .max_send_buf_size(HTTP2_MAX_SEND_BUFFER_BYTES);
    let builder = Arc::new(builder);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let open = OpenConnections::new(limits.max_connections_per_peer);
    let (stopping, connections) = (CancellationToken::new(), TaskTracker::new());
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors and the like: wait a little rather than spin.
                    tracing::warn!(%error, "http.accept_failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Some(admitted) = open.admit(peer) else {
            telemetry::ConnectionRefused { reason: "per_peer_limit", peer }.emit();
            continue;
        };
        let slot = tokio::select! {
            slot = place(&slots, &open) => slot,
            () = &mut shutdown => break,
        };
        let activity = Arc::new(Activity::new(limits));
        admitted.served(Arc::clone(&activity));
        let (builder, router, stopping, tls) = (Arc::clone(&builder), router.clone(), stopping.clone(), tls.clone());
        let connection = Connection { peer, activity, admitted, router, stopping };
        connections.spawn(async move {
            if let Err(error) = stream.set_nodelay(true) {
                tracing::debug!(%error, "http.nodelay_failed");
            }
            match tls {
                None => serve_connection(&builder, stream, connection).await,
                // The handshake gets the time a request head gets.
                Some(acceptor) => match tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream)).await
                {
                    Ok(Ok(stream)) => serve_connection(&builder, stream, connection).await,
                    Ok(Err(error)) => tracing::debug!(%error, "http.tls_handshake_failed"),
                    Err(_) => tracing::debug!("http.tls_handshake_timed_out"),
                },
            }
            drop(slot);
        });
    }
    drop(listener);
    stopping.cancel();
    connections.close();
    if tokio::time::timeout(limits.shutdown_wait, connections.wait()).await.is_err() {
        tracing::warn!(wait_secs = limits.shutdown_wait.as_secs(), "shutdown: connections still open were closed");
    }
}

/// A place for an accepted connection: at once when one is free; otherwise the connection idle
/// the longest is asked to close (again every second while none is idle) until one is.
async fn place(slots: &Arc<Semaphore>, open: &OpenConnections) -> OwnedSemaphorePermit {
    if let Ok(slot) = Arc::clone(slots).try_acquire_owned() {
        return slot;
    }
    loop {
        open.close_longest_idle();
        tokio::select! {
            slot = Arc::clone(slots).acquire_owned() => return slot.expect("the connection limiter is never closed"),
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// One accepted connection and what serves it.
#[derive(Debug)]
struct Connection {
    peer: SocketAddr,
    activity: Arc<Activity>,
    /// Its place among the open connections, given back when it ends.
    admitted: Admitted,
    router: Router,
    stopping: CancellationToken,
}

/// Serves one connection until it ends, a limit closes it, or the server stops.
async fn serve_connection<S>(builder: &auto::Builder<TokioExecutor>, stream: S, connection: Connection)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // Its place among the open connections is given back when this returns.
    let Connection { peer, activity, admitted: _admitted, router, stopping } = connection;
    let io = TokioIo::new(TrackedStream::new(stream, Arc::clone(&activity)));
    let service = TowerToHyperService::new(TrackedRouter { router, activity: Arc::clone(&activity), peer });
    let connection = builder.serve_connection_with_upgrades(io, service);
    let mut connection = std::pin::pin!(connection);
    let reason = loop {
        let changed = activity.changed.notified();
        let deadline = activity.deadline();
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%error, "http.connection_closed_with_error");
                }
                return;
            }
            () = changed => {}
            () = stopping.cancelled() => break CloseReason::Shutdown,
            () = sleep_until(deadline) => {}
        }
        if let Some(reason) = activity.expired() {
            break reason;
        }
    };
    telemetry::ConnectionClosing { reason: reason.as_str() }.emit();
    if reason.is_abrupt() {
        // What it holds is the problem: dropped at once, its streams and buffers with it.
        return;
    }
    connection.as_mut().graceful_shutdown();
    let finished = match reason {
        CloseReason::Shutdown => Some(connection.as_mut().await),
        _ => tokio::time::timeout(CLOSE_GRACE, connection.as_mut()).await.ok(),
    };
    if let Some(Err(error)) = finished {
        tracing::debug!(%error, "http.connection_closed_with_error");
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
