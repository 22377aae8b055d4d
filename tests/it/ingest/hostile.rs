//! Requests a hostile client sends, against the real gateway binary: Arrow encodings that
//! expand when converted, compression bombs, slow bodies and slow heads, floods of idle
//! connections, a declaration changed under a batch, checkpoints that must not be rounded, NUL
//! characters, oversized and duplicate headers. Each asserts its specific answer, that nothing
//! changed in Postgres, that `/healthz` and well-behaved clients are served meanwhile, and that
//! the gateway's peak memory (`VmHWM`) stays within the bound `docs/architecture.md` states.

use std::sync::Arc;
use std::time::Duration;

use arrow_array::builder::StringViewBuilder;
use arrow_array::{Array as _, DictionaryArray, Int8Array, Int32Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use reqwest::{Method, StatusCode};
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::support::arrow::{gzip, ids, ipc_stream, ipc_stream_compressed};
use crate::support::{Gateway, GatewayOptions, TestRun, assert_problem, eventually, send};

/// The memory bound of `docs/architecture.md` with the default settings of a 2-CPU machine:
/// base 64 MiB + receive budget 128 + conversion slots 2 x 64 + upload budget 2 x 64 +
/// requests in flight 8 x 8 + connections 2,048 x 64 KiB.
const DEFAULT_MEMORY_BOUND_KIB: u64 = (64 + 128 + 128 + 128 + 64 + 128) * 1024;

/// The gateway's peak resident memory so far, in KiB (`VmHWM` of `/proc/PID/status`).
pub(super) fn peak_rss_kib(gw: &Gateway) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", gw.pid())).expect("the gateway's status");
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
    line.split_whitespace().nth(1).and_then(|kib| kib.parse().ok()).expect("VmHWM in kB")
}

pub(super) fn assert_within_memory_bound(gw: &Gateway) {
    let peak = peak_rss_kib(gw);
    assert!(peak <= DEFAULT_MEMORY_BOUND_KIB, "peak RSS {peak} KiB above the bound {DEFAULT_MEMORY_BOUND_KIB} KiB");
}

pub(super) async fn healthy(gw: &Gateway) {
    let response = gw.unauthenticated(Method::GET, "/healthz").send().await.expect("/healthz answers");
    assert_eq!(response.status(), StatusCode::OK);
}

/// A gateway with run `run`, resource `t` (full_append) and execution `e` extracting.
async fn ready(options: GatewayOptions) -> Gateway {
    let gw = options.spawn().await;
    TestRun::new("run", "e").full_append(&["t"]).open(&gw).await;
    gw
}

/// Posts `body` as a batch of `t` and asserts its problem, that the database did not change
/// and that the gateway stayed healthy and within its memory bound.
async fn refused(gw: &Gateway, body: Vec<u8>, status: StatusCode, code: &str) -> serde_json::Value {
    let before = gw.db_snapshot().await;
    let problem = assert_problem(gw.post_batch("run", "e", "t", None, body).await, status, code);
    assert_eq!(gw.db_snapshot().await, before, "a refused batch changed the state ({code})");
    healthy(gw).await;
    assert_within_memory_bound(gw);
    problem
}

fn one_column(field: Field, array: arrow_array::ArrayRef) -> RecordBatch {
    RecordBatch::try_new(Arc::new(Schema::new(vec![field])), vec![array]).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn encodings_that_expand_when_converted_are_refused_before_they_allocate() {
    let gw = ready(GatewayOptions::new()).await;
    // A dictionary column: 1,000 indices into one 1 MiB value (1 MiB received, 1 GiB staged).
    let keys = Int32Array::from(vec![0; 1000]);
    let dictionary = DictionaryArray::try_new(keys, Arc::new(StringArray::from(vec!["d".repeat(1 << 20)]))).unwrap();
    let field = Field::new("doc", dictionary.data_type().clone(), false);
    let problem = refused(
        &gw,
        ipc_stream(&[one_column(field, Arc::new(dictionary))]),
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    )
    .await;
    assert!(problem["detail"].as_str().unwrap().contains("column \"doc\""), "{problem}");
    // 300 string views onto one 1 MiB buffer.
    let value = "v".repeat(1 << 20);
    let mut views = StringViewBuilder::new().with_deduplicate_strings();
    for _ in 0..300 {
        views.append_value(&value);
    }
    let views = views.finish();
    let field = Field::new("view", views.data_type().clone(), false);
    let problem = refused(
        &gw,
        ipc_stream(&[one_column(field, Arc::new(views))]),
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    )
    .await;
    assert!(problem["detail"].as_str().unwrap().contains("column \"view\""), "{problem}");
    // 60 M Int8 values (60 MB received, 480 MB once widened to INT64).
    let narrow = Int8Array::from(vec![7i8; 60_000_000]);
    let body = ipc_stream(&[one_column(Field::new("small", DataType::Int8, false), Arc::new(narrow))]);
    let problem = refused(&gw, body, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large").await;
    assert!(problem["detail"].as_str().unwrap().contains("column \"small\""), "{problem}");
    // The same shapes, small, are loaded.
    gw.post_accepted("run", "e", "t", None, ipc_stream(&[ids(0..10)])).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn compression_bombs_are_refused_at_the_body_limit() {
    let gw = ready(GatewayOptions::new()).await;
    // HTTP gzip: an Arrow stream followed by 256 MiB of zeros, in a few hundred kilobytes.
    let mut bomb = ipc_stream(&[ids(0..1)]);
    bomb.resize(256 << 20, 0);
    let gzipped = gzip(&bomb);
    drop(bomb);
    let before = gw.db_snapshot().await;
    let request = gw
        .request(Method::POST, "/v1/runs/run/executions/e/resources/t/batches")
        .header("content-type", "application/vnd.apache.arrow.stream")
        .header("content-encoding", "gzip")
        .body(gzipped);
    assert_problem(send(request).await, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large");
    assert_eq!(gw.db_snapshot().await, before);
    // Arrow IPC buffer compression (LZ4): zeros decompress far beyond the body limit.
    let many: Vec<RecordBatch> = (0..100).map(|i| ids(i * 100_000..(i + 1) * 100_000)).collect();
    let lz4 = ipc_stream_compressed(&many, arrow_ipc::CompressionType::LZ4_FRAME);
    let small_limit = GatewayOptions::new().env("FILAMENT_MAX_BATCH_BODY_BYTES", &(8 << 20).to_string());
    let limited = ready(small_limit).await;
    refused(&limited, lz4, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large").await;
    healthy(&gw).await;
    assert_within_memory_bound(&gw);
}

/// `rows` rows of an int32 column `noise` (random: IPC compression leaves it as it is) and an
/// int64 column `zero` (compresses to almost nothing).
fn noise_and_zeros(rows: usize) -> RecordBatch {
    let noise: Vec<i32> = (0..rows).map(|_| rand::random()).collect();
    let schema =
        Schema::new(vec![Field::new("noise", DataType::Int32, false), Field::new("zero", DataType::Int64, false)]);
    let columns: Vec<arrow_array::ArrayRef> =
        vec![Arc::new(Int32Array::from(noise)), Arc::new(Int64Array::from(vec![0_i64; rows]))];
    RecordBatch::try_new(Arc::new(schema), columns).expect("two columns of one length")
}

/// A body whose bytes and decompressed buffers each fit the receive budget but together do
/// not is refused at once (413), not kept waiting for room only it could free until a
/// retryable 429 it can never get past; a smaller body of the same shape is accepted.
#[tokio::test(flavor = "multi_thread")]
async fn a_body_needing_more_than_the_whole_receive_budget_is_refused_at_once() {
    let options = GatewayOptions::new()
        .env("FILAMENT_MAX_RECEIVING_BYTES", &(1 << 20).to_string())
        .env("FILAMENT_BACKPRESSURE_WAIT_MS", "20000");
    let gw = ready(options).await;
    // About 320 KB received (the noise, stored uncompressed) and 960 KB decompressed.
    let body = ipc_stream_compressed(&[noise_and_zeros(80_000)], arrow_ipc::CompressionType::LZ4_FRAME);
    assert!(body.len() < 1 << 20, "the body alone fits the receive budget ({} bytes)", body.len());
    // Waiting for room would end in 429 `backpressure` after the 20 s wait.
    let problem = refused(&gw, body, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large").await;
    assert!(problem["detail"].as_str().is_some_and(|d| d.contains("receive budget")), "{problem}");
    let small = ipc_stream_compressed(&[noise_and_zeros(10_000)], arrow_ipc::CompressionType::LZ4_FRAME);
    let (status, answer) = gw.post_batch("run", "e", "t", None, small).await;
    assert!(status.is_success(), "the smaller body: {status} {answer}");
}

/// Sends the head of a batch request declaring `length` bytes, then one byte a second; the
/// answer.
async fn trickle_body(address: String, token: String, length: usize) -> String {
    let mut stream = TcpStream::connect(&address).await.unwrap();
    let head = format!(
        "POST /v1/runs/run/executions/e/resources/t/batches HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/vnd.apache.arrow.stream\r\nContent-Length: {length}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    for _ in 0..length {
        let mut chunk = [0u8; 4096];
        tokio::select! {
            read = stream.read(&mut chunk) => {
                let read = read.unwrap_or(0);
                answer.extend_from_slice(&chunk[..read]);
                if read == 0 || answer.windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
            // The slow client's pace: one more byte a second until it is answered.
            () = tokio::time::sleep(Duration::from_secs(1)) => {
                if stream.write_all(b"\xff").await.is_err() {
                    break;
                }
            }
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_bodies_cost_a_connection_never_a_slot_others_need() {
    // One conversion slot: three slow bodies holding slots would stop everyone else.
    let options = GatewayOptions::new()
        .env("FILAMENT_MAX_CONCURRENT_BATCH_DECODES", "1")
        .env("FILAMENT_BODY_READ_TIMEOUT_SECS", "3");
    let gw = ready(options).await;
    let address = gw.base_url.trim_start_matches("http://").to_string();
    let slow: Vec<_> = (0..3).map(|_| tokio::spawn(trickle_body(address.clone(), gw.token.clone(), 440))).collect();
    // A well-behaved extractor meanwhile: every batch accepted, none waits for the slow ones.
    for i in 0..10 {
        let started = tokio::time::Instant::now();
        let (status, body) = gw.post_batch("run", "e", "t", None, ipc_stream(&[ids(i * 10..i * 10 + 10)])).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        assert!(started.elapsed() < Duration::from_secs(2), "batch {i} waited {:?}", started.elapsed());
        // The extractor's pace: its ten batches span the slow bodies' 3 s read timeout.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for answer in slow {
        let answer = answer.await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("body_timeout"), "{answer}");
    }
    assert_eq!(gw.metric("filament_backpressure_rejections_total").await.unwrap_or(0.0), 0.0, "no 429");
    healthy(&gw).await;
}

/// Opens a connection and sends `head` one byte every `every`; whether the gateway closed it
/// within `within`.
async fn closed_within(address: &str, head: &[u8], every: Duration, within: Duration) -> bool {
    let Ok(mut stream) = TcpStream::connect(address).await else { return true };
    let deadline = tokio::time::Instant::now() + within;
    let mut sent = 0;
    loop {
        let mut buffer = [0u8; 1024];
        tokio::select! {
            read = stream.read(&mut buffer) => match read {
                Ok(0) | Err(_) => return true,
                Ok(_) => {}
            },
            // The slowloris pace: one byte of the head every `every`.
            () = tokio::time::sleep(every) => {
                if sent < head.len() && stream.write_all(&head[sent..=sent]).await.is_err() {
                    return true;
                }
                sent += 1;
            }
            () = tokio::time::sleep_until(deadline) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_heads_and_idle_connections_are_closed_and_capped() {
    let options = GatewayOptions::new()
        .env("FILAMENT_HEADER_READ_TIMEOUT_SECS", "2")
        .env("FILAMENT_IDLE_TIMEOUT_SECS", "3")
        .env("FILAMENT_MAX_CONNECTIONS", "300");
    let gw = ready(options).await;
    let address = gw.base_url.trim_start_matches("http://").to_string();
    let head = format!("GET /healthz HTTP/1.1\r\nHost: {address}\r\nX-Slow: {}\r\n\r\n", "s".repeat(200));
    let slowloris: Vec<_> = (0..50)
        .map(|_| {
            let (address, head) = (address.clone(), head.clone());
            tokio::spawn(async move {
                closed_within(&address, head.as_bytes(), Duration::from_millis(500), Duration::from_secs(10)).await
            })
        })
        .collect();
    let mut idle = Vec::new();
    for _ in 0..1000 {
        idle.push(TcpStream::connect(&address).await.unwrap());
    }
    // Never more accepted than the cap: the gateway's open sockets stay bounded.
    let sockets = || {
        std::fs::read_dir(format!("/proc/{}/fd", gw.pid()))
            .unwrap()
            .filter(|entry| {
                entry
                    .as_ref()
                    .ok()
                    .and_then(|e| std::fs::read_link(e.path()).ok())
                    .is_some_and(|target| target.to_string_lossy().starts_with("socket:"))
            })
            .count()
    };
    // Time for the gateway to take in all of the flood it would: the cap must still hold after.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(sockets() <= 300 + 64, "{} sockets open", sockets());
    for closed in slowloris {
        assert!(closed.await.unwrap(), "a slowloris connection outlived the header timeout");
    }
    // Idle ones are closed after the idle timeout, the cap admits the next ones.
    eventually(Duration::from_secs(60), "the idle flood to be closed", || async {
        let mut open = 0;
        for stream in &idle {
            let mut probe = [0u8; 1];
            // EOF or a reset: closed by the gateway; nothing to read yet: still open.
            if tokio::time::timeout(Duration::from_millis(1), stream.peek(&mut probe)).await.is_err() {
                open += 1;
            }
        }
        (open == 0).then_some(())
    })
    .await;
    healthy(&gw).await;
    assert_within_memory_bound(&gw);
}

/// A batch read under one declaration and a re-declaration racing it: one of the two is
/// refused (409 `resource_conflict`), or the batch was read after the re-declaration; never is
/// a batch recorded under a declaration it was not read for (the commit would then fail on a
/// staging table without `_filament_seq`).
#[tokio::test(flavor = "multi_thread")]
async fn a_declaration_is_fixed_once_a_batch_uses_it() {
    let gw = Gateway::spawn().await;
    TestRun::new("run", "e").open(&gw).await;
    let big = ipc_stream(&[ids(0..400_000)]);
    let mut refusals = 0;
    for round in 0..20 {
        let resource = format!("r{round}");
        gw.declare("run", &resource, json!({"write_mode": "full_append"})).await;
        let path = format!("/v1/runs/run/resources/{resource}");
        let redeclare = async {
            // Starts 20 ms into the batch's upload, to race its read.
            tokio::time::sleep(Duration::from_millis(20)).await;
            gw.json(Method::PUT, &path, Some(json!({"write_mode": "full_upsert", "primary_key": ["id"]}))).await
        };
        let ((batch, body), (put, answer)) =
            tokio::join!(gw.post_batch("run", "e", &resource, None, big.clone()), redeclare);
        match (batch, put) {
            (StatusCode::ACCEPTED, StatusCode::OK) => {}
            (StatusCode::ACCEPTED, _) => assert_eq!(answer["code"], "resource_conflict", "{answer}"),
            (_, StatusCode::OK) => assert_eq!(body["code"], "resource_conflict", "{body}"),
            other => panic!("{other:?}: {body} {answer}"),
        }
        refusals += usize::from(batch != StatusCode::ACCEPTED || put != StatusCode::OK);
    }
    let committed = gw.commit_and_wait("run", "e").await;
    assert_eq!(committed["state"], "committed", "every batch was recorded as its declaration reads: {committed}");
    assert!(refusals > 0, "the race was never run: every re-declaration came before or after its batch");
}

#[tokio::test(flavor = "multi_thread")]
async fn checkpoints_are_stored_exactly_as_sent() {
    let gw = ready(GatewayOptions::new()).await;
    let checkpoint = r#"{"big":123456789012345678901234567890,"u":18446744073709551616,"dec":0.10000000000000000555,"lsn":"0/16B3748"}"#;
    let response = gw
        .request(Method::POST, "/v1/runs/run/executions/e/checkpoints")
        .header("content-type", "application/json")
        .body(format!(r#"{{"checkpoint":{checkpoint}}}"#));
    let (status, body) = send(response).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    gw.post_accepted("run", "e", "t", None, ipc_stream(&[ids(0..3)])).await;
    assert_eq!(gw.commit_and_wait("run", "e").await["state"], "committed");
    let text = gw.request(Method::GET, "/v1/runs/run").send().await.unwrap().text().await.unwrap();
    assert!(text.contains(&format!(r#""durable_checkpoint":{checkpoint}"#)), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn nul_characters_and_oversized_json_are_refused_naming_the_field() {
    let gw = ready(GatewayOptions::new()).await;
    let before = gw.db_snapshot().await;
    let described = json!({"write_mode": "full_append", "table_options": {"description": "a\u{0}b"}});
    let problem = assert_problem(
        gw.json(Method::PUT, "/v1/runs/run/resources/u", Some(described)).await,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_text",
    );
    assert!(problem["detail"].as_str().unwrap().contains("$.table_options.description"), "{problem}");
    for checkpoint in [json!({"cursor": "x\u{0}"}), json!({"k\u{0}ey": 1})] {
        assert_problem(
            gw.json(Method::POST, "/v1/runs/run/executions/e/checkpoints", Some(json!({"checkpoint": checkpoint})))
                .await,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_text",
        );
    }
    let big = json!({"checkpoint": {"padding": "p".repeat(3 << 20)}});
    let problem = assert_problem(
        gw.json(Method::POST, "/v1/runs/run/executions/e/checkpoints", Some(big)).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    );
    assert!(problem["detail"].as_str().unwrap().contains("2097152"), "{problem}");
    assert_eq!(gw.db_snapshot().await, before);
}

/// Sends `request` on a new connection; the status line and the whole answer.
async fn raw(gw: &Gateway, request: &[u8]) -> String {
    let address = gw.base_url.trim_start_matches("http://").to_string();
    let mut stream = TcpStream::connect(&address).await.unwrap();
    let _ = stream.write_all(request).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn request_heads_beyond_the_limits_get_problem_documents() {
    let gw = ready(GatewayOptions::new()).await;
    let address = gw.base_url.trim_start_matches("http://").to_string();
    let token = gw.token.clone();
    // Two Authorization headers: refused, whichever comes first.
    let twice = format!(
        "GET /v1/runs/run HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {token}\r\nAuthorization: Bearer other-token-0000000\r\nConnection: close\r\n\r\n"
    );
    let answer = raw(&gw, twice.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 400") && answer.contains("invalid_request"), "{answer}");
    // No Host on HTTP/1.1 (RFC 9112).
    let answer = raw(&gw, b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n").await;
    assert!(answer.starts_with("HTTP/1.1 400") && answer.contains("Host"), "{answer}");
    // A long URI, many headers, large headers: problem documents, as long as the head fits the
    // connection's read buffer.
    let long_uri =
        format!("GET /v1/runs/{} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n", "r".repeat(8000));
    let answer = raw(&gw, long_uri.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 414") && answer.contains("uri_too_long"), "{answer}");
    let many: String = (0..500).map(|i| format!("X-H{i}: v\r\n")).collect();
    let answer =
        raw(&gw, format!("GET /healthz HTTP/1.1\r\nHost: {address}\r\n{many}Connection: close\r\n\r\n").as_bytes())
            .await;
    assert!(answer.starts_with("HTTP/1.1 431") && answer.contains("headers_too_large"), "{answer}");
    let large = format!(
        "GET /healthz HTTP/1.1\r\nHost: {address}\r\nX-Big: {}\r\nConnection: close\r\n\r\n",
        "b".repeat(20_000)
    );
    let answer = raw(&gw, large.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 431") && answer.contains("headers_too_large"), "{answer}");
    // More header fields than hyper's parser takes (1,024 at the default count limit): hyper
    // refuses the head itself with a bare 431 (documented).
    let too_many: String = (0..2000).map(|i| format!("X-H{i}: v\r\n")).collect();
    let answer =
        raw(&gw, format!("GET /healthz HTTP/1.1\r\nHost: {address}\r\n{too_many}Connection: close\r\n\r\n").as_bytes())
            .await;
    assert!(answer.starts_with("HTTP/1.1 431") && !answer.contains("headers_too_large"), "{answer}");
    // Beyond the read buffer, hyper refuses the head itself with a bare 431 (documented; the
    // connection closes with the rest unread, so the answer may be lost to the reset).
    let huge = format!("GET /healthz HTTP/1.1\r\nHost: {address}\r\nX-Huge: {}\r\n\r\n", "h".repeat(1 << 20));
    let answer = raw(&gw, huge.as_bytes()).await;
    assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 431"), "{answer}");
    healthy(&gw).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn project_ids_follow_googles_rules() {
    let gw = Gateway::spawn().await;
    for project in ["abc", "a", &format!("{}.com:my-project", "d".repeat(10_000)), "my-project-"] {
        let run = json!({"run_id": "r", "destination": {"project": project, "dataset": "d"}});
        assert_problem(
            gw.json(Method::POST, "/v1/runs", Some(run)).await,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_identifier",
        );
    }
}
