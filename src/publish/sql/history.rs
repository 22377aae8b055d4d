//! `history` publications (SCD2): the one MERGE that keeps every version of each key, built
//! from the same quoting and conversions as the other statements ([`super`]).

use super::{
    Publication, SOURCE_ALIAS, STAGED_ALIAS, TARGET_ALIAS, key_range_bounds, named, qualified, quote_identifier,
    select_item, staged_value,
};
use crate::model::columns::Column;
use crate::model::staging::{OP_COLUMN, SEQ_COLUMN};
use crate::model::write_options::{DELETED_AT_COLUMN, IS_CURRENT_COLUMN, VALID_FROM_COLUMN, VALID_TO_COLUMN};

/// `history`: every version of each key (SCD2) in one MERGE of the union-of-source form. The
/// source holds, per key, the changes that differ from the version before them (the
/// destination's current version for the first; identical rows and repeated deletes make no
/// version), in (`order_by` value, `_filament_seq`) order, each twice over `UNNEST([TRUE,
/// FALSE])`: as the closer of the destination's current version (the key's first change only,
/// joined on the key) and as a new version (not deletes; NULL merge keys, so it never matches).
/// A version ends where the next change starts; a delete closes one and marks it
/// `_filament_deleted_at`. With `order_by`, changes older than the key's latest version (the
/// current one's start, or where the delete that closed the last one happened) are ignored.
pub(super) fn history(p: &Publication<'_>) -> String {
    let keys = named(p.key, p.columns);
    let order = named(p.order_by, p.columns).first().copied();
    let key_list = keys.iter().map(|k| quote_identifier(&k.name)).collect::<Vec<_>>().join(", ");
    let window = format!("PARTITION BY {key_list} ORDER BY _filament_from, _filament_seq");
    let state = |alias: &str| {
        let columns: Vec<String> = p.columns.iter().map(|c| qualified(alias, &c.name)).collect();
        format!("TO_JSON_STRING(STRUCT({}))", columns.join(", "))
    };
    let mut changes: Vec<String> = p.columns.iter().map(select_item).chain(p.metadata.select_items()).collect();
    changes.push(format!("IFNULL({}, 'upsert') AS _filament_op", qualified(STAGED_ALIAS, OP_COLUMN)));
    let from = order.map_or("CURRENT_TIMESTAMP()".to_string(), staged_value);
    changes.push(format!("{from} AS _filament_from"));
    changes.push(format!("{} AS _filament_seq", qualified(STAGED_ALIAS, SEQ_COLUMN)));
    let mut latest_filter = vec!["TRUE".to_string()];
    latest_filter.extend(key_range_bounds(p.scope, &keys, |name| qualified("_filament_d", name)));
    let joined: Vec<String> = keys
        .iter()
        .map(|k| format!("{} = {}", qualified("_filament_c", &k.name), qualified("_filament_k", &k.name)))
        .collect();
    let not_late = match order {
        Some(_) => {
            "\n    WHERE _filament_k._filament_latest IS NULL OR _filament_c._filament_from >= _filament_k._filament_latest"
        }
        None => "",
    };
    let merge_keys: Vec<String> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| format!("IF(_filament_closes, {}, NULL) AS _filament_merge_k{i}", quote_identifier(&k.name)))
        .collect();
    let source = format!(
        "WITH _filament_changes AS (\n    SELECT {changes}\n    FROM {staging} AS {STAGED_ALIAS}\n  ),\n  \
         _filament_latest AS (\n    SELECT {key_list}, IF({is_current}, {current_state}, NULL) AS _filament_state, \
         IFNULL({valid_to}, {valid_from}) AS _filament_latest\n    \
         FROM {destination} AS _filament_d\n    WHERE {latest_filter}\n    \
         QUALIFY ROW_NUMBER() OVER (PARTITION BY {key_list} ORDER BY {is_current} DESC, {valid_to} DESC, {valid_from} DESC) = 1\n  ),\n  \
         _filament_stated AS (\n    SELECT _filament_c.*, IF(_filament_c._filament_op = 'delete', NULL, {change_state}) AS _filament_state, \
         _filament_k._filament_state AS _filament_current_state\n    \
         FROM _filament_changes AS _filament_c LEFT JOIN _filament_latest AS _filament_k ON {joined}{not_late}\n  ),\n  \
         _filament_effective AS (\n    SELECT * FROM (\n      SELECT *, IF(ROW_NUMBER() OVER ({window}) = 1, _filament_current_state, \
         LAG(_filament_state) OVER ({window})) AS _filament_previous_state\n      FROM _filament_stated\n    )\n    \
         WHERE IFNULL(_filament_state, '') != IFNULL(_filament_previous_state, '')\n  ),\n  \
         _filament_versions AS (\n    SELECT *, ROW_NUMBER() OVER ({window}) AS _filament_n, LEAD(_filament_from) OVER ({window}) AS _filament_to, \
         LEAD(_filament_op) OVER ({window}) AS _filament_next_op\n    FROM _filament_effective\n  )\n  \
         SELECT {merge_keys}, _filament_versions.*, _filament_closes\n  \
         FROM _filament_versions CROSS JOIN UNNEST([TRUE, FALSE]) AS _filament_closes\n  \
         WHERE IF(_filament_closes, _filament_n = 1, _filament_op != 'delete')",
        changes = changes.join(", "),
        staging = p.staging.quoted(),
        current_state = state("_filament_d"),
        valid_from = qualified("_filament_d", VALID_FROM_COLUMN),
        valid_to = qualified("_filament_d", VALID_TO_COLUMN),
        is_current = qualified("_filament_d", IS_CURRENT_COLUMN),
        destination = p.destination.quoted(),
        latest_filter = latest_filter.join(" AND "),
        change_state = state("_filament_c"),
        joined = joined.join(" AND "),
        merge_keys = merge_keys.join(", "),
    );
    let target_bounds = key_range_bounds(p.scope, &keys, |name| qualified(TARGET_ALIAS, name));
    history_merge(p, &keys, &source, &target_bounds)
}

/// The MERGE around `history`'s source: closers update the current version, new versions are
/// inserted.
fn history_merge(p: &Publication<'_>, keys: &[&Column], source: &str, target_bounds: &[String]) -> String {
    let s = |column: &str| qualified(SOURCE_ALIAS, column);
    let mut on: Vec<String> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| format!("{} = {}", qualified(TARGET_ALIAS, &k.name), s(&format!("_filament_merge_k{i}"))))
        .collect();
    on.push(qualified(TARGET_ALIAS, IS_CURRENT_COLUMN));
    // Implied by the join (every closer's key is staged), and lets BigQuery prune the target.
    on.extend(target_bounds.iter().cloned());
    let deleted_now = |op: &str| format!("IF({} = 'delete', CURRENT_TIMESTAMP(), NULL)", s(op));
    let mut columns: Vec<String> = p.columns.iter().map(|c| c.name.clone()).collect();
    columns.extend(p.metadata.names().map(str::to_string));
    let mut values: Vec<String> = columns.iter().map(|c| s(c)).collect();
    columns.extend([VALID_FROM_COLUMN, VALID_TO_COLUMN, IS_CURRENT_COLUMN, DELETED_AT_COLUMN].map(str::to_string));
    values.extend([
        s("_filament_from"),
        s("_filament_to"),
        format!("{} IS NULL", s("_filament_next_op")),
        deleted_now("_filament_next_op"),
    ]);
    let columns: Vec<String> = columns.iter().map(|c| quote_identifier(c)).collect();
    format!(
        "MERGE {} AS {TARGET_ALIAS}\nUSING (\n  {source}\n) AS {SOURCE_ALIAS}\nON {}\n\
         WHEN MATCHED THEN UPDATE SET {} = {}, {} = FALSE, {} = {}\n\
         WHEN NOT MATCHED AND NOT {} THEN INSERT ({}) VALUES ({})",
        p.destination.quoted(),
        on.join(" AND "),
        quote_identifier(VALID_TO_COLUMN),
        s("_filament_from"),
        quote_identifier(IS_CURRENT_COLUMN),
        quote_identifier(DELETED_AT_COLUMN),
        deleted_now("_filament_op"),
        s("_filament_closes"),
        columns.join(", "),
        values.join(", "),
    )
}
