-- What each publication job cost and did, as BigQuery reported it (NULL when not reported):
-- shown on the execution's publication and summed in filament_publication_bytes_billed_total.
ALTER TABLE publications
    ADD COLUMN bytes_processed BIGINT,
    ADD COLUMN bytes_billed BIGINT,
    ADD COLUMN slot_ms BIGINT,
    ADD COLUMN rows_inserted BIGINT,
    ADD COLUMN rows_updated BIGINT,
    ADD COLUMN rows_deleted BIGINT;
