//! Serves the router over HTTP/1.1 and HTTP/2 (hyper-util's auto connection builder), with a
//! graceful stop: once `shutdown` completes no connection is accepted, and open connections
//! finish their requests and close.
//!
//! Unlike `axum::serve`, this bounds what connections can hold ([`ConnectionLimits`]):
//! - at most `max_connections` at once: beyond them the gateway stops accepting, and new
//!   connections wait in the kernel's listen backlog until one closes;
//! - a connection that has started a request head must complete it within
//!   `header_read_timeout` (a slowloris client trickling its headers is closed);
//! - a connection with no request open and none started is closed after `idle_timeout`
//!   (HTTP/1.1 keep-alive and HTTP/2 alike; HTTP/2 pings do not count as requests);
//! - a connection whose pending response makes no progress for `write_timeout` is closed: a
//!   write the socket has not taken (a client that stops reading; HTTP/1.1 pipelining behind
//!   it), or a response body HTTP/2 does not read for sending (a peer holding its flow-control
//!   window at zero). A client that stops reading holds a connection no longer than this;
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
//! from the bytes the connection reads and the requests it has open.

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
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

mod activity;
mod tracked;

use activity::Activity;
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
    pub(crate) header_read_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    /// How long a pending response may make no progress.
    pub(crate) write_timeout: Duration,
    /// How long open connections get to finish on shutdown.
    pub(crate) shutdown_wait: Duration,
    /// The largest header list an HTTP/2 peer may send (the gateway's header limit).
    pub(crate) max_header_list_bytes: usize,
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
    let (stopping, connections) = (CancellationToken::new(), TaskTracker::new());
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => slot.expect("the connection limiter is never closed"),
            () = &mut shutdown => break,
        };
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
        let (builder, router, stopping, tls) = (Arc::clone(&builder), router.clone(), stopping.clone(), tls.clone());
        connections.spawn(async move {
            if let Err(error) = stream.set_nodelay(true) {
                tracing::debug!(%error, "http.nodelay_failed");
            }
            match tls {
                None => serve_connection(&builder, stream, peer, router, limits, stopping).await,
                // The handshake gets the time a request head gets.
                Some(acceptor) => match tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream)).await
                {
                    Ok(Ok(stream)) => serve_connection(&builder, stream, peer, router, limits, stopping).await,
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

/// Serves one connection until it ends, times out (head or idle), or the server stops.
async fn serve_connection<S>(
    builder: &auto::Builder<TokioExecutor>,
    stream: S,
    peer: SocketAddr,
    router: Router,
    limits: ConnectionLimits,
    stopping: CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(TrackedStream::new(stream, Arc::clone(&activity)));
    let service = TowerToHyperService::new(TrackedRouter { router, activity: Arc::clone(&activity), peer });
    let connection = builder.serve_connection_with_upgrades(io, service);
    let mut connection = std::pin::pin!(connection);
    let reason = loop {
        let changed = activity.changed.notified();
        let deadline = activity.deadline(&limits);
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(%error, "http.connection_closed_with_error");
                }
                return;
            }
            () = changed => continue,
            () = stopping.cancelled() => break "shutdown",
            () = sleep_until(deadline) => {
                if let Some(reason) = activity.expired(&limits) {
                    break reason;
                }
            }
        }
    };
    tracing::debug!(reason, "http.connection_closing");
    connection.as_mut().graceful_shutdown();
    let grace = if reason == "shutdown" { None } else { Some(CLOSE_GRACE) };
    let finished = match grace {
        Some(grace) => tokio::time::timeout(grace, connection.as_mut()).await.ok(),
        None => Some(connection.as_mut().await),
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
