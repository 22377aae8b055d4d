//! The connection's stream, router and response bodies, each telling [`Activity`] what it
//! sees: bytes read (a request head starting), writes the socket takes or not (and the HTTP/2
//! DATA among them), flushes, requests opened (with the protocol hyper read them in) and
//! closed, answers produced (with the size their bodies announce) and handed over for sending.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::activity::Activity;
use crate::http::http2_frames::DataFrameCounter;

/// The TCP stream, telling [`Activity`] what it reads.
#[derive(Debug)]
pub(super) struct TrackedStream<S> {
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
            self.activity.read();
        }
        polled
    }
}

impl<S> TrackedStream<S> {
    pub(super) fn new(inner: S, activity: Arc<Activity>) -> Self {
        Self { inner, activity, frames: DataFrameCounter::default() }
    }

    /// Tells [`Activity`] whether a write is waiting for the socket.
    fn track_write<T>(&self, polled: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        self.activity.write_blocked(polled.is_pending());
        polled
    }

    /// Tells [`Activity`] of the answers' bytes among `written` (the bytes the socket took).
    fn track_data(&mut self, written: &[u8]) {
        if !written.is_empty() {
            self.activity.written(written, &mut self.frames);
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
        if matches!(polled, Poll::Ready(Ok(()))) {
            self.activity.flushed();
        }
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
pub(super) struct TrackedRouter {
    pub(super) router: Router,
    pub(super) activity: Arc<Activity>,
    /// The client's address, for the handlers (`ConnectInfo`) and the audit trail.
    pub(super) peer: SocketAddr,
}

impl tower::Service<Request<hyper::body::Incoming>> for TrackedRouter {
    type Response = Response;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, std::convert::Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<hyper::body::Incoming>) -> Self::Future {
        let open = OpenRequest::new(Arc::clone(&self.activity), request.version());
        request.extensions_mut().insert(axum::extract::ConnectInfo(self.peer));
        let mut router = self.router.clone();
        Box::pin(async move {
            let response = tower::Service::call(&mut router, request.map(Body::new)).await?;
            let announced_bytes = http_body::Body::size_hint(response.body()).lower();
            let open = open.responding(announced_bytes);
            Ok(response.map(|body| Body::new(TrackedBody { body, open })))
        })
    }
}

/// One open request, and once its handler answered, its pending response; both end when it
/// is dropped (with its response body).
#[derive(Debug)]
struct OpenRequest {
    activity: Arc<Activity>,
    answer: Option<Answer>,
}

/// What became of a response's body so far.
#[derive(Debug, Clone, Copy)]
struct Answer {
    /// Bytes its size hint announced that hyper has not taken yet.
    announced_left: u64,
    /// Bytes hyper took.
    handed: u64,
    /// The body reached its end.
    ended: bool,
}

impl OpenRequest {
    fn new(activity: Arc<Activity>, version: axum::http::Version) -> Self {
        activity.request_opened(version);
        Self { activity, answer: None }
    }

    /// The handler answered with a body announcing `announced_bytes`: it is to be sent from now.
    fn responding(mut self, announced_bytes: u64) -> Self {
        self.activity.response_started(announced_bytes);
        self.answer = Some(Answer { announced_left: announced_bytes, handed: 0, ended: false });
        self
    }

    /// hyper took `bytes` of the body.
    fn handed_over(&mut self, bytes: u64) {
        if let Some(answer) = &mut self.answer {
            let announced = bytes.min(answer.announced_left);
            answer.announced_left -= announced;
            answer.handed += bytes;
            self.activity.body_handed_over(bytes, announced);
        }
    }
}

impl Drop for OpenRequest {
    fn drop(&mut self) {
        if let Some(answer) = self.answer {
            // A body dropped before its end was a stream reset: hyper drops what it buffered.
            let discarded = if answer.ended { 0 } else { answer.handed };
            self.activity.response_ended(answer.announced_left, discarded);
        }
        self.activity.request_closed();
    }
}

/// A response body that keeps its request open until it is sent or dropped, and tells
/// [`Activity`] each time it is asked for data and what hyper took.
#[derive(Debug)]
struct TrackedBody {
    body: Body,
    open: OpenRequest,
}

impl Drop for TrackedBody {
    fn drop(&mut self) {
        let ended = http_body::Body::is_end_stream(&self.body);
        if let Some(answer) = &mut self.open.answer {
            answer.ended |= ended;
        }
    }
}

impl http_body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        self.open.activity.response_progressed();
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let bytes = data.len() as u64;
                    self.open.handed_over(bytes);
                }
            }
            Poll::Ready(None) => {
                if let Some(answer) = &mut self.open.answer {
                    answer.ended = true;
                }
            }
            _ => {}
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
