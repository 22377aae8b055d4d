//! Several replicas: ownership, forwarding, handover, loss, and BigQuery's quotas shared.

mod behind_a_load_balancer;
mod quota_shares;
mod replicas;
