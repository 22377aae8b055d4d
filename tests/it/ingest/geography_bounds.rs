//! A GEOGRAPHY value's cost is bounded before it is paid, against the real gateway binary: a
//! 60 MB `LINESTRING` and a GeoJSON `Point` padded with a 60 MB member, each about 60 KB on
//! the wire with `Content-Encoding: gzip`, are refused with their 422 while the gateway's peak
//! memory grows by less than 128 MiB (before the one-pass scanners, the first took 897 MiB and
//! the second 2 GiB), and a valid 1 MiB `LINESTRING` still loads exactly.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_array::{RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema};
use reqwest::{Method, StatusCode};

use super::hostile::{healthy, peak_rss_kib};
use crate::support::arrow::{gzip, ipc_stream};
use crate::support::{Gateway, TestRun, assert_problem, send};

/// What the gateway's peak memory may grow by while it refuses one value.
const PEAK_GROWTH_LIMIT_KIB: u64 = 128 * 1024;

/// One row of one string column marked `bigquery_type=GEOGRAPHY`, as an Arrow IPC stream.
fn geography_body(value: String) -> Vec<u8> {
    let metadata = HashMap::from([("bigquery_type".to_string(), "GEOGRAPHY".to_string())]);
    let field = Field::new("shape", DataType::Utf8, true).with_metadata(metadata);
    let batch =
        RecordBatch::try_new(Arc::new(Schema::new(vec![field])), vec![Arc::new(StringArray::from(vec![value]))]);
    ipc_stream(&[batch.expect("one column")])
}

/// Posts `value` gzip'd as a batch of `t` and returns the problem, asserting its status and
/// code, that nothing changed and that the gateway's peak memory grew by less than the limit.
async fn refused_within_memory(gw: &Gateway, value: String, code: &str) -> serde_json::Value {
    let body = gzip(&geography_body(value));
    assert!(body.len() < 1 << 20, "{} bytes on the wire", body.len());
    let before = gw.db_snapshot().await;
    let peak_before_kib = peak_rss_kib(gw);
    let request = gw
        .request(Method::POST, "/v1/runs/r/executions/e/resources/t/batches")
        .header("content-type", "application/vnd.apache.arrow.stream")
        .header("content-encoding", "gzip")
        .body(body);
    let problem = assert_problem(send(request).await, StatusCode::UNPROCESSABLE_ENTITY, code);
    let growth_kib = peak_rss_kib(gw).saturating_sub(peak_before_kib);
    assert!(growth_kib < PEAK_GROWTH_LIMIT_KIB, "peak RSS grew by {growth_kib} KiB refusing it");
    assert_eq!(gw.db_snapshot().await, before, "a refused batch changed the state");
    healthy(gw).await;
    problem
}

/// `count` distinct neighbouring points, whole degrees, as (longitude, latitude).
fn points(count: usize) -> Vec<(i64, i64)> {
    (0..count).map(|i| ((i % 359) as i64 - 179, ((i / 359) % 179) as i64 - 89)).collect()
}

fn linestring(points: &[(i64, i64)]) -> String {
    let coordinates: Vec<String> = points.iter().map(|(x, y)| format!("{x} {y}")).collect();
    format!("LINESTRING({})", coordinates.join(","))
}

/// The points of the WKT `LINESTRING (x y, ...)` the emulator's `ST_ASTEXT` writes.
fn points_of(text: &str) -> Vec<(f64, f64)> {
    let shown = text.get(..40).unwrap_or(text);
    let inner = text.strip_prefix("LINESTRING (").and_then(|t| t.strip_suffix(')'));
    let inner = inner.unwrap_or_else(|| panic!("not a LINESTRING: {shown}"));
    inner
        .split(", ")
        .map(|point| {
            let mut numbers = point.split(' ').map(|n| n.parse::<f64>().expect("a number"));
            (numbers.next().expect("x"), numbers.next().expect("y"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn sixty_megabyte_geographies_are_refused_within_memory_and_a_one_mebibyte_line_loads() {
    let gw = Gateway::spawn().await;
    TestRun::new("r", "e").full_append(&["t"]).open(&gw).await;

    let long_line = format!("LINESTRING({}0 0)", "0 0,".repeat(15_000_000));
    let problem = refused_within_memory(&gw, long_line, "row_too_large").await;
    assert!(problem["detail"].as_str().unwrap_or_default().contains("row 0"), "{problem}");
    let padded_point = format!(r#"{{"type": "Point", "coordinates": [1, 2], "pad": "{}"}}"#, "x".repeat(60_000_000));
    refused_within_memory(&gw, padded_point, "row_too_large").await;
    // Under the append limit the padding is skipped unread; the row is then too large to append.
    let padded_point = format!(r#"{{"type": "Point", "pad": "{}", "coordinates": [1, 2]}}"#, "x".repeat(8_500_000));
    refused_within_memory(&gw, padded_point, "row_too_large").await;
    // Under the append limit a malformed value is read to its fault, in one pass.
    let broken_line = format!("LINESTRING({}0 0", "0 0,".repeat(1_500_000));
    let problem = refused_within_memory(&gw, broken_line, "invalid_value").await;
    assert!(problem["detail"].as_str().unwrap_or_default().contains("not valid WKT"), "{problem}");

    let sent = points(150_000);
    let line = linestring(&sent);
    assert!(line.len() > 1 << 20, "{} bytes", line.len());
    gw.post_accepted("r", "e", "t", None, geography_body(line)).await;
    let committed = gw.commit_and_wait("r", "e").await;
    assert_eq!(committed["state"], "committed", "{committed}");
    let rows = gw.query(&format!("SELECT ST_ASTEXT(shape) FROM {}.t", gw.dataset)).await;
    assert_eq!(rows.len(), 1);
    let read = points_of(rows[0][0].as_str().expect("a WKT text"));
    let expected: Vec<(f64, f64)> = sent.iter().map(|&(x, y)| (x as f64, y as f64)).collect();
    assert!(read == expected, "{} points read back, {} sent", read.len(), expected.len());
}
