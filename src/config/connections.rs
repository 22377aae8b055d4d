//! The settings of what a client connection may hold beyond its read buffer, and how many one
//! peer may open (`http::server`): the sending rate, the unsent answers, the per-peer cap.

use clap::Args;

/// What a connection's answers may hold unsent, how fast they must leave, and how many
/// connections one peer may have.
#[derive(Debug, Clone, Args)]
pub struct ConnectionArgs {
    /// The slowest a connection's answers may leave, in bytes per second over each
    /// `FILAMENT_WRITE_TIMEOUT_SECS` window (HTTP/2: the DATA payload written, so pings and
    /// window updates answered are not progress).
    #[arg(long, env = "FILAMENT_MIN_SEND_RATE_BYTES_PER_SEC", default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1_073_741_824))]
    pub min_send_rate_bytes_per_sec: u64,

    /// Bytes of answers a connection may hold unsent (produced and not yet taken by the socket)
    /// before it may start no other: the next answer closes it. One answer always goes, so a
    /// connection holds at most this plus one answer.
    #[arg(long, env = "FILAMENT_MAX_UNSENT_RESPONSE_BYTES", default_value_t = 256 * 1024, value_parser = clap::value_parser!(u64).range(16_384..=1_073_741_824))]
    pub max_unsent_response_bytes: u64,

    /// Connections one peer (an IPv4 address, an IPv6 /64) may have open at once; more are
    /// closed as they are accepted and counted in `/metrics`
    /// (`filament_http_connections_refused_total{reason="per_peer_limit"}`). For gateways
    /// exposed directly; unset, no cap (behind a load balancer every client has its address).
    #[arg(long, env = "FILAMENT_MAX_CONNECTIONS_PER_PEER", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections_per_peer: Option<u32>,
}
