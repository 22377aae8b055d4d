-- Atomic publication (issue 58): a run whose executions publish every destination in one
-- multi-statement transaction, or one execution asking for it when it opens. Off by default:
-- publication stays per table.
ALTER TABLE runs ADD COLUMN atomic BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE executions ADD COLUMN atomic BOOLEAN NOT NULL DEFAULT false;
