//! What the gateway recorded in Postgres, readable also after the gateway exited: a snapshot of
//! the state requests change, and whether a stopping replica handed an execution over
//! (`executions.handed_over`).

use sqlx::{Connection as _, PgConnection};

use super::Gateway;

impl Gateway {
    /// Every row of every table of the gateway's database, as text: equal snapshots mean no
    /// request changed the state. Upload progress that lanes record in the background (stream
    /// name, acknowledged rows) and lease renewals are left out: they move whatever requests
    /// arrive.
    pub async fn db_snapshot(&self) -> String {
        let mut connection = PgConnection::connect(&self.database_url).await.expect("connect");
        let mut snapshot = String::new();
        let background =
            "- 'stream_name' - 'stream_created_at' - 'rows_acknowledged' - 'finalized_row_count' - 'committed_at'";
        for table in [
            "runs",
            "resources",
            "executions",
            "deliveries",
            "staging_streams",
            "batches",
            "checkpoints",
            "publications",
        ] {
            let row = match table {
                "staging_streams" => format!("(to_jsonb(t) {background})"),
                // Lease renewals (the owner's heartbeat) move whatever requests arrive.
                "executions" => "(to_jsonb(t) - 'lease_expires_at')".into(),
                _ => "to_jsonb(t)".into(),
            };
            let rows: Vec<(String,)> =
                sqlx::query_as(&format!("SELECT {row}::text FROM {table} t ORDER BY {row}::text"))
                    .fetch_all(&mut connection)
                    .await
                    .expect("snapshot query");
            snapshot.push_str(&format!("{table}: {}\n", rows.into_iter().map(|r| r.0).collect::<Vec<_>>().join(", ")));
        }
        snapshot
    }

    /// Whether the execution is recorded as handed over by the replica that served it.
    pub async fn execution_handed_over(&self, run: &str, execution: &str) -> bool {
        let mut connection = PgConnection::connect(&self.database_url).await.expect("connect");
        let (handed_over,): (bool,) =
            sqlx::query_as("SELECT handed_over FROM executions WHERE run_id = $1 AND execution_id = $2")
                .bind(run)
                .bind(execution)
                .fetch_one(&mut connection)
                .await
                .expect("the execution's record");
        handed_over
    }
}
