//! What a publication costs, as BigQuery reports it: each job carries labels users find it by,
//! and its statistics are recorded on the execution's publication, logged and counted.

use reqwest::Method;
use serde_json::json;

use crate::support::arrow::{ids, ipc_stream};
use crate::support::rest_proxy::{JobMode, RestProxy};
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
        &json!({"filament_run": "run-1", "filament_execution": "e", "filament_resource": "public_users"})
    );

    let metrics = gw.unauthenticated(Method::GET, "/metrics").send().await.unwrap().text().await.unwrap();
    let billed = format!(
        "filament_publication_bytes_billed_total{{dataset=\"{}\",table=\"public_Users\"}} 10485760",
        gw.dataset
    );
    assert!(metrics.contains(&billed), "{billed} not in:\n{metrics}");
    let timing = gw.logs().lines().any(|l| l.contains("phase=\"publish\"") && l.contains("bytes_billed=10485760"));
    assert!(timing, "the publish timing carries the statistics");
}
