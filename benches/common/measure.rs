//! What the benchmarks measure beside time: a process's CPU seconds and peak RSS from
//! `/proc`, and the CPU floor of the data path (gzip alone, as the gateway compresses
//! AppendRows requests, and SHA-256 alone, the receipt's digest) on the same bodies, in this
//! thread. Included by `ingest` and `many_tables` (`#[path]`).

#![allow(dead_code, unreachable_pub)]

use std::io::Write as _;

pub const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

/// The gateway's `FILAMENT_APPEND_GZIP_LEVEL` in this benchmark: the bench's own environment's
/// (default 1). [`gateway_settings`] passes it on to every gateway the bench spawns, so the CPU
/// floor is gzip alone at the level the gateway compresses at.
pub fn gateway_gzip_level() -> u32 {
    std::env::var("FILAMENT_APPEND_GZIP_LEVEL")
        .map_or(1, |level| level.parse().expect("FILAMENT_APPEND_GZIP_LEVEL is a number"))
}

/// Settings every benchmarked gateway gets from the bench's environment (the harness starts
/// gateways with a cleared environment): the gzip level, and `FILAMENT_BENCH_GATEWAY_ENV`'s
/// space-separated `NAME=value` pairs (for experiments: `_RJEM_MALLOC_CONF=...`, a budget).
pub fn gateway_settings() -> Vec<(String, String)> {
    let mut settings = vec![("FILAMENT_APPEND_GZIP_LEVEL".to_string(), gateway_gzip_level().to_string())];
    let extra = std::env::var("FILAMENT_BENCH_GATEWAY_ENV").unwrap_or_default();
    for pair in extra.split_whitespace() {
        let (name, value) = pair.split_once('=').expect("FILAMENT_BENCH_GATEWAY_ENV holds NAME=value pairs");
        settings.push((name.to_string(), value.to_string()));
    }
    settings
}

/// The previous main's gateway, built by `scripts/bench.sh` in a worktree of its commit and
/// measured beside this build in the same run: `FILAMENT_BENCH_PREVIOUS_GATEWAY` (the binary)
/// and `FILAMENT_BENCH_PREVIOUS_COMMIT`. `None` when the bench runs without it.
pub struct PreviousMain {
    pub binary: std::path::PathBuf,
    pub commit: String,
}

pub fn previous_main() -> Option<PreviousMain> {
    let binary = std::env::var_os("FILAMENT_BENCH_PREVIOUS_GATEWAY")?.into();
    let commit = std::env::var("FILAMENT_BENCH_PREVIOUS_COMMIT").unwrap_or_else(|_| "unknown commit".into());
    Some(PreviousMain { binary, commit })
}

/// CPU seconds (user + system) of a process or thread from its `stat` file.
pub fn cpu_seconds(stat_path: &str) -> f64 {
    let stat = std::fs::read_to_string(stat_path).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    // After the command: state is field 3, utime 14 and stime 15 (1-based, per proc(5)).
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

/// CPU seconds of process `pid`.
pub fn process_cpu_seconds(pid: u32) -> f64 {
    cpu_seconds(&format!("/proc/{pid}/stat"))
}

/// The peak resident set of process `pid` (`VmHWM`), MiB.
pub fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<f64>().unwrap() / 1024.0
}

/// The resident set of process `pid` now (`VmRSS`), MiB.
pub fn resident_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let line = status.lines().find(|l| l.starts_with("VmRSS:"));
    line.and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok()).unwrap_or(0.0) / 1024.0
}

/// What the gateway's memory held at the sample where its resident set was largest: the two
/// budgets' capacities and use, and the allocator's live and resident bytes (MiB, from its
/// `/metrics`). What is resident beyond the allocator's pages is the binary and the stacks.
#[derive(Debug, Default, Clone, Copy)]
pub struct MemoryAtPeak {
    pub resident_mib: f64,
    pub budgets_mib: f64,
    pub receive_budget_in_use_mib: f64,
    pub upload_budget_in_use_mib: f64,
    pub allocated_mib: f64,
    pub allocator_resident_mib: f64,
    /// The message buffer pool: capacity lent (holding messages) and idle.
    pub message_buffers_lent_mib: f64,
    pub message_buffers_idle_mib: f64,
}

impl MemoryAtPeak {
    /// One sample from `/metrics` text and the resident set.
    pub fn sample(resident_mib: f64, metrics: &str) -> Self {
        let gauge = |name: &str| {
            let value =
                metrics.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok());
            value.unwrap_or(0.0) / (1024.0 * 1024.0)
        };
        Self {
            resident_mib,
            budgets_mib: gauge("filament_upload_budget_bytes") + gauge("filament_receive_budget_bytes"),
            receive_budget_in_use_mib: gauge("filament_receive_budget_bytes_in_use"),
            upload_budget_in_use_mib: gauge("filament_upload_budget_bytes_in_use"),
            allocated_mib: gauge("filament_allocator_allocated_bytes"),
            allocator_resident_mib: gauge("filament_allocator_resident_bytes"),
            message_buffers_lent_mib: gauge("filament_message_buffers_bytes{state=\"lent\"}"),
            message_buffers_idle_mib: gauge("filament_message_buffers_bytes{state=\"idle\"}"),
        }
    }

    /// The sample for `result.json` (MiB).
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "resident_mib": self.resident_mib,
            "budgets_mib": self.budgets_mib,
            "receive_budget_in_use_mib": self.receive_budget_in_use_mib,
            "upload_budget_in_use_mib": self.upload_budget_in_use_mib,
            "allocator_allocated_mib": self.allocated_mib,
            "allocator_resident_mib": self.allocator_resident_mib,
            "message_buffers_lent_mib": self.message_buffers_lent_mib,
            "message_buffers_idle_mib": self.message_buffers_idle_mib,
        })
    }

    /// The sample in words.
    pub fn describe(&self) -> String {
        format!(
            "largest sample {:.0} MiB: receive budget {:.0} and upload budget {:.0} in use of {:.0}, allocator {:.0} allocated, {:.0} resident, message buffers {:.0} lent and {:.0} idle",
            self.resident_mib,
            self.receive_budget_in_use_mib,
            self.upload_budget_in_use_mib,
            self.budgets_mib,
            self.allocated_mib,
            self.allocator_resident_mib,
            self.message_buffers_lent_mib,
            self.message_buffers_idle_mib
        )
    }

    pub fn max(self, other: Self) -> Self {
        if other.resident_mib > self.resident_mib { other } else { self }
    }
}

/// A gzip implementation and level, as the gateway could compress AppendRows requests.
#[derive(Clone, Copy)]
pub enum Gzip {
    /// flate2 with zlib-rs (the gateway's compressor before ISA-L, tonic's and tower-http's).
    ZlibRs(u32),
    /// ISA-L (igzip) as the gateway uses it: its stateful encoder fed 256 KiB pieces.
    Isal(isal::CompressionLevel),
}

impl Gzip {
    pub fn name(self) -> String {
        match self {
            Gzip::ZlibRs(level) => format!("zlib-rs {level}"),
            Gzip::Isal(level) => format!("ISA-L {}", level as u8),
        }
    }

    pub fn compress(self, body: &[u8]) -> usize {
        match self {
            Gzip::ZlibRs(level) => {
                let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::new(level));
                encoder.write_all(body).unwrap();
                encoder.finish().unwrap().len()
            }
            Gzip::Isal(level) => {
                let mut encoder = isal::write::Encoder::new(Vec::new(), level, isal::Codec::Gzip);
                for piece in body.chunks(256 * 1024) {
                    encoder.write_all(piece).unwrap();
                }
                encoder.finish().unwrap().len()
            }
        }
    }

    /// The implementation the gateway uses for a `FILAMENT_APPEND_GZIP_LEVEL` setting.
    pub fn gateway(setting: u32) -> Gzip {
        Gzip::Isal(if setting <= 1 { isal::CompressionLevel::One } else { isal::CompressionLevel::Three })
    }
}

/// One gzip-alone measurement: CPU seconds per GiB of input and compressed share of the input.
#[derive(Debug, Clone)]
pub struct GzipAlone {
    pub name: String,
    pub cpu_seconds_per_gib: f64,
    pub ratio: f64,
}

/// gzip alone on `bodies`: CPU seconds per GiB of input (this thread's), and the compression ratio.
pub fn gzip_alone(bodies: &[Vec<u8>], gzip: Gzip, min_bytes: usize) -> GzipAlone {
    let before = cpu_seconds("/proc/thread-self/stat");
    let (mut input, mut output) = (0usize, 0usize);
    while input < min_bytes {
        for body in bodies {
            output += gzip.compress(body);
            input += body.len();
        }
    }
    let cpu = cpu_seconds("/proc/thread-self/stat") - before;
    GzipAlone {
        name: gzip.name(),
        cpu_seconds_per_gib: cpu / (input as f64 / GIB),
        ratio: output as f64 / input as f64,
    }
}

/// SHA-256 alone (the receipt's digest) on `bodies`: CPU seconds per GiB of this thread.
pub fn sha256_alone(bodies: &[Vec<u8>], min_bytes: usize) -> f64 {
    use sha2::Digest as _;
    let before = cpu_seconds("/proc/thread-self/stat");
    let mut input = 0usize;
    let mut digests = 0u8;
    while input < min_bytes {
        for body in bodies {
            digests ^= sha2::Sha256::digest(body)[0];
            input += body.len();
        }
    }
    std::hint::black_box(digests);
    (cpu_seconds("/proc/thread-self/stat") - before) / (input as f64 / GIB)
}
