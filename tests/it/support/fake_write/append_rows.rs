//! The fake's AppendRows: each request decoded, checked against the stream's offset and the
//! request limit, answered or failed as the script says (before or after applying it), and
//! the connection's reads and answers, which a test can hold back.

use super::*;

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
pub(super) async fn append_rows(
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
