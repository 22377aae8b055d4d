//! Batch bodies as extractors send them: errors, fidelity of values, source types and names, hostile bodies,
//! and the Arrow project's own IPC test files.

mod arrow_testing;
mod destination_rules;
mod errors;
mod fidelity;
mod geography_bounds;
mod hostile;
mod source_types;
