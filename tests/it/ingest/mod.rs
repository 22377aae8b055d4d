//! Batch bodies as extractors send them: errors, fidelity of values, source types and names, hostile bodies.

mod destination_rules;
mod errors;
mod fidelity;
mod hostile;
mod source_types;
