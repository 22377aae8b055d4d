//! The appender against a channel-backed fake of the Storage Write API, with paused time: the
//! test sees each request's offset as the appender sends it, answers (or not) when it
//! chooses, and every timeout fires at its exact instant.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use googleapis_tonic_google_cloud_bigquery_storage_v1::google::cloud::bigquery::storage::v1::append_rows_response;

use super::*;
use crate::bigquery::retry::Backoff;
use crate::pipeline::budget::BudgetPermit;

type Answer = Result<AppendRowsResponse, BigQueryError>;

/// One connection the appender opened, as the test drives it.
struct Call {
    /// The offsets of the requests sent on it, in order (the first one included).
    requests: mpsc::UnboundedReceiver<i64>,
    /// Answers to them, in order; dropping it ends the call.
    answers: mpsc::UnboundedSender<Answer>,
    opened_at: Instant,
    reconnecting: bool,
    closed: Arc<AtomicBool>,
    /// What the fake reports as the oldest untaken request's wait.
    unsent_since: Arc<Mutex<Option<Instant>>>,
}

impl Call {
    /// The next request's offset, waiting at most `within` (paused time: a test that expects
    /// none does not wait for real).
    async fn request(&mut self, within: Duration) -> Option<i64> {
        tokio::time::timeout(within, self.requests.recv()).await.ok().flatten()
    }

    fn acknowledge(&self) {
        let result = append_rows_response::AppendResult { offset: None };
        let response = AppendRowsResponse {
            response: Some(append_rows_response::Response::AppendResult(result)),
            ..Default::default()
        };
        let _ = self.answers.send(Ok(response));
    }

    fn fail(&self, status: tonic::Status) {
        let _ = self.answers.send(Err(BigQueryError::Grpc { operation: "AppendRows", status }));
    }
}

/// The fake service: each connection it opens is handed to the test.
struct FakeWrite {
    calls: mpsc::UnboundedSender<Call>,
    retries: Mutex<Vec<serde_json::Value>>,
    /// Connections it opens from now on never take their requests (a peer that stopped
    /// reading): their oldest untaken request waits from the moment it is sent.
    stalled: Arc<AtomicBool>,
}

struct FakeChannel {
    requests: mpsc::UnboundedSender<i64>,
    answers: mpsc::UnboundedReceiver<Answer>,
    closed: Arc<AtomicBool>,
    unsent_since: Arc<Mutex<Option<Instant>>>,
}

fn offset_of(request: &AppendRowsRequest) -> i64 {
    request.offset.expect("every request carries its offset")
}

fn unavailable(message: &str) -> BigQueryError {
    BigQueryError::Grpc { operation: "AppendRows", status: tonic::Status::unavailable(message.to_string()) }
}

impl AppendService for FakeWrite {
    type Connection = FakeChannel;

    async fn open(&self, first: AppendRowsRequest, reconnecting: bool) -> Result<FakeChannel, BigQueryError> {
        let (requests_tx, requests) = mpsc::unbounded_channel();
        let (answers, answers_rx) = mpsc::unbounded_channel();
        let stalled_since = self.stalled.load(Ordering::SeqCst).then(Instant::now);
        let (closed, unsent_since) = (Arc::new(AtomicBool::new(false)), Arc::new(Mutex::new(stalled_since)));
        assert!(first.rows.is_some(), "a connection opens with a request");
        requests_tx.send(offset_of(&first)).expect("the test holds the call");
        let call = Call {
            requests,
            answers,
            opened_at: Instant::now(),
            reconnecting,
            closed: Arc::clone(&closed),
            unsent_since: Arc::clone(&unsent_since),
        };
        self.calls.send(call).map_err(|_| unavailable("the test ended"))?;
        Ok(FakeChannel { requests: requests_tx, answers: answers_rx, closed, unsent_since })
    }

    async fn add_rows_acknowledged(&self, _rows: i64) -> bool {
        true
    }

    async fn record_retry(&self, retried: Event<'static>) {
        self.retries.lock().push(retried.detail());
    }
}

impl AppendChannel for FakeChannel {
    fn send(&self, request: &AppendRowsRequest) -> Result<(), BigQueryError> {
        self.requests.send(offset_of(request)).map_err(|_| unavailable("the call ended"))
    }

    async fn next_response(&mut self) -> Answer {
        self.answers.recv().await.unwrap_or_else(|| Err(unavailable("the server closed the AppendRows stream")))
    }

    fn unsent_since(&self) -> Option<Instant> {
        *self.unsent_since.lock()
    }

    async fn close(self, _within: Duration) {
        self.closed.store(true, Ordering::SeqCst);
    }
}

const RESPONSE_TIMEOUT: Duration = Duration::from_secs(300);
const SEND_TIMEOUT: Duration = Duration::from_secs(60);
const BACKOFF: Duration = Duration::from_secs(1);
const IDLE_LIFETIME: Duration = Duration::from_secs(300);
/// Long enough for any step of the appender under paused time, short of every timeout.
const SOON: Duration = Duration::from_millis(100);

fn settings(window: usize) -> AppendSettings {
    AppendSettings {
        resource: "orders".into(),
        stream_name: "projects/p/datasets/d/tables/t/streams/s".into(),
        serialized_schema: Bytes::from_static(b"schema"),
        start_offset: 0,
        window,
        retry: RetryPolicy {
            max_attempts: 3,
            // Half jitter: each delay is within [BACKOFF, 2 x BACKOFF].
            backoff: Backoff::new(BACKOFF * 2, BACKOFF * 2),
            quota_wait: Duration::from_secs(600),
            quota_backoff: Backoff::new(BACKOFF * 2, BACKOFF * 2),
        },
        timeouts: AppendTimeouts { response: RESPONSE_TIMEOUT, send: SEND_TIMEOUT },
        connections: AppendConnections::new(10, IDLE_LIFETIME),
        inflight_requests: Arc::new(Semaphore::new(100)),
    }
}

fn upload(rows: usize) -> UploadBatch {
    UploadBatch { rows, message: Bytes::from(vec![0u8; rows]), staged: Vec::new(), _budget: BudgetPermit::empty() }
}

/// A running appender, its input and the connections it opens.
struct Harness {
    input: mpsc::UnboundedSender<UploadBatch>,
    calls: mpsc::UnboundedReceiver<Call>,
    stalled: Arc<AtomicBool>,
    appender: tokio::task::JoinHandle<(Result<i64, Problem>, Vec<serde_json::Value>)>,
}

impl Harness {
    fn start(settings: AppendSettings) -> Self {
        let (input, input_rx) = mpsc::unbounded_channel();
        let (calls_tx, calls) = mpsc::unbounded_channel();
        let stalled = Arc::new(AtomicBool::new(false));
        let service_stalled = Arc::clone(&stalled);
        let appender = tokio::spawn(async move {
            let retries = Mutex::new(Vec::new());
            let service = FakeWrite { calls: calls_tx, retries, stalled: service_stalled };
            let result = Appender::run(&service, settings, input_rx).await;
            (result, service.retries.into_inner())
        });
        Self { input, calls, stalled, appender }
    }

    fn send(&self, rows: usize) {
        self.input.send(upload(rows)).expect("the appender runs");
    }

    async fn next_call(&mut self, within: Duration) -> Option<Call> {
        tokio::time::timeout(within, self.calls.recv()).await.ok().flatten()
    }

    async fn finish(self) -> (Result<i64, Problem>, Vec<serde_json::Value>) {
        drop(self.input);
        tokio::time::timeout(Duration::from_secs(3600), self.appender).await.expect("ends").expect("no panic")
    }
}

#[tokio::test(start_paused = true)]
async fn the_window_bounds_requests_in_flight_and_each_acknowledgement_refills_it() {
    let mut harness = Harness::start(settings(2));
    for rows in [10, 20, 30, 40] {
        harness.send(rows);
    }
    let mut call = harness.next_call(SOON).await.expect("a connection opens");
    assert_eq!(call.request(SOON).await, Some(0));
    assert_eq!(call.request(SOON).await, Some(10));
    assert_eq!(call.request(SOON).await, None, "a window of two holds the third back");
    call.acknowledge();
    assert_eq!(call.request(SOON).await, Some(30), "one acknowledgement lets one more go");
    assert_eq!(call.request(SOON).await, None);
    for _ in 0..3 {
        call.acknowledge();
    }
    assert_eq!(call.request(SOON).await, Some(60));
    call.acknowledge();
    let (rows, retries) = harness.finish().await;
    assert_eq!(rows.expect("appended"), 100);
    assert!(retries.is_empty());
    assert!(call.closed.load(Ordering::SeqCst), "the connection is closed at the end");
}

#[tokio::test(start_paused = true)]
async fn a_broken_connection_replays_the_unacknowledged_suffix_in_order_and_restarts_slowly() {
    let mut harness = Harness::start(settings(4));
    for rows in [10, 10, 10, 10, 10] {
        harness.send(rows);
    }
    let mut first = harness.next_call(SOON).await.expect("a connection opens");
    let mut sent = Vec::new();
    while let Some(offset) = first.request(SOON).await {
        sent.push(offset);
    }
    assert_eq!(sent, [0, 10, 20, 30], "the window is four");
    first.acknowledge();
    assert_eq!(first.request(SOON).await, Some(40));
    first.fail(tonic::Status::unavailable("connection reset"));
    let failed_at = Instant::now();
    let mut second = harness.next_call(BACKOFF * 3).await.expect("a new connection after the backoff");
    let waited = second.opened_at - failed_at;
    assert!(waited >= BACKOFF && waited <= BACKOFF * 2, "opened after the backoff: {waited:?}");
    assert!(second.reconnecting && !first.reconnecting);
    assert_eq!(second.request(SOON).await, Some(10), "replay starts at the first unacknowledged offset");
    assert_eq!(second.request(SOON).await, None, "slow start: one request after a failure");
    second.acknowledge();
    assert_eq!(second.request(SOON).await, Some(20));
    assert_eq!(second.request(SOON).await, Some(30), "the window grew by one");
    assert_eq!(second.request(SOON).await, None);
    for _ in 0..2 {
        second.acknowledge();
    }
    assert_eq!(second.request(SOON).await, Some(40), "the whole suffix is replayed, in order");
    second.acknowledge();
    let (rows, retries) = harness.finish().await;
    assert_eq!(rows.expect("appended"), 50, "every row once");
    assert_eq!(retries.len(), 1);
    assert_eq!(retries[0]["code"], "UNAVAILABLE");
}

#[tokio::test(start_paused = true)]
async fn an_idle_connection_lives_its_idle_lifetime_and_the_next_batch_opens_another() {
    let mut harness = Harness::start(settings(4));
    harness.send(5);
    let mut call = harness.next_call(SOON).await.expect("a connection opens");
    assert_eq!(call.request(SOON).await, Some(0));
    call.acknowledge();
    let acknowledged_at = Instant::now();
    tokio::time::sleep(IDLE_LIFETIME - SOON).await;
    assert!(!call.closed.load(Ordering::SeqCst), "kept while idle and no lane waits for a place");
    tokio::time::sleep(SOON * 2).await;
    assert!(call.closed.load(Ordering::SeqCst), "closed once idle for {IDLE_LIFETIME:?}");
    assert!(Instant::now() - acknowledged_at >= IDLE_LIFETIME);
    harness.send(7);
    let mut next = harness.next_call(SOON).await.expect("the next batch opens a connection");
    assert!(!next.reconnecting, "an idle close is not a failure");
    assert_eq!(next.request(SOON).await, Some(5));
    next.acknowledge();
    let (rows, retries) = harness.finish().await;
    assert_eq!((rows.expect("appended"), retries.len()), (12, 0));
}

#[tokio::test(start_paused = true)]
async fn an_idle_connection_gives_its_place_to_a_lane_that_waits_for_one() {
    let connections = AppendConnections::new(1, IDLE_LIFETIME);
    let mut idle_lane = Harness::start(AppendSettings { connections: connections.clone(), ..settings(4) });
    idle_lane.send(5);
    let mut idle_call = idle_lane.next_call(SOON).await.expect("the only place is taken");
    assert_eq!(idle_call.request(SOON).await, Some(0));
    idle_call.acknowledge();
    tokio::time::sleep(SOON).await;
    let mut waiting_lane = Harness::start(AppendSettings { connections, ..settings(4) });
    waiting_lane.send(3);
    let mut call = waiting_lane.next_call(SOON * 2).await.expect("the waiting lane gets the place at once");
    assert!(idle_call.closed.load(Ordering::SeqCst), "the idle lane gave its place back");
    assert_eq!(call.request(SOON).await, Some(0));
    call.acknowledge();
    let (rows, retries) = waiting_lane.finish().await;
    assert_eq!((rows.expect("appended"), retries.len()), (3, 0));
    let (rows, retries) = idle_lane.finish().await;
    assert_eq!((rows.expect("appended"), retries.len()), (5, 0));
}

#[tokio::test(start_paused = true)]
async fn an_unanswered_request_fails_the_attempt_at_the_response_timeout() {
    let mut harness = Harness::start(settings(4));
    harness.send(3);
    let mut call = harness.next_call(SOON).await.expect("a connection opens");
    assert_eq!(call.request(SOON).await, Some(0));
    let sent_at = Instant::now();
    // The server keeps the call open and never answers.
    let mut again = harness.next_call(RESPONSE_TIMEOUT + BACKOFF * 3).await.expect("reconnected");
    let waited = again.opened_at - sent_at;
    let expected = RESPONSE_TIMEOUT + BACKOFF..=RESPONSE_TIMEOUT + BACKOFF * 2;
    assert!(expected.contains(&waited), "timed out at the timeout, then backed off: {waited:?}");
    assert_eq!(again.request(SOON).await, Some(0), "the same offset again");
    again.acknowledge();
    drop(call);
    let (rows, retries) = harness.finish().await;
    assert_eq!(rows.expect("appended"), 3);
    assert_eq!(retries.len(), 1, "{retries:?}");
    assert_eq!(retries[0]["code"], "timeout");
}

#[tokio::test(start_paused = true)]
async fn a_request_the_connection_does_not_take_fails_the_attempt_at_the_send_timeout() {
    let mut harness = Harness::start(settings(4));
    // The peer stopped reading: the transport never takes the request.
    harness.stalled.store(true, Ordering::SeqCst);
    harness.send(3);
    let mut call = harness.next_call(SOON).await.expect("a connection opens");
    assert_eq!(call.request(SOON).await, Some(0));
    let stuck_since = call.unsent_since.lock().expect("stalled");
    harness.stalled.store(false, Ordering::SeqCst);
    let again = harness.next_call(SEND_TIMEOUT + BACKOFF * 3).await.expect("reconnected");
    let waited = again.opened_at - stuck_since;
    let expected = SEND_TIMEOUT + BACKOFF..=SEND_TIMEOUT + BACKOFF * 2;
    assert!(expected.contains(&waited), "at the send timeout, long before the response timeout: {waited:?}");
    again.acknowledge();
    let (rows, _) = harness.finish().await;
    assert_eq!(rows.expect("appended"), 3);
}

#[tokio::test(start_paused = true)]
async fn failures_without_progress_fail_the_lane_once_the_attempts_run_out() {
    let mut harness = Harness::start(settings(4));
    harness.send(3);
    for attempt in 1..=3 {
        let mut call = harness.next_call(BACKOFF * 3).await.unwrap_or_else(|| panic!("attempt {attempt} opens"));
        assert_eq!(call.request(SOON).await, Some(0));
        call.fail(tonic::Status::unavailable("gone"));
    }
    assert!(harness.next_call(BACKOFF * 3).await.is_none(), "no fourth attempt");
    let (rows, retries) = harness.finish().await;
    let problem = rows.expect_err("the lane fails");
    assert_eq!(problem.code, crate::error::ErrorCode::UploadFailed, "{problem:?}");
    let retryable: Vec<bool> = retries.iter().map(|r| r["retryable"].as_bool().unwrap_or(true)).collect();
    assert_eq!(retryable, [true, true, false]);
}

#[tokio::test(start_paused = true)]
async fn rows_already_in_the_stream_count_as_acknowledged() {
    let mut harness = Harness::start(settings(4));
    harness.send(8);
    let mut call = harness.next_call(SOON).await.expect("a connection opens");
    assert_eq!(call.request(SOON).await, Some(0));
    let status = googleapis_tonic_google_rpc::google::rpc::Status {
        code: tonic::Code::AlreadyExists as i32,
        message: "offset already exists".into(),
        details: Vec::new(),
    };
    let response =
        AppendRowsResponse { response: Some(append_rows_response::Response::Error(status)), ..Default::default() };
    call.answers.send(Ok(response)).expect("the appender listens");
    let (rows, retries) = harness.finish().await;
    assert_eq!((rows.expect("appended"), retries.len()), (8, 0));
}
