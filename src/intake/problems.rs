//! The problems intake answers about a batch in relation to earlier ones: a replayed `seq`
//! with other content, a resource declared again meanwhile, a schema that changed within the
//! execution (its differing columns named, bounded).

use crate::error::{ErrorCode, Problem};
use crate::model::ResourceName;
use crate::store::{ReceiptRecord, ResourceRecord};

/// A `seq` accepted before: its receipt when the body is the same, else 409 `batch_conflict`.
pub(super) fn replayed(existing: ReceiptRecord, sha256: &str) -> Result<ReceiptRecord, Problem> {
    if existing.arrow_ipc_sha256 == sha256 {
        Ok(existing)
    } else {
        Err(Problem::new(
            ErrorCode::BatchConflict,
            format!("seq {} of resource {} was already accepted with other content", existing.seq, existing.resource),
        ))
    }
}

/// 409 `resource_conflict`: the resource was declared otherwise while the batch was prepared
/// for its previous declaration; nothing was recorded.
pub(super) fn redeclared(prepared_for: &ResourceRecord, current: Option<&ResourceRecord>) -> Problem {
    let now = match current {
        None => "it is no longer declared".to_string(),
        Some(current) => format!(
            "it is now {} with primary key [{}] into table {} (the batch was read as {} with primary key [{}] into table {})",
            current.write_mode,
            current.primary_key.join(", "),
            current.table_name,
            prepared_for.write_mode,
            prepared_for.primary_key.join(", "),
            prepared_for.table_name
        ),
    };
    Problem::new(
        ErrorCode::ResourceConflict,
        format!(
            "resource {} was declared again while this batch was read: {now}; nothing was recorded",
            prepared_for.resource
        ),
    )
    .with_hint("send the batch again: it is read under the resource's current declaration")
}

/// Differing columns named in a `schema_mismatch` answer, at most (the rest are counted).
const SHOWN_SCHEMA_DIFFERENCES: usize = 10;

pub(super) fn schema_mismatch(
    resource: &ResourceName,
    recorded: &serde_json::Value,
    received: &serde_json::Value,
) -> Problem {
    let differences = schema_differences(recorded, received);
    let shown: Vec<&str> = differences.iter().take(SHOWN_SCHEMA_DIFFERENCES).map(String::as_str).collect();
    let more = differences.len().saturating_sub(SHOWN_SCHEMA_DIFFERENCES);
    let more = if more > 0 { format!(", and {more} more") } else { String::new() };
    Problem::new(
        ErrorCode::SchemaMismatch,
        format!("resource {resource} changed schema within the execution: {}{more}", shown.join("; ")),
    )
    .with_hint("every batch of a resource within one execution must have the same schema")
}

/// How two canonical schemas (`[{"name", "type", "nullable"}]`) differ, column by column.
fn schema_differences(recorded: &serde_json::Value, received: &serde_json::Value) -> Vec<String> {
    let columns =
        |schema: &serde_json::Value| -> Vec<serde_json::Value> { schema.as_array().cloned().unwrap_or_default() };
    let (recorded, received) = (columns(recorded), columns(received));
    let name = |column: &serde_json::Value| column["name"].as_str().unwrap_or_default().to_string();
    let describe = |column: &serde_json::Value| {
        let nullable = if column["nullable"] == true { "nullable" } else { "not null" };
        let json = if column["json"] == true { ", JSON" } else { "" };
        format!("{} ({nullable}{json})", column["type"].as_str().unwrap_or_default())
    };
    let mut differences = Vec::new();
    for (position, column) in received.iter().enumerate() {
        match recorded.iter().position(|r| name(r) == name(column)) {
            None => differences.push(format!("column {:?} is new", name(column))),
            Some(was) if recorded[was] != *column => differences.push(format!(
                "column {:?} was {}, is {}",
                name(column),
                describe(&recorded[was]),
                describe(column)
            )),
            Some(was) if was != position => {
                differences.push(format!("column {:?} moved from position {was} to {position}", name(column)));
            }
            Some(_) => {}
        }
    }
    for column in &recorded {
        if !received.iter().any(|r| name(r) == name(column)) {
            differences.push(format!("column {:?} is missing", name(column)));
        }
    }
    differences
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schema_mismatch_names_the_differing_columns_bounded() {
        let column = |name: &str, kind: &str| serde_json::json!({"name": name, "type": kind, "nullable": true});
        let recorded: Vec<_> = (0..10_000).map(|i| column(&format!("c{i}"), "Int64")).collect();
        let mut received = recorded.clone();
        received[3] = column("c3", "Utf8");
        received.push(column("extra", "Int64"));
        received.remove(0);
        let problem = schema_mismatch(
            &"r".parse().unwrap(),
            &serde_json::Value::Array(recorded),
            &serde_json::Value::Array(received),
        );
        assert!(
            problem.detail.contains("column \"c3\" was Int64 (nullable), is Utf8 (nullable)"),
            "{}",
            problem.detail
        );
        assert!(problem.detail.contains("more"), "{}", problem.detail);
        assert!(problem.detail.len() < 2000, "bounded: {} bytes", problem.detail.len());
    }
}
