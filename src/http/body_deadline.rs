//! Request bodies arrive at a minimum rate, or the request ends with 408 `body_timeout`: a
//! client that sends its body a byte a second costs the gateway a connection for a few seconds,
//! never a decode slot, budget or request slot for long.
//!
//! [`DeadlineBody`] wraps every request body (`api::protect`). Its allowance starts at
//! `initial` and grows by one second per `min_rate_bytes_per_sec` bytes received; only the
//! time the gateway spends waiting for the client counts against it (not the time a handler
//! takes between reads, waiting for room in its own budgets), and the whole body must arrive
//! within `max_duration` of its first read. Past either, the next read fails with
//! [`BodyTimedOut`], which the handlers answer with 408 `body_timeout`.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tokio::time::{Instant, Sleep};

/// How fast request bodies must arrive.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyRate {
    pub(crate) initial: Duration,
    pub(crate) min_rate_bytes_per_sec: u64,
    pub(crate) max_duration: Duration,
}

/// The body arrived too slowly (see the module documentation).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the request body arrived too slowly: {received_bytes} bytes in {waited_ms} ms of waiting")]
pub(crate) struct BodyTimedOut {
    pub(crate) received_bytes: u64,
    pub(crate) waited_ms: u128,
}

impl BodyTimedOut {
    /// The timeout somewhere in the causes of a body read error, if that is what it was.
    pub(crate) fn in_chain(error: &(dyn std::error::Error + 'static)) -> Option<BodyTimedOut> {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
        while let Some(current) = cause {
            if let Some(timed_out) = current.downcast_ref::<BodyTimedOut>() {
                return Some(*timed_out);
            }
            cause = current.source();
        }
        None
    }
}

/// A request body read against its [`BodyRate`].
pub(crate) struct DeadlineBody {
    inner: Body,
    rate: BodyRate,
    first_read: Option<Instant>,
    received_bytes: u64,
    /// Time spent waiting for the client so far, and since when it waits now.
    waited: Duration,
    waiting_since: Option<Instant>,
    timer: Pin<Box<Sleep>>,
}

impl std::fmt::Debug for DeadlineBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadlineBody").field("received_bytes", &self.received_bytes).finish_non_exhaustive()
    }
}

impl DeadlineBody {
    pub(crate) fn new(inner: Body, rate: BodyRate) -> Self {
        Self {
            inner,
            rate,
            first_read: None,
            received_bytes: 0,
            waited: Duration::ZERO,
            waiting_since: None,
            timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
        }
    }

    /// How long the client may still keep the gateway waiting, from `now`.
    fn remaining(&self, now: Instant) -> Duration {
        let rate = self.rate.min_rate_bytes_per_sec.max(1);
        let earned = Duration::from_secs_f64(self.received_bytes as f64 / rate as f64);
        let allowance = (self.rate.initial + earned).saturating_sub(self.waited);
        let overall = self
            .first_read
            .map_or(self.rate.max_duration, |first| (first + self.rate.max_duration).saturating_duration_since(now));
        allowance.min(overall)
    }

    fn timed_out(&self) -> axum::Error {
        axum::Error::new(BodyTimedOut { received_bytes: self.received_bytes, waited_ms: self.waited.as_millis() })
    }
}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let now = Instant::now();
        self.first_read.get_or_insert(now);
        if let Some(since) = self.waiting_since.take() {
            self.waited += now.saturating_duration_since(since);
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let bytes = frame.data_ref().map_or(0, |data| data.len() as u64);
                self.received_bytes += bytes;
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(other) => Poll::Ready(other),
            Poll::Pending => {
                let remaining = self.remaining(now);
                if remaining.is_zero() {
                    return Poll::Ready(Some(Err(self.timed_out())));
                }
                self.waiting_since = Some(now);
                let wake_at = now + remaining;
                self.timer.as_mut().reset(wake_at);
                if self.timer.as_mut().poll(cx).is_ready() {
                    self.waited += remaining;
                    self.waiting_since = None;
                    return Poll::Ready(Some(Err(self.timed_out())));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt as _;
    use http_body_util::BodyExt as _;

    use super::*;

    const RATE: BodyRate = BodyRate {
        initial: Duration::from_secs(10),
        min_rate_bytes_per_sec: 1000,
        max_duration: Duration::from_secs(60),
    };

    /// A body of `chunks` bytes each, one every `every`.
    fn trickle(chunks: usize, bytes: usize, every: Duration) -> Body {
        let stream = futures::stream::iter(0..chunks).then(move |_| async move {
            tokio::time::sleep(every).await;
            Ok::<_, std::io::Error>(Bytes::from(vec![0u8; bytes]))
        });
        Body::from_stream(stream)
    }

    async fn read(body: Body) -> Result<usize, axum::Error> {
        let collected = DeadlineBody::new(body, RATE).collect().await?;
        Ok(collected.to_bytes().len())
    }

    #[tokio::test(start_paused = true)]
    async fn a_byte_a_second_times_out_after_the_initial_allowance() {
        let started = Instant::now();
        let error = read(trickle(440, 1, Duration::from_secs(1))).await.unwrap_err();
        let timed_out = BodyTimedOut::in_chain(&error).expect("a body timeout");
        assert!(timed_out.received_bytes < 20, "{timed_out:?}");
        assert!(started.elapsed() < Duration::from_secs(12), "{:?}", started.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_at_the_minimum_rate_arrives_whole() {
        // 2,000 bytes a second for 30 s: above the rate, beyond the initial allowance.
        assert_eq!(read(trickle(30, 2000, Duration::from_secs(1))).await.unwrap(), 60_000);
    }

    #[tokio::test(start_paused = true)]
    async fn the_whole_body_must_arrive_within_the_maximum_duration() {
        // Fast enough per second, but 90 s in all.
        let error = read(trickle(90, 5000, Duration::from_secs(1))).await.unwrap_err();
        assert!(BodyTimedOut::in_chain(&error).is_some(), "{error}");
    }

    #[tokio::test(start_paused = true)]
    async fn time_the_reader_spends_elsewhere_does_not_count() {
        let mut body = DeadlineBody::new(trickle(3, 10, Duration::from_millis(10)), RATE);
        let mut received = 0;
        while let Some(frame) = body.frame().await {
            received += frame.unwrap().into_data().unwrap().len();
            // The handler waits for its own budget between reads.
            tokio::time::sleep(Duration::from_secs(20)).await;
        }
        assert_eq!(received, 30);
    }
}
