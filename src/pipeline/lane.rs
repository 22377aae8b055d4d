//! One resource's upload lane: prepare the tables and the PENDING stream, then append every
//! queued payload in order at explicit row offsets. Sequential in this slice.

use std::time::Duration;

use bytes::Bytes;
use sha2::{Digest as _, Sha256};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::bigquery::metadata::{missing_columns, type_conflicts};
use crate::bigquery::write::AppendAck;
use crate::bigquery::{BigQuery, BigQueryError};
use crate::error::{ErrorCode, Problem};
use crate::ingest::encode::AppendPayload;
use crate::ingest::schema::Column;
use crate::store::Store;
use crate::telemetry;

/// Staging tables expire on their own after this long, whatever happens to the gateway.
pub const STAGING_TABLE_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// Where one lane's rows go.
#[derive(Debug, Clone)]
pub struct LaneTarget {
    pub run_id: String,
    pub execution_id: String,
    pub delivery: i32,
    pub resource: String,
    pub project: String,
    pub dataset: String,
    pub location: Option<String>,
    pub destination_table: String,
    pub staging_table: String,
    pub columns: Vec<Column>,
    /// The staging schema as one encapsulated IPC message (the writer schema).
    pub serialized_schema: Bytes,
}

/// What a drained lane hands to commit.
#[derive(Debug, Clone)]
pub struct LaneReport {
    pub resource: String,
    pub destination_table: String,
    pub staging_table: String,
    pub columns: Vec<Column>,
    pub stream_name: String,
    /// Rows appended to the stream (acknowledged, in order).
    pub rows_sent: i64,
}

/// `projects/p/datasets/d/tables/t`, the Storage Write API's table path.
pub fn table_path(project: &str, dataset: &str, table: &str) -> String {
    format!("projects/{project}/datasets/{dataset}/tables/{table}")
}

/// The staging table of one resource in one delivery: reserved prefix, the destination's name
/// (for people reading the dataset) and a hash that makes it unique per delivery.
pub fn staging_table_name(
    run_id: &str,
    execution_id: &str,
    delivery: i32,
    resource: &str,
    destination_table: &str,
) -> String {
    let digest = Sha256::digest(format!("{run_id}\n{execution_id}\n{delivery}\n{resource}").as_bytes());
    let hash = &hex::encode(digest)[..16];
    let readable: String = destination_table.chars().take(900).collect();
    format!("_filament_stg_{readable}_{hash}")
}

pub(super) async fn run_lane(
    bigquery: BigQuery,
    store: Store,
    target: LaneTarget,
    mut receiver: mpsc::UnboundedReceiver<Vec<AppendPayload>>,
    cancel: CancellationToken,
) -> Result<LaneReport, Problem> {
    let result = tokio::select! {
        result = upload(&bigquery, &store, &target, &mut receiver) => result,
        () = cancel.cancelled() => {
            return Err(Problem::new(ErrorCode::UploadFailed, format!("uploads of resource {} were cancelled", target.resource)));
        }
    };
    if let Err(problem) = &result {
        tracing::warn!(run_id = %target.run_id, execution_id = %target.execution_id, resource = %target.resource,
            code = %problem.code, detail = %problem.detail, "upload lane failed; failing the execution");
        if let Err(e) = store.fail_execution(&target.run_id, &target.execution_id, target.delivery, problem).await {
            tracing::error!(error = %e, "could not record the failed execution");
        }
    }
    result
}

async fn prepare(bigquery: &BigQuery, store: &Store, target: &LaneTarget) -> Result<String, Problem> {
    let fail = |e: BigQueryError| e.to_problem(ErrorCode::BigqueryError);
    let (project, dataset) = (target.project.as_str(), target.dataset.as_str());
    bigquery.ensure_dataset(project, dataset, target.location.as_deref()).await.map_err(fail)?;
    match bigquery.table_columns(project, dataset, &target.destination_table).await.map_err(fail)? {
        None => {
            bigquery
                .create_table(project, dataset, &target.destination_table, &target.columns, None)
                .await
                .map_err(fail)?;
        }
        Some(existing) => {
            let conflicts = type_conflicts(&existing, &target.columns);
            if !conflicts.is_empty() {
                let list: Vec<String> = conflicts
                    .iter()
                    .map(|(c, has, wants)| format!("{c} is {has} in the table, the batches send {wants}"))
                    .collect();
                return Err(Problem::new(
                    ErrorCode::IncompatibleSchema,
                    format!("table {}.{}: {}", dataset, target.destination_table, list.join("; ")),
                ));
            }
            let missing = missing_columns(&existing, &target.columns);
            if !missing.is_empty() {
                let names: Vec<&str> = missing.iter().map(|c| c.name.as_str()).collect();
                return Err(Problem::new(
                    ErrorCode::IncompatibleSchema,
                    format!("table {}.{} lacks columns {}", dataset, target.destination_table, names.join(", ")),
                )
                .with_hint("adding columns to existing tables is not supported yet: add them to the table first"));
            }
        }
    }
    let expires_at_ms = chrono::Utc::now().timestamp_millis() + STAGING_TABLE_TTL.as_millis() as i64;
    bigquery
        .create_table(project, dataset, &target.staging_table, &target.columns, Some(expires_at_ms))
        .await
        .map_err(fail)?;
    let stream_name = bigquery
        .writer()
        .create_pending_stream(&table_path(project, dataset, &target.staging_table))
        .await
        .map_err(|e| e.to_problem(ErrorCode::UploadFailed))?;
    store
        .set_stream_name(&target.run_id, &target.execution_id, target.delivery, &target.resource, &stream_name)
        .await?;
    Ok(stream_name)
}

async fn upload(
    bigquery: &BigQuery,
    store: &Store,
    target: &LaneTarget,
    receiver: &mut mpsc::UnboundedReceiver<Vec<AppendPayload>>,
) -> Result<LaneReport, Problem> {
    tracing::info!(run_id = %target.run_id, execution_id = %target.execution_id, resource = %target.resource,
        table = %target.destination_table, "bigquery.write.prepare.started");
    let stream_name = prepare(bigquery, store, target).await?;
    let mut connection = bigquery.writer().append_connection(&stream_name, target.serialized_schema.clone());
    let mut offset: i64 = 0;
    while let Some(payloads) = receiver.recv().await {
        let mut rows_in_request = 0;
        for payload in payloads {
            let ack = connection.append(offset, &payload).await.map_err(|e| {
                metrics::counter!(telemetry::APPENDS, "outcome" => "error").increment(1);
                e.to_problem(ErrorCode::UploadFailed)
            })?;
            metrics::counter!(telemetry::APPENDS, "outcome" => match ack {
                AppendAck::Appended => "appended",
                AppendAck::AlreadyPresent => "already_present",
            })
            .increment(1);
            offset += payload.rows as i64;
            rows_in_request += payload.rows as i64;
        }
        metrics::counter!(telemetry::ROWS_APPENDED).increment(rows_in_request as u64);
        store
            .add_rows_acknowledged(
                &target.run_id,
                &target.execution_id,
                target.delivery,
                &target.resource,
                rows_in_request,
            )
            .await?;
    }
    Ok(LaneReport {
        resource: target.resource.clone(),
        destination_table: target.destination_table.clone(),
        staging_table: target.staging_table.clone(),
        columns: target.columns.clone(),
        stream_name,
        rows_sent: offset,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_names_are_reserved_unique_and_valid() {
        let a = staging_table_name("r", "e", 1, "users", "users");
        let b = staging_table_name("r", "e", 2, "users", "users");
        assert_ne!(a, b);
        assert!(a.starts_with("_filament_stg_users_"));
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'));
        assert!(staging_table_name("r", "e", 1, "x", &"t".repeat(1024)).len() <= 1024);
    }
}
