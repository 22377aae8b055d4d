//! Pure GoogleSQL generation for publication, one statement per destination, snapshot-tested
//! per write mode. Every identifier is validated upstream (`model`, `ingest::schema`) and quoted
//! here with backticks; a backtick or backslash that slipped through is escaped, not trusted.
//!
//! Staged values become their final types here (`PARSE_NUMERIC`, `PARSE_BIGNUMERIC`,
//! `CAST(... AS TIME)`, `PARSE_JSON`, GEOGRAPHY, RANGE and INTERVAL constructors: [`typed`]),
//! inside STRUCTs and ARRAYs too; columns staged under generated names (flexible column names,
//! `Column::staged_name`) are read under those names and written under their own.

mod history;
mod typed;

use crate::model::WriteMode;
use crate::model::columns::{BigQueryType, Collation, Column, same_name};
use crate::model::key_ranges::{KeyRange, string_literal};
use crate::model::staging::{OP_COLUMN, SEQ_COLUMN};
use crate::model::write_options::{DELETED_AT_COLUMN, Deletes, MetadataColumn};

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
    /// `order_by` columns, named as in `columns` (MERGE modes; empty: arrival order alone).
    pub(crate) order_by: &'a [String],
    /// Which destination rows the MERGE may touch (MERGE modes).
    pub(crate) scope: MergeScope<'a>,
    /// (key column, collation) for the key columns the destination compares under a collation
    /// (`und:ci`): repeated keys are folded under it, as the MERGE's join will match them.
    pub(crate) key_collations: &'a [(String, Collation)],
    /// `full_replace` only: whether this publication replaces the table (the run's first
    /// publication of the resource) or appends to it (a later segment).
    pub(crate) replace: bool,
    /// The load metadata the statement sets on every row it writes.
    pub(crate) metadata: LoadMetadata<'a>,
    /// What a delete does to a matched row (the modes that delete).
    pub(crate) deletes: Deletes,
}

/// Which destination rows a keyed publication's MERGE may touch. Only [`Self::SnapshotCompletion`]
/// deletes rows the staged keys do not name (`WHEN NOT MATCHED BY SOURCE`), and it carries no
/// ranges: a bound by the staged key ranges would keep it from deleting outside them.
#[derive(Debug, Clone, Copy)]
pub(crate) enum MergeScope<'a> {
    /// The rows of the staged keys. The destination side is bounded by ranges covering every
    /// staged key value (implied by the join, so always safe), which lets BigQuery prune what
    /// it scans; no ranges: joined on the key alone.
    StagedKeys(&'a [KeyRange]),
    /// `delete_missing`, a segment that does not complete the run's snapshot: as
    /// [`Self::StagedKeys`], and every matched row records the run (`_filament_run_id`) even
    /// when `order_by` keeps its newer values.
    SnapshotSegment(&'a [KeyRange]),
    /// `delete_missing`, the publication that completes the run's snapshot: the whole table;
    /// rows of keys the run never sent (another run's `_filament_run_id`, or none) are deleted.
    SnapshotCompletion,
}

impl<'a> MergeScope<'a> {
    fn ranges(self) -> &'a [KeyRange] {
        match self {
            MergeScope::StagedKeys(ranges) | MergeScope::SnapshotSegment(ranges) => ranges,
            MergeScope::SnapshotCompletion => &[],
        }
    }

    fn is_snapshot(self) -> bool {
        !matches!(self, MergeScope::StagedKeys(_))
    }
}

/// The load metadata columns a publication sets (declared `metadata_columns`) and the values
/// they take: set by the statement, never staged.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LoadMetadata<'a> {
    pub(crate) columns: &'a [MetadataColumn],
    pub(crate) run_id: &'a str,
    pub(crate) execution_id: &'a str,
}

impl LoadMetadata<'_> {
    /// The value of `column` as a GoogleSQL expression: the statement's `CURRENT_TIMESTAMP()`
    /// (one value for every row of the statement) or a string literal.
    fn value(&self, column: MetadataColumn) -> String {
        match column {
            MetadataColumn::LoadedAt => "CURRENT_TIMESTAMP()".to_string(),
            MetadataColumn::RunId => string_literal(self.run_id),
            MetadataColumn::ExecutionId => string_literal(self.execution_id),
        }
    }

    /// `value AS column` for each metadata column, after the staged columns of a SELECT.
    fn select_items(&self) -> impl Iterator<Item = String> + '_ {
        self.columns.iter().map(|&m| format!("{} AS {}", self.value(m), quote_identifier(m.column_name())))
    }

    fn names(&self) -> impl Iterator<Item = &str> + '_ {
        self.columns.iter().map(|m| -> &str { m.column_name() })
    }
}

/// The declared key columns named as the destination columns spell them (keys match
/// case-insensitively).
pub(crate) fn key_as_named(primary_key: &[String], columns: &[Column]) -> Vec<String> {
    primary_key.iter().filter_map(|k| columns.iter().find(|c| same_name(&c.name, k))).map(|c| c.name.clone()).collect()
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
        WriteMode::History => history::history(publication),
    }
}

/// `widen_columns`: the one DDL statement the gateway submits, widening existing columns to the
/// types the batches send.
pub(crate) fn alter_column_types(destination: &TableRef<'_>, columns: &[(String, BigQueryType)]) -> String {
    let alterations: Vec<String> = columns
        .iter()
        .map(|(column, wider)| format!("ALTER COLUMN {} SET DATA TYPE {}", quote_identifier(column), wider.type_name()))
        .collect();
    format!("ALTER TABLE {} {}", destination.quoted(), alterations.join(", "))
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

/// The staged value of `column` (at SQL expression `expr`) converted to its destination type,
/// and cast into the existing destination column's wider type where set-up found one.
/// Array elements are named `_filament_e{depth}` (offsets `_filament_o{depth}`): reserved, so
/// they cannot shadow a column or field of the same name.
fn converted(expr: &str, column: &Column, depth: usize) -> String {
    if !column.needs_conversion() {
        return expr.to_string();
    }
    if column.repeated {
        let (alias, offset) = (format!("_filament_e{depth}"), format!("_filament_o{depth}"));
        return format!(
            "ARRAY(SELECT {} FROM UNNEST({expr}) AS {alias} WITH OFFSET AS {offset} ORDER BY {offset})",
            converted(&alias, &column.element(), depth + 1)
        );
    }
    let value = match &column.bigquery_type {
        BigQueryType::Struct(fields) => {
            let parts: Vec<String> = fields
                .iter()
                .map(|f| {
                    let field_expr = format!("{expr}.{}", quote_identifier(&f.staged_name()));
                    format!("{} AS {}", converted(&field_expr, f, depth), quote_identifier(&f.name))
                })
                .collect();
            format!("IF({expr} IS NULL, NULL, STRUCT({}))", parts.join(", "))
        }
        other => typed::from_staged(expr, other),
    };
    match &column.published_as {
        Some(wider) => format!("CAST({value} AS {})", wider.type_name()),
        None => value,
    }
}

/// The staged value of a top-level column, converted: what a SELECT over the staging table
/// reads for it.
fn staged_value(column: &Column) -> String {
    converted(&qualified(STAGED_ALIAS, &column.staged_name()), column, 0)
}

/// One select item over the staging table: the staged column (under its staged name),
/// converted where needed, under its own name.
fn select_item(column: &Column) -> String {
    format!("{} AS {}", staged_value(column), quote_identifier(&column.name))
}

/// The destination columns a publication writes: the staged ones, then the metadata columns.
fn written_column_list(p: &Publication<'_>) -> String {
    let names = p.columns.iter().map(|c| c.name.as_str()).chain(p.metadata.names());
    names.map(quote_identifier).collect::<Vec<_>>().join(", ")
}

/// Append modes, `cdc_append` and later segments of `full_replace`: every staged row, once.
fn insert_select(p: &Publication<'_>) -> String {
    let select: Vec<String> = p.columns.iter().map(select_item).chain(p.metadata.select_items()).collect();
    format!(
        "INSERT INTO {} ({})\nSELECT {}\nFROM {} AS {STAGED_ALIAS}",
        p.destination.quoted(),
        written_column_list(p),
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

/// The script of an atomic execution's publication (issue 58 item 4): every statement in
/// order inside one multi-statement transaction, so BigQuery applies all or none of them. A
/// statement that is a transaction of its own (`full_replace`'s) contributes its body:
/// transactions do not nest.
pub(crate) fn atomic_script<'a>(statements: impl IntoIterator<Item = &'a str>) -> String {
    let mut script = String::from("BEGIN TRANSACTION;\n");
    for statement in statements {
        let body = statement
            .strip_prefix("BEGIN TRANSACTION;\n")
            .and_then(|inner| inner.strip_suffix("\nCOMMIT TRANSACTION;"))
            .unwrap_or(statement);
        script.push_str(body.trim_end_matches(';'));
        script.push_str(";\n");
    }
    script.push_str("COMMIT TRANSACTION;");
    script
}

/// A key column as the fold groups it: converted to its destination type, and under the
/// destination's collation where it has one (a key `'A'` and a later `'a'` are one key to an
/// `und:ci` column, so only the later row may reach the MERGE).
fn fold_key(key: &Column, collations: &[(String, Collation)]) -> String {
    let converted = staged_value(key);
    match collations.iter().find(|(column, _)| same_name(column, &key.name)) {
        Some((_, collation)) => format!("COLLATE({converted}, '{}')", collation.as_str()),
        None => converted,
    }
}

/// The columns of `names` in `columns`, in the order of `names` (matched case-insensitively).
fn named<'c>(names: &[String], columns: &'c [Column]) -> Vec<&'c Column> {
    names.iter().filter_map(|n| columns.iter().find(|c| same_name(&c.name, n))).collect()
}

/// Whether the source row's `order_by` values are at least the target row's, compared in order
/// (a NULL in the target loses; staged values are never NULL): for `(a, b)`,
/// `(T.a IS NULL OR S.a > T.a OR (S.a = T.a AND (T.b IS NULL OR S.b >= T.b)))`.
fn not_older(order: &[&Column]) -> Option<String> {
    let (last, earlier) = order.split_last()?;
    let (source, target) =
        (|c: &Column| qualified(SOURCE_ALIAS, &c.name), |c: &Column| qualified(TARGET_ALIAS, &c.name));
    let mut condition = format!("({} IS NULL OR {} >= {})", target(last), source(last), target(last));
    for column in earlier.iter().rev() {
        let (s, t) = (source(column), target(column));
        condition = format!("({t} IS NULL OR {s} > {t} OR ({s} = {t} AND {condition}))");
    }
    Some(condition)
}

/// Keyed modes: fold every key to its last staged operation (by the `order_by` values, then
/// `_filament_seq`), then one MERGE: deletes remove the key, everything else updates or inserts
/// it; with `order_by`, a matched row changes only for a change at least as new as it.
fn merge(p: &Publication<'_>) -> String {
    let shape = MergeShape::of(p);
    let mut statement = merge_source(p, &shape);
    let newer = not_older(&shape.order_columns).map_or(String::new(), |condition| format!(" AND {condition}"));
    let op = qualified(SOURCE_ALIAS, OP_COLUMN);
    if shape.deletes {
        let guard = if shape.upserts { format!(" AND {op} = 'delete'") } else { String::new() };
        let action = match p.deletes {
            Deletes::Hard => "DELETE".to_string(),
            Deletes::Soft => format!("UPDATE SET {}", soft_delete_assignments(p, &shape).join(", ")),
        };
        statement.push_str(&format!("\nWHEN MATCHED{guard}{newer} THEN {action}"));
    }
    if shape.upserts {
        let mut updated: Vec<&str> = p.columns.iter().filter(|c| !shape.is_key(c)).map(|c| c.name.as_str()).collect();
        updated.extend(p.metadata.names());
        let mut updates: Vec<String> = updated.iter().map(|name| assignment(name)).collect();
        if p.deletes == Deletes::Soft {
            updates.push(format!("{} = NULL", quote_identifier(DELETED_AT_COLUMN)));
        }
        if !updates.is_empty() {
            statement.push_str(&format!("\nWHEN MATCHED{newer} THEN UPDATE SET {}", updates.join(", ")));
        }
        if p.scope.is_snapshot() && !newer.is_empty() {
            // A newer destination row keeps its values, but the run saw its key: it is part of
            // the snapshot (and alive, under soft deletes).
            let mut seen = vec![assignment(MetadataColumn::RunId.column_name())];
            if p.deletes == Deletes::Soft {
                seen.push(format!("{} = NULL", quote_identifier(DELETED_AT_COLUMN)));
            }
            statement.push_str(&format!("\nWHEN MATCHED THEN UPDATE SET {}", seen.join(", ")));
        }
        let guard = if shape.deletes { format!(" AND {op} != 'delete'") } else { String::new() };
        let values: Vec<String> = p
            .columns
            .iter()
            .map(|c| c.name.as_str())
            .chain(p.metadata.names())
            .map(|name| qualified(SOURCE_ALIAS, name))
            .collect();
        statement.push_str(&format!(
            "\nWHEN NOT MATCHED{guard} THEN INSERT ({}) VALUES ({})",
            written_column_list(p),
            values.join(", ")
        ));
    }
    if let MergeScope::SnapshotCompletion = p.scope {
        let target = |column: &str| qualified(TARGET_ALIAS, column);
        let action = match p.deletes {
            Deletes::Hard => "DELETE".to_string(),
            Deletes::Soft => format!("UPDATE SET {} = CURRENT_TIMESTAMP()", quote_identifier(DELETED_AT_COLUMN)),
        };
        let missing = missing_from_run(target, p.metadata.run_id, p.deletes);
        statement.push_str(&format!("\nWHEN NOT MATCHED BY SOURCE AND {missing} THEN {action}"));
    }
    statement
}

/// The destination rows of keys the run did not send: another run's, or no run's (written
/// before `delete_missing`); under soft deletes, only those not marked yet.
fn missing_from_run(column: impl Fn(&str) -> String, run_id: &str, deletes: Deletes) -> String {
    let run = column(MetadataColumn::RunId.column_name());
    let mut missing = format!("({run} IS NULL OR {run} != {})", string_literal(run_id));
    if deletes == Deletes::Soft {
        missing.push_str(&format!(" AND {} IS NULL", column(DELETED_AT_COLUMN)));
    }
    missing
}

/// `delete_missing`'s completing publication when the execution staged no rows of the resource:
/// the keys the run did not send are deleted (or soft-deleted), as the MERGE's
/// `WHEN NOT MATCHED BY SOURCE` would.
pub(crate) fn delete_missing_statement(destination: &TableRef<'_>, run_id: &str, deletes: Deletes) -> String {
    let condition = missing_from_run(quote_identifier, run_id, deletes);
    match deletes {
        Deletes::Hard => format!("DELETE FROM {} WHERE {condition}", destination.quoted()),
        Deletes::Soft => format!(
            "UPDATE {} SET {} = CURRENT_TIMESTAMP() WHERE {condition}",
            destination.quoted(),
            quote_identifier(DELETED_AT_COLUMN)
        ),
    }
}

/// What a keyed publication's MERGE is made of.
struct MergeShape<'c> {
    /// Whether it deletes (cdc_merge, incremental_delete) and upserts (all but
    /// incremental_delete): only cdc_merge mixes operations.
    deletes: bool,
    upserts: bool,
    key_columns: Vec<&'c Column>,
    order_columns: Vec<&'c Column>,
}

impl<'c> MergeShape<'c> {
    fn of(p: &Publication<'c>) -> Self {
        let (deletes, upserts) = match p.write_mode {
            WriteMode::CdcMerge => (true, true),
            WriteMode::IncrementalDelete => (true, false),
            _ => (false, true),
        };
        Self { deletes, upserts, key_columns: named(p.key, p.columns), order_columns: named(p.order_by, p.columns) }
    }

    fn is_key(&self, column: &Column) -> bool {
        self.key_columns.iter().any(|k| k.name == column.name)
    }

    /// Whether the source carries the load metadata: whenever a matched row may stay.
    fn sets_metadata(&self, deletes: Deletes) -> bool {
        self.upserts || deletes == Deletes::Soft
    }
}

/// `column BETWEEN min AND max` for each key column the scope holds a range of, the column
/// written by `column` (qualified as the caller's range variable names it).
fn key_range_bounds(scope: MergeScope<'_>, keys: &[&Column], column: impl Fn(&str) -> String) -> Vec<String> {
    let mut bounds = Vec::new();
    for k in keys {
        let range = scope.ranges().iter().find(|r| same_name(&r.column, &k.name));
        if let Some((min, max)) = range.and_then(|r| r.min.sql_literal().zip(r.max.sql_literal())) {
            bounds.push(format!("{} BETWEEN {min} AND {max}", column(&k.name)));
        }
    }
    bounds
}

/// `column = source.column`.
fn assignment(column: &str) -> String {
    format!("{} = {}", quote_identifier(column), qualified(SOURCE_ALIAS, column))
}

/// A soft delete keeps the row's values, stamps `_filament_deleted_at` (unless an earlier
/// delete did: it keeps the first deletion's time), takes the delete's
/// `order_by` values (so a later change older than the delete stays ignored) and its load
/// metadata.
fn soft_delete_assignments(p: &Publication<'_>, shape: &MergeShape<'_>) -> Vec<String> {
    let deleted_at = quote_identifier(DELETED_AT_COLUMN);
    let first_deleted = format!("IFNULL({}, CURRENT_TIMESTAMP())", qualified(TARGET_ALIAS, DELETED_AT_COLUMN));
    let mut assignments = vec![format!("{deleted_at} = {first_deleted}")];
    assignments.extend(shape.order_columns.iter().filter(|c| !shape.is_key(c)).map(|c| assignment(&c.name)));
    assignments.extend(p.metadata.names().map(assignment));
    assignments
}

/// `MERGE target USING (the folded staged rows) ON key [AND key BETWEEN range]`: each key's
/// last change by the `order_by` values, then `_filament_seq`.
fn merge_source(p: &Publication<'_>, shape: &MergeShape<'_>) -> String {
    let (source, target) = (|c: &str| qualified(SOURCE_ALIAS, c), |c: &str| qualified(TARGET_ALIAS, c));
    let mut select: Vec<String> = p.columns.iter().map(select_item).collect();
    if shape.sets_metadata(p.deletes) {
        select.extend(p.metadata.select_items());
    }
    if shape.deletes && shape.upserts {
        select.push(qualified(STAGED_ALIAS, OP_COLUMN));
    }
    let partition: Vec<String> = shape.key_columns.iter().map(|k| fold_key(k, p.key_collations)).collect();
    let mut fold_order: Vec<String> = shape.order_columns.iter().map(|c| format!("{} DESC", staged_value(c))).collect();
    fold_order.push(format!("{} DESC", qualified(STAGED_ALIAS, SEQ_COLUMN)));
    let mut on: Vec<String> =
        shape.key_columns.iter().map(|k| format!("{} = {}", target(&k.name), source(&k.name))).collect();
    on.extend(key_range_bounds(p.scope, &shape.key_columns, target));
    format!(
        "MERGE {} AS {TARGET_ALIAS}\nUSING (\n  SELECT {}\n  FROM {} AS {STAGED_ALIAS}\n  WHERE TRUE\n  QUALIFY ROW_NUMBER() OVER (PARTITION BY {} ORDER BY {}) = 1\n) AS {SOURCE_ALIAS}\nON {}",
        p.destination.quoted(),
        select.join(", "),
        p.staging.quoted(),
        partition.join(", "),
        fold_order.join(", "),
        on.join(" AND "),
    )
}

#[cfg(test)]
#[path = "sql_tests.rs"]
mod tests;
