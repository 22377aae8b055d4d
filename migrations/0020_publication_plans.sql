-- The priced plan of a commit (issue 58): at the barrier, once every stream is committed to
-- staging and before any publication, each planned publication's statement is dry-run and its
-- plan recorded here, one row per resource. A redelivery plans again: its rows replace the
-- earlier delivery's (`delivery` says which delivery planned). The price per TiB is the one in
-- force when it was planned, so the estimate shown later does not move with the setting.
CREATE TABLE publication_plans (
    run_id            TEXT NOT NULL,
    execution_id      TEXT NOT NULL,
    resource          TEXT NOT NULL,
    delivery          INTEGER NOT NULL,
    "table"           TEXT NOT NULL,
    path              TEXT NOT NULL,
    statement         TEXT NOT NULL,
    -- NULL when BigQuery could not dry-run the statement (`unpriced` says why).
    bytes_processed   BIGINT,
    query_jobs        INTEGER NOT NULL,
    unpriced          TEXT,
    price_per_tib_usd DOUBLE PRECISION NOT NULL,
    planned_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, execution_id, resource),
    FOREIGN KEY (run_id, execution_id) REFERENCES executions (run_id, execution_id) ON DELETE CASCADE
);
