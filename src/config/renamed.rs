//! Settings renamed in this release, still accepted under their old names for one release.
//!
//! An old environment variable is read when its new name is unset (both set to different
//! values: refused, naming both); an old `--flag` is an alias of the new one. Each old name
//! used is logged once as a warning, naming the new one, once logging is up
//! ([`OldName::warn`]). docs/operations.md lists the renames.

use std::ffi::OsString;

use clap::{CommandFactory as _, FromArgMatches as _};

use super::Cli;

/// One renamed `serve` setting.
#[derive(Debug, PartialEq, Eq)]
pub struct Renamed {
    /// The old environment variable.
    pub old_env: &'static str,
    /// The new environment variable.
    pub new_env: &'static str,
    /// The old long flag (an alias of the new one).
    pub old_flag: &'static str,
    /// The new long flag.
    pub new_flag: &'static str,
    /// The setting's clap id (its field name).
    pub id: &'static str,
}

/// Every setting renamed in this release.
pub static RENAMED: [Renamed; 3] = [
    Renamed {
        old_env: "FILAMENT_MAX_CONCURRENT_PREPARES",
        new_env: "FILAMENT_MAX_CONCURRENT_SET_UPS",
        old_flag: "--max-concurrent-prepares",
        new_flag: "--max-concurrent-set-ups",
        id: "max_concurrent_set_ups",
    },
    Renamed {
        old_env: "FILAMENT_APPEND_MAX_ATTEMPTS",
        new_env: "FILAMENT_BIGQUERY_MAX_ATTEMPTS",
        old_flag: "--append-max-attempts",
        new_flag: "--bigquery-max-attempts",
        id: "bigquery_max_attempts",
    },
    Renamed {
        old_env: "FILAMENT_APPEND_INITIAL_BACKOFF_MS",
        new_env: "FILAMENT_BIGQUERY_INITIAL_BACKOFF_MS",
        old_flag: "--append-initial-backoff-ms",
        new_flag: "--bigquery-initial-backoff-ms",
        id: "bigquery_initial_backoff_ms",
    },
];

/// A renamed setting given under its old name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OldName {
    pub renamed: &'static Renamed,
    /// Given as the old environment variable (and not under its new name): read from it.
    pub via_env: bool,
}

impl OldName {
    /// The deprecation warning (`config.deprecated_name`), once logging is initialised.
    pub fn warn(&self) {
        let (old, new) = if self.via_env {
            (self.renamed.old_env, self.renamed.new_env)
        } else {
            (self.renamed.old_flag, self.renamed.new_flag)
        };
        tracing::warn!(
            old,
            new,
            hint = "renamed in this release: the old name stops working in the next one",
            "config.deprecated_name"
        );
    }
}

/// The renamed settings given under their old names, by environment (`var`) or flag (`args`).
/// Refused when an old and a new environment variable are both set to different values.
pub fn old_names_in_use(var: impl Fn(&str) -> Option<OsString>, args: &[OsString]) -> Result<Vec<OldName>, String> {
    let mut in_use = Vec::new();
    let mut refused = Vec::new();
    for renamed in &RENAMED {
        if let Some(old) = var(renamed.old_env) {
            match var(renamed.new_env) {
                Some(new) if new != old => refused.push(format!(
                    "{} (deprecated) and {} are both set, to different values: unset {}",
                    renamed.old_env, renamed.new_env, renamed.old_env
                )),
                new => in_use.push(OldName { renamed, via_env: new.is_none() }),
            }
        }
        let flag = |arg: &OsString| {
            arg.to_str().is_some_and(|arg| {
                arg == renamed.old_flag || arg.strip_prefix(renamed.old_flag).is_some_and(|rest| rest.starts_with('='))
            })
        };
        if args.iter().any(flag) {
            in_use.push(OldName { renamed, via_env: false });
        }
    }
    if refused.is_empty() { Ok(in_use) } else { Err(refused.join("; ")) }
}

/// The command line interface, each renamed setting given only under its old environment
/// variable read from that variable.
pub fn command(in_use: &[OldName]) -> clap::Command {
    in_use.iter().filter(|old| old.via_env).fold(Cli::command(), |command, old| {
        command.mut_subcommand("serve", |serve| serve.mut_arg(old.renamed.id, |arg| arg.env(old.renamed.old_env)))
    })
}

/// Parses the command line and the environment, old names included (exits on an error, as
/// clap's `parse` does), and the old names used.
pub fn parse() -> (Cli, Vec<OldName>) {
    let args: Vec<OsString> = std::env::args_os().collect();
    let in_use = old_names_in_use(|name| std::env::var_os(name), &args)
        .unwrap_or_else(|message| Cli::command().error(clap::error::ErrorKind::ArgumentConflict, message).exit());
    let matches = command(&in_use).get_matches_from(args);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    (cli, in_use)
}
