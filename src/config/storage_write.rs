//! The "Storage Write" settings: AppendRows requests, their windows, connections and timeouts,
//! and how old a PENDING stream may grow (`bigquery::write`, `pipeline::lane`).

use clap::Args;

/// How the gateway writes through BigQuery's Storage Write API.
#[derive(Debug, Clone, Args)]
pub struct StorageWriteArgs {
    /// Largest uncompressed Arrow payload of one AppendRows request, 64 KiB to 19 MiB (BigQuery's
    /// hard limit is 20 MB per request; this leaves room for the request's own framing). The
    /// default is the product's documented 8 MiB; above it, fewer and larger requests, each
    /// holding more of the upload budget while in flight (docs/performance.md).
    #[arg(long, env = "FILAMENT_MAX_APPEND_REQUEST_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub max_append_request_bytes: usize,

    /// gzip level of AppendRows requests (ISA-L): 1 (fastest, the default: ISA-L level 1), 2 to 9
    /// (smaller: ISA-L's smallest, level 3), 0 to send them uncompressed.
    #[arg(long, env = "FILAMENT_APPEND_GZIP_LEVEL", default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=9))]
    pub append_gzip_level: u32,

    /// Outstanding AppendRows requests per stream (a sliding window).
    #[arg(long, env = "FILAMENT_INFLIGHT_PER_STREAM", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub inflight_per_stream: u32,

    /// Outstanding AppendRows requests across the gateway.
    #[arg(long, env = "FILAMENT_MAX_INFLIGHT_REQUESTS", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub max_inflight_requests: u32,

    /// AppendRows connections this replica keeps open at once. BigQuery allows 10,000
    /// concurrent connections per project in a multi-region and 1,000 in a region; a lane
    /// beyond it waits for a connection another lane gives back (lanes give theirs back once
    /// idle). Across a fleet, keep the replicas' sum under the project's limit.
    #[arg(long, env = "FILAMENT_MAX_APPEND_CONNECTIONS", default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub max_append_connections: u32,

    /// Seconds an idle AppendRows connection is kept open while no other lane waits for a
    /// place under `FILAMENT_MAX_APPEND_CONNECTIONS` (one that does makes an idle connection
    /// give its place back at once). BigQuery advises connections that live for minutes.
    #[arg(long, env = "FILAMENT_APPEND_CONNECTION_IDLE_SECS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub append_connection_idle_secs: u64,

    /// How long the oldest AppendRows request in flight waits for its answer, in seconds,
    /// before its connection counts as broken: it is replaced and the requests after the last
    /// acknowledgement are sent again at their offsets (a connection that stays open but never
    /// answers would otherwise hold the lane, and its execution's commit, for ever). The wait
    /// counts from when the request is handed to the connection, so it includes sending the
    /// requests queued before it: keep it well above `FILAMENT_MAX_INFLIGHT_REQUESTS` x the
    /// request size / the uplink's bandwidth (8 x 8 MiB at 10 MB/s: 7 s).
    #[arg(long, env = "FILAMENT_APPEND_RESPONSE_TIMEOUT_SECS", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    pub append_response_timeout_secs: u64,

    /// How long an AppendRows request may wait, in seconds, for its connection to start sending
    /// it (HTTP/2 flow control holds requests while the peer reads nothing) before the
    /// connection counts as broken: it is replaced and its requests replayed at the same
    /// offsets. Keep it above `FILAMENT_INFLIGHT_PER_STREAM` x the request size / the uplink's
    /// bandwidth per stream.
    #[arg(long, env = "FILAMENT_APPEND_SEND_TIMEOUT_SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub append_send_timeout_secs: u64,

    /// Refuse to commit an execution whose oldest PENDING stream is older than this (BigQuery
    /// garbage-collects uncommitted streams after about 24 hours).
    #[arg(long, env = "FILAMENT_PENDING_STREAM_MAX_AGE_SECS", default_value_t = 23 * 3600)]
    pub pending_stream_max_age_secs: u64,
}
