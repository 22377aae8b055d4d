//! The simulated control plane's limits: BigQuery's latencies and published quotas
//! ([`Limits`], defaults and their sources in `docs/performance.md`), the `CreateWriteStream`
//! quota's enforcement ([`StreamQuota`]), and the floor no client can beat under them
//! ([`Floor`]).

use std::time::Duration;

use super::super::fake_write::FakeWrite;
use super::super::quota_meter::RateMeter;

/// How the `CreateWriteStream` quota (streams per hour per project and region) is enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamQuota {
    /// The hour's streams at once, refilled over the hour.
    Hourly,
    /// A sixtieth of them at once (167), refilled over the minute.
    PerMinute,
}

impl StreamQuota {
    /// The name the benchmark reports and the gateway's setting takes.
    pub fn name(self) -> &'static str {
        match self {
            StreamQuota::Hourly => "hourly",
            StreamQuota::PerMinute => "per_minute",
        }
    }
}

/// BigQuery's control-plane latencies and quotas.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub metadata_read: Duration,
    pub metadata_write: Duration,
    pub table_updates_per_10s: usize,
    pub table_delete: Duration,
    /// `tables.insert` requests per second per user.
    pub tables_insert_per_second: f64,
    /// Requests per second per user of each REST method.
    pub api_requests_per_second_per_method: f64,
    /// REST requests in flight per user.
    pub concurrent_api_requests: usize,
    pub create_stream: Duration,
    /// `CreateWriteStream` calls per hour per project and region, and how they are enforced.
    pub create_write_streams_per_hour: f64,
    pub stream_quota: StreamQuota,
    /// Beyond this many `CreateWriteStream` calls a second, each takes `create_stream_burst`.
    pub create_streams_before_slowdown_per_second: usize,
    pub create_stream_burst: Duration,
    /// The project's concurrent AppendRows connections (10,000 in a multi-region).
    pub concurrent_connections: usize,
    pub finalize: Duration,
    pub batch_commit: Duration,
    pub query: Duration,
    pub query_per_mib: Duration,
    pub concurrent_queries: usize,
    pub concurrent_dml_per_table: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            metadata_read: Duration::from_millis(150),
            metadata_write: Duration::from_millis(400),
            table_updates_per_10s: 5,
            table_delete: Duration::from_millis(200),
            tables_insert_per_second: 10.0,
            api_requests_per_second_per_method: 100.0,
            concurrent_api_requests: 300,
            create_stream: Duration::from_millis(250),
            create_write_streams_per_hour: 10_000.0,
            stream_quota: StreamQuota::PerMinute,
            create_streams_before_slowdown_per_second: 40,
            create_stream_burst: Duration::from_secs(25),
            concurrent_connections: 10_000,
            finalize: Duration::from_millis(100),
            batch_commit: Duration::from_millis(200),
            query: Duration::from_millis(1500),
            query_per_mib: Duration::from_millis(20),
            concurrent_queries: 100,
            concurrent_dml_per_table: 2,
        }
    }
}

/// The floor of a run and what sets it.
#[derive(Debug, Clone, Copy)]
pub struct Floor {
    /// `tables.insert` of every destination and staging table at its quota.
    pub tables_insert_seconds: f64,
    /// Creating one stream per resource within the stream quota.
    pub stream_creation_seconds: f64,
    /// One query job per resource at the allowed concurrency.
    pub publication_seconds: f64,
    /// The bytes at the measured throughput.
    pub data_seconds: f64,
}

impl Floor {
    /// Set-up (tables, streams) and data overlap; publication follows the commit, which
    /// follows the last set-up.
    pub fn seconds(&self) -> f64 {
        self.tables_insert_seconds.max(self.stream_creation_seconds).max(self.data_seconds) + self.publication_seconds
    }
}

impl Limits {
    /// Short latencies and room in every quota, where set-ups and jobs overlap (the tests'
    /// control plane: what they count is calls and order, not time).
    pub fn quick() -> Limits {
        Limits {
            metadata_read: Duration::from_millis(20),
            metadata_write: Duration::from_millis(40),
            table_updates_per_10s: 100,
            table_delete: Duration::from_millis(20),
            create_stream: Duration::from_millis(400),
            create_write_streams_per_hour: 3_600_000.0,
            finalize: Duration::from_millis(20),
            batch_commit: Duration::from_millis(20),
            query: Duration::from_millis(600),
            query_per_mib: Duration::ZERO,
            ..Limits::default()
        }
    }

    /// The Storage Write fake with these limits: stream creation's latency and quota, the
    /// concurrent connections, finalize and commit latencies.
    pub fn apply_to(&self, fake: &FakeWrite) {
        fake.with(|s| {
            s.create_delay = self.create_stream;
            let (burst, per_second) = self.stream_bucket();
            s.create_quota = Some(RateMeter::new("CreateWriteStream", burst, per_second));
            s.create_burst_latency = Some((self.create_streams_before_slowdown_per_second, self.create_stream_burst));
            s.connection_limit = Some(self.concurrent_connections);
            s.finalize_delay = self.finalize;
            s.commit_delay = self.batch_commit;
        });
    }

    /// These limits on a clock `time_scale` times faster (the many-tables benchmark's largest
    /// point, whose floor under the real quotas would outlast its hour): every rate quota
    /// `time_scale` times higher, every latency `time_scale` times shorter, every count (calls
    /// in flight, queries, connections, updates per table) unchanged. A run measured against
    /// them, in wall seconds times `time_scale`, is what the real limits give, except that what
    /// is not simulated (the gateway's CPU, Postgres, the network) and the per-table update
    /// window (kept at 10 wall seconds) weigh `time_scale` times more: an upper bound. What it
    /// gives the other way: a bucket holds one window's worth at the higher rate, so its first
    /// burst is `time_scale` times larger (at 8 and 10,000 tables, 70 `tables.insert` more at
    /// once: 7 s of a floor of 2,151 s).
    pub fn on_faster_clock(&self, time_scale: f64) -> Limits {
        let shorter = |latency: Duration| latency.div_f64(time_scale);
        Limits {
            metadata_read: shorter(self.metadata_read),
            metadata_write: shorter(self.metadata_write),
            table_delete: shorter(self.table_delete),
            tables_insert_per_second: self.tables_insert_per_second * time_scale,
            api_requests_per_second_per_method: self.api_requests_per_second_per_method * time_scale,
            create_stream: shorter(self.create_stream),
            create_write_streams_per_hour: self.create_write_streams_per_hour * time_scale,
            create_streams_before_slowdown_per_second: (self.create_streams_before_slowdown_per_second as f64
                * time_scale)
                .round() as usize,
            create_stream_burst: shorter(self.create_stream_burst),
            finalize: shorter(self.finalize),
            batch_commit: shorter(self.batch_commit),
            query: shorter(self.query),
            query_per_mib: shorter(self.query_per_mib),
            ..*self
        }
    }

    /// The stream quota as a bucket: (calls at once, refill per second).
    fn stream_bucket(&self) -> (f64, f64) {
        let per_second = self.create_write_streams_per_hour / 3600.0;
        match self.stream_quota {
            StreamQuota::Hourly => (self.create_write_streams_per_hour, per_second),
            StreamQuota::PerMinute => (self.create_write_streams_per_hour / 60.0, per_second),
        }
    }

    /// The gateway's settings that pace it within these quotas (an operator sets the same).
    pub fn gateway_settings(&self) -> Vec<(String, String)> {
        [
            ("FILAMENT_QUOTA_TABLES_INSERT_PER_SECOND", self.tables_insert_per_second.to_string()),
            ("FILAMENT_QUOTA_API_REQUESTS_PER_SECOND_PER_METHOD", self.api_requests_per_second_per_method.to_string()),
            ("FILAMENT_QUOTA_CONCURRENT_API_REQUESTS", self.concurrent_api_requests.to_string()),
            ("FILAMENT_QUOTA_CREATE_WRITE_STREAMS_PER_HOUR", self.create_write_streams_per_hour.to_string()),
            ("FILAMENT_QUOTA_CREATE_WRITE_STREAM_READING", self.stream_quota.name().to_string()),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_string(), value))
        .collect()
    }

    /// One query job over `bytes` staged.
    pub fn query_duration(&self, bytes: u64) -> Duration {
        self.query + self.query_per_mib.mul_f64(bytes as f64 / (1024.0 * 1024.0))
    }

    /// The floor of a run of `resources` new tables of `bytes_per_resource` each (a
    /// `tables.insert` for the destination and one for the staging table, then a query job;
    /// with `direct_append`, the destination's only and no job), its data moving at
    /// `throughput_bytes_per_second`.
    pub fn floor(
        &self,
        resources: usize,
        bytes_per_resource: u64,
        throughput_bytes_per_second: f64,
        direct_append: bool,
    ) -> Floor {
        let n = resources as f64;
        let waves = if direct_append { 0.0 } else { (n / self.concurrent_queries as f64).ceil() };
        let inserts = if direct_append { n } else { 2.0 * n };
        let (stream_burst, streams_per_second) = self.stream_bucket();
        Floor {
            tables_insert_seconds: (inserts - self.tables_insert_per_second).max(0.0) / self.tables_insert_per_second,
            stream_creation_seconds: (n - stream_burst).max(0.0) / streams_per_second,
            publication_seconds: waves * self.query_duration(bytes_per_resource).as_secs_f64(),
            data_seconds: n * bytes_per_resource as f64 / throughput_bytes_per_second,
        }
    }
}
