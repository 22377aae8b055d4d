//! A destination's metadata is read once per delivery, not once per resource: the resources of
//! an execution loading into one table share what its set-up read
//! (`pipeline::lane::destination_tables`), and a table one of them creates is read once more.

use std::time::Duration;

use serde_json::json;

use crate::support::arrow::{ids, ipc_stream};
use crate::support::control_plane::SimulatedRest;
use crate::support::control_plane::limits::Limits;
use crate::support::fake_write::FakeWrite;
use crate::support::{GatewayOptions, TestRun, eventually};

#[tokio::test(flavor = "multi_thread")]
async fn resources_loading_into_one_table_read_it_once_per_delivery() {
    const RESOURCES: usize = 4;
    let limits = Limits::quick();
    let fake = FakeWrite::start().await;
    limits.apply_to(&fake);
    let rest = SimulatedRest::start(limits, 0).await;
    let gw = GatewayOptions::new().fake_write(&fake).rest_host(&rest.address).spawn().await;
    let names: Vec<String> = (0..RESOURCES).map(|i| format!("part{i}")).collect();
    let declaration = json!({"table": "shared", "write_mode": "full_append"});
    let run = names.iter().fold(TestRun::new("run", "e1"), |run, name| run.resource(name, declaration.clone()));
    run.open(&gw).await;
    // The first delivery finds no table: one read, the creation, and one read after it that the
    // other three lanes share. The second finds it: one read for all four.
    for (execution, reads_expected) in [("e1", 2), ("e2", 1)] {
        if execution != "e1" {
            gw.open_new_execution("run", execution).await;
        }
        let reads_before = rest.calls_of("tables.get");
        let streams_before = fake.with(|s| s.streams.len());
        for (i, name) in names.iter().enumerate() {
            let first_id = (i * 10) as i64;
            gw.post_accepted("run", execution, name, None, ipc_stream(&[ids(first_id..first_id + 10)])).await;
        }
        let every_stream = || async { (fake.with(|s| s.streams.len()) == streams_before + RESOURCES).then_some(()) };
        eventually(Duration::from_secs(30), "every lane's stream", every_stream).await;
        let reads = rest.calls_of("tables.get") - reads_before;
        assert_eq!(reads, reads_expected, "tables.get calls of {RESOURCES} set-ups into one table in {execution}");
        let ended = gw.commit_and_wait("run", execution).await;
        assert_eq!(ended["state"], "committed", "{ended}");
    }
    let rows: i64 = fake.with(|s| s.streams.values().filter(|stream| stream.committed).map(|stream| stream.rows).sum());
    assert_eq!(rows, 2 * 10 * RESOURCES as i64, "every row of both deliveries committed once");
}
