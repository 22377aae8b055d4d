//! Files the gateway reads again when they change (the TLS certificate and key, the principals
//! file): one poller that compares each file's modification time and size every
//! [`CHECK_INTERVAL`]. What a change means (a new certificate, new principals) is its caller's.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// How often watched files are checked for a change.
pub(crate) const CHECK_INTERVAL: Duration = Duration::from_secs(2);

/// A file's modification time and size, or `None` while it cannot be read. A rewrite within
/// the same second changes the size or, on every file system the gateway runs on, the
/// nanoseconds.
pub(crate) type Modification = Option<(SystemTime, u64)>;

pub(crate) fn modification(path: &Path) -> Modification {
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.modified().ok()?, metadata.len()))
}

/// Some files and how they were when last seen.
#[derive(Debug)]
pub(crate) struct WatchedFiles {
    paths: Vec<PathBuf>,
    last_seen: Vec<Modification>,
    interval: tokio::time::Interval,
}

impl WatchedFiles {
    /// Watches `paths`, as they are now.
    pub(crate) fn new(paths: Vec<PathBuf>) -> Self {
        let last_seen = paths.iter().map(|path| modification(path)).collect();
        let mut interval = tokio::time::interval(CHECK_INTERVAL);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self { paths, last_seen, interval }
    }

    /// Waits for the next check; whether any file changed since it was last seen. Cancel-safe:
    /// dropped while it waits, it checks nothing.
    pub(crate) async fn next_check(&mut self) -> bool {
        self.interval.tick().await;
        self.changed()
    }

    /// Whether any file changed since it was last seen, recording how each is now.
    pub(crate) fn changed(&mut self) -> bool {
        let seen: Vec<Modification> = self.paths.iter().map(|path| modification(path)).collect();
        let changed = seen != self.last_seen;
        self.last_seen = seen;
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_rewrite_is_seen_once_and_an_untouched_file_never() {
        let directory = tempfile::tempdir().unwrap();
        let (first, second) = (directory.path().join("a"), directory.path().join("b"));
        std::fs::write(&first, "one").unwrap();
        std::fs::write(&second, "two").unwrap();
        let mut files = WatchedFiles::new(vec![first.clone(), second.clone()]);
        assert!(!files.next_check().await, "nothing changed since they were watched");
        std::fs::write(&second, "two, longer").unwrap();
        assert!(files.next_check().await, "the second file grew");
        assert!(!files.next_check().await, "a change is seen once");
        std::fs::remove_file(&first).unwrap();
        assert!(files.next_check().await, "a file gone is a change");
        assert!(!files.next_check().await);
    }
}
