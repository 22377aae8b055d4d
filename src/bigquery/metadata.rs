//! Datasets and tables over REST (`datasets.get/insert`, `tables.get/insert/delete`). Never DDL
//! query jobs: metadata calls are cheaper, idempotent and do not need `bigquery.jobs.create`.

use google_cloud_bigquery_v2::model::{
    Dataset, DatasetReference, Table, TableFieldSchema, TableReference, TableSchema,
};

use super::{BigQuery, BigQueryError, BigQueryResult, rest_call};
use crate::model::columns::{BigQueryType, Column};

/// The field schema `tables.insert` / `tables.patch` take for a column (nested for STRUCTs).
pub(crate) fn field_schema(column: &Column) -> TableFieldSchema {
    let field = TableFieldSchema::new()
        .set_name(&column.name)
        .set_type(column.bigquery_type.type_name())
        .set_mode(column.mode());
    match &column.bigquery_type {
        BigQueryType::Struct(fields) => field.set_fields(fields.iter().map(field_schema)),
        _ => field,
    }
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

/// Whether rows of `wanted` can be inserted into the existing field as they are: same type,
/// same repetition, and for STRUCTs the same fields in the same order (BigQuery assigns struct
/// values by position).
pub(crate) fn field_accepts(existing: &TableFieldSchema, wanted: &Column) -> bool {
    if existing.mode.eq_ignore_ascii_case("REPEATED") != wanted.repeated
        || !wanted.bigquery_type.is_named(&existing.r#type)
    {
        return false;
    }
    match &wanted.bigquery_type {
        BigQueryType::Struct(fields) => {
            existing.fields.len() == fields.len()
                && existing
                    .fields
                    .iter()
                    .zip(fields)
                    .all(|(e, w)| e.name.eq_ignore_ascii_case(&w.name) && field_accepts(e, w))
        }
        _ => true,
    }
}

impl BigQuery {
    /// Creates the dataset when it does not exist (in `location` when given). Returns the
    /// location of a dataset that already existed (`None` when it was created here).
    pub(crate) async fn ensure_dataset(
        &self,
        project: &str,
        dataset: &str,
        location: Option<&str>,
    ) -> BigQueryResult<Option<String>> {
        match rest_call("datasets.get", || {
            self.datasets.get_dataset().set_project_id(project).set_dataset_id(dataset).send()
        })
        .await?
        {
            Ok(existing) => return Ok(Some(existing.location)),
            Err(e) if e.http_status_code() == Some(404) => {}
            Err(e) => return Err(BigQueryError::rest("datasets.get")(e)),
        }
        let mut body = Dataset::new()
            .set_dataset_reference(DatasetReference::new().set_project_id(project).set_dataset_id(dataset));
        if let Some(location) = location {
            body = body.set_location(location);
        }
        let insert = || self.datasets.insert_dataset().set_project_id(project).set_dataset(body.clone()).send();
        match rest_call("datasets.insert", insert).await? {
            Ok(_) => Ok(None),
            // Created concurrently by another resource or gateway: fine.
            Err(e) if e.http_status_code() == Some(409) => Ok(None),
            Err(e) => Err(BigQueryError::rest("datasets.insert")(e)),
        }
    }

    /// The table's schema (top-level fields, nested inside), or `None` when it does not exist.
    pub(crate) async fn table_fields(
        &self,
        project: &str,
        dataset: &str,
        table: &str,
    ) -> BigQueryResult<Option<Vec<TableFieldSchema>>> {
        let get = || self.tables.get_table().set_project_id(project).set_dataset_id(dataset).set_table_id(table).send();
        match rest_call("tables.get", get).await? {
            Ok(table) => Ok(Some(table.schema.map(|s| s.fields).unwrap_or_default())),
            Err(e) if e.http_status_code() == Some(404) => Ok(None),
            Err(e) => Err(BigQueryError::rest("tables.get")(e)),
        }
    }

    /// Creates a table with NULLABLE `columns`; `expiration_ms` is milliseconds since the epoch.
    /// Returns `false` when it already existed.
    pub(crate) async fn create_table(
        &self,
        project: &str,
        dataset: &str,
        table: &str,
        columns: &[Column],
        expiration_ms: Option<i64>,
    ) -> BigQueryResult<bool> {
        let mut body = Table::new()
            .set_table_reference(
                TableReference::new().set_project_id(project).set_dataset_id(dataset).set_table_id(table),
            )
            .set_schema(TableSchema::new().set_fields(columns.iter().map(field_schema)));
        if let Some(expiration_ms) = expiration_ms {
            body = body.set_expiration_time(expiration_ms);
        }
        let insert = || {
            self.tables.insert_table().set_project_id(project).set_dataset_id(dataset).set_table(body.clone()).send()
        };
        match rest_call("tables.insert", insert).await? {
            Ok(_) => Ok(true),
            Err(e) if e.http_status_code() == Some(409) => Ok(false),
            Err(e) => Err(BigQueryError::rest("tables.insert")(e)),
        }
    }

    /// Adds NULLABLE / REPEATED columns at the end of an existing table with `tables.patch`
    /// (the only schema change BigQuery allows without rewriting data). `existing` is the
    /// schema just read; the patch sends it unchanged followed by `added`.
    pub(crate) async fn add_columns(
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
        rest_call("tables.patch", patch).await?.map(|_| ()).map_err(BigQueryError::rest("tables.patch"))
    }

    /// Deletes a table; a table that is already gone is fine.
    pub(crate) async fn delete_table(&self, project: &str, dataset: &str, table: &str) -> BigQueryResult<()> {
        let delete =
            || self.tables.delete_table().set_project_id(project).set_dataset_id(dataset).set_table_id(table).send();
        match rest_call("tables.delete", delete).await? {
            Ok(_) => Ok(()),
            Err(e) if e.http_status_code() == Some(404) => Ok(()),
            Err(e) => Err(BigQueryError::rest("tables.delete")(e)),
        }
    }
}

/// Columns of `wanted` that the existing table holds with another type or shape:
/// (name, existing description, wanted SQL type).
pub(crate) fn type_conflicts(existing: &[TableFieldSchema], wanted: &[Column]) -> Vec<(String, String, String)> {
    wanted
        .iter()
        .filter_map(|w| {
            let e = existing.iter().find(|e| e.name.eq_ignore_ascii_case(&w.name))?;
            (!field_accepts(e, w)).then(|| (w.name.clone(), describe_field(e), w.sql_type()))
        })
        .collect()
}

/// Columns of `wanted` the existing table lacks.
pub(crate) fn missing_columns<'a>(existing: &[TableFieldSchema], wanted: &'a [Column]) -> Vec<&'a Column> {
    wanted.iter().filter(|w| !existing.iter().any(|e| e.name.eq_ignore_ascii_case(&w.name))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn existing(name: &str, type_name: &str, mode: &str) -> TableFieldSchema {
        TableFieldSchema::new().set_name(name).set_type(type_name).set_mode(mode)
    }

    #[test]
    fn compares_existing_columns_with_legacy_type_names_and_shapes() {
        let address = Column::new(
            "address",
            BigQueryType::Struct(vec![
                Column::new("city", BigQueryType::String),
                Column::new("zip", BigQueryType::Int64),
            ]),
        );
        let table = vec![
            existing("id", "INTEGER", "NULLABLE"),
            existing("Name", "STRING", ""),
            existing("score", "STRING", "NULLABLE"),
            existing("tags", "STRING", "NULLABLE"),
            existing("amount", "NUMERIC", "NULLABLE"),
            field_schema(&address),
            existing("other", "RECORD", "NULLABLE").set_fields([existing("city", "STRING", "NULLABLE")]),
        ];
        let wanted = vec![
            Column::new("id", BigQueryType::Int64),
            Column::new("name", BigQueryType::String),
            Column::new("score", BigQueryType::Float64),
            Column::repeated("tags", BigQueryType::String),
            Column::new("amount", BigQueryType::Numeric),
            address.clone(),
            Column { name: "other".into(), ..address.clone() },
            Column::new("extra", BigQueryType::Bool),
        ];
        let conflicts = type_conflicts(&table, &wanted);
        assert_eq!(
            conflicts,
            vec![
                ("score".into(), "STRING".into(), "FLOAT64".into()),
                ("tags".into(), "STRING".into(), "ARRAY<STRING>".into()),
                ("other".into(), "RECORD<city STRING>".into(), "STRUCT<city STRING, zip INT64>".into()),
            ]
        );
        assert_eq!(missing_columns(&table, &wanted).iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["extra"]);
    }

    #[test]
    fn nested_columns_become_record_fields() {
        let column = Column::repeated(
            "items",
            BigQueryType::Struct(vec![Column::new("sku", BigQueryType::String), Column::new("at", BigQueryType::Time)]),
        );
        let field = field_schema(&column);
        assert_eq!((field.r#type.as_str(), field.mode.as_str()), ("RECORD", "REPEATED"));
        assert_eq!(field.fields.iter().map(|f| f.r#type.as_str()).collect::<Vec<_>>(), ["STRING", "TIME"]);
        assert_eq!(describe_field(&field), "REPEATED RECORD<sku STRING, at TIME>");
    }
}
