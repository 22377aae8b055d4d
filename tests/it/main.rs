//! The integration suite: one binary, each test spawning the real gateway against a fresh
//! Postgres database and the bqemulator that `make test` provisions.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

mod conformance;
mod documentation;
mod fleet;
mod harness;
mod ingest;
mod operators;
mod pipeline;
mod publish;
mod security;
