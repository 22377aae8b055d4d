-- The write options a resource declares beyond its write mode (`model::write_options`, issue 25:
-- today `metadata_columns`), in their stored JSON shape; '{}' writes as the seed's modes do.
-- Part of the declaration: fixed once the resource has batches, covered by the fingerprint.
ALTER TABLE resources ADD COLUMN write_options JSONB NOT NULL DEFAULT '{}';

-- When the delivery was paused (NULL: never). A paused execution is a segment of a run that
-- resumes in a later execution; the first execution committed without a pause completes the
-- run's snapshot, and only its publication deletes the keys a `delete_missing` run did not send.
-- A redelivery starts unpaused.
ALTER TABLE executions ADD COLUMN paused_at TIMESTAMPTZ;
