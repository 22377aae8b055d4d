//! The documented type rules to the letter, end to end: ARRAY<RANGE> and ARRAY<INTERVAL> are
//! refused by name.

use arrow_schema::{DataType, Field, TimeUnit};
use reqwest::StatusCode;

use crate::support::arrow::{batch, ipc_stream};
use crate::support::{Gateway, TestRun, assert_problem};

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
