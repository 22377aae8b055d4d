-- Run settings of its publication jobs: the project they run and are billed in (NULL: the
-- destination's), and the most bytes one may bill (NULL: no limit; a job over it fails with
-- publication_too_expensive).
ALTER TABLE runs ADD COLUMN job_project TEXT, ADD COLUMN maximum_bytes_billed BIGINT;
