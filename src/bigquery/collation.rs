//! How a destination table's columns compare strings, read from its `tables.get` answer at
//! publication: `publish` leaves out the key ranges such columns would not bound, and folds a
//! delivery's repeated keys the way the destination compares them
//! ([`crate::publish::sql`]).

use google_cloud_bigquery_v2::model::Table;

use crate::model::columns::Collation;

/// Top-level columns whose comparisons may follow a collation (`und:ci`): their own, or the
/// table's default when they report none (conservatively: BigQuery gives the default to
/// columns added after it was set, older ones may compare by code point). The gateway orders
/// STRING key values by code point ([`crate::model::key_ranges`]), so such a column's key range
/// would not bound what the MERGE's join matches.
pub(crate) fn collated_columns(table: &Table) -> Vec<String> {
    let default = table.default_collation.as_deref().unwrap_or_default();
    fields(table)
        .iter()
        .filter(|field| !field.collation.as_deref().unwrap_or(default).is_empty())
        .map(|field| field.name.clone())
        .collect()
}

/// Top-level columns with a collation of their own, as the column's `collation` field reports
/// it. A column that reports none is left out even under a table default collation: the
/// default applies only to columns added after it was set, and guessing it for an older column
/// could merge keys the destination keeps apart (the publication logs a warning for a key
/// column in that case). A name that is not a plain collation name is left out with a warning.
pub(crate) fn own_collations(table: &Table) -> Vec<(String, Collation)> {
    fields(table)
        .iter()
        .filter_map(|field| {
            let name = field.collation.as_deref().filter(|name| !name.is_empty())?;
            let collation = Collation::parse(name);
            if collation.is_none() {
                tracing::warn!(column = %field.name, collation = name, "collation name not understood: ignored");
            }
            Some((field.name.clone(), collation?))
        })
        .collect()
}

fn fields(table: &Table) -> &[google_cloud_bigquery_v2::model::TableFieldSchema] {
    table.schema.as_ref().map(|schema| schema.fields.as_slice()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use google_cloud_bigquery_v2::model::{TableFieldSchema, TableSchema};

    fn table() -> Table {
        let field = |name: &str| TableFieldSchema::new().set_name(name).set_type("STRING").set_mode("NULLABLE");
        Table::new().set_schema(TableSchema::new().set_fields(vec![
            field("plain"),
            field("ci").set_collation("und:ci"),
            field("binary").set_collation(""),
        ]))
    }

    #[test]
    fn collated_columns_follow_their_own_collation_or_the_tables_default() {
        assert_eq!(collated_columns(&table()), ["ci"]);
        assert_eq!(collated_columns(&table().set_default_collation("und:ci")), ["plain", "ci"]);
        assert!(collated_columns(&Table::new().set_default_collation("")).is_empty());
    }

    #[test]
    fn own_collations_are_the_columns_own_only() {
        let ci = Collation::parse("und:ci").expect("a collation");
        assert_eq!(own_collations(&table()), [("ci".to_string(), ci.clone())]);
        assert_eq!(own_collations(&table().set_default_collation("und:ci")), [("ci".to_string(), ci)]);
    }
}
