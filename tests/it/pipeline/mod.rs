//! Uploads: lanes, appends, connections, retries, quotas and the adaptive limits.

mod adaptive_concurrency;
mod append_connections;
mod append_e2e;
mod destination_reads;
mod quotas;
mod reliability;
mod tenants_share;
mod unreachable;
mod upload_budget;
mod windows_and_faults;
