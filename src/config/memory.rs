//! The "memory and batches" settings: how large a batch body may be, and the budgets that
//! bound what bodies being received, converted and uploaded hold (`pipeline::admission`).

use clap::Args;

/// Batch bodies and the memory budgets they are received and uploaded under.
#[derive(Debug, Clone, Args)]
pub struct MemoryArgs {
    /// Largest accepted batch body, after content decoding, and largest size of its Arrow buffers
    /// once decompressed (IPC buffer compression) (413 `payload_too_large` beyond). An answer
    /// given before a body was read waits until up to this many more bytes are read and discarded.
    #[arg(long, env = "FILAMENT_MAX_BATCH_BODY_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub max_batch_body_bytes: usize,

    /// Queued plus in-flight encoded upload payloads, gateway-wide. When full, batch requests
    /// wait up to `FILAMENT_BACKPRESSURE_WAIT_MS`, then answer 429 `backpressure`.
    #[arg(long, env = "FILAMENT_MAX_BUFFERED_BYTES", default_value_t = 64 * 1024 * 1024)]
    pub max_buffered_bytes: usize,

    /// One resource's part of the upload budget (per execution), so that a table BigQuery
    /// acknowledges slowly cannot take the whole budget from the others. Default: half of it.
    #[arg(long, env = "FILAMENT_MAX_BUFFERED_BYTES_PER_RESOURCE")]
    pub max_buffered_bytes_per_resource: Option<usize>,

    /// Batch bodies converted and encoded at once, gateway-wide (read bodies beyond it wait):
    /// conversion is CPU-bound, more would not go faster. Default: the number of CPUs (at
    /// least 2). What a conversion allocates is held in the upload budget first.
    #[arg(long, env = "FILAMENT_MAX_CONCURRENT_BATCH_DECODES", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub max_concurrent_batch_decodes: Option<u32>,

    /// Bytes of batch bodies being received and decoded at once, gateway-wide, counting what
    /// their IPC-compressed buffers decompress to: bounds the memory of bodies not yet in the
    /// upload budget (a request waits for room, then 429 `backpressure`). A slow client holds
    /// only what it has sent. Default: twice `FILAMENT_MAX_BATCH_BODY_BYTES`.
    #[arg(long, env = "FILAMENT_MAX_RECEIVING_BYTES")]
    pub max_receiving_bytes: Option<usize>,

    /// How long a batch request waits for room in the upload budget before answering 429.
    #[arg(long, env = "FILAMENT_BACKPRESSURE_WAIT_MS", default_value_t = 10_000)]
    pub backpressure_wait_ms: u64,
}
