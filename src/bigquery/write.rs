//! The Storage Write API over tonic (generated `googleapis-tonic-google-cloud-bigquery-storage-v1`
//! client): PENDING streams, AppendRows with explicit row offsets and gzip, finalize, batch
//! commit and GetWriteStream. Wire facts: `docs/architecture.md` (Data flow).
//!
//! AppendRows requests are framed by [`super::append_frame`] (gzip with ISA-L, the record batch
//! never copied into a contiguous request); responses are decoded by tonic as usual.

use std::convert::Infallible;
use std::time::Duration;

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt as _;
use google_cloud_auth::credentials::Credentials;
use googleapis_tonic_google_cloud_bigquery_storage_v1::google::cloud::bigquery::storage::v1::{
    AppendRowsRequest, AppendRowsResponse, ArrowRecordBatch, ArrowSchema, BatchCommitWriteStreamsRequest,
    CreateWriteStreamRequest, FinalizeWriteStreamRequest, GetWriteStreamRequest, WriteStream, append_rows_request,
    append_rows_response, big_query_write_client::BigQueryWriteClient, write_stream,
};
use tokio::sync::mpsc;
use tonic::codec::{Codec as _, CompressionEncoding};
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tower::ServiceExt as _;

use super::append_frame::{GzipLevel, grpc_frame};
use super::{BigQueryError, BigQueryResult, credentials};

const APPEND_ROWS_PATH: &str = "/google.cloud.bigquery.storage.v1.BigQueryWrite/AppendRows";
/// Largest response message accepted. Google's clients accept more than any answer needs (Java:
/// `setMaxInboundMessageSize(Integer.MAX_VALUE)`, `BigQueryWriteStubSettings.java`; Go's
/// managedwriter: `grpc.MaxCallRecvMsgSize(10 * 1024 * 1024)` on AppendRows,
/// `managed_stream.go`); requests stay below `FILAMENT_MAX_APPEND_REQUEST_BYTES`, under the
/// 20 MB the Storage Write API's quotas allow one AppendRowsRequest (10 MB before).
const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// HTTP/2 keepalive of the Storage Write channel: a ping every 60 s, answered within 60 s, as
/// Google's Java `StreamWriter` sets it (`setKeepAliveTimeDuration(Duration.ofMinutes(1))`,
/// `setKeepAliveTimeoutDuration(Duration.ofMinutes(1))`, java-bigquerystorage
/// `StreamWriter.java` `getBigQueryWriteSettings`), above the 30 s Google's front ends accept
/// (a faster client is answered GOAWAY `too_many_pings`).
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(60);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(60);
/// Pings only while calls are open. Java pings an idle channel too (`setKeepAliveWithoutCalls
/// (true)`); Go's managedwriter never pings; gRPC's keepalive policy (gRFC A8,
/// `PERMIT_KEEPALIVE_WITHOUT_CALLS` false by default, as grpc-go and grpc-core servers enforce it)
/// answers pings on a connection without calls with GOAWAY `too_many_pings`. An idle channel
/// needs no liveness check: the next call finds a dead connection and is retried.
const KEEPALIVE_WHILE_IDLE: bool = false;
/// The first request of every AppendRows connection names the writer, as Google's clients do
/// (`go-managedwriter:<version>`, `java-streamwriter:<version>`, `python-writer:<version>`):
/// BigQuery shows it in its diagnostics of the stream.
const TRACE_ID: &str = concat!("filament-bigquery:", env!("CARGO_PKG_VERSION"));

/// Shared gRPC channel to the Storage Write API plus the credentials that authorise it.
#[derive(Debug, Clone)]
pub(crate) struct WriteClient {
    channel: Channel,
    /// Where an AppendRows call that must not share the channel gets a connection of its own
    /// (a lane reconnecting after a failure: its replays then neither share a transport, nor
    /// its failures, with the other lanes).
    endpoint: Endpoint,
    /// `scheme://authority` of the endpoint, for hand-built AppendRows calls.
    origin: String,
    credentials: Credentials,
    /// ISA-L level of AppendRows requests; `None` sends them plain.
    gzip_level: Option<GzipLevel>,
}

/// Outcome of one append that BigQuery accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AppendAck {
    /// Appended at this offset now.
    Appended,
    /// The rows were already in the stream (a resend after a lost response).
    AlreadyPresent,
}

/// Outcome of BatchCommitWriteStreams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CommitOutcome {
    Committed,
    /// No stream was committed; each error names its stream.
    Rejected(Vec<String>),
}

/// Percent-encodes a routing-header value (`x-goog-request-params`) of a unary call, as Google's
/// generated clients do (Go: `url.QueryEscape(req.GetParent())`, `big_query_write_client.go`;
/// Java: gax `RequestParamsBuilder.add`, `URLEncoder.encode`). AppendRows carries the stream
/// name as it is ([`WriteClient::open_append_connection`]).
fn routing_value(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl WriteClient {
    /// A lazily connecting channel; TLS with the bundled web PKI roots for `https://` endpoints.
    /// `gzip_level` 0 sends AppendRows requests uncompressed (see [`GzipLevel::from_setting`]).
    pub(crate) fn connect(endpoint: &str, credentials: Credentials, gzip_level: u32) -> anyhow::Result<Self> {
        let mut builder = Endpoint::from_shared(endpoint.to_string())?
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(KEEPALIVE_WHILE_IDLE)
            .connect_timeout(Duration::from_secs(10));
        if endpoint.starts_with("https://") {
            builder = builder.tls_config(ClientTlsConfig::new().with_webpki_roots())?;
        }
        let origin = endpoint.trim_end_matches('/').to_string();
        let gzip_level = GzipLevel::from_setting(gzip_level);
        Ok(Self { channel: builder.connect_lazy(), endpoint: builder, origin, credentials, gzip_level })
    }

    /// How AppendRows requests are compressed, for logs: `gzip-isal-1`, `gzip-isal-3` or `none`.
    pub(crate) fn compression(&self) -> String {
        self.gzip_level.map_or("none", GzipLevel::name).to_string()
    }

    fn client(&self) -> BigQueryWriteClient<Channel> {
        BigQueryWriteClient::new(self.channel.clone())
            .send_compressed(CompressionEncoding::Gzip)
            .accept_compressed(CompressionEncoding::Gzip)
            .max_decoding_message_size(64 * 1024 * 1024)
    }

    /// Wraps a message with auth and routing headers.
    async fn request<T>(&self, message: T, routing_key: &str, routing: &str) -> BigQueryResult<tonic::Request<T>> {
        let mut request = tonic::Request::new(message);
        let headers = credentials::headers(&self.credentials).await?;
        let metadata = request.metadata_mut();
        for (name, value) in headers.iter() {
            if let (Ok(key), Ok(value)) = (
                tonic::metadata::MetadataKey::from_bytes(name.as_str().as_bytes()),
                tonic::metadata::MetadataValue::try_from(value.as_bytes()),
            ) {
                metadata.insert(key, value);
            }
        }
        if let Ok(value) = format!("{routing_key}={}", routing_value(routing)).parse() {
            metadata.insert("x-goog-request-params", value);
        }
        Ok(request)
    }

    /// Creates a PENDING stream on `table_path` (`projects/p/datasets/d/tables/t`).
    pub(crate) async fn create_pending_stream(&self, table_path: &str) -> BigQueryResult<String> {
        let message = CreateWriteStreamRequest {
            parent: table_path.to_string(),
            write_stream: Some(WriteStream { r#type: write_stream::Type::Pending as i32, ..Default::default() }),
        };
        let span =
            tracing::trace_span!(target: crate::traces::TARGET, "bigquery.create_write_stream", table = table_path);
        let created = async {
            let request = self.request(message, "parent", table_path).await?;
            self.client().create_write_stream(request).await.map_err(BigQueryError::grpc("CreateWriteStream"))
        };
        let stream = tracing::Instrument::instrument(created, span).await?.into_inner();
        Ok(stream.name)
    }

    /// Finalizes a stream; returns its row count.
    pub(crate) async fn finalize(&self, stream_name: &str) -> BigQueryResult<i64> {
        let span = tracing::trace_span!(target: crate::traces::TARGET, "bigquery.finalize_write_stream",
            stream = stream_name, row_count = tracing::field::Empty);
        let finalized = async {
            let message = FinalizeWriteStreamRequest { name: stream_name.to_string() };
            let request = self.request(message, "name", stream_name).await?;
            let response = self
                .client()
                .finalize_write_stream(request)
                .await
                .map_err(BigQueryError::grpc("FinalizeWriteStream"))?;
            Ok(response.into_inner().row_count)
        };
        let row_count = tracing::Instrument::instrument(finalized, span.clone()).await?;
        span.record("row_count", row_count);
        Ok(row_count)
    }

    /// Commits finalized streams of one table atomically.
    pub(crate) async fn batch_commit(
        &self,
        table_path: &str,
        stream_names: Vec<String>,
    ) -> BigQueryResult<CommitOutcome> {
        let span = tracing::trace_span!(target: crate::traces::TARGET, "bigquery.batch_commit_write_streams",
            table = table_path, streams = stream_names.len());
        let message = BatchCommitWriteStreamsRequest { parent: table_path.to_string(), write_streams: stream_names };
        let committed = async {
            let request = self.request(message, "parent", table_path).await?;
            self.client()
                .batch_commit_write_streams(request)
                .await
                .map_err(BigQueryError::grpc("BatchCommitWriteStreams"))
        };
        let response = tracing::Instrument::instrument(committed, span).await?.into_inner();
        if response.commit_time.is_some() {
            return Ok(CommitOutcome::Committed);
        }
        Ok(CommitOutcome::Rejected(
            response
                .stream_errors
                .into_iter()
                .map(|e| format!("{} (code {}): {}", e.entity, e.code, e.error_message))
                .collect(),
        ))
    }

    /// Whether BigQuery shows the stream committed (`commit_time` set): resolves a commit whose
    /// response was lost.
    pub(crate) async fn is_committed(&self, stream_name: &str) -> BigQueryResult<bool> {
        let message = GetWriteStreamRequest { name: stream_name.to_string(), view: 0 };
        let request = self.request(message, "name", stream_name).await?;
        let stream =
            self.client().get_write_stream(request).await.map_err(BigQueryError::grpc("GetWriteStream"))?.into_inner();
        Ok(stream.commit_time.is_some())
    }

    /// Opens an AppendRows call whose first requests are `first` (queued before the call starts:
    /// some servers send response headers only once they have a message), on the shared
    /// channel or, when `dedicated`, on a connection of its own. Later requests go through the
    /// returned connection; responses arrive in request order, one each.
    pub(crate) async fn open_append_connection(
        &self,
        stream_name: &str,
        first: Vec<AppendRowsRequest>,
        dedicated: bool,
        send_queue: Arc<dyn SendQueueAccount>,
    ) -> BigQueryResult<AppendConnection> {
        let (sender, receiver) = mpsc::unbounded_channel::<QueuedFrame>();
        let progress = Arc::new(SendProgress::default());
        let connection = AppendConnection {
            sender,
            responses: None,
            gzip_level: self.gzip_level,
            progress: Arc::clone(&progress),
            send_queue,
            _channel: None,
        };
        for request in &first {
            connection.send(request)?;
        }
        // Taken by HTTP/2 to send: the frame's hold on the caller's budget ends here.
        let frames = tokio_stream::wrappers::UnboundedReceiverStream::new(receiver).map(move |queued| {
            progress.taken();
            drop(queued.held);
            Ok::<_, Infallible>(http_body::Frame::data(queued.frame))
        });
        let mut builder = http::Request::builder()
            .method(http::Method::POST)
            .uri(format!("{}{APPEND_ROWS_PATH}", self.origin))
            .version(http::Version::HTTP_2)
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers");
        if self.gzip_level.is_some() {
            builder = builder.header("grpc-encoding", "gzip");
        }
        for (name, value) in credentials::headers(&self.credentials).await?.iter() {
            builder = builder.header(name, value);
        }
        // The routing header BigQuery needs outside the US multi-region ("you must include the
        // following header in your requests: x-goog-request-params: write_stream=<stream_name>",
        // BigQuery documentation, Storage Write API, gRPC), with the stream name as it is,
        // as Google's Python writer sends it (`writer.py`: `f"write_stream={self._stream_name}"`).
        builder = builder.header("x-goog-request-params", format!("write_stream={stream_name}"));
        let request = builder
            .body(tonic::body::Body::new(http_body_util::StreamBody::new(frames)))
            .map_err(|e| BigQueryError::Connect(format!("building the AppendRows request: {e}")))?;
        let grpc_error = |status: tonic::Status| BigQueryError::Grpc { operation: "AppendRows", status };
        let own_channel = match dedicated {
            true => Some(self.endpoint.connect().await.map_err(|e| BigQueryError::Connect(format!("{e}: {e:?}")))?),
            false => None,
        };
        let mut channel = own_channel.clone().unwrap_or_else(|| self.channel.clone());
        let channel = channel.ready().await.map_err(|e| grpc_error(tonic::Status::from_error(e.into())))?;
        let response = tower::Service::call(channel, request)
            .await
            .map_err(|e| grpc_error(tonic::Status::from_error(e.into())))?;
        // A call refused at once answers with its status in the headers (trailers-only).
        if let Some(status) = tonic::Status::from_header_map(response.headers())
            && status.code() != tonic::Code::Ok
        {
            return Err(grpc_error(status));
        }
        let status_code = response.status();
        let decoder = tonic_prost::ProstCodec::<AppendRowsRequest, AppendRowsResponse>::default().decoder();
        let responses =
            tonic::Streaming::new_response(decoder, response.into_body(), status_code, None, Some(MAX_RESPONSE_BYTES));
        Ok(AppendConnection { responses: Some(responses), _channel: own_channel, ..connection })
    }
}

/// How far the transport has taken a call's request frames (HTTP/2 takes the next one only
/// when the peer's flow-control window lets it send), so a send that makes no progress shows.
#[derive(Debug, Default)]
struct SendProgress {
    /// (frames queued, frames taken, since when the oldest untaken frame waits).
    state: parking_lot::Mutex<(u64, u64, Option<tokio::time::Instant>)>,
}

impl SendProgress {
    fn lock(&self) -> parking_lot::MutexGuard<'_, (u64, u64, Option<tokio::time::Instant>)> {
        self.state.lock()
    }

    fn queued(&self) {
        let mut state = self.lock();
        if state.0 == state.1 {
            state.2 = Some(tokio::time::Instant::now());
        }
        state.0 += 1;
    }

    fn taken(&self) {
        let mut state = self.lock();
        state.1 += 1;
        state.2 = (state.0 > state.1).then(tokio::time::Instant::now);
    }

    fn waiting_since(&self) -> Option<tokio::time::Instant> {
        self.lock().2
    }
}

/// Where an AppendRows connection counts the compressed frames it has queued and HTTP/2 has
/// not taken yet (the gateway's upload budget): [`Self::hold`] must not wait, since the frames
/// it counts are what give memory back.
pub(crate) trait SendQueueAccount: Send + Sync + std::fmt::Debug {
    /// Counts `frame_bytes` until the returned hold drops.
    fn hold(&self, frame_bytes: usize) -> SendQueueHold;
}

/// A frame's place in a [`SendQueueAccount`], given back on drop.
pub(crate) type SendQueueHold = Box<dyn Send + Sync>;

/// A frame in a connection's send queue, with its hold.
struct QueuedFrame {
    frame: Bytes,
    held: SendQueueHold,
}

/// One bidirectional AppendRows call. Dropping it stops both sending and receiving.
#[derive(Debug)]
pub(crate) struct AppendConnection {
    sender: mpsc::UnboundedSender<QueuedFrame>,
    responses: Option<tonic::Streaming<AppendRowsResponse>>,
    gzip_level: Option<GzipLevel>,
    progress: Arc<SendProgress>,
    send_queue: Arc<dyn SendQueueAccount>,
    /// The call's own connection (dedicated calls), closed with it.
    _channel: Option<Channel>,
}

impl AppendConnection {
    /// Encodes, compresses and queues one request (on the caller's task: compression is the
    /// costly part and spreads over the lanes that send), counted in the send queue's account
    /// until HTTP/2 takes it.
    pub(crate) fn send(&self, request: &AppendRowsRequest) -> BigQueryResult<()> {
        let frame = grpc_frame(request, self.gzip_level)
            .map_err(|e| BigQueryError::Inconsistent(format!("compressing an AppendRows request: {e}")))?;
        let held = self.send_queue.hold(frame.len());
        self.progress.queued();
        self.sender.send(QueuedFrame { frame, held }).map_err(|_| BigQueryError::Grpc {
            operation: "AppendRows",
            status: tonic::Status::unavailable("the AppendRows connection closed"),
        })
    }

    /// Since when the oldest request the transport has not taken waits; `None` when it has
    /// taken every one.
    pub(crate) fn unsent_since(&self) -> Option<tokio::time::Instant> {
        self.progress.waiting_since()
    }

    /// Ends the call: no more requests (half-close), then waits at most `within` for the
    /// server to end it, so that BigQuery no longer counts the connection when this returns
    /// (its concurrent connections are limited per project).
    pub(crate) async fn close(self, within: Duration) {
        let Self { sender, responses, .. } = self;
        drop(sender);
        let Some(mut responses) = responses else { return };
        let ended = async { while let Ok(Some(_)) = responses.message().await {} };
        let _ = tokio::time::timeout(within, ended).await;
    }

    /// The next response; a closed stream is an `UNAVAILABLE` error (retryable).
    pub(crate) async fn next_response(&mut self) -> BigQueryResult<AppendRowsResponse> {
        let Some(responses) = self.responses.as_mut() else {
            return Err(BigQueryError::Inconsistent("the AppendRows call was not started".into()));
        };
        match responses.message().await {
            Ok(Some(response)) => Ok(response),
            Ok(None) => Err(BigQueryError::Grpc {
                operation: "AppendRows",
                status: tonic::Status::unavailable("the server closed the AppendRows stream"),
            }),
            Err(status) => Err(BigQueryError::Grpc { operation: "AppendRows", status }),
        }
    }
}

/// One AppendRows request. Every request names the stream (BigQuery ignores it after the first
/// request on a connection; bqemulator requires it); only the first carries the writer schema
/// and the [`TRACE_ID`] ("Only initial request setting is respected", `storage.proto`).
pub(crate) fn append_request(
    stream_name: &str,
    writer_schema: Option<Bytes>,
    offset: i64,
    serialized_record_batch: Bytes,
) -> AppendRowsRequest {
    let trace_id = if writer_schema.is_some() { TRACE_ID.to_string() } else { String::new() };
    AppendRowsRequest {
        write_stream: stream_name.to_string(),
        offset: Some(offset),
        trace_id,
        rows: Some(append_rows_request::Rows::ArrowRows(append_rows_request::ArrowData {
            writer_schema: writer_schema.map(|serialized_schema| ArrowSchema { serialized_schema }),
            rows: Some(ArrowRecordBatch { serialized_record_batch, ..Default::default() }),
        })),
        ..Default::default()
    }
}

/// Judges an AppendRows response: errors inside an OK response are errors.
pub(crate) fn judge_append_response(offset: i64, response: AppendRowsResponse) -> BigQueryResult<AppendAck> {
    if !response.row_errors.is_empty() {
        let rows: Vec<String> = response
            .row_errors
            .iter()
            .take(5)
            .map(|e| format!("row {}: {}", e.index, super::row_errors::without_row_values(&e.message)))
            .collect();
        return Err(BigQueryError::InResponse {
            operation: "AppendRows",
            code: tonic::Code::InvalidArgument,
            message: format!("BigQuery rejected rows at offset {offset}: {}", rows.join("; ")),
        });
    }
    match response.response {
        Some(append_rows_response::Response::AppendResult(_)) => Ok(AppendAck::Appended),
        // The offset is below the stream's end: these rows landed in an earlier attempt whose
        // response was lost.
        Some(append_rows_response::Response::Error(status))
            if tonic::Code::from_i32(status.code) == tonic::Code::AlreadyExists =>
        {
            Ok(AppendAck::AlreadyPresent)
        }
        Some(append_rows_response::Response::Error(status)) => Err(BigQueryError::InResponse {
            operation: "AppendRows",
            code: tonic::Code::from_i32(status.code),
            message: format!(
                "append at offset {offset} failed (code {}): {}",
                status.code,
                super::row_errors::without_row_values(&status.message)
            ),
        }),
        None => Err(BigQueryError::Inconsistent(format!("empty AppendRows response at offset {offset}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_values_are_percent_encoded() {
        assert_eq!(routing_value("projects/p/datasets/d"), "projects%2Fp%2Fdatasets%2Fd");
    }
}
