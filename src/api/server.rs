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
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

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

/// How long a connection that was asked to close may take to finish before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// What one connection may hold, and how many there may be.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnectionLimits {
    pub(crate) read_buffer_bytes: usize,
    pub(crate) max_connections: usize,
    pub(crate) header_read_timeout: Duration,
    pub(crate) idle_timeout: Duration,
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
    // Every head that fits the buffer reaches the gateway's own limits (`api::protect`), whose
    // answers are problem documents; the count of header fields is one of them.
    builder.http1().max_buf_size(limits.read_buffer_bytes).max_headers(limits.read_buffer_bytes / 4);
    builder.http2().timer(TokioTimer::new());
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
    connections.wait().await;
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
    let io = TokioIo::new(TrackedStream { inner: stream, activity: Arc::clone(&activity) });
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

/// What one connection is doing, as far as its limits care.
#[derive(Debug)]
struct Activity {
    state: Mutex<ActivityState>,
    /// Woken when requests open or close and when a request head starts.
    changed: Notify,
}

#[derive(Debug, Clone, Copy)]
struct ActivityState {
    open_requests: usize,
    /// Since when no request is open (or since the connection was accepted).
    waiting_since: Instant,
    /// When the first byte after that arrived: a request head has started (HTTP/1).
    head_started: Option<Instant>,
    /// The connection speaks HTTP/2 (its reads without an open stream are frames such as
    /// pings, not a request head).
    http2: bool,
    /// The connection has read nothing yet.
    fresh: bool,
}

/// The client preface's first bytes (RFC 9113, section 3.4).
const HTTP2_PREFACE_START: &[u8] = b"PRI *";

impl Activity {
    fn new() -> Self {
        let state = ActivityState {
            open_requests: 0,
            waiting_since: Instant::now(),
            head_started: None,
            http2: false,
            fresh: true,
        };
        Self { state: Mutex::new(state), changed: Notify::new() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ActivityState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Bytes arrived: with no request open, an HTTP/1 request head has started.
    fn read(&self, bytes: &[u8]) {
        let mut state = self.lock();
        if state.fresh {
            state.fresh = false;
            state.http2 = bytes.starts_with(HTTP2_PREFACE_START);
        }
        if state.open_requests == 0 && state.head_started.is_none() && !state.http2 {
            state.head_started = Some(Instant::now());
            drop(state);
            self.changed.notify_one();
        }
    }

    fn request_opened(&self) {
        let mut state = self.lock();
        state.open_requests += 1;
        state.head_started = None;
        drop(state);
        self.changed.notify_one();
    }

    fn request_closed(&self) {
        let mut state = self.lock();
        state.open_requests = state.open_requests.saturating_sub(1);
        if state.open_requests == 0 {
            state.waiting_since = Instant::now();
            state.head_started = None;
        }
        drop(state);
        self.changed.notify_one();
    }

    /// When the connection times out unless something happens first; `None` while a request
    /// is open.
    fn deadline(&self, limits: &ConnectionLimits) -> Option<Instant> {
        let state = *self.lock();
        if state.open_requests > 0 {
            return None;
        }
        Some(match state.head_started {
            Some(started) => started + limits.header_read_timeout,
            None => state.waiting_since + limits.idle_timeout,
        })
    }

    /// Why the connection must close now, if it must.
    fn expired(&self, limits: &ConnectionLimits) -> Option<&'static str> {
        let deadline = self.deadline(limits)?;
        (Instant::now() >= deadline)
            .then(|| if self.lock().head_started.is_some() { "header_timeout" } else { "idle_timeout" })
    }
}

/// The TCP stream, telling [`Activity`] what it reads.
#[derive(Debug)]
struct TrackedStream<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for TrackedStream<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read(&buf.filled()[before..]);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for TrackedStream<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// The router, telling [`Activity`] which requests are open: from the call until its response
/// body has been sent (or dropped).
#[derive(Debug, Clone)]
struct TrackedRouter {
    router: Router,
    activity: Arc<Activity>,
    /// The client's address, for the handlers (`ConnectInfo`) and the audit trail.
    peer: SocketAddr,
}

impl tower::Service<Request<hyper::body::Incoming>> for TrackedRouter {
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, std::convert::Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<hyper::body::Incoming>) -> Self::Future {
        let open = OpenRequest::new(Arc::clone(&self.activity));
        request.extensions_mut().insert(axum::extract::ConnectInfo(self.peer));
        let mut router = self.router.clone();
        Box::pin(async move {
            let response = tower::Service::call(&mut router, request.map(Body::new)).await?;
            Ok(response.map(|body| Body::new(TrackedBody { body, _open: open })))
        })
    }
}

/// One open request; closed when dropped (with its response body).
#[derive(Debug)]
struct OpenRequest(Arc<Activity>);

impl OpenRequest {
    fn new(activity: Arc<Activity>) -> Self {
        activity.request_opened();
        Self(activity)
    }
}

impl Drop for OpenRequest {
    fn drop(&mut self) {
        self.0.request_closed();
    }
}

/// A response body that keeps its request open until it is sent or dropped.
#[derive(Debug)]
struct TrackedBody {
    body: Body,
    _open: OpenRequest,
}

impl http_body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_read_buffer_fits_the_request_head_limits() {
        assert_eq!(http1_read_buffer_bytes(4096, 16 * 1024), MIN_HTTP1_READ_BUFFER_BYTES);
        assert_eq!(http1_read_buffer_bytes(4096, 60 * 1024), 2 * (4096 + 60 * 1024));
    }

    fn limits() -> ConnectionLimits {
        ConnectionLimits {
            read_buffer_bytes: MIN_HTTP1_READ_BUFFER_BYTES,
            max_connections: 1,
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn idle_connections_and_slow_heads_time_out_open_requests_never() {
        let activity = Activity::new();
        assert_eq!(activity.deadline(&limits()), Some(activity.lock().waiting_since + Duration::from_secs(60)));
        tokio::time::advance(Duration::from_secs(61)).await;
        assert_eq!(activity.expired(&limits()), Some("idle_timeout"));
        activity.read(b"GET / HTTP/1.1\r\n");
        assert_eq!(activity.expired(&limits()), None, "a head has started: it has ten seconds");
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(activity.expired(&limits()), Some("header_timeout"));
        activity.request_opened();
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert_eq!(activity.deadline(&limits()), None, "an open request never times out here");
        activity.request_closed();
        assert_eq!(activity.expired(&limits()), None, "idle again, from now");
    }

    #[tokio::test(start_paused = true)]
    async fn http2_frames_without_a_request_are_idleness() {
        let activity = Activity::new();
        activity.read(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
        activity.read(b"ping");
        tokio::time::advance(Duration::from_secs(11)).await;
        assert_eq!(activity.expired(&limits()), None, "not a slow head");
        tokio::time::advance(Duration::from_secs(50)).await;
        assert_eq!(activity.expired(&limits()), Some("idle_timeout"));
    }
}
