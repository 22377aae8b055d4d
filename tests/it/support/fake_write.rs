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

use arrow_array::Int64Array;
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
    /// Values of the first (Int64) column, in offset order (not kept in null-sink mode).
    pub ids: Vec<i64>,
    /// Rows appended (the stream's end offset).
    pub rows: i64,
    /// (offset, rows) of every applied request.
    pub appends: Vec<(i64, usize)>,
    pub finalized: bool,
    pub committed: bool,
}

#[derive(Debug, Default)]
pub struct FakeState {
    pub streams: HashMap<String, FakeStream>,
    pub script: VecDeque<AppendFault>,
    /// Delay for every append to a table whose name contains the key.
    pub table_delays: Vec<(String, Duration)>,
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
    pub append_requests: usize,
    /// Commit the streams, then answer the BatchCommit call with UNAVAILABLE (a lost response).
    pub lose_commit_response: bool,
    pub get_write_stream_calls: usize,
    /// While set, appends are received (and counted) but not answered.
    pub hold_responses: bool,
    /// Answer CreateWriteStream with this status instead of creating a stream.
    pub create_error: Option<Status>,
    /// Null-sink mode (benchmarks): decode and count rows, keep no values.
    pub null_sink: bool,
    /// Until then, every append is answered with the status `RESOURCE_EXHAUSTED` ("Exceeds
    /// 'AppendRows throughput' quota") before it is applied: a quota that has not refilled.
    pub exhausted_until: Option<std::time::Instant>,
    /// The next this many AppendRows connections stop reading after their first request (for a
    /// minute; the call stays open): HTTP/2 flow control then holds the client's later requests.
    pub stall_reading_connections: usize,
    /// The `x-goog-request-params` header of every call, by method (`AppendRows`, ...).
    pub routing_headers: Vec<(String, String)>,
}

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
}

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
                    let svc = tower::service_fn(move |r: Request<FinalizeWriteStreamRequest>| {
                        let state = Arc::clone(&state);
                        async move {
                            let mut s = state.lock().unwrap();
                            let stream =
                                s.streams.get_mut(&r.get_ref().name).ok_or_else(|| Status::not_found("no stream"))?;
                            stream.finalized = true;
                            Ok::<_, Status>(Response::new(FinalizeWriteStreamResponse { row_count: stream.rows }))
                        }
                    });
                    grpc::<FinalizeWriteStreamRequest, FinalizeWriteStreamResponse>().unary(svc, request).await
                }
                "BatchCommitWriteStreams" => {
                    let svc = tower::service_fn(move |r: Request<BatchCommitWriteStreamsRequest>| {
                        let state = Arc::clone(&state);
                        async move {
                            let mut s = state.lock().unwrap();
                            for name in &r.get_ref().write_streams {
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
                    });
                    grpc::<BatchCommitWriteStreamsRequest, BatchCommitWriteStreamsResponse>().unary(svc, request).await
                }
                "GetWriteStream" => {
                    let svc = tower::service_fn(move |r: Request<GetWriteStreamRequest>| {
                        let state = Arc::clone(&state);
                        async move {
                            let mut s = state.lock().unwrap();
                            s.get_write_stream_calls += 1;
                            let stream =
                                s.streams.get(&r.get_ref().name).ok_or_else(|| Status::not_found("no stream"))?;
                            Ok(Response::new(WriteStream {
                                name: r.get_ref().name.clone(),
                                commit_time: stream
                                    .committed
                                    .then_some(prost_types::Timestamp { seconds: 1, nanos: 0 }),
                                ..Default::default()
                            }))
                        }
                    });
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
        s.creates_in_progress += 1;
        s.max_creates_in_progress = s.max_creates_in_progress.max(s.creates_in_progress);
        s.create_delay
    };
    tokio::time::sleep(delay).await;
    let mut s = state.lock().unwrap();
    s.creates_in_progress -= 1;
    let parent = request.into_inner().parent;
    let name = format!("{parent}/streams/s{}", s.streams.len());
    s.streams.insert(name.clone(), FakeStream { table: parent, ..Default::default() });
    Ok(Response::new(WriteStream { name, r#type: 2, ..Default::default() }))
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

/// Decodes the first column's values of one request.
fn decode_ids(schema: &Bytes, batch: &Bytes) -> Vec<i64> {
    let mut stream = schema.to_vec();
    stream.extend_from_slice(batch);
    let reader = StreamReader::try_new(std::io::Cursor::new(stream), None).expect("fake: writer schema");
    reader
        .flat_map(|b| {
            let b = b.expect("fake: record batch");
            b.column(0).as_any().downcast_ref::<Int64Array>().expect("fake: first column is Int64").values().to_vec()
        })
        .collect()
}

type AppendStream = tokio_stream::wrappers::UnboundedReceiverStream<Result<AppendRowsResponse, Status>>;

async fn append_rows(
    state: Arc<Mutex<FakeState>>,
    request: Request<tonic::Streaming<AppendRowsRequest>>,
) -> Result<Response<AppendStream>, Status> {
    let mut incoming = request.into_inner();
    let (responses, responses_rx) = mpsc::unbounded_channel();
    let (queued, mut queue) = mpsc::unbounded_channel::<AppendRowsRequest>();
    let stalls = {
        let mut s = state.lock().unwrap();
        s.connections += 1;
        let stalls = s.stall_reading_connections > 0;
        s.stall_reading_connections = s.stall_reading_connections.saturating_sub(1);
        stalls
    };
    // Reader: takes requests as they arrive, so outstanding requests are observable.
    let reader_state = Arc::clone(&state);
    tokio::spawn(async move {
        // Clients may name the stream only on a connection's first request (BigQuery's rule).
        let mut connection_stream = String::new();
        let mut read = 0;
        while let Some(Ok(mut request)) = incoming.next().await {
            read += 1;
            if stalls && read > 1 {
                // Holds the request unread: nothing more of the call's body is taken.
                tokio::time::sleep(Duration::from_secs(60)).await;
                break;
            }
            if request.write_stream.is_empty() {
                request.write_stream.clone_from(&connection_stream);
            } else {
                connection_stream.clone_from(&request.write_stream);
            }
            let mut s = reader_state.lock().unwrap();
            let outstanding = s.outstanding_per_stream.entry(request.write_stream.clone()).or_default();
            let before = *outstanding;
            *outstanding += 1;
            let now = *outstanding;
            s.outstanding_at_arrival.push((request.write_stream.clone(), before));
            s.max_outstanding_per_stream = s.max_outstanding_per_stream.max(now);
            s.outstanding_total += 1;
            s.max_outstanding_total = s.max_outstanding_total.max(s.outstanding_total);
            s.append_requests += 1;
            drop(s);
            if queued.send(request).is_err() {
                break;
            }
        }
    });
    // Responder: one request at a time, in order.
    tokio::spawn(async move {
        let mut schema: Option<Bytes> = None;
        while let Some(request) = queue.recv().await {
            while state.lock().unwrap().hold_responses {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let stream_name = request.write_stream.clone();
            let Some(append_rows_request::Rows::ArrowRows(arrow)) = request.rows else {
                let _ = responses.send(Err(Status::invalid_argument("fake: only Arrow rows")));
                break;
            };
            if let Some(writer_schema) = arrow.writer_schema {
                schema = Some(writer_schema.serialized_schema);
            }
            let (fault, delay) = {
                let mut s = state.lock().unwrap();
                let fault = s.script.pop_front();
                let table = s.streams.get(&stream_name).map(|st| st.table.clone()).unwrap_or_default();
                let delay = s.table_delays.iter().find(|(key, _)| table.contains(key.as_str())).map(|(_, d)| *d);
                (fault, delay)
            };
            if let Some(delay) = delay {
                tokio::time::sleep(delay).await;
            }
            let finish = |state: &Arc<Mutex<FakeState>>| {
                let mut s = state.lock().unwrap();
                if let Some(n) = s.outstanding_per_stream.get_mut(&stream_name) {
                    *n = n.saturating_sub(1);
                }
                s.outstanding_total = s.outstanding_total.saturating_sub(1);
            };
            let exhausted =
                state.lock().unwrap().exhausted_until.is_some_and(|until| std::time::Instant::now() < until);
            if exhausted {
                finish(&state);
                let _ = responses
                    .send(Err(Status::resource_exhausted("fake: Exceeds 'AppendRows throughput' quota in region us")));
                return;
            }
            match &fault {
                Some(AppendFault::Delay(d)) => tokio::time::sleep(*d).await,
                Some(AppendFault::CloseBeforeApply) => {
                    finish(&state);
                    let _ = responses.send(Err(Status::unavailable("fake: connection closed")));
                    return;
                }
                Some(AppendFault::Status(code)) => {
                    finish(&state);
                    let _ = responses.send(Err(Status::new(*code, "fake: scripted status")));
                    return;
                }
                Some(AppendFault::InResponseError(code)) => {
                    finish(&state);
                    let _ = responses.send(Ok(in_response(*code, "fake: scripted error")));
                    continue;
                }
                _ => {}
            }
            let Some(schema) = schema.as_ref() else {
                let _ = responses.send(Err(Status::invalid_argument("fake: no writer schema on this connection")));
                return;
            };
            let ids = decode_ids(schema, &arrow.rows.map(|r| r.serialized_record_batch).unwrap_or_default());
            let null_sink = state.lock().unwrap().null_sink;
            let offset = request.offset.unwrap_or(-1);
            let response = {
                let mut s = state.lock().unwrap();
                let Some(stream) = s.streams.get_mut(&stream_name) else {
                    drop(s);
                    finish(&state);
                    let _ = responses.send(Ok(in_response(5, "fake: stream not found")));
                    continue;
                };
                let end = stream.rows;
                if stream.finalized {
                    in_response(9, "fake: stream finalized")
                } else if offset < end {
                    in_response(6, "fake: offset already written")
                } else if offset > end {
                    in_response(11, "fake: offset beyond the end")
                } else {
                    stream.rows += ids.len() as i64;
                    if !null_sink {
                        stream.appends.push((offset, ids.len()));
                        stream.ids.extend(ids);
                    }
                    AppendRowsResponse {
                        response: Some(append_rows_response::Response::AppendResult(
                            append_rows_response::AppendResult { offset: Some(offset) },
                        )),
                        write_stream: stream_name.clone(),
                        ..Default::default()
                    }
                }
            };
            finish(&state);
            if matches!(fault, Some(AppendFault::DropResponseAfterApply)) {
                let _ = responses.send(Err(Status::unavailable("fake: response lost")));
                return;
            }
            if matches!(fault, Some(AppendFault::HangAfterApply)) {
                responses.closed().await;
                return;
            }
            if responses.send(Ok(response)).is_err() {
                return;
            }
        }
    });
    Ok(Response::new(tokio_stream::wrappers::UnboundedReceiverStream::new(responses_rx)))
}
