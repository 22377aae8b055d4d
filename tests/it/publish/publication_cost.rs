//! What a publication costs, as BigQuery reports it: each job carries labels users find it by,
//! and its statistics are recorded on the execution's publication, logged and counted.

use reqwest::Method;
use serde_json::json;

use crate::support::arrow::{ids, ipc_stream};
use crate::support::rest_proxy::{JobMode, RestProxy};
use crate::support::rows::seed_table;
use crate::support::{GatewayOptions, TestRun, required_env};

#[tokio::test(flavor = "multi_thread")]
async fn job_statistics_are_recorded_and_jobs_carry_labels() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    let gw = GatewayOptions::new().rest_proxy(&proxy).spawn().await;
    TestRun::new("Run-1", "e").full_append(&["public.Users"]).open(&gw).await;
    gw.post_accepted("Run-1", "e", "public.Users", None, ipc_stream(&[ids(0..7)])).await;
    // BigQuery's answer for the job (the emulator reports no statistics): see RestProxy's job().
    proxy.set_jobs(JobMode::AlreadyExists);
    let committed = gw.commit_and_wait("Run-1", "e").await;
    let publication = &committed["resources"][0]["publication"];
    assert_eq!(committed["state"], "committed", "{committed}");
    assert_eq!(publication["bytes_processed"], 1_048_576, "{publication}");
    assert_eq!(publication["bytes_billed"], 10_485_760, "{publication}");
    assert_eq!(publication["slot_ms"], 1234, "{publication}");
    assert_eq!(publication["rows_inserted"], 7, "{publication}");

    let insert = proxy.requests("POST", "/jobs").pop().expect("the publication's jobs.insert");
    let labels = &insert.body["configuration"]["labels"];
    assert_eq!(
        labels,
        &json!({
            "filament_job": "publication",
            "filament_principal": "default",
            "filament_run": "run-1",
            "filament_execution": "e",
            "filament_resource": "public_users"
        })
    );

    let metrics = gw.metrics().await;
    let billed = "filament_publication_bytes_billed_total 10485760";
    assert!(metrics.contains(billed), "{billed} not in:\n{metrics}");
    assert!(!metrics.contains(&gw.dataset) && !metrics.contains("public_Users"), "no table names in:\n{metrics}");
    let timing = gw.logs().lines().any(|l| l.contains("phase=\"publish\"") && l.contains("bytes_billed=10485760"));
    assert!(timing, "the publish timing carries the statistics");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_keyed_merge_is_bounded_by_the_staged_key_range_and_its_result_unchanged() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    let gw = GatewayOptions::new().rest_proxy(&proxy).spawn().await;
    // The destination holds keys 0..100; the run upserts 10..20 and 40..45 (two batches).
    seed_table(&gw, "users", 0..100).await;
    let upserts = json!({"write_mode": "incremental_upsert", "primary_key": ["id"]});
    TestRun::new("r", "e").resource("users", upserts).open(&gw).await;
    let doubled = |range: std::ops::Range<i64>| {
        use std::sync::Arc;
        crate::support::arrow::batch(
            vec![
                arrow_schema::Field::new("id", arrow_schema::DataType::Int64, false),
                arrow_schema::Field::new("v", arrow_schema::DataType::Int64, true),
            ],
            vec![
                Arc::new(arrow_array::Int64Array::from_iter_values(range.clone())),
                Arc::new(arrow_array::Int64Array::from_iter_values(range.map(|i| -i))),
            ],
        )
    };
    gw.post_accepted("r", "e", "users", None, ipc_stream(&[doubled(40..45)])).await;
    gw.post_accepted("r", "e", "users", None, ipc_stream(&[doubled(10..20)])).await;
    assert_eq!(gw.commit_and_wait("r", "e").await["state"], "committed");

    let merge = proxy.queries().into_iter().find(|q| q.starts_with("MERGE")).expect("the MERGE was submitted");
    assert!(merge.contains("_filament_target.`id` BETWEEN 10 AND 44"), "the destination side is bounded: {merge}");
    let rows = gw.query(&format!("SELECT id, v FROM {}.users ORDER BY id", gw.dataset)).await;
    let value = |r: &Vec<serde_json::Value>| r[1].as_str().unwrap().parse::<i64>().unwrap();
    assert_eq!(rows.len(), 100, "keys outside the range untouched, none added");
    for row in &rows {
        let id: i64 = row[0].as_str().unwrap().parse().unwrap();
        let expected = if (10..20).contains(&id) || (40..45).contains(&id) { -id } else { id * 10 };
        assert_eq!(value(row), expected, "key {id}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn jobs_run_in_the_job_project_under_the_byte_cap_and_a_job_over_it_names_the_figure() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    let gw = GatewayOptions::new().rest_proxy(&proxy).spawn().await;
    let destination = json!({"project": gw.project, "dataset": gw.dataset});
    let before = gw.db_snapshot().await;
    for (settings, code) in [
        (json!({"job_project": "Not A Project"}), "invalid_identifier"),
        (json!({"maximum_bytes_billed": 0}), "invalid_request"),
    ] {
        let mut body = json!({"run_id": "bad", "destination": destination});
        body.as_object_mut().unwrap().extend(settings.as_object().unwrap().clone());
        let (status, problem) = gw.json(Method::POST, "/v1/runs", Some(body)).await;
        assert_eq!(problem["code"], code, "{status}: {problem}");
    }
    assert_eq!(gw.db_snapshot().await, before, "a refused run changes nothing");

    let settings = json!({"run_id": "r", "destination": destination, "job_project": "billing-project",
        "maximum_bytes_billed": 1_000_000});
    let (status, run) = gw.json(Method::POST, "/v1/runs", Some(settings)).await;
    assert_eq!(status, reqwest::StatusCode::CREATED, "{run}");
    assert_eq!(
        (run["job_project"].as_str(), run["maximum_bytes_billed"].as_i64()),
        (Some("billing-project"), Some(1_000_000))
    );
    gw.declare("r", "t", json!({"write_mode": "full_append"})).await;
    gw.open_new_execution("r", "e").await;
    gw.post_accepted("r", "e", "t", None, ipc_stream(&[ids(0..5)])).await;
    let message = "Query exceeded limit for bytes billed: 1000000. 10485760 or higher required.";
    proxy.set_jobs(JobMode::FailFirstAttempt { reason: "bytesBilledLimitExceeded".into(), message: message.into() });
    let failed = gw.commit_and_wait("r", "e").await;
    assert_eq!(failed["state"], "failed", "{failed}");
    assert_eq!(failed["error"]["code"], "publication_too_expensive", "{failed}");
    assert!(failed["error"]["detail"].as_str().unwrap().contains("10485760"), "the figure: {failed}");

    let insert =
        proxy.requests("POST", "/projects/billing-project/jobs").pop().expect("the job ran in the job project");
    assert_eq!(insert.body["jobReference"]["projectId"], "billing-project");
    assert_eq!(insert.body["configuration"]["query"]["maximumBytesBilled"], "1000000");
    let sql = insert.body["configuration"]["query"]["query"].as_str().unwrap();
    assert!(sql.contains(&format!("`{}`.`{}`.`t`", gw.project, gw.dataset)), "the data stays in its project: {sql}");
}

/// One batch of a single STRING column `code`.
fn codes(values: &[&str]) -> arrow_array::RecordBatch {
    crate::support::arrow::batch(
        vec![arrow_schema::Field::new("code", arrow_schema::DataType::Utf8, false)],
        vec![std::sync::Arc::new(arrow_array::StringArray::from(values.to_vec()))],
    )
}

/// The gateway orders STRING keys by code point; a destination column compared under a
/// collation (`und:ci`) orders them otherwise, so its MERGE is bounded by the join only, and
/// its repeated keys are folded under the collation, as the join matches them.
#[tokio::test(flavor = "multi_thread")]
async fn a_string_key_under_a_collation_gets_no_range_and_folds_under_it() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    proxy.state.lock().unwrap().collated.push(("collated".into(), "code".into()));
    let gw = GatewayOptions::new().rest_proxy(&proxy).spawn().await;
    let upserts = json!({"write_mode": "incremental_upsert", "primary_key": ["code"]});
    TestRun::new("r", "e").resource("plain", upserts.clone()).resource("collated", upserts).open(&gw).await;
    let rows = codes(&["b", "A", "a"]);
    for table in ["plain", "collated"] {
        gw.post_accepted("r", "e", table, None, ipc_stream(std::slice::from_ref(&rows))).await;
    }
    assert_eq!(gw.commit_and_wait("r", "e").await["state"], "committed");

    let merge_into = |table: &str| {
        let target = format!("{}`.`{table}` AS _filament_target", gw.dataset);
        proxy.queries().into_iter().find(|q| q.starts_with("MERGE") && q.contains(&target)).expect("a MERGE")
    };
    let plain = merge_into("plain");
    assert!(plain.contains("_filament_target.`code` BETWEEN 'A' AND 'b'"), "code point order: {plain}");
    assert!(plain.contains("PARTITION BY _filament_staged.`code` ORDER BY"), "folded by code point: {plain}");
    let collated = merge_into("collated");
    assert!(!collated.contains("BETWEEN"), "no range under und:ci: {collated}");
    assert!(
        collated.contains("PARTITION BY COLLATE(_filament_staged.`code`, 'und:ci') ORDER BY"),
        "folded as compared: {collated}"
    );
    // The emulator keeps no collation on the column, but groups by the COLLATE the fold names:
    // 'A' and the later 'a' are one key there, two by code point.
    for (table, expected) in [("plain", vec!["A", "a", "b"]), ("collated", vec!["a", "b"])] {
        let rows = gw.query(&format!("SELECT code FROM `{}`.{table} ORDER BY code", gw.dataset)).await;
        let codes: Vec<&str> = rows.iter().map(|row| row[0].as_str().expect("a code")).collect();
        assert_eq!(codes, expected, "{table}");
    }
}

/// Folding a STRING key needs the destination's collations: when its schema cannot be read at
/// publication, the publication fails instead of folding by code point.
#[tokio::test(flavor = "multi_thread")]
async fn a_string_key_whose_destination_schema_is_unreadable_fails_its_publication() {
    let proxy = RestProxy::start(&required_env("BIGQUERY_EMULATOR_HOST")).await;
    let gw = GatewayOptions::new().rest_proxy(&proxy).spawn().await;
    let upserts = json!({"write_mode": "incremental_upsert", "primary_key": ["code"]});
    TestRun::new("r", "e").resource("t", upserts).open(&gw).await;
    let rows = codes(&["A", "a"]);
    gw.post_accepted("r", "e", "t", None, ipc_stream(&[rows])).await;
    // The destination is read while the resource is prepared, before its staging table is made.
    crate::support::eventually(std::time::Duration::from_secs(20), "the staging table", || async {
        let staged = proxy
            .requests("POST", "/tables")
            .iter()
            .any(|r| r.body["tableReference"]["tableId"].as_str().is_some_and(|t| t.starts_with("_filament_stg_")));
        staged.then_some(())
    })
    .await;
    proxy.state.lock().unwrap().unreadable_tables.push("t".into());

    let failed = gw.commit_and_wait("r", "e").await;
    assert_eq!(failed["state"], "failed", "{failed}");
    assert_eq!(failed["error"]["code"], "permission_denied", "{failed}");
    assert!(failed["error"]["detail"].as_str().unwrap().contains("Access Denied"), "{failed}");
    assert_eq!(failed["resources"][0]["rows_acknowledged"], 2, "staged, then not published: {failed}");
    assert!(proxy.queries().iter().all(|q| !q.starts_with("MERGE")), "no MERGE: {:?}", proxy.queries());
    proxy.state.lock().unwrap().unreadable_tables.clear();
    assert_eq!(gw.query(&format!("SELECT COUNT(*) FROM `{}`.t", gw.dataset)).await[0][0], "0");
}
