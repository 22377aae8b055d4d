//! A scriptable fake of BigQuery's Storage Write gRPC service (`BigQueryWrite`), served by
//! tonic's generic server machinery over the generated message types, on `127.0.0.1:0`.
//!
//! Like arrow-flight's `TestFlightServer`: script what the next appends do ([`AppendFault`]),
//! then inspect what the fake holds (rows per stream, in offset order) and what it observed
//! (concurrent requests per stream and overall, concurrent stream creations, connections).
//! Its offset semantics are BigQuery's: below the end `ALREADY_EXISTS`, above `OUT_OF_RANGE`,
//! both inside the response.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use arrow_array::{Int64Array, RecordBatch};
use arrow_ipc::reader::StreamReader;
use bytes::Bytes;
use futures::StreamExt as _;
use googleapis_tonic_google_cloud_bigquery_storage_v1::google::cloud::bigquery::storage::v1::{
    AppendRowsRequest, AppendRowsResponse, BatchCommitWriteStreamsRequest, BatchCommitWriteStreamsResponse,
    CreateWriteStreamRequest, FinalizeWriteStreamRequest, FinalizeWriteStreamResponse, GetWriteStreamRequest,
    WriteStream, append_rows_request, append_rows_response,
};
use googleapis_tonic_google_rpc::google::rpc::Status as RpcStatus;
use tokio::sync::mpsc;
use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status};

use super::quota_meter::RateMeter;

/// What the fake does with one append request (taken from the script in arrival order).
#[derive(Debug, Clone)]
pub enum AppendFault {
    /// Answer after this delay (the next requests keep arriving meanwhile).
    Delay(Duration),
    /// Do not apply; answer with this gRPC code inside the response.
    InResponseError(i32),
    /// Apply the rows, then break the connection without answering (a lost response).
    DropResponseAfterApply,
    /// Apply the rows, then answer nothing more on this connection, which stays open until the
    /// client closes it (a hung server or a half-dead proxy).
    HangAfterApply,
    /// Break the connection before applying.
    CloseBeforeApply,
    /// End the call with this gRPC status before applying.
    Status(tonic::Code),
}

#[derive(Debug, Default, Clone)]
pub struct FakeStream {
    pub table: String,
    /// Values of the first column when it is Int64, in offset order (not kept in null-sink
    /// mode).
    pub ids: Vec<i64>,
    /// The rows appended, as the record batches the requests carried, in offset order (kept
    /// only with [`FakeState::keep_batches`]).
    pub batches: Vec<RecordBatch>,
    /// Rows appended (the stream's end offset).
    pub rows: i64,
    /// (offset, rows) of every applied request.
    pub appends: Vec<(i64, usize)>,
    pub finalized: bool,
    /// When FinalizeWriteStream was answered for it.
    pub finalized_at: Option<tokio::time::Instant>,
    pub committed: bool,
}

/// Asserts that `stream` holds the ids `expected` in offset order, each exactly once, appended
/// in contiguous requests, and was committed.
pub fn assert_exact_stream(stream: &FakeStream, expected: std::ops::Range<i64>) {
    assert_eq!(stream.ids, expected.collect::<Vec<_>>(), "rows in offset order, each exactly once");
    let mut next = 0;
    for (offset, rows) in &stream.appends {
        assert_eq!(*offset, next, "appends are contiguous: {:?}", stream.appends);
        next += *rows as i64;
    }
    assert!(stream.committed);
}

#[derive(Debug, Default)]
pub struct FakeState {
    pub streams: HashMap<String, FakeStream>,
    pub script: VecDeque<AppendFault>,
    /// Delay for every append to a table whose name contains the key.
    pub table_delays: Vec<(String, Duration)>,
    /// The fault of every append to a table whose name contains the key (after its delay),
    /// before the script's: a table BigQuery refuses.
    pub table_faults: Vec<(String, AppendFault)>,
    pub create_delay: Duration,
    pub outstanding_per_stream: HashMap<String, usize>,
    pub max_outstanding_per_stream: usize,
    pub outstanding_total: usize,
    pub max_outstanding_total: usize,
    /// Outstanding requests on the stream when each new request arrived (window evidence).
    pub outstanding_at_arrival: Vec<(String, usize)>,
    pub creates_in_progress: usize,
    pub max_creates_in_progress: usize,
    pub connections: usize,
    /// AppendRows calls open now (until the client ends its request stream), and the most
    /// open at once.
    pub open_connections: usize,
    pub max_open_connections: usize,
    /// The project's concurrent connections: an AppendRows call beyond this many open is
    /// answered `RESOURCE_EXHAUSTED` (counted in `refused_connections`).
    pub connection_limit: Option<usize>,
    pub refused_connections: usize,
    pub append_requests: usize,
    /// Commit the streams, then answer the BatchCommit call with UNAVAILABLE (a lost response).
    pub lose_commit_response: bool,
    pub get_write_stream_calls: usize,
    /// Answer GetWriteStream with this status (BigQuery unreachable when a commit is checked).
    pub get_write_stream_error: Option<Status>,
    /// While set, appends are received (and counted) but not answered.
    pub hold_responses: bool,
    /// Answer CreateWriteStream with this status instead of creating a stream.
    pub create_error: Option<Status>,
    /// The project's stream-creation rate: CreateWriteStream calls beyond this many in any
    /// second are answered `RESOURCE_EXHAUSTED` (counted in `refused_creates`).
    pub create_rate_per_second: Option<usize>,
    /// When each accepted CreateWriteStream arrived, within the last second.
    pub recent_creates: VecDeque<tokio::time::Instant>,
    pub refused_creates: usize,
    /// The project's `CreateWriteStream` quota (the control-plane simulation's): a call beyond
    /// it is answered `RESOURCE_EXHAUSTED` (counted in `refused_creates`).
    pub create_quota: Option<RateMeter>,
    /// Beyond this many CreateWriteStream calls started within a second, each takes the
    /// second duration instead of `create_delay` (BigQuery's latency under a burst).
    pub create_burst_latency: Option<(usize, Duration)>,
    /// How long FinalizeWriteStream and BatchCommitWriteStreams take (the control-plane
    /// simulation's latencies).
    pub finalize_delay: Duration,
    pub commit_delay: Duration,
    /// FinalizeWriteStream of streams on tables whose name contains one of these fails
    /// `INTERNAL` (not retried by the gateway's commit: the execution fails).
    pub failing_finalize_tables: Vec<String>,
    /// FinalizeWriteStream of streams on tables whose name contains the key answers a row count
    /// this much off the rows appended (a stream that lost or gained rows).
    pub finalize_row_count_error: Vec<(String, i64)>,
    /// Null-sink mode (benchmarks): decode and count rows, keep no values.
    pub null_sink: bool,
    /// Keep every appended record batch ([`FakeStream::batches`]): the staged rows of types the
    /// emulator cannot store, checked as the gateway appended them.
    pub keep_batches: bool,
    /// Until then, every append is answered with the status `RESOURCE_EXHAUSTED` ("Exceeds
    /// 'AppendRows throughput' quota") before it is applied: a quota that has not refilled.
    pub exhausted_until: Option<tokio::time::Instant>,
    /// The next this many AppendRows connections stop reading after their first request (for a
    /// minute; the call stays open): HTTP/2 flow control then holds the client's later requests.
    pub stall_reading_connections: usize,
    /// The `x-goog-request-params` header of every call, by method (`AppendRows`, ...).
    pub routing_headers: Vec<(String, String)>,
    /// Bytes of Arrow record batches (`serialized_record_batch`, what the gateway's upload
    /// budget counts) received on any stream and not yet answered, and the most seen at once.
    pub bytes_in_flight: usize,
    pub max_bytes_in_flight: usize,
    /// The record-batch bytes of every append request received, in arrival order (replays
    /// included).
    pub payload_bytes: Vec<usize>,
}

/// How long a connection that stops reading holds its call open before ending it.
pub const STALL: Duration = Duration::from_secs(60);

/// Handle to a running fake.
#[derive(Clone)]
pub struct FakeWrite {
    pub state: Arc<Mutex<FakeState>>,
    pub address: String,
}

impl FakeWrite {
    pub async fn start() -> Self {
        let state = Arc::new(Mutex::new(FakeState::default()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let service = WriteService { state: Arc::clone(&state) };
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .unwrap();
        });
        Self { state, address }
    }

    pub fn script(&self, faults: impl IntoIterator<Item = AppendFault>) {
        self.state.lock().unwrap().script.extend(faults);
    }

    pub fn with<T>(&self, f: impl FnOnce(&mut FakeState) -> T) -> T {
        f(&mut self.state.lock().unwrap())
    }

    /// The stream of the staging table whose name contains `table` that was committed (else the one with most rows): a stream
    /// created by an attempt whose answer was lost stays empty beside it.
    pub fn stream_for(&self, table: &str) -> FakeStream {
        self.with(|s| {
            s.streams
                .values()
                .filter(|st| st.table.contains(table))
                .max_by_key(|st| (st.committed, st.rows))
                .cloned()
                .unwrap_or_else(|| panic!("no stream for {table}"))
        })
    }
}

#[derive(Clone)]
struct WriteService {
    state: Arc<Mutex<FakeState>>,
}

impl tonic::server::NamedService for WriteService {
    const NAME: &'static str = "google.cloud.bigquery.storage.v1.BigQueryWrite";
}

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

fn grpc<Req: prost::Message + Default + Send + 'static, Resp: prost::Message + Send + 'static>()
-> tonic::server::Grpc<tonic_prost::ProstCodec<Resp, Req>> {
    tonic::server::Grpc::new(tonic_prost::ProstCodec::default())
        .accept_compressed(CompressionEncoding::Gzip)
        .send_compressed(CompressionEncoding::Gzip)
        // BigQuery takes AppendRows requests up to 10 MB (tonic's default is 4 MiB).
        .max_decoding_message_size(BIGQUERY_MAX_REQUEST_BYTES)
}

/// The largest AppendRows request BigQuery accepts, with the fake's margin for the envelope.
const BIGQUERY_MAX_REQUEST_BYTES: usize = 10 * 1024 * 1024 + 64 * 1024;

impl tower::Service<http::Request<tonic::body::Body>> for WriteService {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let state = Arc::clone(&self.state);
        let path = request.uri().path().rsplit('/').next().unwrap_or_default().to_string();
        let routing = request.headers().get("x-goog-request-params").and_then(|v| v.to_str().ok()).unwrap_or_default();
        state.lock().unwrap().routing_headers.push((path.clone(), routing.to_string()));
        Box::pin(async move {
            let response = match path.as_str() {
                "CreateWriteStream" => {
                    let svc =
                        tower::service_fn(move |r: Request<CreateWriteStreamRequest>| create(Arc::clone(&state), r));
                    grpc::<CreateWriteStreamRequest, WriteStream>().unary(svc, request).await
                }
                "AppendRows" => {
                    let svc = tower::service_fn(move |r: Request<tonic::Streaming<AppendRowsRequest>>| {
                        append_rows(Arc::clone(&state), r)
                    });
                    let request = super::grpc_inflate::inflated(request);
                    grpc::<AppendRowsRequest, AppendRowsResponse>().streaming(svc, request).await
                }
                "FinalizeWriteStream" => {
                    let svc = tower::service_fn(move |r| finalize(Arc::clone(&state), r));
                    grpc::<FinalizeWriteStreamRequest, FinalizeWriteStreamResponse>().unary(svc, request).await
                }
                "BatchCommitWriteStreams" => {
                    let svc = tower::service_fn(move |r| batch_commit(Arc::clone(&state), r));
                    grpc::<BatchCommitWriteStreamsRequest, BatchCommitWriteStreamsResponse>().unary(svc, request).await
                }
                "GetWriteStream" => {
                    let svc = tower::service_fn(move |r| get_write_stream(Arc::clone(&state), r));
                    grpc::<GetWriteStreamRequest, WriteStream>().unary(svc, request).await
                }
                _ => Status::unimplemented(path).into_http(),
            };
            Ok(response)
        })
    }
}

async fn create(
    state: Arc<Mutex<FakeState>>,
    request: Request<CreateWriteStreamRequest>,
) -> Result<Response<WriteStream>, Status> {
    let delay = {
        let mut s = state.lock().unwrap();
        if let Some(error) = s.create_error.clone() {
            return Err(error);
        }
        let now = tokio::time::Instant::now();
        while s.recent_creates.front().is_some_and(|at| now.duration_since(*at) >= Duration::from_secs(1)) {
            s.recent_creates.pop_front();
        }
        let over_rate = s.create_rate_per_second.is_some_and(|rate| s.recent_creates.len() >= rate);
        if over_rate || s.create_quota.as_mut().is_some_and(|quota| !quota.admit()) {
            s.refused_creates += 1;
            return Err(Status::resource_exhausted(
                "Exceeds 'CreateWriteStream requests' quota for the project (fake: rate limit)",
            ));
        }
        s.recent_creates.push_back(now);
        s.creates_in_progress += 1;
        s.max_creates_in_progress = s.max_creates_in_progress.max(s.creates_in_progress);
        match s.create_burst_latency {
            Some((calls_per_second, slow)) if s.recent_creates.len() > calls_per_second => slow,
            _ => s.create_delay,
        }
    };
    tokio::time::sleep(delay).await;
    let mut s = state.lock().unwrap();
    s.creates_in_progress -= 1;
    let parent = request.into_inner().parent;
    let name = format!("{parent}/streams/s{}", s.streams.len());
    s.streams.insert(name.clone(), FakeStream { table: parent, ..Default::default() });
    Ok(Response::new(WriteStream { name, r#type: 2, ..Default::default() }))
}

async fn finalize(
    state: Arc<Mutex<FakeState>>,
    request: Request<FinalizeWriteStreamRequest>,
) -> Result<Response<FinalizeWriteStreamResponse>, Status> {
    let delay = state.lock().unwrap().finalize_delay;
    tokio::time::sleep(delay).await;
    let mut s = state.lock().unwrap();
    let failing = s.failing_finalize_tables.clone();
    let miscounted = s.finalize_row_count_error.clone();
    let stream = s.streams.get_mut(&request.get_ref().name).ok_or_else(|| Status::not_found("no stream"))?;
    if failing.iter().any(|table| stream.table.contains(table.as_str())) {
        return Err(Status::internal("fake: finalize failed"));
    }
    stream.finalized = true;
    stream.finalized_at = Some(tokio::time::Instant::now());
    let error = miscounted.iter().find(|(table, _)| stream.table.contains(table.as_str())).map_or(0, |(_, n)| *n);
    Ok(Response::new(FinalizeWriteStreamResponse { row_count: stream.rows + error }))
}

/// Commits finalized streams; with `lose_commit_response`, commits them and then answers
/// UNAVAILABLE.
async fn batch_commit(
    state: Arc<Mutex<FakeState>>,
    request: Request<BatchCommitWriteStreamsRequest>,
) -> Result<Response<BatchCommitWriteStreamsResponse>, Status> {
    let delay = state.lock().unwrap().commit_delay;
    tokio::time::sleep(delay).await;
    let mut s = state.lock().unwrap();
    for name in &request.get_ref().write_streams {
        let stream = s.streams.get_mut(name).ok_or_else(|| Status::not_found("no stream"))?;
        if !stream.finalized {
            return Err(Status::failed_precondition("not finalized"));
        }
        stream.committed = true;
    }
    if s.lose_commit_response {
        return Err(Status::unavailable("fake: commit response lost"));
    }
    Ok(Response::new(BatchCommitWriteStreamsResponse {
        commit_time: Some(prost_types::Timestamp { seconds: 1, nanos: 0 }),
        stream_errors: vec![],
    }))
}

async fn get_write_stream(
    state: Arc<Mutex<FakeState>>,
    request: Request<GetWriteStreamRequest>,
) -> Result<Response<WriteStream>, Status> {
    let mut s = state.lock().unwrap();
    s.get_write_stream_calls += 1;
    if let Some(status) = &s.get_write_stream_error {
        return Err(status.clone());
    }
    let stream = s.streams.get(&request.get_ref().name).ok_or_else(|| Status::not_found("no stream"))?;
    Ok(Response::new(WriteStream {
        name: request.get_ref().name.clone(),
        commit_time: stream.committed.then_some(prost_types::Timestamp { seconds: 1, nanos: 0 }),
        ..Default::default()
    }))
}

fn in_response(code: i32, message: &str) -> AppendRowsResponse {
    AppendRowsResponse {
        response: Some(append_rows_response::Response::Error(RpcStatus {
            code,
            message: message.into(),
            details: vec![],
        })),
        ..Default::default()
    }
}

/// The rows of one request: how many, the first column's values when it is Int64 (the ids
/// most tests check), and the record batches themselves.
struct AppendedRows {
    rows: usize,
    ids: Vec<i64>,
    batches: Vec<RecordBatch>,
}

fn decode_rows(schema: &Bytes, batch: &Bytes) -> AppendedRows {
    let mut stream = schema.to_vec();
    stream.extend_from_slice(batch);
    let reader = StreamReader::try_new(std::io::Cursor::new(stream), None).expect("fake: writer schema");
    let batches: Vec<RecordBatch> = reader.map(|b| b.expect("fake: record batch")).collect();
    let rows = batches.iter().map(RecordBatch::num_rows).sum();
    let ids = batches
        .iter()
        .filter_map(|b| b.column(0).as_any().downcast_ref::<Int64Array>())
        .flat_map(|ids| ids.values().to_vec())
        .collect();
    AppendedRows { rows, ids, batches }
}

type AppendStream = tokio_stream::wrappers::UnboundedReceiverStream<Result<AppendRowsResponse, Status>>;
type Responses = mpsc::UnboundedSender<Result<AppendRowsResponse, Status>>;

/// One AppendRows connection: a reader takes requests as they arrive (so outstanding requests
/// are observable) and queues them for a responder that answers them one at a time, in order.
async fn append_rows(
    state: Arc<Mutex<FakeState>>,
    request: Request<tonic::Streaming<AppendRowsRequest>>,
) -> Result<Response<AppendStream>, Status> {
    let (responses, responses_rx) = mpsc::unbounded_channel();
    let (queued, queue) = mpsc::unbounded_channel::<AppendRowsRequest>();
    let stalls = state.lock().unwrap().open_connection()?;
    tokio::spawn(read_requests(Arc::clone(&state), request.into_inner(), stalls, queued));
    tokio::spawn(answer_requests(state, queue, responses));
    Ok(Response::new(tokio_stream::wrappers::UnboundedReceiverStream::new(responses_rx)))
}

/// Bytes of the Arrow record batch an append carries (what the gateway's upload budget counts).
fn payload_bytes(request: &AppendRowsRequest) -> usize {
    match &request.rows {
        Some(append_rows_request::Rows::ArrowRows(arrow)) => {
            arrow.rows.as_ref().map_or(0, |rows| rows.serialized_record_batch.len())
        }
        _ => 0,
    }
}

impl FakeState {
    /// Counts a new AppendRows connection, or refuses it beyond the connection limit; whether
    /// it is one that stops reading after its first request.
    fn open_connection(&mut self) -> Result<bool, Status> {
        if self.connection_limit.is_some_and(|limit| self.open_connections >= limit) {
            self.refused_connections += 1;
            return Err(Status::resource_exhausted("fake: the project's concurrent connections are all in use"));
        }
        self.connections += 1;
        self.open_connections += 1;
        self.max_open_connections = self.max_open_connections.max(self.open_connections);
        let stalls = self.stall_reading_connections > 0;
        self.stall_reading_connections = self.stall_reading_connections.saturating_sub(1);
        Ok(stalls)
    }

    /// Counts a request received on `stream` and not yet answered.
    fn received(&mut self, stream: &str, bytes: usize) {
        let outstanding = self.outstanding_per_stream.entry(stream.to_string()).or_default();
        let before = *outstanding;
        *outstanding += 1;
        let now = *outstanding;
        self.outstanding_at_arrival.push((stream.to_string(), before));
        self.max_outstanding_per_stream = self.max_outstanding_per_stream.max(now);
        self.outstanding_total += 1;
        self.max_outstanding_total = self.max_outstanding_total.max(self.outstanding_total);
        self.bytes_in_flight += bytes;
        self.max_bytes_in_flight = self.max_bytes_in_flight.max(self.bytes_in_flight);
        self.payload_bytes.push(bytes);
        self.append_requests += 1;
    }

    /// Counts a request of `stream` as answered (whatever the answer).
    fn answered(&mut self, stream: &str, bytes: usize) {
        if let Some(n) = self.outstanding_per_stream.get_mut(stream) {
            *n = n.saturating_sub(1);
        }
        self.outstanding_total = self.outstanding_total.saturating_sub(1);
        self.bytes_in_flight = self.bytes_in_flight.saturating_sub(bytes);
    }

    /// What the script says of the next request, and the delay of its stream's table.
    fn next_fault(&mut self, stream: &str) -> (Option<AppendFault>, Option<Duration>) {
        let table = self.streams.get(stream).map(|st| st.table.clone()).unwrap_or_default();
        let delay = self.table_delays.iter().find(|(key, _)| table.contains(key.as_str())).map(|(_, d)| *d);
        let table_fault = self.table_faults.iter().find(|(key, _)| table.contains(key.as_str()));
        let fault = match table_fault {
            Some((_, fault)) => Some(fault.clone()),
            None => self.script.pop_front(),
        };
        (fault, delay)
    }

    fn quota_exhausted(&self) -> bool {
        self.exhausted_until.is_some_and(|until| tokio::time::Instant::now() < until)
    }

    /// Applies `ids` at `offset` with BigQuery's offset semantics: the answer (an error inside
    /// the response unless the rows were appended); `None` when there is no such stream.
    fn apply(&mut self, stream_name: &str, offset: i64, appended: AppendedRows) -> Option<AppendRowsResponse> {
        let (null_sink, keep_batches) = (self.null_sink, self.keep_batches);
        let stream = self.streams.get_mut(stream_name)?;
        let end = stream.rows;
        if stream.finalized {
            return Some(in_response(9, "fake: stream finalized"));
        }
        if offset < end {
            return Some(in_response(6, "fake: offset already written"));
        }
        if offset > end {
            return Some(in_response(11, "fake: offset beyond the end"));
        }
        stream.rows += appended.rows as i64;
        if !null_sink {
            stream.appends.push((offset, appended.rows));
            stream.ids.extend(appended.ids);
        }
        if keep_batches {
            stream.batches.extend(appended.batches);
        }
        Some(AppendRowsResponse {
            response: Some(append_rows_response::Response::AppendResult(append_rows_response::AppendResult {
                offset: Some(offset),
            })),
            write_stream: stream_name.to_string(),
            ..Default::default()
        })
    }
}

/// The reader of a connection: names each request's stream (clients may name it only on a
/// connection's first request, BigQuery's rule), counts it as outstanding and queues it.
async fn read_requests(
    state: Arc<Mutex<FakeState>>,
    mut incoming: tonic::Streaming<AppendRowsRequest>,
    stalls: bool,
    queued: mpsc::UnboundedSender<AppendRowsRequest>,
) {
    /// Counts the connection closed when the reader ends (the client ended its requests).
    struct Closed(Arc<Mutex<FakeState>>);
    impl Drop for Closed {
        fn drop(&mut self) {
            let mut state = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            state.open_connections = state.open_connections.saturating_sub(1);
        }
    }
    let _closed = Closed(Arc::clone(&state));
    let mut connection_stream = String::new();
    let mut read = 0;
    while let Some(Ok(mut request)) = incoming.next().await {
        read += 1;
        if stalls && read > 1 {
            // Holds the request unread: nothing more of the call's body is taken.
            tokio::time::sleep(STALL).await;
            break;
        }
        if request.write_stream.is_empty() {
            request.write_stream.clone_from(&connection_stream);
        } else {
            connection_stream.clone_from(&request.write_stream);
        }
        state.lock().unwrap().received(&request.write_stream, payload_bytes(&request));
        if queued.send(request).is_err() {
            break;
        }
    }
}

/// What the responder does after one request.
enum Then {
    NextRequest,
    EndCall,
}

/// The responder of a connection: answers its requests one at a time, in order, until one
/// ends the call.
async fn answer_requests(
    state: Arc<Mutex<FakeState>>,
    mut queue: mpsc::UnboundedReceiver<AppendRowsRequest>,
    responses: Responses,
) {
    let mut schema: Option<Bytes> = None;
    while let Some(request) = queue.recv().await {
        if let Then::EndCall = answer(&state, request, &mut schema, &responses).await {
            return;
        }
    }
}

/// Answers one request: the scripted fault or quota answer, else the rows applied at the
/// request's offset.
async fn answer(
    state: &Mutex<FakeState>,
    request: AppendRowsRequest,
    schema: &mut Option<Bytes>,
    responses: &Responses,
) -> Then {
    while state.lock().unwrap().hold_responses {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (stream_name, bytes) = (request.write_stream.clone(), payload_bytes(&request));
    let Some(append_rows_request::Rows::ArrowRows(arrow)) = request.rows else {
        let _ = responses.send(Err(Status::invalid_argument("fake: only Arrow rows")));
        return Then::EndCall;
    };
    if let Some(writer_schema) = arrow.writer_schema {
        *schema = Some(writer_schema.serialized_schema);
    }
    let (fault, delay) = state.lock().unwrap().next_fault(&stream_name);
    if let Some(delay) = delay {
        tokio::time::sleep(delay).await;
    }
    let answered = || state.lock().unwrap().answered(&stream_name, bytes);
    if let Some(then) = fail_before_applying(state, fault.as_ref(), responses, answered).await {
        return then;
    }
    let Some(schema) = schema.as_ref() else {
        let _ = responses.send(Err(Status::invalid_argument("fake: no writer schema on this connection")));
        return Then::EndCall;
    };
    let appended = decode_rows(schema, &arrow.rows.map(|r| r.serialized_record_batch).unwrap_or_default());
    let applied = state.lock().unwrap().apply(&stream_name, request.offset.unwrap_or(-1), appended);
    answered();
    let Some(response) = applied else {
        let _ = responses.send(Ok(in_response(5, "fake: stream not found")));
        return Then::NextRequest;
    };
    match fault {
        Some(AppendFault::DropResponseAfterApply) => {
            let _ = responses.send(Err(Status::unavailable("fake: response lost")));
            Then::EndCall
        }
        Some(AppendFault::HangAfterApply) => {
            responses.closed().await;
            Then::EndCall
        }
        _ if responses.send(Ok(response)).is_err() => Then::EndCall,
        _ => Then::NextRequest,
    }
}

/// The answers given before the rows are applied: an exhausted quota, or the scripted fault
/// (after its delay, for [`AppendFault::Delay`]). `None`: go on and apply the rows.
async fn fail_before_applying(
    state: &Mutex<FakeState>,
    fault: Option<&AppendFault>,
    responses: &Responses,
    answered: impl Fn(),
) -> Option<Then> {
    if state.lock().unwrap().quota_exhausted() {
        answered();
        let _ =
            responses.send(Err(Status::resource_exhausted("fake: Exceeds 'AppendRows throughput' quota in region us")));
        return Some(Then::EndCall);
    }
    match fault? {
        AppendFault::Delay(d) => {
            tokio::time::sleep(*d).await;
            None
        }
        AppendFault::CloseBeforeApply => {
            answered();
            let _ = responses.send(Err(Status::unavailable("fake: connection closed")));
            Some(Then::EndCall)
        }
        AppendFault::Status(code) => {
            answered();
            let _ = responses.send(Err(Status::new(*code, "fake: scripted status")));
            Some(Then::EndCall)
        }
        AppendFault::InResponseError(code) => {
            answered();
            let _ = responses.send(Ok(in_response(*code, "fake: scripted error")));
            Some(Then::NextRequest)
        }
        AppendFault::DropResponseAfterApply | AppendFault::HangAfterApply => None,
    }
}
