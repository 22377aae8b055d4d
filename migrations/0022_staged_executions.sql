-- A commit asked to hold (issue 58) stops at `staged`: every stream committed to its staging
-- table and the plan recorded, nothing published, until a second commit publishes it or an
-- abort discards it. No lease keeps a staged execution (nothing of it is in a replica's
-- memory), so the lease index keeps its predicate; the open-state index gains it.
ALTER TABLE executions DROP CONSTRAINT executions_state_check;
ALTER TABLE executions ADD CONSTRAINT executions_state_check
    CHECK (state IN ('extracting', 'paused', 'committing', 'staged', 'committed', 'failed', 'aborted'));
DROP INDEX executions_open;
CREATE INDEX executions_open ON executions (state) WHERE state IN ('extracting', 'paused', 'committing', 'staged');
-- When the delivery was staged: how long it has been held.
ALTER TABLE executions ADD COLUMN staged_at TIMESTAMPTZ;
