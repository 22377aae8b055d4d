-- Jobs are ours or refused (issue 54). Job ids end in a tag keyed by a secret the fleet shares
-- (HMAC-SHA256, publish/job_id.rs), so they cannot be predicted from the run id. The first
-- replica to start generates the secret as generation 1; an operator rotates it by adding the
-- next generation (docs/operations.md), which each replica uses from its next start. A
-- publication never recomputes its id: a redelivery re-attaches under the id its record holds,
-- so a rotation changes no in-flight publication's id.
CREATE TABLE job_id_keys (
    generation INTEGER PRIMARY KEY CHECK (generation > 0),
    secret BYTEA NOT NULL CHECK (length(secret) >= 32),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- The SHA-256 of each statement submitted under the publication's job id, recorded before it
-- is submitted (a redelivery re-attaching under the same id over its own staging table adds
-- its own). A job found under the id (409 on jobs.insert) is taken as the publication only
-- when its query is one of these; anything else fails the publication with `foreign_job`.
ALTER TABLE publications ADD COLUMN statement_sha256 TEXT[];
