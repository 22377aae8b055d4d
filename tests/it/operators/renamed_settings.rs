//! Settings renamed in this release still work under their old names, with a warning; old
//! and new names set to different values refuse to start.

use crate::support::{GatewayOptions, required_env};

/// The one test that spawns the gateway with old setting names (every other test uses the new
/// ones): they are read, and each is logged once as deprecated, naming its new name.
#[tokio::test(flavor = "multi_thread")]
async fn old_setting_names_still_work_and_warn() {
    let gw = GatewayOptions::new()
        .env("FILAMENT_MAX_CONCURRENT_PREPARES", "3")
        .env("FILAMENT_APPEND_MAX_ATTEMPTS", "5")
        .spawn()
        .await;
    let logs = gw.logs();
    let ready = logs.lines().find(|l| l.contains("bigquery.write.ready")).expect("the writer's settings are logged");
    assert!(ready.contains("max_concurrent_set_ups=3"), "{ready}");
    for (old, new) in [
        ("FILAMENT_MAX_CONCURRENT_PREPARES", "FILAMENT_MAX_CONCURRENT_SET_UPS"),
        ("FILAMENT_APPEND_MAX_ATTEMPTS", "FILAMENT_BIGQUERY_MAX_ATTEMPTS"),
    ] {
        let warned: Vec<&str> =
            logs.lines().filter(|l| l.contains("config.deprecated_name") && l.contains(old)).collect();
        assert_eq!(warned.len(), 1, "{old} warned once:\n{logs}");
        assert!(warned[0].contains("WARN") && warned[0].contains(new), "{}", warned[0]);
    }
}

#[test]
fn old_and_new_names_with_different_values_refuse_to_start() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_filament-bigquery"))
        .arg("serve")
        .env_clear()
        .env("DATABASE_URL", required_env("DATABASE_URL"))
        .env("FILAMENT_LISTEN", "127.0.0.1:0")
        .env("FILAMENT_API_TOKENS", "0123456789abcdef0123")
        .env("FILAMENT_MAX_CONCURRENT_PREPARES", "4")
        .env("FILAMENT_MAX_CONCURRENT_SET_UPS", "6")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("FILAMENT_MAX_CONCURRENT_PREPARES") && stderr.contains("FILAMENT_MAX_CONCURRENT_SET_UPS"),
        "{stderr}"
    );
}
