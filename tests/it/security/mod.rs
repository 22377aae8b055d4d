//! Who may call and what a hostile client cannot do: principals, ID tokens, TLS, hardening, clients that stop reading.

mod foreign_jobs;
mod hardening;
mod id_tokens;
mod peer_caps;
mod principal_operations;
mod principals;
mod stalled_readers;
mod tls;
mod trickling_peers;
