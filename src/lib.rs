//! filament-bigquery: an HTTP ingestion gateway that loads extractors' Apache Arrow IPC streams
//! into Google BigQuery through the Storage Write API.
//!
//! # Layout (follow the data)
//! - [`config`]: clap configuration (flags and env vars); a leaf.
//! - [`app`]: maps the configuration onto each part, wires the store, BigQuery clients,
//!   pipeline and HTTP router; serves.
//! - `http`: connection supervision beneath the handlers: the accept loop, each connection's
//!   deadlines and limits, the HTTP/2 frame counter, request-body rates, early answers, TLS.
//! - [`api`]: axum routes (one file per resource), auth, problem+json errors, OpenAPI.
//! - [`ingest`]: batch bodies: incremental IPC decoding, hashing, schema validation and
//!   conversion to the staging representation, split into AppendRows payloads.
//! - `intake`: one batch request from its loaded target to rows queued on a lane: admission,
//!   body, preparation, receipt, enqueue, in that order.
//! - `pipeline`: admission under the byte budget, then per execution and resource upload
//!   lanes (`pipeline::lane`: set-up of tables and stream, accumulation, the appender's
//!   windows and replays).
//! - `bigquery`: Storage Write client (tonic), datasets/tables/jobs (REST), credentials, the
//!   one retry policy, the pacers of BigQuery's published quotas (`bigquery::quota`, shared
//!   by the fleet) and the adaptive concurrency that learns from call results (per project and
//!   location), principals taking turns at both (`bigquery::fair`).
//! - `publish`: commit in phases: every stream finalized and committed to staging, then (the
//!   barrier) one query job per resource, eight tables at a time by default; its decisions
//!   pure (`publish::decide`), SQL generation, deterministic job ids, fingerprints and the
//!   redelivery decision.
//! - `store`: the only module that talks to Postgres (sqlx).
//! - `replica`: this process as one replica of a fleet: leases on the executions it serves,
//!   and its place in the fleet that divides BigQuery's quotas.
//! - `principals`: who may call (the principals file, its reloads, Google ID tokens); `audit`:
//!   what they did. `watched_files`: the one poller of files read again when they change
//!   (the principals file, the TLS pair).
//! - `cli`: the operator CLI over the HTTP API; the operator console lives in `api::console`.
//! - [`model`]: identifiers and keys, columns, the staging contract, write modes and states
//!   shared by every stage.
//! - [`conformance`]: every statement and table body the gateway would send for one resource,
//!   for judges outside the crate (Google's SQL analyzer, live-BigQuery dry runs).
//! - [`error`]: the closed set of stable error codes and their HTTP statuses.
//! - [`telemetry`]: logging set-up, metric names and telemetry events; [`traces`]: OpenTelemetry
//!   spans exported over OTLP, off unless configured.
//!
//! The public surface is what `main`, the integration tests and the fuzz target use; the
//! rest is `pub(crate)`.

#![deny(rustdoc::broken_intra_doc_links)]

pub mod api;
pub mod app;
pub(crate) mod audit;
pub(crate) mod bigquery;
pub mod cli;
pub mod config;
pub mod conformance;
pub mod error;
pub(crate) mod http;
pub mod ingest;
pub(crate) mod intake;
pub mod model;
pub(crate) mod pipeline;
pub(crate) mod principals;
pub(crate) mod publish;
pub(crate) mod replica;
pub(crate) mod store;
pub mod telemetry;
pub mod traces;
pub(crate) mod watched_files;
