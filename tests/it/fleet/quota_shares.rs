//! BigQuery's quotas shared by a fleet (`bigquery::quota`): replicas on one database pace their
//! share of each quota of one simulated project (`support::control_plane`, which counts every
//! call against every quota), re-divided when a replica is lost; a quota the operator lowers is
//! honoured, and a gateway that does not know it is refused, slowed down, and still loads; a
//! replica cut off from Postgres gives its share up before the others take it.

use std::time::Duration;

use serde_json::Value;

use crate::support::arrow::{ids, ipc_stream};
use crate::support::control_plane::SimulatedRest;
use crate::support::control_plane::limits::{Limits, StreamQuota};
use crate::support::fake_write::FakeWrite;
use crate::support::proxy::SeveringProxy;
use crate::support::quota_meter::QuotaUse;
use crate::support::{Gateway, GatewayOptions, TestRun, within};

/// A small project: quotas a few dozen tables reach, latencies short.
fn small_project() -> Limits {
    Limits {
        metadata_read: Duration::from_millis(20),
        metadata_write: Duration::from_millis(40),
        table_delete: Duration::from_millis(20),
        tables_insert_per_second: 6.0,
        api_requests_per_second_per_method: 30.0,
        concurrent_api_requests: 30,
        create_stream: Duration::from_millis(50),
        // 30 streams a minute at once, then one every two seconds.
        create_write_streams_per_hour: 1_800.0,
        stream_quota: StreamQuota::PerMinute,
        finalize: Duration::from_millis(20),
        batch_commit: Duration::from_millis(20),
        query: Duration::from_millis(200),
        query_per_mib: Duration::ZERO,
        ..Limits::default()
    }
}

/// The Storage Write fake and the simulated REST control plane of one project with `limits`.
async fn simulated(limits: Limits) -> (FakeWrite, SimulatedRest) {
    let fake = FakeWrite::start().await;
    limits.apply_to(&fake);
    (fake, SimulatedRest::start(limits, 0).await)
}

/// The gateway's options for the simulated project, pacing by `limits` as an operator would set
/// them, renewing its fleet membership every second.
fn replica_options(fake: &FakeWrite, rest: &SimulatedRest, limits: &Limits) -> GatewayOptions {
    let mut options =
        GatewayOptions::new().fake_write(fake).rest_host(&rest.address).env("FILAMENT_REPLICA_LEASE_SECS", "3");
    for (name, value) in limits.gateway_settings() {
        options = options.env(&name, &value);
    }
    options
}

/// `size` replicas on one database, each counting all of them.
async fn fleet(size: usize, options: impl Fn() -> GatewayOptions) -> Vec<Gateway> {
    let first = options().spawn().await;
    let database_url = first.database_url.clone();
    let mut replicas = vec![first];
    for _ in 1..size {
        let mut more = options();
        more.database_url = Some(database_url.clone());
        replicas.push(more.spawn().await);
    }
    for replica in &replicas {
        fleet_counted(replica, size).await;
    }
    replicas
}

async fn fleet_counted(replica: &Gateway, size: usize) {
    let counted = within(Duration::from_secs(30), Duration::from_millis(200), || async {
        (replica.metric("filament_fleet_replicas").await == Some(size as f64)).then_some(())
    });
    counted.await.unwrap_or_else(|| panic!("the replica counts {size} replicas within 30 s"));
}

/// Declares `tables` resources in a run on `gw`, posts five rows to each and commits.
async fn load(gw: &Gateway, run: &str, tables: usize) -> Value {
    let names: Vec<String> = (0..tables).map(|i| format!("{run}_t{i:02}")).collect();
    let resources: Vec<&str> = names.iter().map(String::as_str).collect();
    TestRun::new(run, "e").full_append(&resources).open(gw).await;
    for name in &names {
        gw.post_accepted(run, "e", name, None, ipc_stream(&[ids(0..5)])).await;
    }
    gw.commit_and_wait(run, "e").await
}

fn every_quota(rest: &SimulatedRest, fake: &FakeWrite) -> Vec<QuotaUse> {
    let mut uses = rest.quota_use();
    uses.extend(fake.with(|s| s.create_quota.as_ref().map(QuotaUse::from)));
    uses
}

fn rate_of(metrics: &str, quota: &str) -> Option<f64> {
    let series = format!("filament_bigquery_quota_rate_per_second{{quota=\"{quota}\"}} ");
    metrics.lines().find_map(|line| line.strip_prefix(&series)?.trim().parse().ok())
}

/// The replica's `tables.insert` pace, calls per second.
async fn insert_rate(replica: &Gateway) -> f64 {
    let metrics = replica.metrics().await;
    rate_of(&metrics, "tables.insert").unwrap_or_else(|| panic!("the tables.insert pacer is in /metrics: {metrics}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn three_replicas_loading_at_once_stay_within_every_quota_in_sum() {
    let limits = small_project();
    let (fake, rest) = simulated(limits).await;
    let replicas = fleet(3, || replica_options(&fake, &rest, &limits)).await;
    // 3 x 14 tables: 84 tables.insert (14 s at 6 per second) and 42 streams (beyond the 30 at once).
    let loads = replicas.iter().enumerate().map(|(i, gw)| load(gw, ["a", "b", "c"][i], 14));
    for ended in futures::future::join_all(loads).await {
        assert_eq!(ended["state"], "committed", "{ended}");
    }
    let committed_rows: i64 = fake.with(|s| s.streams.values().filter(|st| st.committed).map(|st| st.rows).sum());
    assert_eq!(committed_rows, 3 * 14 * 5);
    let uses = every_quota(&rest, &fake);
    let busiest = uses.iter().max_by(|a, b| a.max_use.total_cmp(&b.max_use)).unwrap();
    assert!(uses.iter().all(|u| u.refused == 0 && u.max_use <= 1.0), "{uses:#?}");
    // The binding quotas were reached: the fleet paced at them, not far below.
    assert!(busiest.max_use > 0.5, "{uses:#?}");
    let metrics = replicas[0].metrics().await;
    let insert_rate = rate_of(&metrics, "tables.insert").expect("the tables.insert pacer is in /metrics");
    assert!((insert_rate - 6.0 * 0.9 / 3.0).abs() < 1e-9, "a third of 90% of 6 per second: {insert_rate}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_replica_hands_its_share_to_the_others() {
    let limits = small_project();
    let (fake, rest) = simulated(limits).await;
    let mut replicas = fleet(2, || replica_options(&fake, &rest, &limits)).await;
    let mut lost = replicas.pop().unwrap();
    let survivor = &replicas[0];
    let survivor_rate = || async { rate_of(&survivor.metrics().await, "tables.insert") };
    assert_eq!(survivor_rate().await, Some(6.0 * 0.9 / 2.0));
    lost.kill();
    // Its place lapses with its 3 s lease; the survivor counts itself alone at its next renewal.
    fleet_counted(survivor, 1).await;
    let handed_back = within(Duration::from_secs(10), Duration::from_millis(200), || async {
        (survivor_rate().await == Some(6.0 * 0.9)).then_some(())
    });
    handed_back.await.expect("the survivor paces at the whole quota");
    let ended = load(survivor, "after", 4).await;
    assert_eq!(ended["state"], "committed", "{ended}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_shows_each_pacer_from_its_start() {
    let gw = GatewayOptions::new().spawn().await;
    // Google's 10 tables.insert per second, paced at 90%, before any call and any change.
    assert_eq!(insert_rate(&gw).await, 9.0);
    let metrics = gw.metrics().await;
    assert!(rate_of(&metrics, "CreateWriteStream").is_some_and(|rate| rate > 0.0), "{metrics}");
    assert_eq!(gw.metric("filament_fleet_replicas").await, Some(1.0));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replica_cut_off_from_postgres_gives_up_its_share_before_the_others_take_it() {
    let limits = small_project();
    let (fake, rest) = simulated(limits).await;
    let reachable = replica_options(&fake, &rest, &limits).spawn().await;
    let proxy = SeveringProxy::in_front_of(&reachable.database_url).await;
    let mut cut_off = replica_options(&fake, &rest, &limits);
    cut_off.database_url = Some(proxy.url.clone());
    let cut_off = cut_off.spawn().await;
    fleet_counted(&reachable, 2).await;
    fleet_counted(&cut_off, 2).await;
    assert_eq!(insert_rate(&cut_off).await, 6.0 * 0.9 / 2.0);

    proxy.sever();
    // The reachable replica counts itself alone once the other's 3 s lease ran out: by then
    // the cut-off one has given its share up (it cannot know what the others count).
    fleet_counted(&reachable, 1).await;
    assert_eq!(cut_off.metric("filament_fleet_replicas").await, Some(0.0), "lapsed");
    assert_eq!(insert_rate(&cut_off).await, 0.0);
    let whole = within(Duration::from_secs(10), Duration::from_millis(200), || async {
        (insert_rate(&reachable).await == 6.0 * 0.9).then_some(())
    });
    whole.await.expect("the reachable replica paces at the whole quota");

    proxy.restore();
    fleet_counted(&cut_off, 2).await;
    assert_eq!(insert_rate(&cut_off).await, 6.0 * 0.9 / 2.0, "counted again: its share back");
    let ended = load(&cut_off, "back", 3).await;
    assert_eq!(ended["state"], "committed", "{ended}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_quota_lowered_by_the_operator_is_honoured_and_one_not_told_is_refused_but_loads() {
    let limits = Limits { tables_insert_per_second: 2.0, ..small_project() };
    let (fake, told_rest) = simulated(limits).await;
    let told = replica_options(&fake, &told_rest, &limits).spawn().await;
    let ended = load(&told, "told", 8).await;
    assert_eq!(ended["state"], "committed", "{ended}");
    let uses = told_rest.quota_use();
    assert!(uses.iter().all(|u| u.refused == 0 && u.max_use <= 1.0), "{uses:#?}");
    // The same project for a gateway left at Google's 10 per second: refused, slowed, loaded.
    let untold_rest = SimulatedRest::start(limits, 0).await;
    let untold = GatewayOptions::new()
        .fake_write(&fake)
        .rest_host(&untold_rest.address)
        .env("FILAMENT_QUOTA_WAIT_SECS", "120")
        .spawn()
        .await;
    let ended = load(&untold, "untold", 8).await;
    assert_eq!(ended["state"], "committed", "a refusal slows the gateway down, never fails the run: {ended}");
    let refused: usize = untold_rest.quota_use().iter().map(|u| u.refused).sum();
    assert!(refused > 0, "the quota the operator did not set was exceeded: {:#?}", untold_rest.quota_use());
    let metrics = untold.metrics().await;
    assert!(metrics.contains("filament_bigquery_quota_refusals_total{quota=\"tables.insert\"}"), "{metrics}");
}
