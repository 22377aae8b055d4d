//! A commit goes on per destination table (`publish::pipelined`): a table publishes as soon as
//! its own lanes have drained and its streams are committed, while another still uploads; and a
//! stream failing after that fails the execution naming the table that changed.

use std::time::Duration;

use crate::support::fake_write::FakeWrite;
use crate::support::rows::post_ids;
use crate::support::{Gateway, GatewayOptions, TestRun};

/// Resources `fast` and `slow` (tables of their names), 20 rows each, with every append to
/// `slow`'s stream answered after `slow_appends`; commits and returns the execution.
async fn commit_fast_beside_slow(fake: &FakeWrite, slow_appends: Duration) -> (Gateway, serde_json::Value) {
    fake.with(|s| s.table_delays.push(("_filament_stg_slow_".to_string(), slow_appends)));
    let gw = GatewayOptions::new().fake_write(fake).spawn().await;
    TestRun::new("run", "e").full_append(&["fast", "slow"]).open(&gw).await;
    post_ids(&gw, "fast", 0..20).await;
    post_ids(&gw, "slow", 0..20).await;
    let ended = gw.commit_and_wait("run", "e").await;
    (gw, ended)
}

/// When the proxy received the `jobs.insert` of the statement writing table `table`.
fn job_inserted_at(gw: &Gateway, table: &str) -> std::time::Instant {
    let proxy = gw.rest_conformance.as_ref().expect("the harness proxies REST calls");
    let needle = format!("`{table}`");
    proxy
        .requests("POST", "/jobs")
        .into_iter()
        .find(|r| r.body["configuration"]["query"]["query"].as_str().is_some_and(|q| q.contains(&needle)))
        .unwrap_or_else(|| panic!("no job wrote {table}"))
        .at
}

fn publication_state<'a>(execution: &'a serde_json::Value, resource: &str) -> &'a serde_json::Value {
    let resources = execution["resources"].as_array().expect("resources");
    let found = resources.iter().find(|r| r["resource"] == resource).unwrap_or_else(|| panic!("{execution}"));
    &found["publication"]["state"]
}

#[tokio::test(flavor = "multi_thread")]
async fn a_table_publishes_while_another_still_uploads() {
    let fake = FakeWrite::start().await;
    let (gw, ended) = commit_fast_beside_slow(&fake, Duration::from_secs(2)).await;
    assert_eq!(ended["state"], "committed", "{ended}");
    let slow_finalized = fake.stream_for("_filament_stg_slow_").finalized_at.expect("slow was finalized");
    assert!(
        job_inserted_at(&gw, "fast") < slow_finalized,
        "fast's publication started before slow's stream was finalized"
    );
    assert!(job_inserted_at(&gw, "slow") > slow_finalized);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_failing_after_another_table_published_fails_the_execution_naming_it() {
    let fake = FakeWrite::start().await;
    fake.with(|s| s.failing_finalize_tables.push("_filament_stg_slow_".to_string()));
    let (gw, ended) = commit_fast_beside_slow(&fake, Duration::from_secs(2)).await;
    assert_eq!(ended["state"], "failed", "{ended}");
    let detail = ended["error"]["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("published before it failed") && detail.contains("fast"), "{ended}");
    assert_eq!(publication_state(&ended, "fast"), "done", "{ended}");
    assert!(publication_state(&ended, "slow").is_null(), "slow was never published: {ended}");
    let proxy = gw.rest_conformance.as_ref().unwrap();
    assert_eq!(proxy.queries().len(), 1, "only fast's job ran");
}
