//! The numeric limits of request fields, stated once: each is a constant that the request's
//! validation checks and that the OpenAPI document states (`api::openapi` applies
//! [`DOCUMENTED_BOUNDS`] to the generated schemas), so the document cannot drift from the
//! check.

use super::MAX_APPEND_PAYLOAD_BYTES;

/// BigQuery's limit on clustering columns.
pub(crate) const MAX_CLUSTERING_COLUMNS: usize = 4;
/// BigQuery's limit on labels per resource.
pub(crate) const MAX_LABELS: usize = 64;
/// BigQuery's limit on a table description, in characters.
pub(crate) const MAX_TABLE_DESCRIPTION_CHARS: usize = 16_384;
/// Longest table expiration the gateway accepts (100 years).
pub(crate) const MAX_EXPIRATION_DAYS: i64 = 36_500;

/// An inclusive integer range a field's value must fall in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IntegerBounds {
    pub(crate) min: i64,
    pub(crate) max: Option<i64>,
}

impl IntegerBounds {
    pub(crate) const fn between(min: i64, max: i64) -> Self {
        Self { min, max: Some(max) }
    }

    pub(crate) const fn at_least(min: i64) -> Self {
        Self { min, max: None }
    }

    pub(crate) fn contains(&self, value: i64) -> bool {
        value >= self.min && self.max.is_none_or(|max| value <= max)
    }

    /// "between 1 and 10" or "at least 1", for problem details.
    pub(crate) fn describe(&self) -> String {
        match self.max {
            Some(max) => format!("between {} and {max}", self.min),
            None => format!("at least {}", self.min),
        }
    }
}

/// `batching.max_rows`: rows per upload batch.
pub(crate) const BATCHING_MAX_ROWS: IntegerBounds = IntegerBounds::between(1, 1_000_000);
/// `batching.max_bytes`: encoded bytes of every AppendRows payload, at most the request budget's.
pub(crate) const BATCHING_MAX_BYTES: IntegerBounds = IntegerBounds::between(1024, MAX_APPEND_PAYLOAD_BYTES as i64);
/// `batching.flush_interval_ms`.
pub(crate) const BATCHING_FLUSH_INTERVAL_MS: IntegerBounds = IntegerBounds::between(10, 3_600_000);
/// `table_options.expiration_days`.
pub(crate) const EXPIRATION_DAYS: IntegerBounds = IntegerBounds::between(1, MAX_EXPIRATION_DAYS);
/// `table_options.partitioning.range.interval`.
pub(crate) const RANGE_INTERVAL: IntegerBounds = IntegerBounds::at_least(1);
/// `maximum_bytes_billed` and `maximum_bytes_billed_per_execution` of a run.
pub(crate) const MAXIMUM_BYTES_BILLED: IntegerBounds = IntegerBounds::at_least(1);

/// A limit as the OpenAPI document states it on one property.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DocumentedBound {
    /// `minimum` / `maximum` of an integer.
    Integer(IntegerBounds),
    /// `maxLength` of a string, in characters.
    MaxLength(usize),
    /// `maxItems` of an array.
    MaxItems(usize),
    /// `maxProperties` of an object (a map).
    MaxProperties(usize),
}

/// Every documented limit: (schema, property, limit).
pub(crate) const DOCUMENTED_BOUNDS: &[(&str, &str, DocumentedBound)] = &[
    ("Batching", "max_rows", DocumentedBound::Integer(BATCHING_MAX_ROWS)),
    ("Batching", "max_bytes", DocumentedBound::Integer(BATCHING_MAX_BYTES)),
    ("Batching", "flush_interval_ms", DocumentedBound::Integer(BATCHING_FLUSH_INTERVAL_MS)),
    ("TableOptionsDeclaration", "expiration_days", DocumentedBound::Integer(EXPIRATION_DAYS)),
    ("TableOptionsDeclaration", "description", DocumentedBound::MaxLength(MAX_TABLE_DESCRIPTION_CHARS)),
    ("TableOptionsDeclaration", "clustering", DocumentedBound::MaxItems(MAX_CLUSTERING_COLUMNS)),
    ("TableOptionsDeclaration", "labels", DocumentedBound::MaxProperties(MAX_LABELS)),
    ("IntegerRange", "interval", DocumentedBound::Integer(RANGE_INTERVAL)),
    ("CreateRunRequest", "maximum_bytes_billed", DocumentedBound::Integer(MAXIMUM_BYTES_BILLED)),
    ("CreateRunRequest", "maximum_bytes_billed_per_execution", DocumentedBound::Integer(MAXIMUM_BYTES_BILLED)),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_inclusive() {
        assert!(BATCHING_MAX_ROWS.contains(1) && BATCHING_MAX_ROWS.contains(1_000_000));
        assert!(!BATCHING_MAX_ROWS.contains(0) && !BATCHING_MAX_ROWS.contains(1_000_001));
        assert!(MAXIMUM_BYTES_BILLED.contains(i64::MAX) && !MAXIMUM_BYTES_BILLED.contains(0));
        assert_eq!(BATCHING_MAX_ROWS.describe(), "between 1 and 1000000");
        assert_eq!(RANGE_INTERVAL.describe(), "at least 1");
    }
}
