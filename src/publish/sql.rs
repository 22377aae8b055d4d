//! Pure GoogleSQL generation for publication, one statement per destination, snapshot-tested
//! per write mode. Every identifier is validated upstream (`model`, `ingest::schema`) and quoted
//! here with backticks; a backtick or backslash that slipped through is escaped, not trusted.
//!
//! Staged strings become their final types here (`PARSE_NUMERIC`, `PARSE_BIGNUMERIC`,
//! `CAST(... AS TIME)`, `PARSE_JSON`), inside STRUCTs and ARRAYs too.

use crate::model::WriteMode;
use crate::model::bounds::KeyRange;
use crate::model::columns::{BigQueryType, Collation, Column};
use crate::model::staging::{OP_COLUMN, SEQ_COLUMN};

/// A fully qualified table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TableRef<'a> {
    pub(crate) project: &'a str,
    pub(crate) dataset: &'a str,
    pub(crate) table: &'a str,
}

/// Quotes one identifier part.
pub(crate) fn quote_identifier(part: &str) -> String {
    let mut quoted = String::with_capacity(part.len() + 2);
    quoted.push('`');
    for c in part.chars() {
        if c == '`' || c == '\\' {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    quoted.push('`');
    quoted
}

impl TableRef<'_> {
    pub(crate) fn quoted(&self) -> String {
        format!(
            "{}.{}.{}",
            quote_identifier(self.project),
            quote_identifier(self.dataset),
            quote_identifier(self.table)
        )
    }
}

/// What one destination's publication statement needs.
#[derive(Debug, Clone)]
pub(crate) struct Publication<'a> {
    pub(crate) destination: TableRef<'a>,
    pub(crate) staging: TableRef<'a>,
    pub(crate) write_mode: WriteMode,
    /// The destination columns the load writes (for `cdc_append` including `_filament_op`).
    pub(crate) columns: &'a [Column],
    /// Key columns, named as in `columns` (MERGE modes).
    pub(crate) key: &'a [String],
    /// Ranges covering every staged key value (MERGE modes): the destination side is bounded by
    /// them (implied by the join, so always safe), which lets BigQuery prune what it scans.
    pub(crate) key_ranges: &'a [KeyRange],
    /// (key column, collation) for the key columns the destination compares under a collation
    /// (`und:ci`): repeated keys are folded under it, as the MERGE's join will match them.
    pub(crate) key_collations: &'a [(String, Collation)],
    /// `full_replace` only: whether this publication replaces the table (the run's first
    /// publication of the resource) or appends to it (a later segment).
    pub(crate) replace: bool,
}

/// The declared key columns named as the destination columns spell them (keys match
/// case-insensitively).
pub(crate) fn key_as_named(primary_key: &[String], columns: &[Column]) -> Vec<String> {
    primary_key
        .iter()
        .filter_map(|k| columns.iter().find(|c| c.name.eq_ignore_ascii_case(k)))
        .map(|c| c.name.clone())
        .collect()
}

/// The one statement (a script for `full_replace`) that publishes the staged rows.
pub(crate) fn publication_statement(publication: &Publication<'_>) -> String {
    match publication.write_mode {
        WriteMode::FullReplace if publication.replace => replace(publication),
        WriteMode::FullReplace | WriteMode::FullAppend | WriteMode::IncrementalAppend | WriteMode::CdcAppend => {
            insert_select(publication)
        }
        WriteMode::FullUpsert | WriteMode::IncrementalUpsert | WriteMode::IncrementalDelete | WriteMode::CdcMerge => {
            merge(publication)
        }
    }
}

/// An empty replacement: the source is empty now, so the destination is emptied.
pub(crate) fn truncate_statement(destination: &TableRef<'_>) -> String {
    format!("TRUNCATE TABLE {}", destination.quoted())
}

/// The target of a MERGE, its source (the folded staged rows) and the staging table within the
/// source, as range variables. Column and field names never start with the reserved prefix
/// (`model::ids::validate_column_name`), so no alias can capture a column reference: GoogleSQL
/// resolves a name to a range variable before a column, so with a target aliased `T` the
/// `t` of `UPDATE SET t = ...` would name the whole row, and a staged column `k` read after
/// `PARSE_NUMERIC(k) AS k` in the same SELECT would be the converted alias (both refused by
/// Google's analyzer, `docs/testing.md`).
const TARGET_ALIAS: &str = "_filament_target";
const SOURCE_ALIAS: &str = "_filament_source";
const STAGED_ALIAS: &str = "_filament_staged";

/// `alias.`column``: a column of one range variable, never a SELECT-list alias.
fn qualified(alias: &str, column: &str) -> String {
    format!("{alias}.{}", quote_identifier(column))
}

/// The staged value of `column` (at SQL expression `expr`) converted to its destination type.
/// Array elements are named `_filament_e{depth}` (offsets `_filament_o{depth}`): reserved, so
/// they cannot shadow a column or field of the same name.
fn converted(expr: &str, column: &Column, depth: usize) -> String {
    if !column.bigquery_type.needs_conversion() {
        return expr.to_string();
    }
    if column.repeated {
        let element = Column { repeated: false, ..column.clone() };
        let (alias, offset) = (format!("_filament_e{depth}"), format!("_filament_o{depth}"));
        return format!(
            "ARRAY(SELECT {} FROM UNNEST({expr}) AS {alias} WITH OFFSET AS {offset} ORDER BY {offset})",
            converted(&alias, &element, depth + 1)
        );
    }
    match &column.bigquery_type {
        BigQueryType::Numeric => format!("PARSE_NUMERIC({expr})"),
        BigQueryType::BigNumeric => format!("PARSE_BIGNUMERIC({expr})"),
        BigQueryType::Time => format!("CAST({expr} AS TIME)"),
        BigQueryType::Json => format!("PARSE_JSON({expr})"),
        BigQueryType::Struct(fields) => {
            let parts: Vec<String> = fields
                .iter()
                .map(|f| {
                    let field_expr = format!("{expr}.{}", quote_identifier(&f.name));
                    format!("{} AS {}", converted(&field_expr, f, depth), quote_identifier(&f.name))
                })
                .collect();
            format!("IF({expr} IS NULL, NULL, STRUCT({}))", parts.join(", "))
        }
        other => unreachable!("{other} needs no conversion"),
    }
}

/// One select item over the staging table: the staged column, converted where needed, under
/// its own name.
fn select_item(column: &Column) -> String {
    let staged = qualified(STAGED_ALIAS, &column.name);
    format!("{} AS {}", converted(&staged, column, 0), quote_identifier(&column.name))
}

fn column_list(columns: &[Column]) -> String {
    columns.iter().map(|c| quote_identifier(&c.name)).collect::<Vec<_>>().join(", ")
}

/// Append modes, `cdc_append` and later segments of `full_replace`: every staged row, once.
fn insert_select(p: &Publication<'_>) -> String {
    let select: Vec<String> = p.columns.iter().map(select_item).collect();
    format!(
        "INSERT INTO {} ({})\nSELECT {}\nFROM {} AS {STAGED_ALIAS}",
        p.destination.quoted(),
        column_list(p.columns),
        select.join(", "),
        p.staging.quoted()
    )
}

/// `full_replace`: truncate and insert in one transaction, so readers see the old table or
/// the new one. With no staged rows the table ends up empty.
fn replace(p: &Publication<'_>) -> String {
    format!(
        "BEGIN TRANSACTION;\nTRUNCATE TABLE {};\n{};\nCOMMIT TRANSACTION;",
        p.destination.quoted(),
        insert_select(p)
    )
}

/// A key column as the fold groups it: converted to its destination type, and under the
/// destination's collation where it has one (a key `'A'` and a later `'a'` are one key to an
/// `und:ci` column, so only the later row may reach the MERGE).
fn fold_key(key: &Column, collations: &[(String, Collation)]) -> String {
    let converted = converted(&qualified(STAGED_ALIAS, &key.name), key, 0);
    match collations.iter().find(|(column, _)| column.eq_ignore_ascii_case(&key.name)) {
        Some((_, collation)) => format!("COLLATE({converted}, '{}')", collation.as_str()),
        None => converted,
    }
}

/// Keyed modes: fold every key to its last staged operation (by `_filament_seq`), then one
/// MERGE: deletes remove the key, everything else updates or inserts it.
fn merge(p: &Publication<'_>) -> String {
    let source = |column: &str| qualified(SOURCE_ALIAS, column);
    let target = |column: &str| qualified(TARGET_ALIAS, column);
    let op = source(OP_COLUMN);
    // Only cdc_merge mixes operations; the other keyed modes have one each.
    let (deletes, upserts) = match p.write_mode {
        WriteMode::CdcMerge => (true, true),
        WriteMode::IncrementalDelete => (true, false),
        _ => (false, true),
    };
    let key_columns: Vec<&Column> =
        p.key.iter().filter_map(|k| p.columns.iter().find(|c| c.name.eq_ignore_ascii_case(k))).collect();
    let is_key = |c: &Column| key_columns.iter().any(|k| k.name == c.name);
    let mut select: Vec<String> = p.columns.iter().map(select_item).collect();
    if deletes && upserts {
        select.push(qualified(STAGED_ALIAS, OP_COLUMN));
    }
    let partition: Vec<String> = key_columns.iter().map(|k| fold_key(k, p.key_collations)).collect();
    let mut on: Vec<String> =
        key_columns.iter().map(|k| format!("{} = {}", target(&k.name), source(&k.name))).collect();
    for k in &key_columns {
        let range = p.key_ranges.iter().find(|r| r.column.eq_ignore_ascii_case(&k.name));
        if let Some((min, max)) = range.and_then(|r| r.min.sql_literal().zip(r.max.sql_literal())) {
            on.push(format!("{} BETWEEN {min} AND {max}", target(&k.name)));
        }
    }
    let mut statement = format!(
        "MERGE {} AS {TARGET_ALIAS}\nUSING (\n  SELECT {}\n  FROM {} AS {STAGED_ALIAS}\n  WHERE TRUE\n  QUALIFY ROW_NUMBER() OVER (PARTITION BY {} ORDER BY {} DESC) = 1\n) AS {SOURCE_ALIAS}\nON {}",
        p.destination.quoted(),
        select.join(", "),
        p.staging.quoted(),
        partition.join(", "),
        qualified(STAGED_ALIAS, SEQ_COLUMN),
        on.join(" AND "),
    );
    if deletes {
        let guard = if upserts { format!(" AND {op} = 'delete'") } else { String::new() };
        statement.push_str(&format!("\nWHEN MATCHED{guard} THEN DELETE"));
    }
    if upserts {
        let updates: Vec<String> = p
            .columns
            .iter()
            .filter(|c| !is_key(c))
            .map(|c| format!("{} = {}", quote_identifier(&c.name), source(&c.name)))
            .collect();
        if !updates.is_empty() {
            statement.push_str(&format!("\nWHEN MATCHED THEN UPDATE SET {}", updates.join(", ")));
        }
        let guard = if deletes { format!(" AND {op} != 'delete'") } else { String::new() };
        let values: Vec<String> = p.columns.iter().map(|c| source(&c.name)).collect();
        statement.push_str(&format!(
            "\nWHEN NOT MATCHED{guard} THEN INSERT ({}) VALUES ({})",
            column_list(p.columns),
            values.join(", ")
        ));
    }
    statement
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::bounds::KeyValue;

    const DESTINATION: TableRef<'static> = TableRef { project: "my-project", dataset: "raw", table: "users" };
    const STAGING: TableRef<'static> =
        TableRef { project: "my-project", dataset: "raw", table: "_filament_stg_users_0123456789abcdef" };

    fn columns() -> Vec<Column> {
        vec![
            Column::new("id", BigQueryType::Int64),
            Column::new("name", BigQueryType::String),
            Column::new("balance", BigQueryType::Numeric),
            Column::new("updated_at", BigQueryType::Timestamp),
        ]
    }

    fn statement(write_mode: WriteMode, columns: &[Column], key: &[String], replace: bool) -> String {
        bounded(write_mode, columns, key, &[], replace)
    }

    fn bounded(
        write_mode: WriteMode,
        columns: &[Column],
        key: &[String],
        ranges: &[KeyRange],
        replace: bool,
    ) -> String {
        publication_statement(&Publication {
            destination: DESTINATION,
            staging: STAGING,
            write_mode,
            columns,
            key,
            key_ranges: ranges,
            key_collations: &[],
            replace,
        })
    }

    fn id_range(min: i64, max: i64) -> Vec<KeyRange> {
        vec![KeyRange { column: "id".into(), min: KeyValue::Int64(min), max: KeyValue::Int64(max) }]
    }

    #[test]
    fn append_modes_insert_every_staged_row() {
        let sql = statement(WriteMode::FullAppend, &columns(), &[], false);
        assert_eq!(sql, statement(WriteMode::IncrementalAppend, &columns(), &[], false));
        assert_eq!(sql, statement(WriteMode::FullReplace, &columns(), &[], false), "a later replace segment appends");
        insta::assert_snapshot!(sql);
    }

    #[test]
    fn full_replace_truncates_and_inserts_in_one_transaction() {
        insta::assert_snapshot!(statement(WriteMode::FullReplace, &columns(), &[], true));
    }

    #[test]
    fn cdc_append_keeps_the_operation() {
        let mut columns = columns();
        columns.push(Column::new(OP_COLUMN, BigQueryType::String));
        insta::assert_snapshot!(statement(WriteMode::CdcAppend, &columns, &[], false));
    }

    #[test]
    fn upserts_fold_keys_to_the_last_row_then_merge() {
        let key = vec!["id".to_string()];
        let sql = bounded(WriteMode::IncrementalUpsert, &columns(), &key, &id_range(3, 97), false);
        assert_eq!(sql, bounded(WriteMode::FullUpsert, &columns(), &key, &id_range(3, 97), false));
        assert!(
            sql.contains("ON _filament_target.`id` = _filament_source.`id` AND _filament_target.`id` BETWEEN 3 AND 97"),
            "{sql}"
        );
        insta::assert_snapshot!(sql);
    }

    #[test]
    fn incremental_delete_only_deletes() {
        let key = vec!["id".to_string()];
        insta::assert_snapshot!(bounded(WriteMode::IncrementalDelete, &columns()[..1], &key, &id_range(-5, 5), false));
    }

    #[test]
    fn cdc_merge_deletes_updates_and_inserts_by_the_last_operation() {
        let key = vec!["tenant".to_string(), "at".to_string()];
        let mut columns = vec![Column::new("tenant", BigQueryType::String), Column::new("at", BigQueryType::Time)];
        columns.extend(columns_without_id());
        // TIME keys get no range (the gateway stages them as strings); STRING keys do.
        let ranges = [KeyRange {
            column: "tenant".into(),
            min: KeyValue::String("acme".into()),
            max: KeyValue::String("o'hara".into()),
        }];
        insta::assert_snapshot!(bounded(WriteMode::CdcMerge, &columns, &key, &ranges, false));
    }

    #[test]
    fn keys_under_a_collation_fold_under_it() {
        let key = vec!["tenant".to_string(), "id".to_string()];
        let mut columns = vec![Column::new("tenant", BigQueryType::String)];
        columns.extend(self::columns());
        let collations = [("Tenant".to_string(), Collation::parse("und:ci").expect("a collation"))];
        let sql = publication_statement(&Publication {
            destination: DESTINATION,
            staging: STAGING,
            write_mode: WriteMode::IncrementalUpsert,
            columns: &columns,
            key: &key,
            key_ranges: &id_range(1, 9),
            key_collations: &collations,
            replace: false,
        });
        assert!(
            sql.contains("PARTITION BY COLLATE(_filament_staged.`tenant`, 'und:ci'), _filament_staged.`id` ORDER BY"),
            "{sql}"
        );
        assert!(
            sql.contains(
                "ON _filament_target.`tenant` = _filament_source.`tenant` AND _filament_target.`id` = _filament_source.`id` AND _filament_target.`id` BETWEEN 1 AND 9"
            ),
            "{sql}"
        );
        insta::assert_snapshot!(sql);
    }

    fn columns_without_id() -> Vec<Column> {
        columns().into_iter().skip(1).collect()
    }

    #[test]
    fn ranges_bound_only_keyed_merges() {
        let key = vec!["id".to_string()];
        let append = bounded(WriteMode::FullAppend, &columns(), &[], &id_range(1, 2), false);
        assert!(!append.contains("BETWEEN"), "appends read only the staging table: {append}");
        let unbounded = statement(WriteMode::IncrementalUpsert, &columns(), &key, false);
        assert!(
            unbounded.contains("ON _filament_target.`id` = _filament_source.`id`\n"),
            "no range, no bound: {unbounded}"
        );
    }

    #[test]
    fn a_merge_of_key_columns_only_has_no_update_clause() {
        let key = vec!["id".to_string()];
        let sql = statement(WriteMode::IncrementalUpsert, &columns()[..1], &key, false);
        assert!(!sql.contains("UPDATE SET"), "{sql}");
        assert!(sql.contains("WHEN NOT MATCHED THEN INSERT (`id`) VALUES (_filament_source.`id`)"), "{sql}");
    }

    #[test]
    fn nested_strings_convert_inside_structs_and_arrays() {
        let columns = vec![
            Column::repeated("amounts", BigQueryType::BigNumeric),
            Column::new(
                "shipment",
                BigQueryType::Struct(vec![
                    Column::new("carrier", BigQueryType::String),
                    Column::new("at", BigQueryType::Time),
                    Column::repeated(
                        "lines",
                        BigQueryType::Struct(vec![
                            Column::new("sku", BigQueryType::String),
                            Column::new("price", BigQueryType::Numeric),
                        ]),
                    ),
                ]),
            ),
            Column::new("payload", BigQueryType::Json),
            Column::repeated("tags", BigQueryType::String),
        ];
        insta::assert_snapshot!(statement(WriteMode::FullAppend, &columns, &[], false));
    }

    #[test]
    fn an_empty_replacement_truncates() {
        assert_eq!(truncate_statement(&DESTINATION), "TRUNCATE TABLE `my-project`.`raw`.`users`");
    }

    #[test]
    fn quoting_escapes_what_validation_should_have_rejected() {
        assert_eq!(quote_identifier("a`b"), "`a\\`b`");
        assert_eq!(quote_identifier("a\\b"), "`a\\\\b`");
        assert_eq!(TableRef { project: "example.com:p", dataset: "d", table: "t" }.quoted(), "`example.com:p`.`d`.`t`");
        let hostile = [Column::new("x`; DROP TABLE t; --", BigQueryType::Int64)];
        let sql = statement(WriteMode::FullAppend, &hostile, &[], false);
        assert!(sql.contains("`x\\`; DROP TABLE t; --`"), "{sql}");
    }
}
