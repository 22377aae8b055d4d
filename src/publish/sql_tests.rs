use super::*;
use crate::model::key_ranges::KeyValue;

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

fn bounded(write_mode: WriteMode, columns: &[Column], key: &[String], ranges: &[KeyRange], replace: bool) -> String {
    publication_statement(&plain(write_mode, columns, key, ranges, replace))
}

/// A publication with no ordering, collations or metadata columns, and hard deletes.
fn plain<'a>(
    write_mode: WriteMode,
    columns: &'a [Column],
    key: &'a [String],
    ranges: &'a [KeyRange],
    replace: bool,
) -> Publication<'a> {
    Publication {
        destination: DESTINATION,
        staging: STAGING,
        write_mode,
        columns,
        key,
        order_by: &[],
        scope: MergeScope::StagedKeys(ranges),
        key_collations: &[],
        replace,
        metadata: NO_METADATA,
        deletes: Deletes::Hard,
    }
}

const NO_METADATA: LoadMetadata<'static> = LoadMetadata { columns: &[], run_id: "run-1", execution_id: "exec-1" };

fn with_metadata(write_mode: WriteMode, columns: &[Column], key: &[String], replace: bool) -> String {
    let ranges = id_range(3, 97);
    publication_statement(&Publication {
        metadata: LoadMetadata { columns: &MetadataColumn::ALL, run_id: "run-1", execution_id: "o'exec" },
        ..plain(write_mode, columns, key, &ranges, replace)
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
    let ranges = id_range(1, 9);
    let sql = publication_statement(&Publication {
        key_collations: &collations,
        ..plain(WriteMode::IncrementalUpsert, &columns, &key, &ranges, false)
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
fn geography_range_and_interval_are_built_by_their_constructors() {
    use crate::model::columns::{GeographyEncoding, RangeElement};
    let columns = vec![
        Column::new("id", BigQueryType::Int64),
        Column::new("shape", BigQueryType::Geography(GeographyEncoding::Wkb)),
        Column::new("parcel", BigQueryType::Geography(GeographyEncoding::PlanarWkb)),
        Column::new("route", BigQueryType::Geography(GeographyEncoding::PlanarWkt)),
        Column::new("outline", BigQueryType::Geography(GeographyEncoding::Wkt)),
        Column::repeated("places", BigQueryType::Geography(GeographyEncoding::WktOrGeoJson)),
        Column::new("stay", BigQueryType::Range(RangeElement::Date)),
        Column::new("open", BigQueryType::Range(RangeElement::Timestamp)),
        Column::new("wait", BigQueryType::Interval),
    ];
    insta::assert_snapshot!(statement(WriteMode::FullAppend, &columns, &[], false));
}

#[test]
fn flexible_names_are_read_under_their_staged_names_and_written_under_their_own() {
    let columns = vec![
        Column::new("first name", BigQueryType::String),
        Column::new("Größe", BigQueryType::Int64),
        Column::new("plain", BigQueryType::Struct(vec![Column::new("a&b", BigQueryType::Numeric)])),
        Column::new("revenue-2024", BigQueryType::Float64),
    ];
    let key = ["first name".to_string()];
    let merged = with_metadata(WriteMode::IncrementalUpsert, &columns, &key, false);
    assert!(merged.contains(&format!("_filament_staged.`{}` AS `first name`", columns[0].staged_name())));
    assert!(!merged.contains("_filament_staged.`first name`"), "the staging table has no flexible name");
    insta::assert_snapshot!(merged);
}

#[test]
fn columns_an_existing_table_holds_wider_are_cast_into_its_type() {
    let mut count = Column::new("count", BigQueryType::Int64);
    count.published_as = Some(BigQueryType::Float64);
    let mut price = Column::repeated("prices", BigQueryType::Numeric);
    price.published_as = Some(BigQueryType::BigNumeric);
    let mut id = Column::new("id", BigQueryType::Int64);
    id.published_as = Some(BigQueryType::Numeric);
    let merged = statement(WriteMode::IncrementalUpsert, &[id, count, price], &["id".to_string()], false);
    assert!(merged.contains("CAST(_filament_staged.`id` AS NUMERIC) AS `id`"), "{merged}");
    assert!(merged.contains("PARTITION BY CAST(_filament_staged.`id` AS NUMERIC)"), "{merged}");
    assert!(merged.contains("CAST(_filament_staged.`count` AS FLOAT64) AS `count`"), "{merged}");
    assert!(merged.contains("CAST(PARSE_NUMERIC(_filament_e0) AS BIGNUMERIC)"), "{merged}");
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
fn metadata_columns_are_set_by_the_statement_in_every_mode() {
    let key = vec!["id".to_string()];
    let insert = with_metadata(WriteMode::FullAppend, &columns(), &[], false);
    assert!(
        insert.contains("(`id`, `name`, `balance`, `updated_at`, `_filament_loaded_at`, `_filament_run_id`, `_filament_execution_id`)"),
        "{insert}"
    );
    assert!(insert.contains("CURRENT_TIMESTAMP() AS `_filament_loaded_at`, 'run-1' AS `_filament_run_id`, 'o\\'exec' AS `_filament_execution_id`"), "{insert}");
    insta::assert_snapshot!("metadata_insert", insert);
    insta::assert_snapshot!("metadata_replace", with_metadata(WriteMode::FullReplace, &columns(), &[], true));
    insta::assert_snapshot!("metadata_cdc_merge", with_metadata(WriteMode::CdcMerge, &columns(), &key, false));
    // A key-only upsert still refreshes the metadata of the rows it matches.
    let key_only = with_metadata(WriteMode::IncrementalUpsert, &columns()[..1], &key, false);
    assert!(
        key_only
            .contains("WHEN MATCHED THEN UPDATE SET `_filament_loaded_at` = _filament_source.`_filament_loaded_at`"),
        "{key_only}"
    );
    // Deleted rows carry nothing: a delete-only MERGE sets no metadata.
    let deletes = with_metadata(WriteMode::IncrementalDelete, &columns()[..1], &key, false);
    assert!(!deletes.contains("_filament_loaded_at"), "{deletes}");
}

fn ordered(write_mode: WriteMode, columns: &[Column], order_by: &[String]) -> String {
    let (key, ranges) = (["id".to_string()], id_range(3, 97));
    publication_statement(&Publication { order_by, ..plain(write_mode, columns, &key, &ranges, false) })
}

#[test]
fn order_by_folds_by_its_values_first_and_never_rolls_a_row_back() {
    let one = ordered(WriteMode::CdcMerge, &columns(), &["updated_at".to_string()]);
    assert!(
        one.contains("ORDER BY _filament_staged.`updated_at` DESC, _filament_staged.`_filament_seq` DESC"),
        "{one}"
    );
    let newer =
        "(_filament_target.`updated_at` IS NULL OR _filament_source.`updated_at` >= _filament_target.`updated_at`)";
    assert!(
        one.contains(&format!("WHEN MATCHED AND _filament_source.`_filament_op` = 'delete' AND {newer} THEN DELETE")),
        "{one}"
    );
    assert!(one.contains(&format!("WHEN MATCHED AND {newer} THEN UPDATE SET")), "{one}");
    insta::assert_snapshot!("order_by_cdc_merge", one);
    // A NUMERIC order folds by its value, not its staged text; a list compares in order.
    let listed = ordered(WriteMode::IncrementalUpsert, &columns(), &["balance".to_string(), "updated_at".to_string()]);
    assert!(
        listed.contains("ORDER BY PARSE_NUMERIC(_filament_staged.`balance`) DESC, _filament_staged.`updated_at` DESC"),
        "{listed}"
    );
    insta::assert_snapshot!("order_by_listed_upsert", listed);
    let deletes = ordered(WriteMode::IncrementalDelete, &columns(), &["updated_at".to_string()]);
    assert!(deletes.contains(&format!("WHEN MATCHED AND {newer} THEN DELETE")), "{deletes}");
}

#[test]
fn soft_deletes_keep_the_row_stamp_it_once_and_take_the_deletes_order() {
    let (key, order_by) = (["id".to_string()], ["updated_at".to_string()]);
    let soft = |write_mode, columns: &[Column], metadata| {
        publication_statement(&Publication {
            order_by: &order_by,
            metadata,
            deletes: Deletes::Soft,
            ..plain(write_mode, columns, &key, &[], false)
        })
    };
    let all = LoadMetadata { columns: &[MetadataColumn::LoadedAt], run_id: "r", execution_id: "e" };
    let merged = soft(WriteMode::CdcMerge, &columns(), all);
    assert!(!merged.contains("THEN DELETE"), "{merged}");
    assert!(
        merged.contains(
            "THEN UPDATE SET `_filament_deleted_at` = IFNULL(_filament_target.`_filament_deleted_at`, CURRENT_TIMESTAMP()), `updated_at` = _filament_source.`updated_at`, `_filament_loaded_at` = _filament_source.`_filament_loaded_at`\n"
        ),
        "{merged}"
    );
    assert!(merged.contains(", `_filament_deleted_at` = NULL\nWHEN NOT MATCHED"), "an upsert clears it: {merged}");
    insta::assert_snapshot!("soft_deletes_cdc_merge", merged);
    let deleted = soft(WriteMode::IncrementalDelete, &[columns()[0].clone(), columns()[3].clone()], NO_METADATA);
    insta::assert_snapshot!("soft_deletes_incremental_delete", deleted);
}

#[test]
fn history_closes_the_current_version_and_inserts_every_new_one() {
    let key = ["id".to_string()];
    let history = |order_by: &[String]| {
        let (columns, ranges) = (columns(), id_range(3, 97));
        publication_statement(&Publication {
            order_by,
            metadata: LoadMetadata { columns: &[MetadataColumn::RunId], run_id: "r", execution_id: "e" },
            ..plain(WriteMode::History, &columns, &key, &ranges, false)
        })
    };
    let ordered = history(&["updated_at".to_string()]);
    assert!(ordered.contains("_filament_staged.`updated_at` AS _filament_from"), "{ordered}");
    assert!(ordered.contains("WHERE TRUE AND _filament_d.`id` BETWEEN 3 AND 97"), "{ordered}");
    assert!(
        ordered.contains("ON _filament_target.`id` = _filament_source.`_filament_merge_k0` AND _filament_target.`_filament_is_current` AND _filament_target.`id` BETWEEN 3 AND 97"),
        "{ordered}"
    );
    assert!(ordered.contains("_filament_c._filament_from >= _filament_k._filament_latest"), "{ordered}");
    insta::assert_snapshot!("history_ordered", ordered);
    let by_publication = history(&[]);
    assert!(by_publication.contains("CURRENT_TIMESTAMP() AS _filament_from"), "{by_publication}");
    assert!(
        !by_publication.contains(">= _filament_k._filament_latest"),
        "no late changes without order: {by_publication}"
    );
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

#[test]
fn an_atomic_script_holds_every_statement_in_one_transaction() {
    let key = ["id".to_string()];
    let replace = statement(WriteMode::FullReplace, &columns(), &[], true);
    let merge = statement(WriteMode::IncrementalUpsert, &columns(), &key, false);
    let script = atomic_script([replace.as_str(), merge.as_str()]);
    assert_eq!(script.matches("BEGIN TRANSACTION;").count(), 1, "{script}");
    assert_eq!(script.matches("COMMIT TRANSACTION;").count(), 1, "{script}");
    assert!(script.starts_with("BEGIN TRANSACTION;\nTRUNCATE TABLE") && script.ends_with(";\nCOMMIT TRANSACTION;"));
    assert!(script.find("TRUNCATE").unwrap() < script.find("MERGE").unwrap(), "in order: {script}");
    insta::assert_snapshot!("atomic_replace_then_merge", script);
}
