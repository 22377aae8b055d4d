-- Each run belongs to the principal that created it (issue 23). Runs created before principals
-- belong to the simple mode's principal, `default`.
ALTER TABLE runs ADD COLUMN principal text NOT NULL DEFAULT 'default';
CREATE INDEX runs_principal_created_at ON runs (principal, created_at DESC);
