//! The integration suite: one binary, each test spawning the real gateway against a fresh
//! Postgres database and the bqemulator that `make test` provisions.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

mod adaptive_concurrency;
mod append_connections;
mod append_e2e;
mod commit_order;
mod console;
mod errors;
mod fidelity;
mod fleet;
mod googlesql;
mod hardening;
mod hostile;
mod id_tokens;
mod live_bigquery;
mod operations;
mod operator_cli;
mod pipeline;

mod principals;
mod publication;
mod publication_cost;
mod publication_safety;
mod quotas;
mod reliability;
mod replicas;
mod rest_conformance;
mod run_list;
mod source_types;
mod stalled_readers;
mod table_layout;
mod timeline;
mod tls;
mod troubleshooting;
mod unreachable;
mod write_modes;
mod write_options;
