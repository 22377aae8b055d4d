-- Per keyed batch: the smallest and largest staged value of each ordered key column
-- ([{"column", "min": {"type", "value"}, "max": ...}]), computed at ingestion. A keyed
-- publication bounds its MERGE's destination side with the ranges covering every batch.
ALTER TABLE batches ADD COLUMN key_ranges JSONB;
