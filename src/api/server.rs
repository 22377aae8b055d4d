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

use super::http2_frames::DataFrameCounter;

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
    // Every head that fits the buffer reaches the gateway's own limits (`api::protect`), whose
    // answers are problem documents; the count of header fields is one of them.
    builder.http1().max_buf_size(limits.read_buffer_bytes).max_headers(limits.read_buffer_bytes / 4);
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
    /// Responses produced whose bodies are not sent yet.
    responses_pending: usize,
    /// The last progress of a pending response: its body read for sending (or produced).
    response_progress: Instant,
    /// Since when a write waits for the socket to take bytes (it is full: the peer reads
    /// nothing), if one does.
    write_blocked_since: Option<Instant>,
    /// HTTP/2: response body bytes handed over for sending, and those written in DATA frames;
    /// while the first exceed the second, the last time DATA reached the socket.
    body_bytes_handed_over: u64,
    data_bytes_written: u64,
    data_progress: Instant,
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
            responses_pending: 0,
            response_progress: Instant::now(),
            write_blocked_since: None,
            body_bytes_handed_over: 0,
            data_bytes_written: 0,
            data_progress: Instant::now(),
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

    /// A response was produced: its body is to be sent from now.
    fn response_started(&self) {
        let mut state = self.lock();
        state.responses_pending += 1;
        state.response_progress = Instant::now();
        drop(state);
        self.changed.notify_one();
    }

    /// A pending response's body was read for sending (or ended).
    fn response_progressed(&self) {
        self.lock().response_progress = Instant::now();
    }

    /// A response body's data frame was handed over for sending.
    fn body_handed_over(&self, bytes: u64) {
        let mut state = self.lock();
        if state.body_bytes_handed_over == state.data_bytes_written {
            state.data_progress = Instant::now();
        }
        state.body_bytes_handed_over += bytes;
        drop(state);
        self.changed.notify_one();
    }

    /// HTTP/2 DATA payload reached the socket.
    fn data_written(&self, bytes: u64) {
        let mut state = self.lock();
        state.data_bytes_written += bytes;
        state.data_progress = Instant::now();
    }

    fn is_http2(&self) -> bool {
        self.lock().http2
    }

    fn response_ended(&self) {
        let mut state = self.lock();
        state.responses_pending = state.responses_pending.saturating_sub(1);
        state.response_progress = Instant::now();
    }

    /// A write to the socket waits (`true`: it is full) or went through (`false`).
    fn write_blocked(&self, blocked: bool) {
        let mut state = self.lock();
        match (blocked, state.write_blocked_since) {
            (true, None) => {
                state.write_blocked_since = Some(Instant::now());
                drop(state);
                self.changed.notify_one();
            }
            (false, Some(_)) => state.write_blocked_since = None,
            _ => {}
        }
    }

    /// When the connection times out unless something happens first, and why; `None` while a
    /// request is open and its response (if any) makes progress.
    fn deadline_and_reason(&self, limits: &ConnectionLimits) -> Option<(Instant, &'static str)> {
        let state = *self.lock();
        let waiting = if state.open_requests > 0 {
            (state.responses_pending > 0).then(|| (state.response_progress + limits.write_timeout, "write_timeout"))
        } else {
            Some(match state.head_started {
                Some(started) => (started + limits.header_read_timeout, "header_timeout"),
                None => (state.waiting_since + limits.idle_timeout, "idle_timeout"),
            })
        };
        let blocked = state.write_blocked_since.map(|since| (since + limits.write_timeout, "write_timeout"));
        // HTTP/2 takes a whole body into its buffers: what the peer's window holds back shows
        // as data handed over and not written.
        let unsent = (state.http2 && state.body_bytes_handed_over > state.data_bytes_written)
            .then(|| (state.data_progress + limits.write_timeout, "write_timeout"));
        [waiting, blocked, unsent].into_iter().flatten().min_by_key(|(deadline, _)| *deadline)
    }

    /// When the connection times out unless something happens first.
    fn deadline(&self, limits: &ConnectionLimits) -> Option<Instant> {
        self.deadline_and_reason(limits).map(|(deadline, _)| deadline)
    }

    /// Why the connection must close now, if it must.
    fn expired(&self, limits: &ConnectionLimits) -> Option<&'static str> {
        let (deadline, reason) = self.deadline_and_reason(limits)?;
        (Instant::now() >= deadline).then_some(reason)
    }
}

/// The TCP stream, telling [`Activity`] what it reads.
#[derive(Debug)]
struct TrackedStream<S> {
    inner: S,
    activity: Arc<Activity>,
    /// HTTP/2: the DATA payload in what the connection writes.
    frames: DataFrameCounter,
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

impl<S> TrackedStream<S> {
    fn new(inner: S, activity: Arc<Activity>) -> Self {
        Self { inner, activity, frames: DataFrameCounter::default() }
    }

    /// Tells [`Activity`] whether a write is waiting for the socket.
    fn track_write<T>(&self, polled: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        self.activity.write_blocked(polled.is_pending());
        polled
    }

    /// Tells [`Activity`] of the HTTP/2 DATA among `written` (the bytes the socket took).
    fn track_data(&mut self, written: &[u8]) {
        if !written.is_empty() && self.activity.is_http2() {
            let data = self.frames.data_bytes(written);
            if data > 0 {
                self.activity.data_written(data);
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for TrackedStream<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(written)) = polled {
            self.track_data(&buf[..written]);
        }
        self.track_write(polled)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.track_write(polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(mut written)) = polled {
            for buf in bufs {
                let taken = written.min(buf.len());
                self.track_data(&buf[..taken]);
                written -= taken;
                if written == 0 {
                    break;
                }
            }
        }
        self.track_write(polled)
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
            let pending = PendingResponse::new(Arc::clone(&open.0));
            Ok(response.map(|body| Body::new(TrackedBody { body, pending, _open: open })))
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

/// A response produced and not yet sent; ended when dropped (with its body).
#[derive(Debug)]
struct PendingResponse(Arc<Activity>);

impl PendingResponse {
    fn new(activity: Arc<Activity>) -> Self {
        activity.response_started();
        Self(activity)
    }
}

impl Drop for PendingResponse {
    fn drop(&mut self) {
        self.0.response_ended();
    }
}

/// A response body that keeps its request open until it is sent or dropped, and tells
/// [`Activity`] each time it is read for sending.
#[derive(Debug)]
struct TrackedBody {
    body: Body,
    pending: PendingResponse,
    _open: OpenRequest,
}

impl http_body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        self.pending.0.response_progressed();
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            self.pending.0.body_handed_over(data.len() as u64);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
