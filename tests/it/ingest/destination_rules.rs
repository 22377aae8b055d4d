//! The documented type rules to the letter, end to end: a run's `max_bytes` caps every append;
//! ARRAY<RANGE> and ARRAY<INTERVAL> are refused by name.

use arrow_schema::{DataType, Field, TimeUnit};
use reqwest::StatusCode;
use serde_json::json;

use crate::support::arrow::{batch, ids, ipc_stream};
use crate::support::fake_write::{FakeWrite, assert_exact_stream};
use crate::support::{Gateway, GatewayOptions, TestRun, assert_problem};

#[tokio::test(flavor = "multi_thread")]
async fn a_runs_max_bytes_caps_every_append_of_a_large_body() {
    const MAX_BYTES: usize = 1 << 20;
    let fake = FakeWrite::start().await;
    let gw = GatewayOptions::new().fake_write(&fake).spawn().await;
    let batching = json!({"max_bytes": MAX_BYTES, "max_rows": 1_000_000});
    TestRun::new("r", "e").batching(batching).full_append(&["t"]).open(&gw).await;
    // 400,000 rows of two INT64 columns: one 6.4 MB record batch, then bodies of 0.6 and 1.6 MB.
    for range in [0..400_000, 400_000..440_000, 440_000..540_000] {
        gw.post_accepted("r", "e", "t", None, ipc_stream(&[ids(range)])).await;
    }
    assert_eq!(gw.commit_and_wait("r", "e").await["state"], "committed");
    assert_exact_stream(&fake.stream_for("_filament_stg_t_"), 0..540_000);
    let sizes = fake.with(|s| s.payload_bytes.clone());
    assert!(sizes.len() >= 7, "the large bodies were split: {sizes:?}");
    assert!(sizes.iter().all(|bytes| *bytes <= MAX_BYTES), "an append above {MAX_BYTES} bytes: {sizes:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn arrays_of_ranges_and_intervals_are_refused_at_the_schema_by_name() {
    let gw = Gateway::spawn().await;
    TestRun::new("r", "e").full_append(&["t"]).open(&gw).await;
    let before = gw.db_snapshot().await;
    let range = DataType::Struct(
        vec![Field::new("start", DataType::Date32, true), Field::new("end", DataType::Date32, true)].into(),
    );
    let marked_range = Field::new("item", range, true)
        .with_metadata(std::collections::HashMap::from([("bigquery_type".to_string(), "RANGE".to_string())]));
    let cases = [
        (Field::new_list("stays", marked_range, true), "ARRAY<RANGE<DATE>>"),
        (
            Field::new_list("waits", Field::new("item", DataType::Duration(TimeUnit::Second), true), true),
            "ARRAY<INTERVAL>",
        ),
    ];
    for (field, shown) in cases {
        let column = field.name().clone();
        let empty = arrow_array::new_empty_array(field.data_type());
        let body = ipc_stream(&[batch(vec![field], vec![empty])]);
        let problem = assert_problem(
            gw.post_batch("r", "e", "t", None, body).await,
            StatusCode::UNPROCESSABLE_ENTITY,
            "unsupported_type",
        );
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.contains(&format!("column {column:?}")) && detail.contains(shown), "{problem}");
    }
    assert_eq!(gw.db_snapshot().await, before, "nothing recorded");
}
