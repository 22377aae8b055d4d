//! The "HTTP and hardening" settings: where the gateway listens, TLS, and what a client
//! connection and its requests may hold and take (`http::server`, `http::body_deadline`).

use std::net::SocketAddr;

use clap::Args;

use super::ConnectionArgs;

/// Listening, TLS, and the limits of client connections, request heads and bodies.
#[derive(Debug, Clone, Args)]
pub struct HttpArgs {
    /// Address the HTTP API listens on (`127.0.0.1:0` picks a free port; the bound address is
    /// printed on standard output).
    #[arg(long, env = "FILAMENT_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,

    /// Serve HTTPS with this PEM certificate chain (with `FILAMENT_TLS_KEY_FILE`); a replaced
    /// file is picked up for new connections.
    #[arg(long, env = "FILAMENT_TLS_CERT_FILE")]
    pub tls_cert_file: Option<std::path::PathBuf>,

    /// The PEM private key of `FILAMENT_TLS_CERT_FILE`.
    #[arg(long, env = "FILAMENT_TLS_KEY_FILE")]
    pub tls_key_file: Option<std::path::PathBuf>,

    /// The gateway sits behind a TLS-terminating load balancer (clients reach it over HTTPS):
    /// console cookies are `Secure` and `__Host-` prefixed and answers carry HSTS, as when it
    /// serves HTTPS itself.
    #[arg(long, env = "FILAMENT_BEHIND_TLS", default_value_t = false)]
    pub behind_tls: bool,

    /// Requests served at once; beyond it requests are shed with 503 `overloaded` (and
    /// `Retry-After`) instead of queueing without bound.
    #[arg(long, env = "FILAMENT_MAX_CONCURRENT_REQUESTS", default_value_t = 2048, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_concurrent_requests: u32,

    /// Client connections served at once, each one file descriptor; beyond it the gateway stops
    /// accepting and new connections wait in the kernel's listen backlog. Above the requests
    /// served at once (an HTTP/1.1 connection carries one at a time) and below the open-files
    /// limit: the gateway lowers it to that limit less 256 descriptors (Postgres, BigQuery,
    /// files) when `ulimit -n` is smaller.
    #[arg(long, env = "FILAMENT_MAX_CONNECTIONS", default_value_t = 2048, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: u32,

    /// How long a connection may take to send a complete request head once its first byte
    /// arrived, in seconds; slower, it is closed (a slowloris client holds a connection no
    /// longer than this).
    #[arg(long, env = "FILAMENT_HEADER_READ_TIMEOUT_SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub header_read_timeout_secs: u64,

    /// How long a connection with no request open and none started stays open, in seconds
    /// (HTTP/1.1 keep-alive and HTTP/2 alike).
    #[arg(long, env = "FILAMENT_IDLE_TIMEOUT_SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub idle_timeout_secs: u64,

    /// The window, in seconds, over which a connection with answers to send must send them at
    /// `FILAMENT_MIN_SEND_RATE_BYTES_PER_SEC` (or all it held unsent when the window opened, if
    /// less); slower, or with a response body HTTP/2 does not ask for during a window (a peer
    /// whose flow-control window stays at zero), it is closed. A client that stops reading, or
    /// reads a byte now and then, holds a connection for about this long.
    #[arg(long, env = "FILAMENT_WRITE_TIMEOUT_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub write_timeout_secs: u64,

    /// What a client connection's answers may hold and how fast they leave; peers' caps.
    #[command(flatten)]
    pub connections: ConnectionArgs,

    /// Request bodies (batches and JSON alike) get this many seconds at first, plus one per
    /// `FILAMENT_BODY_MIN_RATE_BYTES_PER_SEC` bytes received; only the time spent waiting for
    /// the client counts. A slower body ends with 408 `body_timeout`.
    #[arg(long, env = "FILAMENT_BODY_READ_TIMEOUT_SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub body_read_timeout_secs: u64,

    /// The minimum rate of a request body, in bytes per second (see
    /// `FILAMENT_BODY_READ_TIMEOUT_SECS`).
    #[arg(long, env = "FILAMENT_BODY_MIN_RATE_BYTES_PER_SEC", default_value_t = 16 * 1024, value_parser = clap::value_parser!(u64).range(1..))]
    pub body_min_rate_bytes_per_sec: u64,

    /// The longest a request body may take in all, in seconds, from its first byte (408
    /// `body_timeout` beyond).
    #[arg(long, env = "FILAMENT_BODY_MAX_READ_SECS", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub body_max_read_secs: u64,

    /// Longest accepted request URI, in bytes (414 `uri_too_long` beyond).
    #[arg(long, env = "FILAMENT_MAX_URI_BYTES", default_value_t = 4096)]
    pub max_uri_bytes: usize,

    /// Largest accepted total of request header names and values, in bytes (431
    /// `headers_too_large` beyond).
    #[arg(long, env = "FILAMENT_MAX_HEADER_BYTES", default_value_t = 16 * 1024)]
    pub max_header_bytes: usize,

    /// Most header fields a request may carry (431 `headers_too_large` beyond).
    #[arg(long, env = "FILAMENT_MAX_HEADER_COUNT", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub max_header_count: u32,

    /// On shutdown, how long open connections may take to finish their requests once no new
    /// one is accepted, in seconds; the rest are closed.
    #[arg(long, env = "FILAMENT_SHUTDOWN_CONNECTION_WAIT_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub shutdown_connection_wait_secs: u64,
}
