-- The runs list (GET /v1/runs, issue 24): newest first, keyset-paginated on (created_at,
-- run_id). An operator's list walks runs_created_at backwards; a principal's list (and the
-- `principal` filter) walks runs_principal_created_at. The latest execution of each listed run
-- is found through executions_run_created_at.
CREATE INDEX runs_created_at ON runs (created_at DESC, run_id DESC);
DROP INDEX runs_principal_created_at;
CREATE INDEX runs_principal_created_at ON runs (principal, created_at DESC, run_id DESC);
CREATE INDEX executions_run_created_at ON executions (run_id, created_at DESC, execution_id DESC);
