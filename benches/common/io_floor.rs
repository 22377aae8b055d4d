//! The I/O floor: the least any gateway must do with the benchmark's bodies, as a program of its
//! own, run as a separate process beside the gateway on the same loopback sockets and the same
//! null Storage Write sink (`make bench` reports the gateway's CPU and MB/s as ratios to it).
//!
//! Per POST it reads the body over HTTP/1.1 (hyper), hashes it with SHA-256, cuts the Arrow IPC
//! stream into its schema and record-batch messages (reading only the messages' length prefixes
//! and flatbuffer headers: the row count an offset needs), and sends each record batch as one
//! `AppendRowsRequest` compressed with ISA-L's gzip at the gateway's level, over one HTTP/2
//! connection per stream (tonic's transport), with explicit offsets. It answers the POST once
//! the request is queued for sending, at most [`REQUESTS_IN_FLIGHT`] unacknowledged per stream;
//! `POST /streams/{name}/finish` answers once every request of the stream is acknowledged and
//! the stream finalized and committed (as a gateway's commit must).
//!
//! Nothing else: no Postgres, no decoding or validation of values, no budgets, no retries, no
//! metrics. It shares no code with the gateway (its request encoding is its own), so none of the
//! gateway's work can hide in it. The bench starts it by running its own binary with
//! [`SERVE_ARGUMENT`] (see [`serve_if_asked`]).

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::io::Write as _;
use std::sync::Arc;

use bytes::{BufMut as _, Bytes, BytesMut};
use googleapis_tonic_google_cloud_bigquery_storage_v1::google::cloud::bigquery::storage::v1::{
    AppendRowsRequest, AppendRowsResponse, BatchCommitWriteStreamsRequest, CreateWriteStreamRequest,
    FinalizeWriteStreamRequest, WriteStream, append_rows_response, big_query_write_client::BigQueryWriteClient,
    write_stream,
};
use http_body_util::BodyExt as _;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};
use sha2::Digest as _;
use tokio::sync::{Mutex, Semaphore, mpsc};
use tonic::codec::Codec as _;

/// The argument that makes the bench binary serve as the floor: `<binary> --io-floor <sink>`.
pub const SERVE_ARGUMENT: &str = "--io-floor";

/// Unacknowledged requests per stream before a POST waits (the gateway's default window is
/// bytes-bounded; a few requests of a few MiB each is the same order).
const REQUESTS_IN_FLIGHT: usize = 8;

const APPEND_ROWS_PATH: &str = "/google.cloud.bigquery.storage.v1.BigQueryWrite/AppendRows";

/// Serves the floor and never returns when the process was started with [`SERVE_ARGUMENT`];
/// returns at once otherwise. Prints `listening <port>` on stdout once it accepts connections,
/// and exits when its standard input closes (the bench ends it by dropping the child).
pub fn serve_if_asked() {
    let args: Vec<String> = std::env::args().collect();
    let Some(at) = args.iter().position(|arg| arg == SERVE_ARGUMENT) else {
        return;
    };
    let sink = format!("http://{}", args[at + 1]);
    let gzip_level = std::env::var("FILAMENT_APPEND_GZIP_LEVEL").map_or(1, |level| level.parse().unwrap_or(1));
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    runtime.block_on(serve(sink, gzip_level));
    std::process::exit(0);
}

async fn serve(sink: String, gzip_level: u32) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    println!("listening {}", listener.local_addr().unwrap().port());
    let floor = Arc::new(Floor { sink, gzip_level, streams: Mutex::new(HashMap::new()) });
    tokio::spawn(async {
        // Ends the process when the bench closes our standard input.
        let mut stdin = tokio::io::stdin();
        let _ = tokio::io::copy(&mut stdin, &mut tokio::io::sink()).await;
        std::process::exit(0);
    });
    loop {
        let (socket, _) = listener.accept().await.unwrap();
        let floor = Arc::clone(&floor);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let floor = Arc::clone(&floor);
                async move { Ok::<_, Infallible>(floor.handle(request).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(socket), service)
                .await;
        });
    }
}

struct Floor {
    sink: String,
    gzip_level: u32,
    streams: Mutex<HashMap<String, Arc<StreamCell>>>,
}

/// A resource's stream, opened once by its first POST.
type StreamCell = tokio::sync::OnceCell<Mutex<FloorStream>>;

/// Ends the stream's requests, waits for every acknowledgement, then finalizes it and commits it
/// (what a gateway's commit must do with a PENDING stream): the requests acknowledged.
async fn finish(stream: &mut FloorStream) -> i64 {
    stream.frames = None;
    let acknowledged = stream.reader.take().unwrap().await.unwrap();
    let mut client = BigQueryWriteClient::new(stream.channel.clone());
    let name = stream.name.clone();
    let finalized = client.finalize_write_stream(FinalizeWriteStreamRequest { name: name.clone() }).await.unwrap();
    assert_eq!(finalized.into_inner().row_count, stream.next_offset, "the sink holds every row sent");
    let parent = name.split("/streams/").next().unwrap().to_string();
    let commit = BatchCommitWriteStreamsRequest { parent, write_streams: vec![name] };
    let committed = client.batch_commit_write_streams(commit).await.unwrap().into_inner();
    assert!(committed.stream_errors.is_empty(), "the sink committed the stream");
    acknowledged
}

/// One resource's write stream at the sink: the connection's request sender, the next offset,
/// and the window of unacknowledged requests.
struct FloorStream {
    name: String,
    channel: tonic::transport::Channel,
    frames: Option<mpsc::UnboundedSender<Bytes>>,
    next_offset: i64,
    window: Arc<Semaphore>,
    /// Ends with the response reader: the rows acknowledged.
    reader: Option<tokio::task::JoinHandle<i64>>,
}

type Response = http::Response<http_body_util::Full<Bytes>>;

fn answer(status: u16, text: String) -> Response {
    http::Response::builder().status(status).body(http_body_util::Full::new(Bytes::from(text))).unwrap()
}

impl Floor {
    async fn handle(&self, request: http::Request<hyper::body::Incoming>) -> Response {
        let path = request.uri().path().to_string();
        let Some(rest) = path.strip_prefix("/streams/") else {
            return answer(404, "no such path".into());
        };
        if let Some(resource) = rest.strip_suffix("/finish") {
            let stream = self.streams.lock().await.remove(resource);
            let Some(stream) = stream.as_deref().and_then(tokio::sync::OnceCell::get) else {
                return answer(404, "no such stream".into());
            };
            return answer(200, finish(&mut *stream.lock().await).await.to_string());
        }
        let body = request.into_body().collect().await.unwrap().to_bytes();
        let digest = sha2::Sha256::digest(&body);
        std::hint::black_box(digest);
        let cell = self.stream(rest).await;
        let mut stream = cell.get().unwrap().lock().await;
        let mut rows = 0;
        for (schema, record_batch, batch_rows) in ipc_messages(&body) {
            let writer_schema = (stream.next_offset == 0).then_some(schema);
            let frame = grpc_frame(&stream.name, writer_schema, stream.next_offset, &record_batch, self.gzip_level);
            stream.window.acquire().await.unwrap().forget();
            stream.frames.as_ref().unwrap().send(frame).unwrap();
            stream.next_offset += batch_rows;
            rows += batch_rows;
        }
        answer(202, rows.to_string())
    }

    /// The resource's stream, created at the sink with its connection on the first POST (each
    /// resource's on its own: the map is locked only to find its cell).
    async fn stream(&self, resource: &str) -> Arc<StreamCell> {
        let cell = Arc::clone(self.streams.lock().await.entry(resource.to_string()).or_default());
        cell.get_or_init(|| async { Mutex::new(self.open(resource).await) }).await;
        cell
    }

    async fn open(&self, resource: &str) -> FloorStream {
        let channel = tonic::transport::Endpoint::from_shared(self.sink.clone()).unwrap().connect().await.unwrap();
        let created = BigQueryWriteClient::new(channel.clone())
            .create_write_stream(CreateWriteStreamRequest {
                parent: format!("projects/floor/datasets/floor/tables/{resource}"),
                write_stream: Some(WriteStream { r#type: write_stream::Type::Pending as i32, ..Default::default() }),
            })
            .await
            .unwrap()
            .into_inner();
        let (frames, queued) = mpsc::unbounded_channel::<Bytes>();
        let body =
            tokio_stream::StreamExt::map(tokio_stream::wrappers::UnboundedReceiverStream::new(queued), |frame| {
                Ok::<_, Infallible>(http_body::Frame::data(frame))
            });
        let mut builder = http::Request::builder()
            .method(http::Method::POST)
            .uri(format!("{}{APPEND_ROWS_PATH}", self.sink))
            .version(http::Version::HTTP_2)
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers");
        if self.gzip_level > 0 {
            builder = builder.header("grpc-encoding", "gzip");
        }
        let request = builder.body(tonic::body::Body::new(http_body_util::StreamBody::new(body))).unwrap();
        let created_on = channel.clone();
        let mut channel = channel;
        let ready = tower::ServiceExt::ready(&mut channel).await.unwrap();
        let response = tower::Service::call(ready, request).await.unwrap();
        let status = response.status();
        let decoder = tonic_prost::ProstCodec::<AppendRowsRequest, AppendRowsResponse>::default().decoder();
        let mut responses = tonic::Streaming::new_response(decoder, response.into_body(), status, None, None);
        let window = Arc::new(Semaphore::new(REQUESTS_IN_FLIGHT));
        let released = Arc::clone(&window);
        let reader = tokio::spawn(async move {
            let mut acknowledged = 0;
            while let Some(response) = responses.message().await.unwrap() {
                let appended = matches!(response.response, Some(append_rows_response::Response::AppendResult(_)));
                assert!(appended && response.row_errors.is_empty(), "the sink refused an append: {response:?}");
                acknowledged += 1;
                released.add_permits(1);
            }
            acknowledged
        });
        let channel = created_on;
        FloorStream { name: created.name, channel, frames: Some(frames), next_offset: 0, window, reader: Some(reader) }
    }
}

/// The IPC stream's messages as (schema message, record batch message, rows) per record batch;
/// each message keeps its encapsulation (continuation, length, flatbuffer, body), as the
/// `AppendRowsRequest` fields want them. Reads only the flatbuffer headers.
fn ipc_messages(stream: &Bytes) -> Vec<(Bytes, Bytes, i64)> {
    let mut at = 0;
    let mut schema = Bytes::new();
    let mut batches = Vec::new();
    while at + 8 <= stream.len() {
        let metadata_length = u32::from_le_bytes(stream[at + 4..at + 8].try_into().unwrap()) as usize;
        if metadata_length == 0 {
            break; // end of stream
        }
        let metadata = &stream[at + 8..at + 8 + metadata_length];
        let message = arrow_ipc::root_as_message(metadata).expect("an IPC message");
        let end = at + 8 + metadata_length + message.bodyLength() as usize;
        let bytes = stream.slice(at..end);
        match message.header_type() {
            arrow_ipc::MessageHeader::Schema => schema = bytes,
            arrow_ipc::MessageHeader::RecordBatch => {
                let rows = message.header_as_record_batch().unwrap().length();
                batches.push((schema.clone(), bytes, rows));
            }
            other => panic!("the floor sends only record batches, not {other:?}"),
        }
        at = end;
    }
    batches
}

/// `AppendRowsRequest{write_stream=1, offset=2 (Int64Value), arrow_rows=5{writer_schema=1
/// {serialized_schema=1}, rows=2{serialized_record_batch=1}}}`, encoded by hand so the record
/// batch goes straight from the body into ISA-L, framed as one gRPC message.
fn grpc_frame(stream: &str, schema: Option<Bytes>, offset: i64, record_batch: &Bytes, gzip_level: u32) -> Bytes {
    let mut head = Vec::with_capacity(256 + schema.as_ref().map_or(0, Bytes::len));
    prost::encoding::string::encode(1, &stream.to_string(), &mut head);
    encode_key(2, WireType::LengthDelimited, &mut head);
    let offset_value = key_len(1) + encoded_len_varint(offset as u64);
    encode_varint(offset_value as u64, &mut head);
    prost::encoding::int64::encode(1, &offset, &mut head);
    let rows_length = key_len(1) + encoded_len_varint(record_batch.len() as u64) + record_batch.len();
    let schema_length = schema.as_ref().map_or(0, |schema| {
        let inner = key_len(1) + encoded_len_varint(schema.len() as u64) + schema.len();
        key_len(1) + encoded_len_varint(inner as u64) + inner
    });
    let arrow_length = schema_length + key_len(2) + encoded_len_varint(rows_length as u64) + rows_length;
    encode_key(5, WireType::LengthDelimited, &mut head);
    encode_varint(arrow_length as u64, &mut head);
    if let Some(schema) = &schema {
        let inner = key_len(1) + encoded_len_varint(schema.len() as u64) + schema.len();
        encode_key(1, WireType::LengthDelimited, &mut head);
        encode_varint(inner as u64, &mut head);
        prost::encoding::bytes::encode(1, schema, &mut head);
    }
    encode_key(2, WireType::LengthDelimited, &mut head);
    encode_varint(rows_length as u64, &mut head);
    encode_key(1, WireType::LengthDelimited, &mut head);
    encode_varint(record_batch.len() as u64, &mut head);
    let mut frame = BytesMut::with_capacity(5 + (head.len() + record_batch.len()) / 2);
    frame.put_u8(u8::from(gzip_level > 0));
    frame.put_u32(0);
    let level = if gzip_level == 1 { isal::CompressionLevel::One } else { isal::CompressionLevel::Three };
    if gzip_level > 0 {
        let mut encoder = isal::write::Encoder::new((&mut frame).writer(), level, isal::Codec::Gzip);
        encoder.write_all(&head).unwrap();
        for piece in record_batch.chunks(256 * 1024) {
            encoder.write_all(piece).unwrap();
        }
        encoder.finish().unwrap();
    } else {
        frame.extend_from_slice(&head);
        frame.extend_from_slice(record_batch);
    }
    let length = (frame.len() - 5) as u32;
    frame[1..5].copy_from_slice(&length.to_be_bytes());
    frame.freeze()
}

/// The floor, running as a child process of the bench against the sink at `sink_address`.
pub struct IoFloor {
    child: std::process::Child,
    pub origin: String,
}

impl IoFloor {
    pub fn spawn(sink_address: &str) -> Self {
        use std::io::BufRead as _;
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([SERVE_ARGUMENT, sink_address])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let port = line.trim().strip_prefix("listening ").expect("the floor's first line names its port");
        IoFloor { child, origin: format!("http://127.0.0.1:{port}") }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for IoFloor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
