-- The timeline of each delivery (GET .../executions/{execution}/events, issue 24): what happened,
-- in order, whichever replica served it. `event_id` orders the events and is the clients'
-- cursor (`after`). Repeated append retries of one resource with the same code are one row
-- whose `count` grows. At most 1,000 rows per delivery (the store refuses more, except the
-- end state); pruned with the batch receipts (FILAMENT_RETENTION_DAYS after the execution ended).
CREATE TABLE execution_events (
    event_id      BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id        TEXT NOT NULL,
    execution_id  TEXT NOT NULL,
    delivery      INTEGER NOT NULL,
    at            TIMESTAMPTZ NOT NULL DEFAULT now(),
    kind          TEXT NOT NULL,
    resource      TEXT,
    count         INTEGER NOT NULL DEFAULT 1,
    detail        JSONB NOT NULL DEFAULT '{}'::jsonb,
    FOREIGN KEY (run_id, execution_id) REFERENCES executions (run_id, execution_id) ON DELETE CASCADE
);
CREATE INDEX execution_events_by_execution ON execution_events (run_id, execution_id, event_id);
