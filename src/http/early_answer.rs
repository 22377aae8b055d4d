//! Early answers reach the client. A request refused before its body was read (503
//! `overloaded`, 429 `backpressure` after the wait, 413 `payload_too_large` part-way) used to be
//! answered while the client was still writing; the server then closed the connection with
//! unread bytes, and a client without `Expect: 100-continue` (reqwest, most HTTP libraries) got
//! a broken pipe or a reset instead of the problem document and its `Retry-After`.
//!
//! This middleware, outermost but for tracing, hands the handler the body through a shared
//! slot. Once the answer is ready, whatever the handler left unread is read and discarded, at
//! most [`UnreadBodyDrain::max_bytes`] (the router gives twice the batch body limit) and
//! [`DRAIN_WITHIN`], before the answer goes out; beyond those bounds the connection is closed
//! as before. A client that sent `Expect: 100-continue` and whose body was never asked for is
//! not drained: hyper sends `100 Continue` only when the body is first read, so such a client
//! receives the answer without having sent its body.

use parking_lot::Mutex;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt as _;
use http_body::{Frame, SizeHint};

/// How much of an unread request body is read and discarded before answering, at most.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UnreadBodyDrain {
    pub(crate) max_bytes: u64,
}

/// How long an unread remainder is read before answering, at most.
pub(crate) const DRAIN_WITHIN: Duration = Duration::from_secs(10);

/// The request body as the handler reads it, and whether it asked for it at all.
#[derive(Debug)]
struct BodySlot {
    body: Body,
    polled: bool,
}

/// The handler's view of the body: reads go through the shared slot.
#[derive(Debug, Clone)]
struct SharedBody(Arc<Mutex<BodySlot>>);

impl http_body::Body for SharedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let mut slot = self.0.lock();
        slot.polled = true;
        Pin::new(&mut slot.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.0.lock().body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.0.lock().body.size_hint()
    }
}

/// Runs the request, then reads what its handler left of the body (see the module documentation).
pub(crate) async fn answer_after_reading_body(
    State(drain_limit): State<UnreadBodyDrain>,
    request: Request,
    next: Next,
) -> Response {
    let expects_continue = request
        .headers()
        .get(header::EXPECT)
        .is_some_and(|value| value.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let (parts, body) = request.into_parts();
    let slot = Arc::new(Mutex::new(BodySlot { body, polled: false }));
    let response = next.run(Request::from_parts(parts, Body::new(SharedBody(Arc::clone(&slot))))).await;
    // An answer that closes the connection (a body too slow to wait for) reads nothing more.
    let closes =
        response.headers().get(header::CONNECTION).is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
    let unread = {
        let mut slot = slot.lock();
        let never_asked = (expects_continue && !slot.polled) || closes;
        (!never_asked && !http_body::Body::is_end_stream(&slot.body)).then(|| std::mem::take(&mut slot.body))
    };
    if let Some(unread) = unread {
        let drained = drain(unread, drain_limit.max_bytes).await;
        if !drained {
            tracing::debug!(status = %response.status(), "closing the connection: the unread request body exceeds the drain bounds");
        }
    }
    response
}

/// Reads and discards `body`; `false` when it holds more than `max_bytes` or takes longer than
/// [`DRAIN_WITHIN`] (the connection then closes with bytes unread).
async fn drain(body: Body, max_bytes: u64) -> bool {
    if http_body::Body::size_hint(&body).lower() > max_bytes {
        return false;
    }
    let read_all = async {
        let mut drained_bytes = 0u64;
        let mut chunks = body.into_data_stream();
        while let Some(chunk) = chunks.next().await {
            let Ok(chunk) = chunk else { return false };
            drained_bytes += chunk.len() as u64;
            if drained_bytes > max_bytes {
                return false;
            }
        }
        true
    };
    tokio::time::timeout(DRAIN_WITHIN, read_all).await.unwrap_or(false)
}
