//! Commit and publication: order, statements per write mode, options, layouts, cost and safety.

mod atomic;
mod commit_order;
mod direct_append;
pub(crate) mod held;
mod plan;
mod publication;
mod publication_cost;
mod publication_safety;
mod table_layout;
mod widening;
mod write_modes;
mod write_options;
