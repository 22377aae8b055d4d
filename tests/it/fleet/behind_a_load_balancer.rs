//! The gateway as a fleet: three real replicas on one database behind a real haproxy doing
//! plain round-robin (no affinity), with extractors running concurrently through it. Requests
//! that land on a replica other than their execution's owner are forwarded to it; a replica
//! restarted with SIGTERM hands its executions over; a killed one fails only the executions it
//! served, once its lease expires. Every row lands exactly once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::support::arrow::{ids, ipc_stream};
use crate::support::fake_write::FakeWrite;
use crate::support::fleet::{Extractor, Fleet};
use crate::support::lease::outlive_current_leases;
use crate::support::rows::count_rows_and_ids_at;
use crate::support::{eventually, required_env};

const LEASE: &str = "2";
const ROWS_PER_BATCH: i64 = 500;
/// An extractor's pace: it posts a batch (and a checkpoint) this often, so that its execution
/// stays open across whatever the test does meanwhile.
const BATCH_INTERVAL: Duration = Duration::from_millis(100);

/// Odd-numbered executions load a keyed table, even-numbered ones append.
fn keyed(number: usize) -> bool {
    !number.is_multiple_of(2)
}

/// Append and keyed modes, alternating by execution number.
fn declaration(number: usize) -> Value {
    if !keyed(number) {
        json!({"write_mode": "full_append"})
    } else {
        json!({"write_mode": "incremental_upsert", "primary_key": ["id"]})
    }
}

/// Rows of batch `seq`: keyed executions send every even batch's ids again in the next one (an
/// update), so their tables hold fewer rows than were sent.
fn batch_ids(number: usize, seq: i64) -> std::ops::Range<i64> {
    let block = if keyed(number) && seq % 2 == 1 { seq - 1 } else { seq };
    block * ROWS_PER_BATCH..(block + 1) * ROWS_PER_BATCH
}

/// Distinct rows the table must hold after `batches` batches.
fn expected_rows(number: usize, batches: i64) -> i64 {
    let blocks = if keyed(number) { (batches + 1) / 2 } else { batches };
    blocks * ROWS_PER_BATCH
}

/// One extraction: run `r{number}` with table `t{number}`, execution `e{number}`.
struct Extraction {
    number: usize,
    run: String,
    execution: String,
    table: String,
}

impl Extraction {
    fn new(number: usize) -> Self {
        Self { number, run: format!("r{number}"), execution: format!("e{number}"), table: format!("t{number}") }
    }

    async fn open(&self, extractor: &Extractor) {
        extractor.create_run(&self.run, &[(&self.table, declaration(self.number))]).await;
        let (status, opened) = extractor.open(&self.run, &self.execution).await;
        assert_eq!(status, StatusCode::CREATED, "{opened}");
    }

    async fn post(&self, extractor: &Extractor, seq: i64) -> (StatusCode, Value) {
        let body = ipc_stream(&[ids(batch_ids(self.number, seq))]);
        extractor.post(&self.run, &self.execution, &self.table, seq, body).await
    }

    async fn post_accepted(&self, extractor: &Extractor, seq: i64) {
        let (status, receipt) = self.post(extractor, seq).await;
        assert!(matches!(status.as_u16(), 200 | 202), "e{} seq {seq}: {status} {receipt}", self.number);
        assert_eq!(receipt["rows"], ROWS_PER_BATCH, "{receipt}");
    }

    /// Posts batches (a checkpoint after each, every [`BATCH_INTERVAL`]) until `keep_going`
    /// turns false and at least `minimum` were sent, counting them in `posted`; how many were sent.
    async fn extract(&self, extractor: &Extractor, minimum: i64, keep_going: &AtomicBool, posted: &AtomicI64) -> i64 {
        let mut seq = 0;
        while seq < minimum || keep_going.load(Ordering::SeqCst) {
            self.post_accepted(extractor, seq).await;
            let path = format!("/v1/runs/{}/executions/{}/checkpoints", self.run, self.execution);
            let (status, body) = extractor.json(Method::POST, &path, Some(json!({"checkpoint": {"seq": seq}}))).await;
            assert!(status.is_success(), "checkpoint of e{}: {status} {body}", self.number);
            seq += 1;
            posted.store(seq, Ordering::SeqCst);
            tokio::time::sleep(BATCH_INTERVAL).await;
        }
        seq
    }

    /// Commits; then every row sent is in the table (or, against the fake, in the committed
    /// staging streams) exactly once, and the run's durable checkpoint is the last one posted.
    async fn commit_and_check(&self, extractor: &Extractor, batches: i64, sink: &Sink) {
        let committed = extractor.commit(&self.run, &self.execution).await;
        assert_eq!(committed["state"], "committed", "e{}: {committed}", self.number);
        match sink {
            Sink::Emulator => {
                let host = required_env("BIGQUERY_EMULATOR_HOST");
                let counted = count_rows_and_ids_at(&host, "filament-demo", &extractor.dataset, &self.table).await;
                let expected = expected_rows(self.number, batches);
                assert_eq!(counted, (expected, expected), "e{}: every row once", self.number);
            }
            Sink::Fake(fake) => {
                let mut staged = committed_ids(fake, &self.table);
                staged.sort_unstable();
                let mut sent: Vec<i64> = (0..batches).flat_map(|seq| batch_ids(self.number, seq)).collect();
                sent.sort_unstable();
                assert_eq!(staged, sent, "e{}: every row sent staged exactly once", self.number);
            }
        }
        let (_, run) = extractor.json(Method::GET, &format!("/v1/runs/{}", self.run), None).await;
        assert_eq!(run["durable_checkpoint"], json!({"seq": batches - 1}), "{run}");
    }
}

/// Where the rows are checked: the destination table in bqemulator, or the committed streams of
/// the Storage Write fake. bqemulator serves AppendRows on a thread pool of about six threads
/// (Python's default executor on two cores), one per open stream, and a stream cut by a
/// killed process keeps its thread for good: tests that hold more streams open at once, or
/// kill replicas, use the fake.
#[derive(Clone)]
enum Sink {
    Emulator,
    Fake(FakeWrite),
}

impl Sink {
    fn env(&self) -> Vec<(&str, &str)> {
        let mut env = vec![("FILAMENT_REPLICA_LEASE_SECS", LEASE)];
        if let Sink::Fake(fake) = self {
            env.push(("BIGQUERY_STORAGE_EMULATOR_HOST", fake.address.as_str()));
        }
        env
    }
}

/// Extractions running concurrently through the load balancer, each posting until told to
/// stop, then committing and checking its rows.
struct Extracting {
    tasks: tokio::task::JoinSet<()>,
    keep_going: Arc<AtomicBool>,
    /// Extractions that ended (however), counted as their task ends.
    ended: Arc<std::sync::atomic::AtomicUsize>,
    /// Batches each extraction has posted so far.
    posted: Vec<Arc<AtomicI64>>,
    count: usize,
}

/// Counts its extraction as ended when dropped (returned or panicked).
struct EndGuard(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for EndGuard {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl Extracting {
    fn start(extractor: &Extractor, sink: &Sink, count: usize, minimum_batches: i64) -> Self {
        let keep_going = Arc::new(AtomicBool::new(true));
        let ended = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let posted: Vec<Arc<AtomicI64>> = (0..count).map(|_| Arc::default()).collect();
        let mut tasks = tokio::task::JoinSet::new();
        for number in 0..count {
            let (extractor, keep_going, sink) = (extractor.clone(), Arc::clone(&keep_going), sink.clone());
            let guard = EndGuard(Arc::clone(&ended));
            let posted = Arc::clone(&posted[number]);
            tasks.spawn(async move {
                let _guard = guard;
                let extraction = Extraction::new(number);
                extraction.open(&extractor).await;
                let batches = extraction.extract(&extractor, minimum_batches, &keep_going, &posted).await;
                extraction.commit_and_check(&extractor, batches, &sink).await;
            });
        }
        Self { tasks, keep_going, ended, posted, count }
    }

    /// Waits until every extraction has posted a batch: each has an open execution with rows.
    async fn wait_until_each_posted(&self) {
        eventually(Duration::from_secs(60), "every extraction to post a batch", || async {
            self.posted.iter().all(|posted| posted.load(Ordering::SeqCst) > 0).then_some(())
        })
        .await;
    }

    /// Every extraction is still extracting (none ended early, by failure or otherwise).
    fn all_running(&self) -> bool {
        self.ended.load(Ordering::SeqCst) == 0 && self.count > 0
    }

    /// Lets every extraction commit; panics with the first failed one.
    async fn finish(mut self) {
        self.keep_going.store(false, Ordering::SeqCst);
        while let Some(finished) = self.tasks.join_next().await {
            finished.expect("an extraction failed");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn extractors_through_a_round_robin_balancer_load_every_row_once() {
    // Four extractions: at most four AppendRows streams open in bqemulator at once.
    let fleet = Fleet::start(3, &Sink::Emulator.env()).await;
    let extracting = Extracting::start(&fleet.extractor(), &Sink::Emulator, 4, 6);
    extracting.wait_until_each_posted().await;
    // A fourth replica starting while executions are open on the others fails none of them,
    // though it sweeps after every lease they held when it started has run out: they were renewed.
    let fourth = fleet.spawn_extra().await;
    outlive_current_leases(&fleet.database_url, Duration::from_secs(LEASE.parse().unwrap())).await;
    assert!(extracting.all_running(), "no extraction ended while the fourth replica started");
    extracting.finish().await;
    let mut forwarded = 0;
    for replica in &fleet.replicas {
        forwarded += forwarded_requests(&replica.metrics().await);
    }
    assert!(forwarded > 0, "round-robin sent requests to replicas that forwarded them to the owner");
    assert!(!fourth.logs().contains("failed executions whose replica stopped"), "{}", fourth.logs());
}

/// Eight executions hold eight streams open: against the Storage Write fake (see [`Sink`]).
#[tokio::test(flavor = "multi_thread")]
async fn a_rolling_restart_fails_no_execution() {
    let sink = Sink::Fake(FakeWrite::start().await);
    let mut fleet = Fleet::start(3, &sink.env()).await;
    let extracting = Extracting::start(&fleet.extractor(), &sink, 8, 4);
    extracting.wait_until_each_posted().await;
    let mut handed_over = 0;
    for index in 0..fleet.replicas.len() {
        assert!(extracting.all_running(), "extractions run during the restarts");
        let stopped_logs = fleet.restart(index).await;
        handed_over += stopped_logs.matches("replica.handed_over").count();
    }
    extracting.finish().await;
    assert!(handed_over > 0, "the stopped replicas handed executions over");
}

/// Against the Storage Write fake (see [`Sink`]): killing a replica cuts its open AppendRows
/// streams.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_replica_fails_only_its_executions_after_the_lease() {
    let fake = FakeWrite::start().await;
    let sink = Sink::Fake(fake.clone());
    let mut fleet = Fleet::start(3, &sink.env()).await;
    let extractor = fleet.extractor();
    let extractions: Vec<Extraction> = (0..6).map(Extraction::new).collect();
    for (number, extraction) in extractions.iter().enumerate() {
        // Opened on each replica in turn (a balancer decides where in production), then
        // extracted through the balancer.
        extraction.open(&fleet.direct_extractor(number % 3)).await;
        extraction.post_accepted(&extractor, 0).await;
    }
    let mut owners = Vec::new();
    for extraction in &extractions {
        owners.push(fleet.owner_of(&extraction.run, &extraction.execution).await.expect("an owner"));
    }
    assert_eq!(owners, vec![0, 1, 2, 0, 1, 2], "the replica that opened an execution serves it");
    let victim = 0;
    fleet.replicas[victim].kill();
    let killed_at = Instant::now();
    // Every execution of the killed replica fails once its lease runs out (documented: at most
    // the lease, 2 s here, plus a third of it after the last renewal); all are watched before
    // any is redelivered, so the time measured is each one's detection, not the loop's.
    for (extraction, _) in extractions.iter().zip(&owners).filter(|(_, owner)| **owner == victim) {
        let failed = wait_for_failure(&extractor, extraction).await;
        let detected_after = killed_at.elapsed();
        assert!(detected_after < Duration::from_secs(8), "detected after {detected_after:?}");
        assert_eq!(failed["error"]["code"], "gateway_restarted", "{failed}");
        assert!(failed["error"]["hint"].as_str().unwrap_or("").contains("deliver"), "{failed}");
    }
    for (extraction, owner) in extractions.iter().zip(&owners) {
        if *owner == victim {
            let (status, redelivered) = extractor.open(&extraction.run, &extraction.execution).await;
            assert_eq!(status, StatusCode::OK, "{redelivered}");
            extraction.post_accepted(&extractor, 0).await;
        }
        extraction.post_accepted(&extractor, 1).await;
        let path = format!("/v1/runs/{}/executions/{}/checkpoints", extraction.run, extraction.execution);
        extractor.json(Method::POST, &path, Some(json!({"checkpoint": {"seq": 1}}))).await;
        extraction.commit_and_check(&extractor, 2, &sink).await;
        let (_, seen) = extractor
            .json(Method::GET, &format!("/v1/runs/{}/executions/{}", extraction.run, extraction.execution), None)
            .await;
        assert_eq!(
            seen["delivery"],
            if *owner == victim { 2 } else { 1 },
            "only the killed replica's executions were redelivered: {seen}"
        );
    }
}

async fn wait_for_failure(extractor: &Extractor, extraction: &Extraction) -> Value {
    let path = format!("/v1/runs/{}/executions/{}", extraction.run, extraction.execution);
    eventually(Duration::from_secs(20), "the killed replica's execution to fail", || async {
        let (_, seen) = extractor.json(Method::GET, &path, None).await;
        (seen["state"] == "failed").then_some(seen)
    })
    .await
}

/// The rows of every committed stream into `table`'s staging tables.
fn committed_ids(fake: &FakeWrite, table: &str) -> Vec<i64> {
    let marker = format!("_filament_stg_{table}_");
    fake.with(|state| {
        state
            .streams
            .values()
            .filter(|stream| stream.committed && stream.table.contains(&marker))
            .flat_map(|stream| stream.ids.clone())
            .collect()
    })
}

fn forwarded_requests(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("filament_requests_forwarded_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}
