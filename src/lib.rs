//! filament-bigquery: an HTTP ingestion gateway that loads extractors' Apache Arrow IPC streams
//! into Google BigQuery through the Storage Write API.
//!
//! # Layout (follow the data)
//! - [`config`]: clap configuration (flags and env vars).
//! - [`app`]: wires the store, BigQuery clients, pipeline and HTTP router; serves.
//! - [`api`]: axum routes (one file per resource), auth, problem+json errors, OpenAPI.
//! - [`ingest`]: batch bodies: incremental IPC decoding, hashing, schema validation and
//!   conversion to the staging representation, split into AppendRows payloads.
//! - [`pipeline`]: per execution and resource upload lanes that move encoded payloads into
//!   PENDING write streams (the seam where windows, budgets and retries slot in).
//! - [`bigquery`]: Storage Write client (tonic), datasets/tables/jobs (REST), credentials.
//! - [`publish`]: commit: finalize and commit streams, then one query job per destination;
//!   pure SQL generation and deterministic job ids.
//! - [`store`]: the only module that talks to Postgres (sqlx).
//! - [`model`]: identifiers, write modes and states shared by every stage.
//! - [`error`]: the closed set of stable error codes and their HTTP statuses.
//! - [`telemetry`]: logging set-up and metric names.

pub mod api;
pub mod app;
pub mod bigquery;
pub mod config;
pub mod error;
pub mod ingest;
pub mod model;
pub mod pipeline;
pub mod publish;
pub mod store;
pub mod telemetry;
