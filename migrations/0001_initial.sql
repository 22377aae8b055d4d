-- The gateway's durable state. Upload payloads themselves are never stored here: Postgres holds
-- what was promised (receipts), where it went (staging streams) and what was published.
-- Identifiers are TEXT because the contract bounds them; states are TEXT with CHECKs so that a
-- state the code does not know cannot be written.

CREATE TABLE runs (
    run_id                  TEXT PRIMARY KEY,
    project                 TEXT NOT NULL,
    dataset                 TEXT NOT NULL,
    location                TEXT,
    batching                JSONB NOT NULL DEFAULT '{}'::jsonb,
    -- SHA-256 of the canonical creation request: the same request again is idempotent (200),
    -- another definition under the same id is a conflict (409 run_conflict).
    definition_sha256       TEXT NOT NULL,
    -- The last checkpoint of the last execution that committed (NULL until one does).
    durable_checkpoint      JSONB,
    durable_checkpoint_execution_id TEXT,
    created_at              TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at              TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE resources (
    run_id       TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    resource     TEXT NOT NULL,
    table_name   TEXT NOT NULL,
    write_mode   TEXT NOT NULL CHECK (write_mode IN ('full_replace', 'full_append', 'full_upsert',
                     'incremental_append', 'incremental_upsert', 'incremental_delete', 'cdc_append', 'cdc_merge')),
    primary_key  TEXT[] NOT NULL DEFAULT '{}',
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, resource)
);

CREATE TABLE executions (
    run_id        TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    execution_id  TEXT NOT NULL,
    -- Each POST of the execution starts a new delivery; batches belong to one delivery.
    delivery      INTEGER NOT NULL DEFAULT 1 CHECK (delivery >= 1),
    state         TEXT NOT NULL CHECK (state IN ('extracting', 'paused', 'committing', 'committed', 'failed', 'aborted')),
    error         JSONB,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at   TIMESTAMPTZ,
    PRIMARY KEY (run_id, execution_id)
);
CREATE INDEX executions_open ON executions (state) WHERE state IN ('extracting', 'paused', 'committing');

-- One row per delivery of an execution: when it started and how it ended.
CREATE TABLE deliveries (
    run_id        TEXT NOT NULL,
    execution_id  TEXT NOT NULL,
    delivery      INTEGER NOT NULL,
    started_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    final_state   TEXT,
    PRIMARY KEY (run_id, execution_id, delivery),
    FOREIGN KEY (run_id, execution_id) REFERENCES executions (run_id, execution_id) ON DELETE CASCADE
);

-- Per resource and delivery: the Arrow schema every batch must repeat, and where its rows are
-- staged. stream_name is recorded before the stream is committed, so that a commit whose
-- response was lost can be resolved by asking BigQuery instead of rewriting data.
CREATE TABLE staging_streams (
    run_id               TEXT NOT NULL,
    execution_id         TEXT NOT NULL,
    delivery             INTEGER NOT NULL,
    resource             TEXT NOT NULL,
    arrow_schema         JSONB NOT NULL,
    arrow_schema_sha256  TEXT NOT NULL,
    staging_table        TEXT NOT NULL,
    stream_name          TEXT,
    stream_created_at    TIMESTAMPTZ,
    rows_acknowledged    BIGINT NOT NULL DEFAULT 0,
    finalized_row_count  BIGINT,
    committed_at         TIMESTAMPTZ,
    created_at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, execution_id, delivery, resource),
    FOREIGN KEY (run_id, execution_id, delivery) REFERENCES deliveries (run_id, execution_id, delivery) ON DELETE CASCADE
);

-- Receipts: one row per accepted batch request. checkpoint_seq is the number of checkpoints the
-- delivery had recorded when the batch was accepted (its position between checkpoints).
CREATE TABLE batches (
    run_id              TEXT NOT NULL,
    execution_id        TEXT NOT NULL,
    delivery            INTEGER NOT NULL,
    resource            TEXT NOT NULL,
    seq                 BIGINT NOT NULL CHECK (seq >= 0),
    rows                BIGINT NOT NULL CHECK (rows >= 0),
    uncompressed_bytes  BIGINT NOT NULL CHECK (uncompressed_bytes >= 0),
    arrow_ipc_sha256    TEXT NOT NULL,
    checkpoint_seq      BIGINT NOT NULL,
    created_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, execution_id, delivery, resource, seq),
    FOREIGN KEY (run_id, execution_id, delivery, resource)
        REFERENCES staging_streams (run_id, execution_id, delivery, resource) ON DELETE CASCADE
);

CREATE TABLE checkpoints (
    run_id          TEXT NOT NULL,
    execution_id    TEXT NOT NULL,
    delivery        INTEGER NOT NULL,
    checkpoint_seq  BIGINT NOT NULL,
    value           JSONB NOT NULL,
    flushed_rows    BIGINT NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, execution_id, delivery, checkpoint_seq),
    FOREIGN KEY (run_id, execution_id, delivery) REFERENCES deliveries (run_id, execution_id, delivery) ON DELETE CASCADE
);

-- One publication (query job) per execution and resource. The fingerprint is persisted before
-- the job is submitted, so a redelivered execution reuses a job only when it staged the same.
CREATE TABLE publications (
    run_id          TEXT NOT NULL,
    execution_id    TEXT NOT NULL,
    resource        TEXT NOT NULL,
    delivery        INTEGER NOT NULL,
    destination     TEXT NOT NULL,
    job_id          TEXT NOT NULL,
    fingerprint     TEXT NOT NULL,
    state           TEXT NOT NULL CHECK (state IN ('running', 'done', 'failed')),
    rows_affected   BIGINT,
    error           JSONB,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, execution_id, resource),
    FOREIGN KEY (run_id, execution_id) REFERENCES executions (run_id, execution_id) ON DELETE CASCADE
);
