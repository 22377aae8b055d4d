//! Datasets and tables over REST (`datasets.get/insert`, `tables.get/insert/delete`). Never DDL
//! query jobs: metadata calls are cheaper, idempotent and do not need `bigquery.jobs.create`.
//! A destination table is created with its resource's [`TableLayout`] (partitioning,
//! clustering, descriptions, labels); an existing one is only compared with it
//! ([`layout_differences`]), never re-laid out.

use google_cloud_bigquery_v2::model::{
    Clustering, Dataset, DatasetReference, RangePartitioning, Table, TableFieldSchema, TableReference, TableSchema,
    TimePartitioning, range_partitioning, table_field_schema::FieldElementType,
};

use super::known_datasets::KnownDataset;
use super::{BigQuery, BigQueryError, BigQueryResult, rest_call};
use crate::model::columns::{BigQueryType, Column, same_name};
use crate::model::table_layout::{ColumnDescriptions, LayoutDifference, TableLayout};
use crate::model::table_options::{Partitioning, TableOptions};

const MILLIS_PER_DAY: i64 = 86_400_000;

/// The field schema `tables.insert` / `tables.patch` take for a column (nested for STRUCTs).
pub(crate) fn field_schema(column: &Column) -> TableFieldSchema {
    let field = typed_field(column);
    match &column.bigquery_type {
        BigQueryType::Struct(fields) => field.set_fields(fields.iter().map(field_schema)),
        _ => field,
    }
}

/// A column's name, type and mode (and a RANGE's element type), without STRUCT fields.
fn typed_field(column: &Column) -> TableFieldSchema {
    let field = TableFieldSchema::new()
        .set_name(&column.name)
        .set_type(column.bigquery_type.type_name())
        .set_mode(column.mode());
    match &column.bigquery_type {
        BigQueryType::Range(element) => {
            field.set_range_element_type(FieldElementType::new().set_type(element.type_name()))
        }
        _ => field,
    }
}

/// [`field_schema`] with the column's description (and its STRUCT fields' descriptions).
fn described_field_schema(column: &Column, descriptions: &ColumnDescriptions) -> TableFieldSchema {
    let mut field = typed_field(column);
    if let Some(text) = descriptions.text(&column.name) {
        field = field.set_description(text);
    }
    match (&column.bigquery_type, descriptions.fields(&column.name)) {
        (BigQueryType::Struct(fields), Some(nested)) => {
            field.set_fields(fields.iter().map(|f| described_field_schema(f, nested)))
        }
        (BigQueryType::Struct(fields), None) => field.set_fields(fields.iter().map(field_schema)),
        _ => field,
    }
}

/// The `tables.insert` body of a staging table: NULLABLE `columns`, no layout, expiring at
/// `expiration_ms` (milliseconds since the epoch). Its default collation is set to code-point
/// order (`""`): without one it would take the dataset's default (`und:ci`, say), and a staged
/// STRING key would then fold, and join, case-insensitively into a destination column that
/// keeps `'A'` and `'a'` apart. The fold applies the destination's own collation where there is
/// one (`publish::sql`).
pub(crate) fn staging_table_body(reference: TableReference, columns: &[Column], expiration_ms: Option<i64>) -> Table {
    let body = Table::new()
        .set_table_reference(reference)
        .set_schema(TableSchema::new().set_fields(columns.iter().map(field_schema)))
        .set_default_collation("");
    match expiration_ms {
        Some(expiration_ms) => body.set_expiration_time(expiration_ms),
        None => body,
    }
}

/// The `tables.insert` body of a destination table laid out as `layout` (created at
/// `now_ms`, milliseconds since the epoch, which the expiration counts from).
pub(crate) fn destination_table_body(
    reference: TableReference,
    columns: &[Column],
    layout: &TableLayout,
    now_ms: i64,
) -> Table {
    let fields = columns.iter().map(|c| described_field_schema(c, &layout.column_descriptions));
    let mut body = Table::new().set_table_reference(reference).set_schema(TableSchema::new().set_fields(fields));
    match &layout.partitioning {
        Some(Partitioning::TimeUnitColumn { field, granularity }) => {
            body = body.set_time_partitioning(TimePartitioning::new().set_type(granularity.as_str()).set_field(field));
        }
        Some(Partitioning::IngestionTime { granularity }) => {
            body = body.set_time_partitioning(TimePartitioning::new().set_type(granularity.as_str()));
        }
        Some(Partitioning::IntegerRange { field, range }) => {
            let range = range_partitioning::Range::new()
                .set_start(range.start.to_string())
                .set_end(range.end.to_string())
                .set_interval(range.interval.to_string());
            body = body.set_range_partitioning(RangePartitioning::new().set_field(field).set_range(range));
        }
        None => {}
    }
    if !layout.clustering.is_empty() {
        body = body.set_clustering(Clustering::new().set_fields(layout.clustering.iter().cloned()));
    }
    if layout.require_partition_filter {
        body = body.set_require_partition_filter(true);
    }
    if let Some(days) = layout.expiration_days {
        body = body.set_expiration_time(now_ms + days * MILLIS_PER_DAY);
    }
    if let Some(description) = &layout.description {
        body = body.set_description(description);
    }
    body.set_labels(layout.labels.clone())
}

/// How an existing table's partitioning reads in messages (the terms of [`Partitioning::describe`]).
fn describe_partitioning(table: &Table) -> Option<String> {
    if let Some(range) = &table.range_partitioning
        && !range.field.is_empty()
    {
        let bounds = range.range.clone().unwrap_or_default();
        return Some(format!("range [{}, {}) by {} on {}", bounds.start, bounds.end, bounds.interval, range.field));
    }
    let time = table.time_partitioning.as_ref().filter(|t| !t.r#type.is_empty())?;
    Some(match &time.field {
        Some(field) if !field.is_empty() => format!("{} on {field}", time.r#type),
        _ => format!("{} by ingestion time", time.r#type),
    })
}

/// What the existing `table` has otherwise than `declared` explicitly asks for: partitioning,
/// clustering and the partition filter requirement (descriptions, labels and expiration are
/// not layout). Names compare case-insensitively.
pub(crate) fn layout_differences(table: &Table, declared: &TableOptions) -> Vec<LayoutDifference> {
    let mut differences = Vec::new();
    let mut differ = |option: &str, table: String, declared: String| {
        if !table.eq_ignore_ascii_case(&declared) {
            differences.push(LayoutDifference { option: option.into(), table, declared });
        }
    };
    if let Some(partitioning) = &declared.partitioning {
        let existing = describe_partitioning(table).unwrap_or_else(|| "none".into());
        differ("partitioning", existing, partitioning.describe());
    }
    if let Some(clustering) = &declared.clustering {
        let existing = table.clustering.as_ref().map(|c| c.fields.join(", ")).unwrap_or_default();
        let none = |list: String| if list.is_empty() { "none".to_string() } else { list };
        differ("clustering", none(existing), none(clustering.join(", ")));
    }
    if let Some(required) = declared.require_partition_filter {
        let existing = table.require_partition_filter.unwrap_or(false);
        differ("require_partition_filter", existing.to_string(), required.to_string());
    }
    differences
}

/// How an existing field reads in messages: `INTEGER`, `REPEATED STRING`, `RECORD<a STRING>`.
pub(crate) fn describe_field(field: &TableFieldSchema) -> String {
    let mut text = String::new();
    if field.mode.eq_ignore_ascii_case("REPEATED") {
        text.push_str("REPEATED ");
    }
    text.push_str(&field.r#type);
    if !field.fields.is_empty() {
        let inner: Vec<String> = field.fields.iter().map(|f| format!("{} {}", f.name, describe_field(f))).collect();
        text.push_str(&format!("<{}>", inner.join(", ")));
    }
    text
}

/// `wanted` as the existing field takes it: as it is (same type, same repetition, a RANGE of
/// the same element type, and for STRUCTs the same fields in the same order, as BigQuery
/// assigns struct values by position), or cast into the field's wider type where BigQuery
/// coerces without changing a value's meaning ([`BigQueryType::coerces_into`]; the column
/// comes back with `published_as`); `None` when the field cannot take it. A `REQUIRED` field
/// (at any depth) comes back `required`: its values are checked before anything is published
/// (`ingest::destination_rules`), as are the values cast into FLOAT64.
pub(crate) fn as_published_into(existing: &TableFieldSchema, wanted: &Column) -> Option<Column> {
    let required = existing.mode.eq_ignore_ascii_case("REQUIRED");
    as_published_shape(existing, wanted).map(|published| Column { required, ..published })
}

/// [`as_published_into`] but for the field's mode.
fn as_published_shape(existing: &TableFieldSchema, wanted: &Column) -> Option<Column> {
    if existing.mode.eq_ignore_ascii_case("REPEATED") != wanted.repeated {
        return None;
    }
    if !wanted.bigquery_type.is_named(&existing.r#type) {
        let wider = BigQueryType::numeric_named(&existing.r#type)?;
        return wanted
            .bigquery_type
            .coerces_into()
            .contains(&wider)
            .then(|| Column { published_as: Some(wider), ..wanted.clone() });
    }
    match &wanted.bigquery_type {
        BigQueryType::Struct(fields) => {
            if existing.fields.len() != fields.len() {
                return None;
            }
            let published = existing
                .fields
                .iter()
                .zip(fields)
                .map(|(e, w)| same_name(&e.name, &w.name).then(|| as_published_into(e, w)).flatten())
                .collect::<Option<Vec<_>>>()?;
            Some(Column { bigquery_type: BigQueryType::Struct(published), ..wanted.clone() })
        }
        BigQueryType::Range(element) => {
            let held = existing.range_element_type.as_ref().map(|e| e.r#type.as_str());
            held.is_some_and(|held| held.eq_ignore_ascii_case(element.type_name())).then(|| wanted.clone())
        }
        _ => Some(wanted.clone()),
    }
}

/// Whether rows of `wanted` can be inserted into the existing field ([`as_published_into`]).
pub(crate) fn field_accepts(existing: &TableFieldSchema, wanted: &Column) -> bool {
    as_published_into(existing, wanted).is_some()
}

/// `wanted` as the existing table takes each column: columns the table holds with a wider type
/// are cast into it by the publication; the others (the table's own types, or new columns)
/// as they are. Columns the table cannot take are [`type_conflicts`].
pub(crate) fn published_columns(existing: &[TableFieldSchema], wanted: &[Column]) -> Vec<Column> {
    wanted
        .iter()
        .map(|w| {
            let held = existing.iter().find(|e| same_name(&e.name, &w.name));
            held.and_then(|e| as_published_into(e, w)).unwrap_or_else(|| w.clone())
        })
        .collect()
}

/// The top-level columns of `wanted` whose existing field holds a narrower type that BigQuery
/// can widen in place to the wanted one (`ALTER COLUMN ... SET DATA TYPE` takes exactly the
/// coercions of [`BigQueryType::coerces_into`]: INT64 to NUMERIC, BIGNUMERIC, FLOAT64;
/// NUMERIC to BIGNUMERIC, FLOAT64): (column as the table names it, the wider type).
pub(crate) fn widenings<'a>(existing: &'a [TableFieldSchema], wanted: &[Column]) -> Vec<(&'a str, BigQueryType)> {
    wanted
        .iter()
        .filter_map(|w| {
            let e = existing.iter().find(|e| same_name(&e.name, &w.name))?;
            let held = BigQueryType::numeric_named(&e.r#type)?;
            let same_shape = e.mode.eq_ignore_ascii_case("REPEATED") == w.repeated;
            (same_shape && held.coerces_into().contains(&w.bigquery_type))
                .then(|| (e.name.as_str(), w.bigquery_type.clone()))
        })
        .collect()
}

/// The existing table's REQUIRED columns that `wanted` does not hold: rows published without
/// them would be refused by BigQuery.
pub(crate) fn required_columns_missing<'a>(existing: &'a [TableFieldSchema], wanted: &[Column]) -> Vec<&'a str> {
    existing
        .iter()
        .filter(|e| e.mode.eq_ignore_ascii_case("REQUIRED"))
        .filter(|e| !wanted.iter().any(|w| same_name(&w.name, &e.name)))
        .map(|e| e.name.as_str())
        .collect()
}

impl BigQuery {
    /// Creates the dataset when it does not exist (in `location` when given). Returns its
    /// location when known (`None` when it was created without one, here or concurrently
    /// elsewhere). Answers are remembered per process
    /// ([`super::known_datasets::KnownDatasets`]).
    pub(crate) async fn ensure_dataset(
        &self,
        project: &str,
        dataset: &str,
        location: Option<&str>,
    ) -> BigQueryResult<Option<String>> {
        let find_or_create = || self.find_or_create_dataset(project, dataset, location);
        Ok(self.known_datasets.get_or_check(project, dataset, location, find_or_create).await?.location)
    }

    async fn find_or_create_dataset(
        &self,
        project: &str,
        dataset: &str,
        location: Option<&str>,
    ) -> BigQueryResult<KnownDataset> {
        match rest_call(&self.quotas, "datasets.get", || {
            self.datasets.get_dataset().set_project_id(project).set_dataset_id(dataset).send()
        })
        .await?
        {
            Ok(existing) => return Ok(KnownDataset { location: Some(existing.location) }),
            Err(e) if e.http_status_code() == Some(404) => {}
            Err(e) => return Err(BigQueryError::rest("datasets.get")(e)),
        }
        let mut body = Dataset::new()
            .set_dataset_reference(DatasetReference::new().set_project_id(project).set_dataset_id(dataset));
        if let Some(location) = location {
            body = body.set_location(location);
        }
        let insert = || self.datasets.insert_dataset().set_project_id(project).set_dataset(body.clone()).send();
        match rest_call(&self.quotas, "datasets.insert", insert).await? {
            Ok(_) => Ok(KnownDataset { location: location.map(String::from) }),
            // Created concurrently by another gateway: where is not known here.
            Err(e) if e.http_status_code() == Some(409) => Ok(KnownDataset { location: None }),
            Err(e) => Err(BigQueryError::rest("datasets.insert")(e)),
        }
    }

    /// The table (schema, layout, labels), or `None` when it does not exist.
    pub(crate) async fn get_table(&self, project: &str, dataset: &str, table: &str) -> BigQueryResult<Option<Table>> {
        let get = || self.tables.get_table().set_project_id(project).set_dataset_id(dataset).set_table_id(table).send();
        match rest_call(&self.quotas, "tables.get", get).await? {
            Ok(table) => Ok(Some(table)),
            Err(e) if e.http_status_code() == Some(404) => Ok(None),
            Err(e) => Err(BigQueryError::rest("tables.get")(e)),
        }
    }

    /// The table's schema (top-level fields, nested inside), or `None` when it does not exist.
    pub(crate) async fn table_fields(
        &self,
        project: &str,
        dataset: &str,
        table: &str,
    ) -> BigQueryResult<Option<Vec<TableFieldSchema>>> {
        Ok(self.get_table(project, dataset, table).await?.map(|t| t.schema.map(|s| s.fields).unwrap_or_default()))
    }

    /// Creates a staging table: NULLABLE `columns`, no layout;
    /// `expiration_ms` is milliseconds since the epoch. Returns `false` when it already existed.
    pub(crate) async fn create_staging_table(
        &self,
        project: &str,
        dataset: &str,
        table: &str,
        columns: &[Column],
        expiration_ms: Option<i64>,
    ) -> BigQueryResult<bool> {
        let body = staging_table_body(table_reference(project, dataset, table), columns, expiration_ms);
        self.insert_table(project, dataset, body).await
    }

    /// Creates a destination table laid out as `layout`. Returns `false` when it already existed.
    pub(crate) async fn create_destination_table(
        &self,
        project: &str,
        dataset: &str,
        table: &str,
        columns: &[Column],
        layout: &TableLayout,
    ) -> BigQueryResult<bool> {
        let now_ms = chrono::Utc::now().timestamp_millis();
        let body = destination_table_body(table_reference(project, dataset, table), columns, layout, now_ms);
        self.insert_table(project, dataset, body).await
    }

    /// `tables.insert`; `false` when the table already existed.
    async fn insert_table(&self, project: &str, dataset: &str, body: Table) -> BigQueryResult<bool> {
        let insert = || {
            self.tables.insert_table().set_project_id(project).set_dataset_id(dataset).set_table(body.clone()).send()
        };
        match rest_call(&self.quotas, "tables.insert", insert).await? {
            Ok(_) => Ok(true),
            Err(e) if e.http_status_code() == Some(409) => Ok(false),
            Err(e) => Err(BigQueryError::rest("tables.insert")(e)),
        }
    }

    /// Adds the columns of `wanted` that the existing table (`existing`, its schema just read)
    /// lacks, and returns them: the one place a destination gains columns (set-up, and a
    /// snapshot's end that set nothing up).
    pub(crate) async fn add_missing_columns<'a>(
        &self,
        project: &str,
        dataset: &str,
        table: &str,
        existing: &[TableFieldSchema],
        wanted: &'a [Column],
    ) -> BigQueryResult<Vec<&'a Column>> {
        let missing = missing_columns(existing, wanted);
        if !missing.is_empty() {
            self.add_columns(project, dataset, table, existing, &missing).await?;
        }
        Ok(missing)
    }

    /// Adds NULLABLE / REPEATED columns at the end of an existing table with `tables.patch`
    /// (the only schema change BigQuery allows without rewriting data). `existing` is the
    /// schema just read; the patch sends it unchanged followed by `added`.
    async fn add_columns(
        &self,
        project: &str,
        dataset: &str,
        table: &str,
        existing: &[TableFieldSchema],
        added: &[&Column],
    ) -> BigQueryResult<()> {
        let fields = existing.iter().cloned().chain(added.iter().map(|c| field_schema(c)));
        let body = Table::new().set_schema(TableSchema::new().set_fields(fields));
        let patch = || {
            let body = body.clone();
            self.tables
                .patch_table()
                .set_project_id(project)
                .set_dataset_id(dataset)
                .set_table_id(table)
                .set_table(body)
                .send()
        };
        rest_call(&self.quotas, "tables.patch", patch).await?.map(|_| ()).map_err(BigQueryError::rest("tables.patch"))
    }

    /// Deletes a table; a table that is already gone is fine.
    pub(crate) async fn delete_table(&self, project: &str, dataset: &str, table: &str) -> BigQueryResult<()> {
        let delete =
            || self.tables.delete_table().set_project_id(project).set_dataset_id(dataset).set_table_id(table).send();
        match rest_call(&self.quotas, "tables.delete", delete).await? {
            Ok(_) => Ok(()),
            Err(e) if e.http_status_code() == Some(404) => Ok(()),
            Err(e) => Err(BigQueryError::rest("tables.delete")(e)),
        }
    }
}

pub(crate) fn table_reference(project: &str, dataset: &str, table: &str) -> TableReference {
    TableReference::new().set_project_id(project).set_dataset_id(dataset).set_table_id(table)
}

/// Columns of `wanted` that the existing table holds with another type or shape:
/// (name, existing description, wanted SQL type).
pub(crate) fn type_conflicts(existing: &[TableFieldSchema], wanted: &[Column]) -> Vec<(String, String, String)> {
    wanted
        .iter()
        .filter_map(|w| {
            let e = existing.iter().find(|e| same_name(&e.name, &w.name))?;
            (!field_accepts(e, w)).then(|| (w.name.clone(), describe_field(e), w.sql_type()))
        })
        .collect()
}

/// Columns of `wanted` the existing table lacks.
pub(crate) fn missing_columns<'a>(existing: &[TableFieldSchema], wanted: &'a [Column]) -> Vec<&'a Column> {
    wanted.iter().filter(|w| !existing.iter().any(|e| same_name(&e.name, &w.name))).collect()
}

#[cfg(test)]
#[path = "metadata_tests.rs"]
mod tests;
