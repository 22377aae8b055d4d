//! Datasets this process has already found or created, with their location, so that the
//! resources sharing a dataset check it once: a thousand resources starting at once would
//! otherwise send a thousand `datasets.get` calls (BigQuery limits API requests per method and
//! user to about 100 a second). [`crate::pipeline`]'s set-up step asks here before it creates
//! the tables.
//!
//! An answer is trusted for [`DATASET_KNOWN_FOR`]; checks of one dataset that arrive together
//! wait for the first one's answer; a failed check is not remembered (the next one asks again).
//! A dataset created here without a location is remembered without one: a later check that
//! wants a location asks BigQuery where it is, so the run's location is still compared before
//! any row is uploaded.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OnceCell;
use tokio::time::Instant;

/// How long a dataset's existence and location are trusted without asking BigQuery again. A
/// dataset deleted meanwhile shows as a failed `tables.insert`, as it would between the check
/// and the insert anyway.
pub(crate) const DATASET_KNOWN_FOR: Duration = Duration::from_secs(300);

/// A dataset that exists, and its location when known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KnownDataset {
    /// BigQuery's answer, or the location it was created in here; `None` when it was created
    /// here without one (BigQuery chose it).
    pub(crate) location: Option<String>,
}

#[derive(Debug)]
struct Entry {
    checked: OnceCell<(KnownDataset, Instant)>,
}

/// The datasets checked by this process, keyed by `(project, dataset)`.
#[derive(Debug, Default)]
pub(crate) struct KnownDatasets {
    entries: Mutex<HashMap<(String, String), Arc<Entry>>>,
}

impl KnownDatasets {
    /// The dataset as remembered, or as `check` finds it (the first caller for a dataset runs
    /// `check`, the others wait for its answer). A dataset known without a location is
    /// checked again when `wanted_location` is given, also when this caller joined a check
    /// that answered without one.
    pub(crate) async fn get_or_check<E, Check, Fut>(
        &self,
        project: &str,
        dataset: &str,
        wanted_location: Option<&str>,
        check: Check,
    ) -> Result<KnownDataset, E>
    where
        Check: Fn() -> Fut,
        Fut: Future<Output = Result<KnownDataset, E>>,
    {
        let location_wanted = wanted_location.is_some();
        let known = Self::checked(&self.entry(project, dataset, location_wanted), &check).await?;
        if known.location.is_some() || !location_wanted {
            return Ok(known);
        }
        // Joined a check that could not say where the dataset is: ask where it is.
        Self::checked(&self.entry(project, dataset, location_wanted), &check).await
    }

    async fn checked<E, Check, Fut>(entry: &Entry, check: &Check) -> Result<KnownDataset, E>
    where
        Check: Fn() -> Fut,
        Fut: Future<Output = Result<KnownDataset, E>>,
    {
        let (known, _) = entry.checked.get_or_try_init(|| async { Ok((check().await?, Instant::now())) }).await?;
        Ok(known.clone())
    }

    /// The entry to use: the remembered one while it is fresh and good enough, else a new one
    /// in its place.
    fn entry(&self, project: &str, dataset: &str, location_wanted: bool) -> Arc<Entry> {
        let mut entries = self.entries.lock();
        let key = (project.to_string(), dataset.to_string());
        if let Some(entry) = entries.get(&key) {
            let usable = match entry.checked.get() {
                // Still being checked (or the check failed and the next caller retries): join it.
                None => true,
                Some((known, checked_at)) => {
                    checked_at.elapsed() < DATASET_KNOWN_FOR && (known.location.is_some() || !location_wanted)
                }
            };
            if usable {
                return Arc::clone(entry);
            }
        }
        let entry = Arc::new(Entry { checked: OnceCell::new() });
        entries.insert(key, Arc::clone(&entry));
        entry
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn in_location(location: Option<&str>) -> KnownDataset {
        KnownDataset { location: location.map(String::from) }
    }

    /// `get_or_check` whose check counts its calls and answers `answer` after 10 ms.
    async fn checked(
        known: &KnownDatasets,
        dataset: &str,
        wanted: Option<&str>,
        calls: &AtomicUsize,
        answer: Result<KnownDataset, &'static str>,
    ) -> Result<KnownDataset, &'static str> {
        known
            .get_or_check("p", dataset, wanted, || {
                let answer = answer.clone();
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    answer
                }
            })
            .await
    }

    #[tokio::test]
    async fn checks_arriving_together_ask_once() {
        let (known, calls) = (KnownDatasets::default(), AtomicUsize::new(0));
        let answers = futures::future::join_all(
            (0..50).map(|_| checked(&known, "d", Some("EU"), &calls, Ok(in_location(Some("EU"))))),
        )
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(answers.iter().all(|a| a == &Ok(in_location(Some("EU")))), "{answers:?}");
        checked(&known, "other", None, &calls, Ok(in_location(Some("US")))).await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 2, "another dataset is checked on its own");
    }

    #[tokio::test]
    async fn a_failed_check_is_not_remembered() {
        let (known, calls) = (KnownDatasets::default(), AtomicUsize::new(0));
        assert_eq!(checked(&known, "d", None, &calls, Err("unreachable")).await, Err("unreachable"));
        assert_eq!(checked(&known, "d", None, &calls, Ok(in_location(Some("US")))).await, Ok(in_location(Some("US"))));
        checked(&known, "d", None, &calls, Err("not asked")).await.unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_is_trusted_for_five_minutes() {
        let (known, calls) = (KnownDatasets::default(), AtomicUsize::new(0));
        checked(&known, "d", None, &calls, Ok(in_location(Some("US")))).await.unwrap();
        tokio::time::advance(DATASET_KNOWN_FOR - Duration::from_secs(1)).await;
        assert_eq!(checked(&known, "d", None, &calls, Err("not asked")).await, Ok(in_location(Some("US"))));
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(checked(&known, "d", None, &calls, Ok(in_location(Some("EU")))).await, Ok(in_location(Some("EU"))));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_dataset_created_without_a_location_is_asked_again_when_one_is_wanted() {
        let (known, calls) = (KnownDatasets::default(), AtomicUsize::new(0));
        checked(&known, "d", None, &calls, Ok(in_location(None))).await.unwrap();
        assert_eq!(checked(&known, "d", None, &calls, Err("not asked")).await, Ok(in_location(None)));
        assert_eq!(
            checked(&known, "d", Some("EU"), &calls, Ok(in_location(Some("US")))).await,
            Ok(in_location(Some("US")))
        );
        assert_eq!(checked(&known, "d", Some("EU"), &calls, Err("not asked")).await, Ok(in_location(Some("US"))));
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_caller_that_wants_a_location_does_not_settle_for_a_joined_check_without_one() {
        let (known, calls) = (KnownDatasets::default(), AtomicUsize::new(0));
        let (created, located) = futures::future::join(
            checked(&known, "d", None, &calls, Ok(in_location(None))),
            checked(&known, "d", Some("EU"), &calls, Ok(in_location(Some("US")))),
        )
        .await;
        assert_eq!((created, located), (Ok(in_location(None)), Ok(in_location(Some("US")))));
        assert_eq!(calls.load(Ordering::SeqCst), 2, "the second caller joined the first check, then asked");
    }
}
