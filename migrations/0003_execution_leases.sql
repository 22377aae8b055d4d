-- Which gateway replica serves an execution: its uploads live in that process's memory, so
-- batches, checkpoints and transitions of an open execution must reach it (others refuse with
-- 503 execution_owned_elsewhere). The owner renews the lease while it lives; an execution whose
-- lease expired lost its owner (a crash) and is failed with gateway_restarted by any replica.
-- Ownership is never transferred, only expired, so no fencing token is needed: a stalled owner
-- finds its execution failed and every later transition refused by the state checks.
ALTER TABLE executions ADD COLUMN owner TEXT, ADD COLUMN lease_expires_at TIMESTAMPTZ;
CREATE INDEX executions_leases ON executions (lease_expires_at) WHERE state IN ('extracting', 'paused', 'committing');
