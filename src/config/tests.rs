use std::ffi::OsString;

use clap::{CommandFactory as _, Parser as _};

use super::renamed::{self, RENAMED};
use super::{Cli, Command, SERVE_HELP_HEADINGS, ServeConfig};

/// `serve` with the few settings it needs, and `extra`.
fn serve(extra: &[&str]) -> ServeConfig {
    let mut args =
        vec!["filament-bigquery", "serve", "--database-url", "postgres://x", "--api-tokens", "0123456789abcdef"];
    args.extend_from_slice(extra);
    match Cli::try_parse_from(args).unwrap().command {
        Command::Serve(config) => *config,
        other => panic!("{other:?}"),
    }
}

#[test]
fn serve_help_shows_the_groups_in_order() {
    let mut command = Cli::command();
    let help = command.find_subcommand_mut("serve").unwrap().render_long_help().to_string();
    let mut from = 0;
    for heading in SERVE_HELP_HEADINGS {
        let at =
            help[from..].find(&format!("{heading}:")).unwrap_or_else(|| panic!("{heading} after {from} in {help}"));
        from += at + heading.len();
    }
    // Each group's settings under its heading: one of each, in order.
    let settings =
        ["FILAMENT_LISTEN", "FILAMENT_API_TOKENS", "FILAMENT_MAX_BUFFERED_BYTES=", "FILAMENT_APPEND_GZIP_LEVEL"];
    let settings =
        settings.into_iter().chain(["FILAMENT_MAX_CONCURRENT_SET_UPS", "FILAMENT_ADVERTISE_URL", "DATABASE_URL"]);
    let env = |name: &str| help.find(&format!("[env: {name}")).unwrap_or_else(|| panic!("{name} in {help}"));
    let positions: Vec<usize> = settings.map(env).collect();
    let headings: Vec<usize> = SERVE_HELP_HEADINGS.iter().map(|h| help.find(&format!("{h}:")).unwrap()).collect();
    for (i, (setting, heading)) in positions.iter().zip(&headings).enumerate() {
        assert!(setting > heading && headings.get(i + 1).is_none_or(|next| setting < next), "{i}: {help}");
    }
}

#[test]
fn the_groups_hold_their_settings() {
    let config = serve(&["--max-concurrent-set-ups", "12", "--bigquery-max-attempts", "3"]);
    assert_eq!(config.control_plane.max_concurrent_set_ups, 12);
    assert_eq!(config.control_plane.bigquery_max_attempts, 3);
    assert_eq!(config.http.max_connections, 2048);
    assert_eq!(config.infrastructure.database.database_url, "postgres://x");
    assert_eq!(config.validate(), Ok(()));
}

#[test]
fn old_flags_are_aliases_and_reported() {
    let config =
        serve(&["--max-concurrent-prepares", "5", "--append-max-attempts=4", "--append-initial-backoff-ms", "7"]);
    assert_eq!(config.control_plane.max_concurrent_set_ups, 5);
    assert_eq!(config.control_plane.bigquery_max_attempts, 4);
    assert_eq!(config.control_plane.bigquery_initial_backoff_ms, 7);
    let args: Vec<OsString> =
        ["serve", "--max-concurrent-prepares", "5", "--append-max-attempts=4"].map(OsString::from).into();
    let in_use = renamed::old_names_in_use(|_| None, &args).unwrap();
    let flags: Vec<&str> = in_use.iter().filter(|old| !old.via_env).map(|old| old.renamed.old_flag).collect();
    assert_eq!(flags, ["--max-concurrent-prepares", "--append-max-attempts"]);
}

#[test]
fn an_old_env_name_is_read_when_the_new_one_is_unset_and_reported() {
    let env = |name: &str| (name == "FILAMENT_MAX_CONCURRENT_PREPARES").then(|| OsString::from("16"));
    let in_use = renamed::old_names_in_use(env, &[]).unwrap();
    assert_eq!(in_use.len(), 1);
    assert!(in_use[0].via_env);
    assert_eq!(in_use[0].renamed.new_env, "FILAMENT_MAX_CONCURRENT_SET_UPS");
    // The new setting reads the old variable.
    let mut command = renamed::command(&in_use);
    let serve = command.find_subcommand_mut("serve").unwrap();
    let arg = serve.get_arguments().find(|arg| arg.get_id() == "max_concurrent_set_ups").unwrap();
    assert_eq!(arg.get_env().and_then(|e| e.to_str()), Some("FILAMENT_MAX_CONCURRENT_PREPARES"));
    // The same value under both names is accepted (reported all the same); the new one is read.
    let both = |name: &str| name.contains("ATTEMPTS").then(|| OsString::from("5"));
    let in_use = renamed::old_names_in_use(both, &[]).unwrap();
    assert_eq!(in_use.len(), 1);
    assert!(!in_use[0].via_env);
}

#[test]
fn old_and_new_env_names_with_different_values_are_refused_naming_both() {
    let env = |name: &str| match name {
        "FILAMENT_APPEND_MAX_ATTEMPTS" => Some(OsString::from("3")),
        "FILAMENT_BIGQUERY_MAX_ATTEMPTS" => Some(OsString::from("5")),
        _ => None,
    };
    let refused = renamed::old_names_in_use(env, &[]).unwrap_err();
    assert!(
        refused.contains("FILAMENT_APPEND_MAX_ATTEMPTS") && refused.contains("FILAMENT_BIGQUERY_MAX_ATTEMPTS"),
        "{refused}"
    );
}

#[test]
fn every_renamed_setting_exists_under_its_new_names_with_the_old_flag_as_alias() {
    let mut command = Cli::command();
    let serve = command.find_subcommand_mut("serve").unwrap();
    for renamed in &RENAMED {
        let arg = serve.get_arguments().find(|arg| arg.get_id() == renamed.id).unwrap();
        assert_eq!(arg.get_env().and_then(|e| e.to_str()), Some(renamed.new_env));
        assert_eq!(arg.get_long().map(|long| format!("--{long}")).as_deref(), Some(renamed.new_flag));
        let aliases = arg.get_all_aliases().unwrap_or_default();
        assert!(aliases.contains(&renamed.old_flag.trim_start_matches("--")), "{aliases:?}");
    }
}

#[test]
fn validation_reports_every_invalid_setting_at_once() {
    let config = serve(&[
        "--metrics-token",
        "short",
        "--max-append-request-bytes",
        "1024",
        "--tls-cert-file",
        "c.pem",
        "--google-id-token-audience",
        "a",
        "--google-jwks-url",
        "http://example.com/certs",
    ]);
    let problems = config.validate().unwrap_err().0;
    for name in [
        "FILAMENT_METRICS_TOKEN",
        "FILAMENT_MAX_APPEND_REQUEST_BYTES",
        "FILAMENT_TLS_KEY_FILE",
        "FILAMENT_GOOGLE_JWKS_URL",
    ] {
        assert!(problems.iter().any(|problem| problem.contains(name)), "{name} in {problems:?}");
    }
    assert_eq!(problems.len(), 4, "{problems:?}");
}

#[test]
fn forwarding_in_clear_from_a_gateway_serving_https_is_refused() {
    let advertising = |url| serve(&["--tls-cert-file", "c.pem", "--tls-key-file", "k.pem", "--advertise-url", url]);
    assert!(advertising("http://10.0.0.1:8080").validate().unwrap_err().0[0].contains("FILAMENT_ADVERTISE_URL"));
    assert_eq!(advertising("https://10.0.0.1:8080").validate(), Ok(()));
}

#[test]
fn append_requests_may_reach_19_mib_under_googles_20_mb_limit() {
    let accepted = serve(&["--max-append-request-bytes", &(19 * 1024 * 1024).to_string()]);
    assert_eq!(accepted.validate(), Ok(()));
    let refused = serve(&["--max-append-request-bytes", &(19 * 1024 * 1024 + 1).to_string()]);
    let problems = refused.validate().unwrap_err().0;
    assert!(problems.iter().any(|problem| problem.contains("FILAMENT_MAX_APPEND_REQUEST_BYTES")), "{problems:?}");
}
