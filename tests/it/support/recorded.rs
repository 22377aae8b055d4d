//! What the gateway recorded of an execution in Postgres, readable also after the gateway
//! exited: whether a stopping replica handed it over (`executions.handed_over`).

use sqlx::{Connection as _, PgConnection};

use super::Gateway;

impl Gateway {
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
