//! The suite's own support, checked where it could silently stop doing its job.

use std::time::Duration;

use serde_json::json;

use crate::support::emulator_watch::{EmulatorSpec, EmulatorWatch};
use crate::support::{bigquery_query_at, eventually, free_port_for_later_bind, random_suffix};

/// The emulator dies natively at times (a segfault); the watch must name the test that was
/// using it and bring it back on the same ports, so later tests do not fail for its reason.
#[tokio::test]
async fn a_crashed_emulator_is_restarted_on_its_ports_and_reported_with_the_test_using_it() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("emulator-watch-{}", random_suffix()));
    std::fs::create_dir_all(&dir).unwrap();
    let spec = EmulatorSpec {
        rest_port: free_port_for_later_bind(),
        grpc_port: free_port_for_later_bind(),
        log_file: dir.join("emulator.log"),
        pid_file: Some(dir.join("pid")),
        crash_log: Some(dir.join("crashes.log")),
    };
    let watch = tokio::task::spawn_blocking({
        let spec = spec.clone();
        move || EmulatorWatch::start_private(spec)
    })
    .await
    .unwrap();
    let _using = watch.use_for_test().await;
    let crashed_pid = watch.pid();

    let status = std::process::Command::new("kill").args(["-SEGV", &crashed_pid.to_string()]).status().unwrap();
    assert!(status.success());
    let crash = eventually(Duration::from_secs(90), "the crash to be reported and the emulator restarted", || {
        std::future::ready(watch.crashes().first().cloned())
    })
    .await;

    let this_test = "harness::a_crashed_emulator_is_restarted_on_its_ports_and_reported_with_the_test_using_it";
    assert_eq!(crash.pid, crashed_pid);
    assert_eq!(crash.tests_running, [this_test]);
    assert_ne!(watch.pid(), crashed_pid);
    assert_eq!(std::fs::read_to_string(dir.join("pid")).unwrap(), watch.pid().to_string());
    assert!(std::fs::read_to_string(dir.join("crashes.log")).unwrap().contains(this_test));
    let address = format!("127.0.0.1:{}", spec.rest_port);
    assert_eq!(bigquery_query_at(&address, "filament-demo", "SELECT 1 AS one").await, [[json!("1")]]);
}
