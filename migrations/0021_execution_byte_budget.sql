-- A run's budget for the bytes every publication of one execution may process together
-- (issue 58): judged against the priced plan at the commit's barrier, before any publication
-- job, as the per-job `maximum_bytes_billed` is judged there too. NULL: no such budget.
ALTER TABLE runs ADD COLUMN maximum_bytes_billed_per_execution BIGINT;
