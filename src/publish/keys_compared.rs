//! How a destination compares a keyed publication's keys, read from its table metadata: the
//! key ranges a MERGE may narrow its scan with, and the collations its STRING keys compare
//! under. Pure facts that [`super::decide`] chooses with and `destination` fetches; also what
//! `conformance` enumerates statements with.

use google_cloud_bigquery_v2::model::Table;

use crate::bigquery::collation::{collated_columns, own_collations};
use crate::model::columns::{BigQueryType, Collation, Column, same_name};
use crate::model::key_ranges::{KeyRange, KeyValue};

/// A keyed publication's key ranges and collations, as the destination compares its keys.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct KeysAsCompared {
    pub(crate) ranges: Vec<KeyRange>,
    /// (key column, the collation it compares under).
    pub(crate) collations: Vec<(String, Collation)>,
}

impl KeysAsCompared {
    /// How the destination `table` (its `tables.get` answer) compares the keys: the key
    /// ranges without those of STRING columns that may compare under a collation (`und:ci`;
    /// the gateway orders strings by code point, so such a range could leave out a row the
    /// MERGE's join matches, and the row would be inserted twice), and the collation of each
    /// STRING key column (`string_keys`) that has one of its own, for folding repeated keys the
    /// way the join matches them.
    pub(crate) fn in_table(table: &Table, string_keys: &[&str], key_ranges: &[KeyRange]) -> Self {
        let collated = collated_columns(table);
        let ordered_alike = |range: &&KeyRange| {
            !(is_string_range(range) && collated.iter().any(|column| same_name(column, &range.column)))
        };
        let mut collations = own_collations(table);
        collations.retain(|(column, _)| string_keys.iter().any(|k| same_name(k, column)));
        Self { ranges: key_ranges.iter().filter(ordered_alike).cloned().collect(), collations }
    }
}

pub(crate) fn is_string_range(range: &KeyRange) -> bool {
    matches!(range.min, KeyValue::String(_))
}

/// The key columns of type STRING, named as in `columns`.
pub(crate) fn string_key_columns<'a>(columns: &'a [Column], key: &[String]) -> Vec<&'a str> {
    columns
        .iter()
        .filter(|c| c.bigquery_type == BigQueryType::String && key.iter().any(|k| c.name.eq_ignore_ascii_case(k)))
        .map(|c| c.name.as_str())
        .collect()
}
