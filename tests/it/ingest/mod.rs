//! Batch bodies as extractors send them: errors, fidelity of values, source types and names, hostile bodies.

mod errors;
mod fidelity;
mod hostile;
mod source_types;
