//! OpenTelemetry traces (`crate::traces`) received by a real OTLP/HTTP receiver decoding the
//! OpenTelemetry project's protobuf: an extractor's `traceparent` is continued from the batch
//! request through its upload (an anonymous caller's is not); the commit runs in a trace of the
//! gateway's own, linked to the request, and its publication job's label carries that trace id.

use std::sync::Arc;
use std::time::Duration;

use arrow_array::{ArrayRef, Int64Array, StringArray};
use arrow_schema::{DataType, Field};
use reqwest::{Method, StatusCode};

use crate::support::arrow::{batch, ipc_stream};
use crate::support::otlp::{OtlpReceiver, ReceivedSpan};
use crate::support::{Gateway, GatewayOptions, TestRun, within};

/// The extractor's trace (W3C trace context: version, trace id, parent span id, sampled).
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
/// Another extractor's trace, whose batch the same lane uploads.
const OTHER_TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";
const OTHER_TRACEPARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
/// A row value no span may carry.
const SENTINEL: &str = "row-value-sentinel-5d1c";

/// Rows `ids` with a text column holding [`SENTINEL`].
fn rows_with_sentinel(ids: std::ops::Range<i64>) -> Vec<u8> {
    let count = ids.clone().count();
    let fields = vec![Field::new("id", DataType::Int64, false), Field::new("note", DataType::Utf8, true)];
    let columns: Vec<ArrayRef> =
        vec![Arc::new(Int64Array::from_iter_values(ids)), Arc::new(StringArray::from(vec![SENTINEL; count]))];
    ipc_stream(&[batch(fields, columns)])
}

async fn post_traced(gw: &crate::support::Gateway, traceparent: &str, body: Vec<u8>) {
    let post = gw
        .request(Method::POST, "/v1/runs/run/executions/e/resources/t/batches")
        .header("content-type", "application/vnd.apache.arrow.stream")
        .header("traceparent", traceparent)
        .body(body);
    assert_eq!(post.send().await.unwrap().status(), StatusCode::ACCEPTED);
}

fn named<'a>(spans: &'a [ReceivedSpan], name: &str) -> Vec<&'a ReceivedSpan> {
    spans.iter().filter(|span| span.name == name && span.trace_id == TRACE_ID).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_is_followed_from_the_extractors_request_to_the_publication_job() {
    let receiver = OtlpReceiver::start().await;
    let gw = GatewayOptions::new()
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        .env("OTEL_SERVICE_NAME", "filament-under-test")
        .env("OTEL_BSP_SCHEDULE_DELAY", "500")
        .spawn()
        .await;
    TestRun::new("run", "e").full_append(&["t"]).open(&gw).await;
    post_traced(&gw, TRACEPARENT, rows_with_sentinel(0..7)).await;
    post_traced(&gw, OTHER_TRACEPARENT, rows_with_sentinel(7..9)).await;
    let commit =
        gw.request(Method::POST, "/v1/runs/run/executions/e/commit?wait=true").header("traceparent", TRACEPARENT);
    let committed = commit.send().await.unwrap();
    assert_eq!(committed.status(), StatusCode::OK, "{}", committed.text().await.unwrap());

    let wanted = ["batch.decode", "lane.upload", "bigquery.append_rows"];
    let spans = within(Duration::from_secs(30), Duration::from_millis(200), || async {
        let spans = receiver.spans();
        let seen =
            |name: &str| spans.iter().any(|s| s.trace_id == TRACE_ID && (s.name == name || s.name.starts_with(name)));
        let committed = spans.iter().any(|s| s.name == "execution.commit");
        (wanted.iter().all(|name| seen(name)) && seen("POST ") && committed).then_some(spans)
    })
    .await
    .unwrap_or_else(|| panic!("spans of the trace within 30 s: {:#?}", receiver.spans()));

    upload_spans_follow_the_request(&spans);
    commit_runs_in_a_trace_of_its_own(&gw, &spans);
    // No row value and no credential in any span.
    let leaks = |s: &ReceivedSpan| {
        std::iter::once(&s.name)
            .chain(s.attributes.iter().map(|(_, v)| v))
            .any(|text| text.contains(SENTINEL) || text.contains(&gw.token))
    };
    assert!(!receiver.spans().iter().any(leaks), "{spans:#?}");
}

/// The batch request continues the extractor's span; its stages, the lane's upload (linked to
/// the later request), set-up and the appends (9 rows at consecutive offsets) descend from it.
fn upload_spans_follow_the_request(spans: &[ReceivedSpan]) {
    let requests: Vec<_> = spans.iter().filter(|s| s.trace_id == TRACE_ID && s.name.starts_with("POST ")).collect();
    let batch_request = requests
        .iter()
        .find(|s| {
            s.attribute("http.route")
                == Some("/v1/runs/{run_id}/executions/{execution_id}/resources/{resource}/batches")
        })
        .unwrap_or_else(|| panic!("the batch request's span: {requests:#?}"));
    assert_eq!(batch_request.parent_span_id, "00f067aa0ba902b7", "it continues the extractor's span");
    assert_eq!(batch_request.attribute("http.response.status_code"), Some("202"));
    assert_eq!(batch_request.service_name, "filament-under-test");
    for stage in ["batch.admission", "batch.decode", "batch.convert_and_encode"] {
        let stage = named(spans, stage);
        assert!(stage.iter().any(|s| s.parent_span_id == batch_request.span_id), "{stage:#?}");
    }
    let lane = named(spans, "lane.upload");
    assert_eq!(lane.len(), 1, "{lane:#?}");
    assert_eq!(lane[0].parent_span_id, batch_request.span_id, "the upload continues the request that accepted it");
    assert!(lane[0].linked_traces.iter().any(|t| t == OTHER_TRACE_ID), "and links to the later request: {lane:#?}");
    // Set-up runs in the lane: its REST calls and the stream's creation.
    for set_up in ["tables.insert", "bigquery.create_write_stream"] {
        let calls = named(spans, set_up);
        assert!(!calls.is_empty() && calls.iter().all(|s| s.parent_span_id == lane[0].span_id), "{set_up}: {calls:#?}");
    }
    let appends = named(spans, "bigquery.append_rows");
    assert!(!appends.is_empty() && appends.iter().all(|s| s.parent_span_id == lane[0].span_id), "{appends:#?}");
    // The two batches' 9 rows, in one request or two, at consecutive offsets from 0.
    let number = |span: &ReceivedSpan, key: &str| span.attribute(key).map_or(-1, |v| v.parse::<i64>().unwrap());
    let mut offsets: Vec<(i64, i64)> = appends.iter().map(|s| (number(s, "offset"), number(s, "rows"))).collect();
    offsets.sort_unstable();
    assert_eq!(offsets[0].0, 0, "{appends:#?}");
    assert!(offsets.windows(2).all(|w| w[0].0 + w[0].1 == w[1].0), "{offsets:?}");
    assert_eq!(offsets.iter().map(|(_, rows)| rows).sum::<i64>(), 9, "{appends:#?}");
    let append = appends[0];
    assert!(
        append.attribute("bytes").is_some_and(|b| b.parse::<u64>().unwrap() > 0)
            && append.attribute("attempt") == Some("1")
    );
}

/// The commit runs in a trace of the gateway's own, linked to the request that committed, and
/// the publication job's label names that trace.
fn commit_runs_in_a_trace_of_its_own(gw: &Gateway, spans: &[ReceivedSpan]) {
    // The commit runs in a trace of the gateway's own, linked to the request that committed: its
    // jobs' trace label is never a trace id the caller chose.
    let commits: Vec<_> = spans.iter().filter(|s| s.name == "execution.commit").collect();
    assert_eq!(commits.len(), 1, "{commits:#?}");
    let commit = commits[0];
    assert!(commit.trace_id != TRACE_ID && commit.parent_span_id.is_empty(), "a root of its own: {commit:#?}");
    assert!(commit.linked_traces.iter().any(|t| t == TRACE_ID), "linked to the commit request: {commit:#?}");
    let in_commit = |name: &str| spans.iter().filter(|s| s.name == name && s.trace_id == commit.trace_id).count();
    for name in ["bigquery.finalize_write_stream", "bigquery.batch_commit_write_streams", "publication.job"] {
        assert_eq!(in_commit(name), 1, "{name}: {spans:#?}");
    }
    let job = spans.iter().find(|s| s.name == "publication.job").unwrap();
    let job_id = job.attribute("bigquery.job_id").expect("the job span names its job").to_string();
    // BigQuery's job history leads back to the trace: the job carries its id as a label.
    let proxy = gw.rest_conformance.as_ref().expect("the harness proxies REST calls");
    let inserted = proxy.requests("POST", "/jobs");
    let submitted = inserted
        .iter()
        .find(|r| r.body["jobReference"]["jobId"] == job_id.as_str())
        .unwrap_or_else(|| panic!("the job {job_id} was submitted"));
    let label = &submitted.body["configuration"]["labels"]["filament_trace_id"];
    assert_eq!(label, commit.trace_id.as_str(), "{}", submitted.body);
}

/// A `traceparent` is continued only for a caller that authenticates as a principal: a request
/// without a credential, or with one no principal has, starts a trace of its own.
#[tokio::test(flavor = "multi_thread")]
async fn an_unauthenticated_callers_traceparent_is_not_continued() {
    let receiver = OtlpReceiver::start().await;
    let gw = GatewayOptions::new().env("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint).spawn().await;
    let anonymous = gw.unauthenticated(Method::GET, "/v1/runs").header("traceparent", TRACEPARENT);
    assert_eq!(anonymous.send().await.unwrap().status(), StatusCode::UNAUTHORIZED);
    let unknown = gw.unauthenticated(Method::GET, "/v1/runs").bearer_auth("not-a-principals-token-0123456789");
    let unknown = unknown.header("traceparent", TRACEPARENT);
    assert_eq!(unknown.send().await.unwrap().status(), StatusCode::UNAUTHORIZED);
    let principal = gw.request(Method::GET, "/v1/runs").header("traceparent", OTHER_TRACEPARENT);
    assert_eq!(principal.send().await.unwrap().status(), StatusCode::OK);

    let requests = within(Duration::from_secs(30), Duration::from_millis(200), || async {
        let requests: Vec<_> = receiver.spans().into_iter().filter(|s| s.name == "GET /v1/runs").collect();
        (requests.len() == 3).then_some(requests)
    })
    .await
    .unwrap_or_else(|| panic!("the three requests' spans within 30 s: {:#?}", receiver.spans()));
    let continued: Vec<_> = requests.iter().filter(|s| s.trace_id == OTHER_TRACE_ID).collect();
    assert_eq!(continued.len(), 1, "the principal's request continues its trace: {requests:#?}");
    assert_eq!(continued[0].parent_span_id, "b7ad6b7169203331");
    let roots = requests.iter().filter(|s| s.trace_id != OTHER_TRACE_ID);
    assert!(roots.clone().all(|s| s.trace_id != TRACE_ID && s.parent_span_id.is_empty()), "{requests:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn spans_still_queued_when_the_gateway_stops_are_exported_before_it_exits() {
    let receiver = OtlpReceiver::start().await;
    // A batch waits ten minutes to fill: only the flush at shutdown can send these spans.
    let mut gw = GatewayOptions::new()
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.endpoint)
        .env("OTEL_BSP_SCHEDULE_DELAY", "600000")
        .spawn()
        .await;
    TestRun::new("run", "e").full_append(&["t"]).open(&gw).await;
    post_traced(&gw, TRACEPARENT, rows_with_sentinel(0..3)).await;
    assert!(receiver.spans().is_empty(), "nothing is exported before the batch delay: {:#?}", receiver.spans());

    let exit = gw.terminate().await;
    assert!(exit.success(), "{exit:?}: {}", gw.logs());
    let spans = receiver.spans();
    let batch_request = spans.iter().find(|s| {
        s.trace_id == TRACE_ID
            && s.attribute("http.route")
                == Some("/v1/runs/{run_id}/executions/{execution_id}/resources/{resource}/batches")
    });
    assert!(batch_request.is_some(), "the last request's span left with the process: {spans:#?}");
}
