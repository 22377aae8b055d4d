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

mod append_rows;

use append_rows::append_rows;

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
        // BigQuery takes AppendRows requests up to 20 MB (tonic's default is 4 MiB).
        .max_decoding_message_size(BIGQUERY_MAX_REQUEST_BYTES)
}

/// The largest AppendRows request BigQuery accepts: 20 MB ("Maximum size of an AppendRows
/// request", the Storage Write API quotas; 10 MB before).
const BIGQUERY_MAX_REQUEST_BYTES: usize = 20_000_000;

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
