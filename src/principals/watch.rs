//! Loads the principals in force and keeps them current: the file is read at start (a broken
//! file stops the start), then re-read when its modification time or size changes
//! ([`crate::watched_files`]) and on SIGHUP. A file that does not parse or validate is refused
//! whole: an ERROR names the line, `filament_principals_reload_errors_total` counts it, and the
//! previous principals stay in force.

use std::path::{Path, PathBuf};

use tokio_util::sync::CancellationToken;

use super::file::{self, FileRefused};
use super::{Action, Principal, PrincipalSet, Principals};
use crate::watched_files::{WatchedFiles, modification};

/// Where the principals come from: the file, and the simple mode's tokens.
#[derive(Debug, Clone)]
pub(crate) struct PrincipalSources {
    pub(crate) file: Option<PathBuf>,
    /// `FILAMENT_API_TOKENS`: the `default` principal's, when set.
    pub(crate) api_tokens: Vec<String>,
}

/// Why the principals could not be loaded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LoadError {
    #[error("cannot read the principals file {path}: {error}")]
    Read { path: String, error: std::io::Error },
    #[error("the principals file {path} was refused: {refused}")]
    Refused { path: String, refused: FileRefused },
}

impl PrincipalSources {
    /// The principals the sources declare now.
    pub(crate) fn load(&self) -> Result<PrincipalSet, LoadError> {
        let mut principals: Vec<Principal> = Vec::new();
        if !self.api_tokens.is_empty() {
            principals.push(Principal::default_with_tokens(&self.api_tokens));
        }
        if let Some(path) = &self.file {
            let shown = path.display().to_string();
            let text = read_settled(path).map_err(|error| LoadError::Read { path: shown.clone(), error })?;
            let declared = file::parse(&text, !self.api_tokens.is_empty())
                .map_err(|refused| LoadError::Refused { path: shown, refused })?;
            // A digest in both FILAMENT_API_TOKENS and the file would select two principals.
            if let Some(default) = principals.first()
                && declared.iter().any(|p| p.token_sha256.iter().any(|d| default.token_sha256.contains(d)))
            {
                return Err(LoadError::Refused {
                    path: path.display().to_string(),
                    refused: FileRefused {
                        line: 1,
                        message: "a token_sha256 is also a FILAMENT_API_TOKENS token".to_string(),
                    },
                });
            }
            principals.extend(declared);
        }
        warn_of_unprefixed_beside_prefixed(&principals);
        Ok(PrincipalSet::new(principals))
    }
}

/// A principal without a run-id prefix may name runs in every other principal's prefix: it
/// cannot read them (another's run answers as missing), but it can take those ids first.
fn warn_of_unprefixed_beside_prefixed(principals: &[Principal]) {
    let (prefixed, unprefixed): (Vec<&Principal>, Vec<&Principal>) =
        principals.iter().filter(|p| p.may(Action::Write)).partition(|p| p.run_id_prefix.is_some());
    if !prefixed.is_empty() && !unprefixed.is_empty() {
        let names: Vec<&str> = unprefixed.iter().map(|p| p.name.as_str()).collect();
        tracing::warn!(principals = %names.join(","),
            "principals.unprefixed: these principals have no run_id_prefix beside others that do; they can create run ids in the others' prefixes");
    }
}

/// Reloads the principals when the file changes or on SIGHUP, until `stop`. The SIGHUP handler
/// is installed here, before the returned future is spawned: installed inside the task, a
/// SIGHUP that came before the task first ran (a loaded machine, the gateway already serving)
/// would end the process, SIGHUP's default action.
pub(crate) fn keep_current(
    sources: PrincipalSources,
    principals: Principals,
    stop: CancellationToken,
) -> impl Future<Output = ()> + Send + 'static {
    let hangups = hangup_signals();
    watch_until_stopped(sources, principals, stop, hangups)
}

async fn watch_until_stopped(
    sources: PrincipalSources,
    principals: Principals,
    stop: CancellationToken,
    mut hangups: Hangups,
) {
    let Some(path) = sources.file.clone() else {
        // Nothing to reload (FILAMENT_API_TOKENS only): a SIGHUP is noted and changes nothing.
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                Some(()) = recv_hangup(&mut hangups) => {
                    tracing::info!("principals.reload_skipped: no FILAMENT_PRINCIPALS_FILE to reload");
                }
            }
        }
    };
    let mut watched = WatchedFiles::new(vec![path]);
    loop {
        let changed = tokio::select! {
            () = stop.cancelled() => return,
            changed = watched.next_check() => changed,
            Some(()) = recv_hangup(&mut hangups) => {
                watched.changed();
                true
            }
        };
        if changed {
            reload(&sources, &principals);
        }
    }
}

/// Loads the sources and puts them in force, or keeps the principals in force.
pub(crate) fn reload(sources: &PrincipalSources, principals: &Principals) {
    match sources.load() {
        Ok(set) => {
            crate::audit::principals_reloaded(set.len(), set.token_count(), set.service_account_count());
            principals.replace(set);
        }
        Err(error) => {
            crate::telemetry::principals_reload_refused();
            tracing::error!(%error, "principals.reload_refused: the previous principals stay in force");
        }
    }
}

/// Reads of a file that keeps changing while it is read, before the load gives up.
const SETTLED_READ_ATTEMPTS: usize = 3;

/// The file's text, read whole, once it did not change while it was read (its modification
/// time and size the same before and after): an editor writing in place could otherwise hand
/// over a half-written file that parses, its missing lines falling back to defaults.
fn read_settled(path: &Path) -> std::io::Result<String> {
    for _ in 0..SETTLED_READ_ATTEMPTS {
        let before = modification(path);
        let text = std::fs::read_to_string(path)?;
        if before.is_some() && modification(path) == before {
            return Ok(text);
        }
    }
    Err(std::io::Error::other("the file kept changing while it was read; the next check reads it again"))
}

#[cfg(unix)]
type Hangups = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangups = Option<()>;

#[cfg(unix)]
fn hangup_signals() -> Hangups {
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok()
}

#[cfg(not(unix))]
fn hangup_signals() -> Hangups {
    None
}

#[cfg(unix)]
async fn recv_hangup(hangups: &mut Hangups) -> Option<()> {
    match hangups {
        Some(signal) => signal.recv().await,
        None => std::future::pending().await,
    }
}

#[cfg(not(unix))]
async fn recv_hangup(_: &mut Hangups) -> Option<()> {
    std::future::pending().await
}
