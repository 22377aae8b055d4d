//! The appender of a lane: sends upload batches over one AppendRows connection at explicit row
//! offsets with a sliding window (refilled per acknowledgement), under the gateway-wide
//! in-flight limit. A retryable failure tears the connection down (no more sending or
//! receiving), backs off as [`FailureStreak::record`] decides, and replays every
//! unacknowledged request, in order and at the same offsets, on a new connection;
//! `ALREADY_EXISTS` on a replay means the rows had landed. After a failure the window restarts
//! at one request and grows by one per acknowledgement up to `inflight_per_stream` (slow
//! start), so a network that cuts connections after a few hundred kilobytes still lets every
//! connection make progress. A connection that stays open but leaves the oldest request
//! unanswered for the `response` timeout, or a request untaken for the `send` timeout
//! ([`AppendTimeouts`]), counts as broken. When the input closes and everything is
//! acknowledged it reports how many rows the stream holds.
//!
//! A connection takes one of the gateway's `max_append_connections` before its first request
//! (before any in-flight slot, so a lane waiting for a connection never holds one) and gives
//! it back when torn down, drained, idle for the connections' idle lifetime, or idle while
//! another lane waits for a place ([`AppendConnections`]; once the server has ended the call,
//! so BigQuery no longer counts it when another lane opens one): BigQuery limits a project's
//! concurrent connections (10,000 in a multi-region) and advises connections that live for
//! minutes, and a run of thousands of resources must not hold one per resource until its
//! commit.
//!
//! The appender reaches the Storage Write API and the execution's record through
//! [`AppendService`]: the lane's stream ([`LaneStream`]) in the gateway, a channel-backed fake
//! in the unit tests (`appender_tests.rs`, with paused time).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use googleapis_tonic_google_cloud_bigquery_storage_v1::google::cloud::bigquery::storage::v1::{
    AppendRowsRequest, AppendRowsResponse,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;

use super::accumulator::UploadBatch;
use super::connections::{AppendConnections, PlaceRequest};
use super::{AppendTimeouts, LaneContext, LaneTarget};
use crate::bigquery::BigQueryError;
use crate::bigquery::error::Stage;
use crate::bigquery::retry::{FailureStreak, Retried, RetryAction, RetryClass, RetryPolicy};
use crate::bigquery::write::{AppendAck, AppendConnection, append_request, judge_append_response};
use crate::error::Problem;
use crate::store::Event;
use crate::telemetry::{self, AppendAcknowledged};

/// How long a closing connection waits for the server to end the call before its place is
/// given back anyway.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// What the appender needs of the Storage Write API and of the execution's record.
pub(super) trait AppendService: Sync {
    type Connection: AppendChannel;

    /// Opens an AppendRows connection whose first request is `first` (`reconnecting`: after a
    /// failure, on a connection of the lane's own).
    fn open(
        &self,
        first: AppendRowsRequest,
        reconnecting: bool,
    ) -> impl Future<Output = Result<Self::Connection, BigQueryError>> + Send;

    /// Adds `rows` acknowledged rows to the execution's progress; `false` when it could not
    /// (progress only: the rows are counted again with the next acknowledgement).
    fn add_rows_acknowledged(&self, rows: i64) -> impl Future<Output = bool> + Send;

    /// Records a failed attempt in the execution's timeline.
    fn record_retry(&self, retried: Event<'static>) -> impl Future<Output = ()> + Send;
}

/// One open AppendRows connection, as the appender uses it.
pub(super) trait AppendChannel: Send {
    /// Queues one request (its first one was given to [`AppendService::open`]).
    fn send(&self, request: &AppendRowsRequest) -> Result<(), BigQueryError>;
    /// The next response; a closed call is a retryable error.
    fn next_response(&mut self) -> impl Future<Output = Result<AppendRowsResponse, BigQueryError>> + Send;
    /// Since when the oldest request the transport has not taken waits.
    fn unsent_since(&self) -> Option<Instant>;
    /// Half-closes the call and waits at most `within` for the server to end it.
    fn close(self, within: Duration) -> impl Future<Output = ()> + Send;
}

impl AppendChannel for AppendConnection {
    fn send(&self, request: &AppendRowsRequest) -> Result<(), BigQueryError> {
        AppendConnection::send(self, request)
    }

    fn next_response(&mut self) -> impl Future<Output = Result<AppendRowsResponse, BigQueryError>> + Send {
        AppendConnection::next_response(self)
    }

    fn unsent_since(&self) -> Option<Instant> {
        AppendConnection::unsent_since(self)
    }

    fn close(self, within: Duration) -> impl Future<Output = ()> + Send {
        AppendConnection::close(self, within)
    }
}

/// A lane's PENDING stream in BigQuery, its progress and retries recorded in Postgres.
#[derive(Debug)]
pub(super) struct LaneStream<'a> {
    pub(super) context: &'a LaneContext,
    pub(super) target: &'a LaneTarget,
    pub(super) stream_name: &'a str,
}

impl AppendService for LaneStream<'_> {
    type Connection = AppendConnection;

    async fn open(&self, first: AppendRowsRequest, reconnecting: bool) -> Result<AppendConnection, BigQueryError> {
        let writer = self.context.bigquery.writer();
        let send_queue = Arc::clone(&self.context.upload_budget);
        writer.open_append_connection(self.stream_name, vec![first], reconnecting, send_queue).await
    }

    async fn add_rows_acknowledged(&self, rows: i64) -> bool {
        self.context.store.add_rows_acknowledged(&self.target.resource, rows).await.is_ok()
    }

    async fn record_retry(&self, retried: Event<'static>) {
        let resource = &self.target.resource;
        let (delivery, name) = (&resource.delivery, Some(resource.resource.as_ref()));
        self.context.store.record_event(delivery, name, retried).await;
    }
}

/// How one lane appends: its stream and the limits it shares.
#[derive(Debug, Clone)]
pub(super) struct AppendSettings {
    /// The resource, for logs and metrics.
    pub(super) resource: String,
    pub(super) stream_name: String,
    /// The writer schema, sent on each connection's first request.
    pub(super) serialized_schema: Bytes,
    /// The stream's next offset (rows already in it: a handed-over stream's).
    pub(super) start_offset: i64,
    /// Outstanding requests on this stream at most (`inflight_per_stream`).
    pub(super) window: usize,
    pub(super) retry: RetryPolicy,
    pub(super) timeouts: AppendTimeouts,
    /// Gateway-wide AppendRows connections open (`max_append_connections`).
    pub(super) connections: AppendConnections,
    /// Gateway-wide AppendRows requests in flight (`max_inflight_requests`).
    pub(super) inflight_requests: Arc<Semaphore>,
}

impl AppendSettings {
    /// The settings of `target`'s lane appending to `stream_name` from `start_offset`.
    pub(super) fn of_lane(context: &LaneContext, target: &LaneTarget, stream_name: &str, start_offset: i64) -> Self {
        Self {
            resource: target.resource.resource.to_string(),
            stream_name: stream_name.to_string(),
            serialized_schema: target.serialized_schema.clone(),
            start_offset,
            window: context.inflight_per_stream.max(1),
            retry: context.retry,
            timeouts: context.append_timeouts,
            connections: context.append_connections.clone(),
            inflight_requests: Arc::clone(&context.inflight_requests),
        }
    }
}

/// A place under `max_append_connections`, counted in `filament_append_connections_open`.
#[derive(Debug)]
struct ConnectionSlot {
    _permit: OwnedSemaphorePermit,
}

impl ConnectionSlot {
    fn new(permit: OwnedSemaphorePermit) -> Self {
        telemetry::append_connection(true);
        Self { _permit: permit }
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        telemetry::append_connection(false);
    }
}

/// A request sent and not yet acknowledged; it keeps its payload for replay.
#[derive(Debug)]
struct InFlight {
    offset: i64,
    upload: UploadBatch,
    sent_at: Instant,
    send_duration: Duration,
    _slot: OwnedSemaphorePermit,
    /// The request's trace span (`crate::traces`), ended with its answer.
    _span: tracing::Span,
}

/// A request whose connection failed before its acknowledgement: sent again at its offset.
#[derive(Debug)]
struct Unacknowledged {
    offset: i64,
    upload: UploadBatch,
}

/// The lane's AppendRows connection.
#[derive(Debug)]
enum Connection<C> {
    /// None yet (or torn down after a failure): the next send opens one.
    Closed,
    Open(Box<C>),
    /// Opening or sending failed: the error is judged like a failed response, on the next turn.
    Broken(BigQueryError),
}

/// One lane's appends to its PENDING stream.
#[derive(Debug)]
pub(super) struct Appender<'a, S: AppendService> {
    service: &'a S,
    settings: AppendSettings,
    /// Outstanding requests allowed now: one after a failure, growing per acknowledgement.
    congestion_window: usize,
    /// Requests to send again, in offset order, before anything queued.
    replay: VecDeque<Unacknowledged>,
    /// UploadBatch batches not sent yet.
    queue: VecDeque<UploadBatch>,
    /// Sent and not acknowledged, in offset order.
    in_flight: VecDeque<InFlight>,
    connection: Connection<S::Connection>,
    /// The connection's place under `max_append_connections`: taken before the first send,
    /// given back with the connection.
    connection_slot: Option<ConnectionSlot>,
    /// The last send or acknowledgement: the connection is idle its idle lifetime after it.
    last_activity: Instant,
    next_offset: i64,
    acknowledged_rows: i64,
    /// Acknowledged rows already added to the execution's progress.
    rows_recorded: i64,
    /// Consecutive failed attempts (reset by an acknowledgement).
    failures: FailureStreak,
    /// A connection failed once: later ones are the lane's own, not the shared channel.
    reconnecting: bool,
}

impl<'a, S: AppendService> Appender<'a, S> {
    /// Appends every upload batch it receives until `upload_batches` closes and all are
    /// acknowledged; returns the rows the stream holds.
    pub(super) async fn run(
        service: &'a S,
        settings: AppendSettings,
        mut upload_batches: mpsc::UnboundedReceiver<UploadBatch>,
    ) -> Result<i64, Problem> {
        let start_offset = settings.start_offset;
        let mut appender = Appender {
            service,
            congestion_window: settings.window,
            settings,
            replay: VecDeque::new(),
            queue: VecDeque::new(),
            in_flight: VecDeque::new(),
            connection: Connection::Closed,
            connection_slot: None,
            last_activity: Instant::now(),
            next_offset: start_offset,
            acknowledged_rows: start_offset,
            rows_recorded: start_offset,
            failures: FailureStreak::default(),
            reconnecting: false,
        };
        let mut input_open = true;
        let mut place_request = PlaceRequest::default();
        while input_open || appender.has_unsent() || !appender.in_flight.is_empty() {
            let connected = appender.connection_slot.is_some();
            let needs_connection = !connected && appender.has_unsent();
            let can_send = connected && appender.in_flight.len() < appender.congestion_window && appender.has_unsent();
            let idle = connected && appender.in_flight.is_empty() && !appender.has_unsent();
            let connections = appender.settings.connections.clone();
            let idle_at = appender.last_activity + connections.idle_lifetime;
            let waiting_for_a_place = needs_connection && connections.exhausted();
            let ask_again_at = place_request.update(&connections, waiting_for_a_place).unwrap_or(idle_at);
            let inflight_requests = Arc::clone(&appender.settings.inflight_requests);
            tokio::select! {
                biased;
                response = appender.next_response(), if !appender.in_flight.is_empty() => {
                    appender.on_response(response).await?;
                }
                slot = Arc::clone(&connections.places).acquire_owned(), if needs_connection => {
                    let slot = slot.map_err(|_| Problem::internal("connection limiter closed"))?;
                    appender.connection_slot = Some(ConnectionSlot::new(slot));
                }
                slot = inflight_requests.acquire_owned(), if can_send => {
                    let slot = slot.map_err(|_| Problem::internal("in-flight limiter closed"))?;
                    appender.send_next(slot).await;
                }
                upload = upload_batches.recv(), if input_open => match upload {
                    Some(upload) => appender.queue.push_back(upload),
                    None => input_open = false,
                },
                () = tokio::time::sleep_until(idle_at), if idle => appender.close_connection().await,
                // Another lane waits for a place: this idle one gives its own back.
                () = connections.wanted.notified(), if idle => {
                    if connections.someone_waits() {
                        appender.close_connection().await;
                    }
                }
                () = tokio::time::sleep_until(ask_again_at), if waiting_for_a_place => {}
            }
        }
        appender.close_connection().await;
        Ok(appender.acknowledged_rows)
    }

    /// The answer to the oldest request in flight, or a retryable timeout once it has waited
    /// the `response` timeout (a hung server or a half-dead proxy that keeps the connection
    /// open), or once a request has waited the `send` timeout for the connection to take it (a
    /// peer that stopped reading: HTTP/2 flow control holds every later request).
    async fn next_response(&mut self) -> Result<AppendRowsResponse, BigQueryError> {
        let timeouts = self.settings.timeouts;
        let Some(oldest) = self.in_flight.front() else { return next_response(&mut self.connection).await };
        let response_deadline = oldest.sent_at + timeouts.response;
        loop {
            let send_deadline = self.connection.unsent_since().map(|since| since + timeouts.send);
            let deadline = send_deadline.map_or(response_deadline, |send| send.min(response_deadline));
            if let Ok(response) = tokio::time::timeout_at(deadline, next_response(&mut self.connection)).await {
                return response;
            }
            let now = Instant::now();
            if now >= response_deadline {
                let seconds = timeouts.response.as_secs();
                return Err(BigQueryError::Timeout { operation: "AppendRows response", seconds });
            }
            if self.connection.unsent_since().is_some_and(|since| since + timeouts.send <= now) {
                let seconds = timeouts.send.as_secs();
                return Err(BigQueryError::Timeout { operation: "AppendRows send", seconds });
            }
            // The connection took a request meanwhile: wait on.
        }
    }

    /// Ends the connection (waiting for the server to end the call, at most
    /// [`CLOSE_WAIT`]) and gives its place back; the next send opens another.
    async fn close_connection(&mut self) {
        if let Connection::Open(open) = std::mem::replace(&mut self.connection, Connection::Closed) {
            open.close(CLOSE_WAIT).await;
        }
        self.connection_slot = None;
    }

    /// Drops a failed connection at once and gives its place back.
    fn tear_down_connection(&mut self) {
        self.connection = Connection::Closed;
        self.connection_slot = None;
    }

    fn has_unsent(&self) -> bool {
        !self.replay.is_empty() || !self.queue.is_empty()
    }

    /// Judges the answer to the oldest request in flight.
    async fn on_response(&mut self, response: Result<AppendRowsResponse, BigQueryError>) -> Result<(), Problem> {
        let Some(front) = self.in_flight.front() else { return Ok(()) };
        match response.and_then(|r| judge_append_response(front.offset, r)) {
            Ok(ack) => {
                self.on_acknowledged(ack).await;
                Ok(())
            }
            Err(error) => self.on_failure(error).await,
        }
    }

    /// Retires the oldest request: its payload and budget are released here. Progress: the
    /// failure streak ends and the window grows by one.
    async fn on_acknowledged(&mut self, ack: AppendAck) {
        self.failures.reset();
        self.last_activity = Instant::now();
        self.congestion_window = (self.congestion_window + 1).min(self.settings.window);
        let Some(done) = self.in_flight.pop_front() else { return };
        AppendAcknowledged {
            resource: &self.settings.resource,
            rows: done.upload.rows,
            uncompressed_bytes: done.upload.message.len(),
            already_present: ack == AppendAck::AlreadyPresent,
            send: done.send_duration,
            response_wait: done.sent_at.elapsed(),
        }
        .emit();
        self.acknowledged_rows += done.upload.rows as i64;
        drop(done);
        telemetry::appends_in_flight(0, 1);
        // Progress for the execution view; not needed for correctness.
        if self.service.add_rows_acknowledged(self.acknowledged_rows - self.rows_recorded).await {
            self.rows_recorded = self.acknowledged_rows;
        }
    }

    /// A failed attempt: give up, or stop sending and receiving, back off and queue everything
    /// after the last acknowledgement for replay (in order, at the same offsets) on a new
    /// connection that starts with a window of one.
    async fn on_failure(&mut self, error: BigQueryError) -> Result<(), Problem> {
        let (attempt, action) = self.failures.record(&self.settings.retry, RetryClass::of(&error));
        let offset = self.in_flight.front().map(|f| f.offset);
        let delay = action.delay();
        Retried::emit_failed_call("AppendRows", &self.settings.resource, &error, attempt, delay, offset);
        let retried = Event::AppendRetried { code: error.code_name(), attempt, retryable: delay.is_some() };
        self.service.record_retry(retried).await;
        let RetryAction::RetryAfter(backoff) = action else {
            return Err(error.problem(Stage::Upload));
        };
        // The connection's place is given back during the backoff too.
        self.tear_down_connection();
        telemetry::appends_in_flight(0, self.in_flight.len());
        // Released slots let other lanes upload while this one waits.
        for f in self.in_flight.drain(..).rev() {
            self.replay.push_front(Unacknowledged { offset: f.offset, upload: f.upload });
        }
        self.congestion_window = 1;
        self.reconnecting = true;
        tokio::time::sleep(backoff).await;
        Ok(())
    }

    /// Sends the next request: a replayed one at its offset, else the next queued upload at
    /// the stream's next offset (opening a connection when there is none; its first request
    /// carries the writer schema).
    async fn send_next(&mut self, slot: OwnedSemaphorePermit) {
        let (offset, upload) = match self.replay.pop_front() {
            Some(again) => (again.offset, again.upload),
            None => {
                let Some(upload) = self.queue.pop_front() else { return };
                let offset = self.next_offset;
                self.next_offset += upload.rows as i64;
                (offset, upload)
            }
        };
        let started = Instant::now();
        self.last_activity = started;
        let opening = !matches!(self.connection, Connection::Open(_));
        let schema = opening.then(|| self.settings.serialized_schema.clone());
        let request = append_request(&self.settings.stream_name, schema, offset, upload.message.clone());
        let sent = match &self.connection {
            Connection::Open(open) => open.send(&request),
            // A broken connection is judged (and replaced) on the next turn.
            Connection::Broken(_) => Ok(()),
            Connection::Closed => match self.service.open(request, self.reconnecting).await {
                Ok(open) => {
                    self.connection = Connection::Open(Box::new(open));
                    Ok(())
                }
                Err(e) => Err(e),
            },
        };
        telemetry::appends_in_flight(1, 0);
        let send_duration = started.elapsed();
        let span = tracing::trace_span!(target: crate::traces::TARGET, "bigquery.append_rows", offset, rows = upload.rows,
            bytes = upload.message.len(), attempt = self.failures.attempts() + 1);
        let sent_at = Instant::now();
        self.in_flight.push_back(InFlight { offset, upload, sent_at, send_duration, _slot: slot, _span: span });
        if let Err(error) = sent {
            // Judged like a failed response (logged, retried or not), with the real error.
            self.connection = Connection::Broken(error);
        }
    }
}

impl<C: AppendChannel> Connection<C> {
    /// Since when a request waits for an open connection to take it.
    fn unsent_since(&self) -> Option<Instant> {
        match self {
            Connection::Open(open) => open.unsent_since(),
            Connection::Closed | Connection::Broken(_) => None,
        }
    }
}

async fn next_response<C: AppendChannel>(connection: &mut Connection<C>) -> Result<AppendRowsResponse, BigQueryError> {
    if let Connection::Open(open) = connection {
        return open.next_response().await;
    }
    match std::mem::replace(connection, Connection::Closed) {
        Connection::Broken(error) => Err(error),
        _ => Err(BigQueryError::Grpc {
            operation: "AppendRows",
            status: tonic::Status::unavailable("no AppendRows connection"),
        }),
    }
}

#[cfg(test)]
#[path = "appender_tests.rs"]
mod tests;
