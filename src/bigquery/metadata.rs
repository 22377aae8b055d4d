//! Datasets and tables over REST (`datasets.get/insert`, `tables.get/insert/delete`). Never DDL
//! query jobs: metadata calls are cheaper, idempotent and do not need `bigquery.jobs.create`.

use google_cloud_bigquery_v2::model::{
    Dataset, DatasetReference, Table, TableFieldSchema, TableReference, TableSchema,
};

use super::{BigQuery, BigQueryError, BigQueryResult};
use crate::ingest::schema::{BigQueryType, Column};

/// A destination column as BigQuery reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExistingColumn {
    pub name: String,
    /// The type name as `tables.get` reports it (`INTEGER`, `STRING`, ...).
    pub type_name: String,
}

fn field_schema(column: &Column) -> TableFieldSchema {
    TableFieldSchema::new().set_name(&column.name).set_type(column.bigquery_type.as_str()).set_mode("NULLABLE")
}

impl BigQuery {
    /// Creates the dataset when it does not exist (in `location` when given).
    pub async fn ensure_dataset(&self, project: &str, dataset: &str, location: Option<&str>) -> BigQueryResult<()> {
        match self.datasets.get_dataset().set_project_id(project).set_dataset_id(dataset).send().await {
            Ok(_) => return Ok(()),
            Err(e) if e.http_status_code() == Some(404) => {}
            Err(e) => return Err(BigQueryError::rest("datasets.get")(e)),
        }
        let mut body = Dataset::new()
            .set_dataset_reference(DatasetReference::new().set_project_id(project).set_dataset_id(dataset));
        if let Some(location) = location {
            body = body.set_location(location);
        }
        match self.datasets.insert_dataset().set_project_id(project).set_dataset(body).send().await {
            Ok(_) => Ok(()),
            // Created concurrently by another resource or gateway: fine.
            Err(e) if e.http_status_code() == Some(409) => Ok(()),
            Err(e) => Err(BigQueryError::rest("datasets.insert")(e)),
        }
    }

    /// The table's top-level columns, or `None` when it does not exist.
    pub async fn table_columns(
        &self,
        project: &str,
        dataset: &str,
        table: &str,
    ) -> BigQueryResult<Option<Vec<ExistingColumn>>> {
        match self.tables.get_table().set_project_id(project).set_dataset_id(dataset).set_table_id(table).send().await {
            Ok(table) => Ok(Some(
                table
                    .schema
                    .map(|s| s.fields)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|f| ExistingColumn { name: f.name, type_name: f.r#type })
                    .collect(),
            )),
            Err(e) if e.http_status_code() == Some(404) => Ok(None),
            Err(e) => Err(BigQueryError::rest("tables.get")(e)),
        }
    }

    /// Creates a table with NULLABLE `columns`; `expiration_ms` is milliseconds since the epoch.
    /// Returns `false` when it already existed.
    pub async fn create_table(
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
        match self.tables.insert_table().set_project_id(project).set_dataset_id(dataset).set_table(body).send().await {
            Ok(_) => Ok(true),
            Err(e) if e.http_status_code() == Some(409) => Ok(false),
            Err(e) => Err(BigQueryError::rest("tables.insert")(e)),
        }
    }

    /// Deletes a table; a table that is already gone is fine.
    pub async fn delete_table(&self, project: &str, dataset: &str, table: &str) -> BigQueryResult<()> {
        match self
            .tables
            .delete_table()
            .set_project_id(project)
            .set_dataset_id(dataset)
            .set_table_id(table)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if e.http_status_code() == Some(404) => Ok(()),
            Err(e) => Err(BigQueryError::rest("tables.delete")(e)),
        }
    }
}

/// Columns of `wanted` that an existing table holds with another type: (name, existing, wanted).
pub fn type_conflicts(existing: &[ExistingColumn], wanted: &[Column]) -> Vec<(String, String, BigQueryType)> {
    wanted
        .iter()
        .filter_map(|w| {
            let e = existing.iter().find(|e| e.name.eq_ignore_ascii_case(&w.name))?;
            (BigQueryType::from_table_type(&e.type_name) != Some(w.bigquery_type))
                .then(|| (w.name.clone(), e.type_name.clone(), w.bigquery_type))
        })
        .collect()
}

/// Columns of `wanted` the existing table lacks.
pub fn missing_columns<'a>(existing: &[ExistingColumn], wanted: &'a [Column]) -> Vec<&'a Column> {
    wanted.iter().filter(|w| !existing.iter().any(|e| e.name.eq_ignore_ascii_case(&w.name))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compares_existing_columns_with_legacy_type_names() {
        let existing = vec![
            ExistingColumn { name: "id".into(), type_name: "INTEGER".into() },
            ExistingColumn { name: "Name".into(), type_name: "STRING".into() },
            ExistingColumn { name: "score".into(), type_name: "STRING".into() },
        ];
        let wanted = vec![
            Column { name: "id".into(), bigquery_type: BigQueryType::Int64 },
            Column { name: "name".into(), bigquery_type: BigQueryType::String },
            Column { name: "score".into(), bigquery_type: BigQueryType::Float64 },
            Column { name: "extra".into(), bigquery_type: BigQueryType::Bool },
        ];
        assert_eq!(type_conflicts(&existing, &wanted), vec![("score".into(), "STRING".into(), BigQueryType::Float64)]);
        assert_eq!(missing_columns(&existing, &wanted).iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["extra"]);
    }
}
