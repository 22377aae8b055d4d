//! How a publication writes beyond its write mode: the options of a resource declaration that
//! shape the publication's statement (`docs/write-modes.md`): which columns order a keyed
//! mode's changes (`order_by`: the largest value wins, an older change never rolls a row back),
//! what a delete does ([`Deletes`]), whether a `full_upsert` run is a snapshot that deletes the
//! keys it did not send (`delete_missing`), and which load metadata columns each published row
//! carries ([`MetadataColumn`]); and the columns the publication adds for them and for
//! `history` (`WriteOptions::publication_columns`).
//!
//! Declared on `PUT /v1/runs/{run}/resources/{resource}` (`api::runs`), stored with the resource
//! (`store::runs`, one JSONB column so later options need no migration), covered by the
//! publication's fingerprint (`publish::fingerprint`), added to the destination table at set-up
//! (`pipeline::lane::set_up`) and set by the statement (`publish::sql`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::WriteMode;
use super::columns::{BigQueryType, Column, MAX_KEY_COLUMNS};
use super::ids::validate_column_name;
use crate::error::{ErrorCode, Problem};

/// `order_by` as declared: one column, or a list compared in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub(crate) enum OrderByDeclaration {
    Column(String),
    Columns(Vec<String>),
}

impl OrderByDeclaration {
    fn columns(&self) -> &[String] {
        match self {
            OrderByDeclaration::Column(column) => std::slice::from_ref(column),
            OrderByDeclaration::Columns(columns) => columns,
        }
    }
}

/// A column the publication sets on every row it writes, from the publication itself rather
/// than from the batches: nothing of it is staged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MetadataColumn {
    /// `_filament_loaded_at` TIMESTAMP: when the publication ran (`CURRENT_TIMESTAMP()` of its
    /// statement, the same for every row it writes).
    LoadedAt,
    /// `_filament_run_id` STRING: the run that published the row.
    RunId,
    /// `_filament_execution_id` STRING: the execution that published the row.
    ExecutionId,
}

impl MetadataColumn {
    /// Every metadata column, in the order they follow the data columns.
    pub const ALL: [MetadataColumn; 3] = [MetadataColumn::LoadedAt, MetadataColumn::RunId, MetadataColumn::ExecutionId];

    /// The destination column's name (reserved prefix: no data column can take it).
    pub fn column_name(self) -> &'static str {
        match self {
            MetadataColumn::LoadedAt => "_filament_loaded_at",
            MetadataColumn::RunId => "_filament_run_id",
            MetadataColumn::ExecutionId => "_filament_execution_id",
        }
    }

    /// The destination column, NULLABLE like any column the gateway adds.
    pub(crate) fn column(self) -> Column {
        let bigquery_type = match self {
            MetadataColumn::LoadedAt => BigQueryType::Timestamp,
            MetadataColumn::RunId | MetadataColumn::ExecutionId => BigQueryType::String,
        };
        Column::new(self.column_name(), bigquery_type)
    }
}

/// What a delete does to the destination row (keyed modes: cdc_merge and incremental_delete
/// delete; an upsert resource declared `soft` clears the mark its table's deletes set).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Deletes {
    /// The row is removed.
    #[default]
    Hard,
    /// The row stays with its last values and `_filament_deleted_at` set to the publication's
    /// time; a later insert, update or upsert of the key clears it.
    Soft,
}

impl Deletes {
    fn is_hard(&self) -> bool {
        *self == Deletes::Hard
    }
}

/// The column a soft delete sets (TIMESTAMP, NULLABLE).
pub const DELETED_AT_COLUMN: &str = "_filament_deleted_at";
/// `history`: where a version starts (the change's `order_by` value, else the publication's
/// time), where it ends (the next version's start, NULL for the current one), and whether it is
/// the key's current version.
pub const VALID_FROM_COLUMN: &str = "_filament_valid_from";
pub const VALID_TO_COLUMN: &str = "_filament_valid_to";
pub const IS_CURRENT_COLUMN: &str = "_filament_is_current";

/// The write path a declaration asks for: through staging (the default), or, declared
/// `direct_append`, straight into the destination where set-up finds the batches' columns go
/// in as they are (set-up decides the [`WritePath`](super::staging::WritePath) its lane takes).
/// Stored, answered and fingerprinted as the declaration's `direct_append` bool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "bool", into = "bool")]
pub(crate) enum DeclaredPath {
    #[default]
    Staging,
    Direct,
}

impl DeclaredPath {
    fn is_staging(&self) -> bool {
        *self == DeclaredPath::Staging
    }
}

/// The stored `direct_append`.
impl From<bool> for DeclaredPath {
    fn from(direct_append: bool) -> Self {
        if direct_append { DeclaredPath::Direct } else { DeclaredPath::Staging }
    }
}

/// As stored: `direct_append`.
impl From<DeclaredPath> for bool {
    fn from(path: DeclaredPath) -> Self {
        path == DeclaredPath::Direct
    }
}

/// The write options as a declaration states them (each absent one takes its default).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct DeclaredWriteOptions<'a> {
    pub(crate) order_by: Option<&'a OrderByDeclaration>,
    pub(crate) metadata_columns: Option<&'a [MetadataColumn]>,
    pub(crate) deletes: Option<Deletes>,
    pub(crate) delete_missing: Option<bool>,
    pub(crate) widen_columns: Option<bool>,
    pub(crate) direct_append: Option<bool>,
}

/// The declaration's write options. The default writes as the seed's modes do.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WriteOptions {
    /// Keyed modes: the columns whose largest value (compared in order, then by arrival) wins
    /// the fold and the MERGE; empty: arrival order alone, as the seed's modes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) order_by: Vec<String>,
    /// Distinct, in [`MetadataColumn::ALL`] order (so two declarations listing the same columns
    /// in another order are the same declaration).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) metadata_columns: Vec<MetadataColumn>,
    /// What a delete does (keyed modes only take `soft`).
    #[serde(default, skip_serializing_if = "Deletes::is_hard")]
    pub(crate) deletes: Deletes,
    /// `full_upsert`: the run is a snapshot; the publication that completes it deletes (or
    /// soft-deletes) every key the run did not send. Implies the `run_id` metadata column,
    /// which records the run that last sent each key.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) delete_missing: bool,
    /// Set-up widens an existing destination column narrower than the batches' type
    /// (`ALTER TABLE ... ALTER COLUMN ... SET DATA TYPE`, `bigquery::metadata::widenings`): the
    /// one departure from "no DDL", declared per resource.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) widen_columns: bool,
    /// Append modes: the lane writes its PENDING stream into the destination table itself and
    /// the publication commits it (`BatchCommitWriteStreams`), with no staging table and no
    /// query job, where set-up finds the batches' columns go in as they are
    /// (`pipeline::lane::write_path`); otherwise the resource loads through staging as usual.
    /// Stored as `direct_append`.
    #[serde(rename = "direct_append", default, skip_serializing_if = "DeclaredPath::is_staging")]
    pub(crate) write_path: DeclaredPath,
}

impl WriteOptions {
    /// The options of a declaration of `write_mode`: `order_by` only for the keyed modes, 1 to
    /// 16 distinct column names (`invalid_order_by`); `metadata_columns` each at most once
    /// (`invalid_request`); soft `deletes` only for the keyed modes (`invalid_deletes`);
    /// `delete_missing` only for `full_upsert` (`invalid_delete_missing`), adding `run_id` to
    /// the metadata columns; `direct_append` only for the append modes and without metadata
    /// columns, which only a statement sets (`invalid_direct_append`).
    pub(crate) fn parse(write_mode: WriteMode, declared: DeclaredWriteOptions<'_>) -> Result<Self, Problem> {
        let DeclaredWriteOptions { order_by, metadata_columns, deletes, delete_missing, widen_columns, direct_append } =
            declared;
        let delete_missing = delete_missing.unwrap_or(false);
        if delete_missing && write_mode != WriteMode::FullUpsert {
            return Err(Problem::new(
                ErrorCode::InvalidDeleteMissing,
                format!("delete_missing makes a full_upsert run a snapshot; {write_mode} is not full_upsert"),
            ));
        }
        let deletes = deletes.unwrap_or_default();
        if deletes == Deletes::Soft && write_mode == WriteMode::History {
            return Err(Problem::new(
                ErrorCode::InvalidDeletes,
                "history closes a deleted key's current version and marks it _filament_deleted_at itself; \
                 declare no deletes option",
            ));
        }
        if deletes == Deletes::Soft && !write_mode.is_merge() {
            return Err(Problem::new(
                ErrorCode::InvalidDeletes,
                format!(
                    "deletes: soft applies to the keyed modes, whose rows a delete can keep; {write_mode} is not one"
                ),
            ));
        }
        let order_by = match order_by {
            Some(declared) => parse_order_by(write_mode, declared.columns())?,
            None => Vec::new(),
        };
        let mut columns = metadata_columns.unwrap_or_default().to_vec();
        columns.sort_unstable();
        if let Some(pair) = columns.windows(2).find(|pair| pair[0] == pair[1]) {
            return Err(Problem::invalid_request(format!(
                "metadata_columns lists {} twice",
                serde_json::to_string(&pair[0]).unwrap_or_default()
            )));
        }
        if delete_missing && !columns.contains(&MetadataColumn::RunId) {
            columns.push(MetadataColumn::RunId);
            columns.sort_unstable();
        }
        let widen_columns = widen_columns.unwrap_or(false);
        let write_path = DeclaredPath::from(direct_append.unwrap_or(false));
        check_direct_append(write_mode, write_path, &columns)?;
        Ok(Self { order_by, metadata_columns: columns, deletes, delete_missing, widen_columns, write_path })
    }

    /// Whether these are the seed's defaults (a fingerprint then leaves them out, so
    /// publications recorded before the options existed keep their fingerprint).
    pub(crate) fn is_default(&self) -> bool {
        self == &Self::default()
    }

    /// The destination columns the publication of a `write_mode` resource staging `staged`
    /// sets beyond the staged ones: the metadata columns, then `_filament_deleted_at` for soft
    /// deletes, or `history`'s validity columns (typed as its `order_by` column, else
    /// TIMESTAMP) and `_filament_deleted_at`.
    pub(crate) fn publication_columns(&self, write_mode: WriteMode, staged: &[Column]) -> Vec<Column> {
        let mut columns: Vec<Column> = self.metadata_columns.iter().map(|m| m.column()).collect();
        if write_mode == WriteMode::History {
            let order = self.order_by.first().and_then(|o| staged.iter().find(|c| c.name.eq_ignore_ascii_case(o)));
            let validity_type = order.map_or(BigQueryType::Timestamp, |c| c.bigquery_type.clone());
            columns.push(Column::new(VALID_FROM_COLUMN, validity_type.clone()));
            columns.push(Column::new(VALID_TO_COLUMN, validity_type));
            columns.push(Column::new(IS_CURRENT_COLUMN, BigQueryType::Bool));
        }
        if self.deletes == Deletes::Soft || write_mode == WriteMode::History {
            columns.push(Column::new(DELETED_AT_COLUMN, BigQueryType::Timestamp));
        }
        columns
    }
}

/// `direct_append` writes the batches' rows as they are, committed by no statement: only an
/// append mode's publication is that, and only without metadata columns.
fn check_direct_append(write_mode: WriteMode, path: DeclaredPath, metadata: &[MetadataColumn]) -> Result<(), Problem> {
    if path == DeclaredPath::Staging {
        return Ok(());
    }
    if !write_mode.is_append() {
        return Err(Problem::new(
            ErrorCode::InvalidDirectAppend,
            format!(
                "direct_append commits the appended rows into the table as they are; {write_mode} publishes them with \
                 a statement (only full_append, incremental_append and cdc_append write directly)"
            ),
        ));
    }
    if !metadata.is_empty() {
        return Err(Problem::new(
            ErrorCode::InvalidDirectAppend,
            "direct_append writes no column the batches do not send; metadata_columns are set by a publication \
             statement: declare one or the other",
        ));
    }
    Ok(())
}

fn invalid_order_by(detail: String) -> Problem {
    Problem::new(ErrorCode::InvalidOrderBy, detail)
}

fn parse_order_by(write_mode: WriteMode, columns: &[String]) -> Result<Vec<String>, Problem> {
    if !write_mode.is_merge() {
        return Err(invalid_order_by(format!(
            "order_by orders the changes of a keyed write mode; {write_mode} folds nothing"
        )));
    }
    if columns.is_empty() || columns.len() > MAX_KEY_COLUMNS {
        return Err(invalid_order_by(format!("order_by names 1 to {MAX_KEY_COLUMNS} columns")));
    }
    for (index, column) in columns.iter().enumerate() {
        validate_column_name(column).map_err(|p| invalid_order_by(p.detail))?;
        if write_mode == WriteMode::History && index > 0 {
            return Err(invalid_order_by(format!(
                "history orders versions by one column, whose value is a version's {VALID_FROM_COLUMN}"
            )));
        }
        if columns[..index].iter().any(|earlier| earlier.eq_ignore_ascii_case(column)) {
            return Err(invalid_order_by(format!("order_by names {column:?} twice")));
        }
    }
    Ok(columns.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ids::validate_column_name;

    fn parse_with(
        write_mode: WriteMode,
        order_by: Option<&OrderByDeclaration>,
        metadata_columns: Option<&[MetadataColumn]>,
        deletes: Option<Deletes>,
        delete_missing: Option<bool>,
    ) -> Result<WriteOptions, Problem> {
        WriteOptions::parse(
            write_mode,
            DeclaredWriteOptions {
                order_by,
                metadata_columns,
                deletes,
                delete_missing,
                widen_columns: None,
                direct_append: None,
            },
        )
    }

    #[test]
    fn declarations_in_any_order_are_one_declaration_and_a_repeat_is_refused() {
        let parse = |columns: &[MetadataColumn]| parse_with(WriteMode::FullAppend, None, Some(columns), None, None);
        let one = parse(&[MetadataColumn::ExecutionId, MetadataColumn::LoadedAt]).unwrap();
        let other = parse(&[MetadataColumn::LoadedAt, MetadataColumn::ExecutionId]).unwrap();
        assert_eq!(one, other);
        assert_eq!(one.metadata_columns, [MetadataColumn::LoadedAt, MetadataColumn::ExecutionId]);
        let repeated = parse(&[MetadataColumn::RunId, MetadataColumn::RunId]).unwrap_err();
        assert!(repeated.detail.contains("\"run_id\" twice"), "{}", repeated.detail);
        assert!(parse_with(WriteMode::CdcMerge, None, None, None, None).unwrap().is_default());
        assert!(!one.is_default());
    }

    #[test]
    fn metadata_columns_are_reserved_names_no_batch_can_send() {
        for column in MetadataColumn::ALL {
            assert!(validate_column_name(column.column_name()).is_err(), "{}", column.column_name());
        }
        let all = parse_with(WriteMode::FullAppend, None, Some(&MetadataColumn::ALL), None, None).unwrap();
        let stored = serde_json::to_value(all).unwrap();
        assert_eq!(stored, serde_json::json!({"metadata_columns": ["loaded_at", "run_id", "execution_id"]}));
        assert_eq!(serde_json::to_value(WriteOptions::default()).unwrap(), serde_json::json!({}));
    }

    #[test]
    fn order_by_is_one_or_more_distinct_columns_of_a_keyed_mode() {
        let declared: OrderByDeclaration = serde_json::from_value(serde_json::json!("lsn")).unwrap();
        let options = parse_with(WriteMode::CdcMerge, Some(&declared), None, None, None).unwrap();
        assert_eq!(options.order_by, ["lsn"]);
        let listed: OrderByDeclaration = serde_json::from_value(serde_json::json!(["day", "lsn"])).unwrap();
        assert_eq!(
            parse_with(WriteMode::FullUpsert, Some(&listed), None, None, None).unwrap().order_by,
            ["day", "lsn"]
        );
        let refused = |write_mode, value: serde_json::Value| {
            let declared: OrderByDeclaration = serde_json::from_value(value).unwrap();
            let problem = parse_with(write_mode, Some(&declared), None, None, None).unwrap_err();
            assert_eq!(problem.code, ErrorCode::InvalidOrderBy, "{}", problem.detail);
            problem.detail
        };
        assert!(refused(WriteMode::FullAppend, serde_json::json!("lsn")).contains("full_append folds nothing"));
        assert!(refused(WriteMode::CdcMerge, serde_json::json!([])).contains("1 to 16"));
        assert!(refused(WriteMode::CdcMerge, serde_json::json!(["a", "A"])).contains("twice"));
        refused(WriteMode::CdcMerge, serde_json::json!("_filament_seq"));
        refused(WriteMode::CdcMerge, serde_json::json!("no.dots"));
    }

    #[test]
    fn soft_deletes_belong_to_the_keyed_modes_and_add_their_column() {
        for write_mode in [WriteMode::CdcMerge, WriteMode::IncrementalDelete, WriteMode::IncrementalUpsert] {
            let options = parse_with(write_mode, None, None, Some(Deletes::Soft), None).unwrap();
            let added: Vec<String> = options.publication_columns(write_mode, &[]).into_iter().map(|c| c.name).collect();
            assert_eq!(added, [DELETED_AT_COLUMN]);
            assert_eq!(serde_json::to_value(&options).unwrap(), serde_json::json!({"deletes": "soft"}));
        }
        for write_mode in
            [WriteMode::FullReplace, WriteMode::FullAppend, WriteMode::IncrementalAppend, WriteMode::CdcAppend]
        {
            let refused = parse_with(write_mode, None, None, Some(Deletes::Soft), None).unwrap_err();
            assert_eq!(refused.code, ErrorCode::InvalidDeletes, "{write_mode}");
        }
        let hard = parse_with(WriteMode::FullAppend, None, None, Some(Deletes::Hard), None).unwrap();
        assert!(hard.is_default(), "hard is the default");
        assert!(validate_column_name(DELETED_AT_COLUMN).is_err());
    }

    #[test]
    fn delete_missing_belongs_to_full_upsert_and_records_the_run_of_each_key() {
        let options = parse_with(WriteMode::FullUpsert, None, None, Some(Deletes::Soft), Some(true)).unwrap();
        assert_eq!(options.metadata_columns, [MetadataColumn::RunId]);
        let stored = serde_json::to_value(&options).unwrap();
        assert_eq!(
            stored,
            serde_json::json!({"metadata_columns": ["run_id"], "deletes": "soft", "delete_missing": true})
        );
        let declared = [MetadataColumn::ExecutionId, MetadataColumn::RunId];
        let both = parse_with(WriteMode::FullUpsert, None, Some(&declared), None, Some(true)).unwrap();
        assert_eq!(both.metadata_columns, [MetadataColumn::RunId, MetadataColumn::ExecutionId]);
        for write_mode in [WriteMode::IncrementalUpsert, WriteMode::CdcMerge, WriteMode::FullReplace] {
            let refused = parse_with(write_mode, None, None, None, Some(true)).unwrap_err();
            assert_eq!(refused.code, ErrorCode::InvalidDeleteMissing, "{write_mode}");
        }
        assert!(parse_with(WriteMode::CdcMerge, None, None, None, Some(false)).unwrap().is_default());
    }

    #[test]
    fn direct_append_is_refused_outside_the_append_modes_and_beside_metadata_columns() {
        let declared = |write_mode, metadata_columns| {
            let options =
                DeclaredWriteOptions { metadata_columns, direct_append: Some(true), ..DeclaredWriteOptions::default() };
            WriteOptions::parse(write_mode, options)
        };
        for write_mode in [WriteMode::FullAppend, WriteMode::IncrementalAppend, WriteMode::CdcAppend] {
            assert_eq!(declared(write_mode, None).unwrap().write_path, DeclaredPath::Direct, "{write_mode}");
            let metadata: &[MetadataColumn] = &[MetadataColumn::RunId];
            assert_eq!(declared(write_mode, Some(metadata)).unwrap_err().code, ErrorCode::InvalidDirectAppend);
        }
        for write_mode in WriteMode::ALL.into_iter().filter(|mode| !mode.is_append()) {
            assert_eq!(declared(write_mode, None).unwrap_err().code, ErrorCode::InvalidDirectAppend, "{write_mode}");
        }
    }

    #[test]
    fn the_declared_path_is_stored_as_the_direct_append_bool() {
        let direct = WriteOptions { write_path: DeclaredPath::Direct, ..WriteOptions::default() };
        let stored = serde_json::to_value(&direct).unwrap();
        assert_eq!(stored, serde_json::json!({"direct_append": true}));
        assert_eq!(serde_json::from_value::<WriteOptions>(stored).unwrap(), direct);
        let staged: WriteOptions = serde_json::from_value(serde_json::json!({"direct_append": false})).unwrap();
        assert_eq!(staged.write_path, DeclaredPath::Staging);
        assert!(staged.is_default());
    }
}
