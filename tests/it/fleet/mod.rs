//! Several replicas: ownership, forwarding, handover, loss.

mod behind_a_load_balancer;
mod replicas;
