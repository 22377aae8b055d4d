//! Limits kept per BigQuery project and location ([`ProjectLocation`]): the adaptive limits
//! (`super::adaptive`) and the `CreateWriteStream` pacing (`super::quota`), so one project's
//! refusals and queueing slow only that project's calls. [`PerDestination`] makes each at its
//! first use and forgets idle ones when it holds many.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

/// Past this many destinations, idle ones are forgotten as new ones come (each is a few
/// hundred bytes; a forgotten one starts afresh at its next call).
const IDLE_KEPT: usize = 1024;

/// A project and location whose quotas and queueing are BigQuery's own: calls to one do not
/// tell how another answers. The location is compared case-insensitively (`US`, `us`); none
/// (the run names none) is one more.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ProjectLocation {
    project: String,
    location: String,
}

impl ProjectLocation {
    pub(crate) fn new(project: &str, location: Option<&str>) -> Self {
        Self { project: project.to_string(), location: location.unwrap_or_default().to_ascii_lowercase() }
    }

    pub(crate) fn project(&self) -> &str {
        &self.project
    }

    pub(crate) fn location(&self) -> &str {
        &self.location
    }
}

/// One `T` per destination, shared by every call to it.
#[derive(Debug)]
pub(crate) struct PerDestination<T> {
    entries: Mutex<HashMap<ProjectLocation, Arc<T>>>,
}

impl<T> Default for PerDestination<T> {
    fn default() -> Self {
        Self { entries: Mutex::default() }
    }
}

impl<T> PerDestination<T> {
    fn lock(&self) -> parking_lot::MutexGuard<'_, HashMap<ProjectLocation, Arc<T>>> {
        self.entries.lock()
    }

    /// The destination's `T`, made by `make` at its first use. Past [`IDLE_KEPT`]
    /// destinations, those no call holds and `idle` calls idle are forgotten first.
    pub(crate) fn of(&self, key: &ProjectLocation, make: impl FnOnce() -> T, idle: impl Fn(&T) -> bool) -> Arc<T> {
        let mut entries = self.lock();
        if let Some(entry) = entries.get(key) {
            return Arc::clone(entry);
        }
        if entries.len() >= IDLE_KEPT {
            entries.retain(|_, entry| Arc::strong_count(entry) > 1 || !idle(entry));
        }
        Arc::clone(entries.entry(key.clone()).or_insert_with(|| Arc::new(make())))
    }

    /// The destination's `T`, when it has one.
    #[cfg(test)]
    pub(crate) fn get(&self, key: &ProjectLocation) -> Option<Arc<T>> {
        self.lock().get(key).map(Arc::clone)
    }

    /// Every destination's `T`.
    pub(crate) fn all(&self) -> Vec<Arc<T>> {
        self.lock().values().map(Arc::clone).collect()
    }
}
