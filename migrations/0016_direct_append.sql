-- Direct append (issue 44): an append-mode resource declared direct_append may write its PENDING
-- stream into the destination table itself, committed at publication with
-- BatchCommitWriteStreams instead of a query job. The staging row records which way its stream
-- went (a direct stream has no staging table to delete), and the publication records the
-- streams it commits before it commits them, so a redelivery that finds it running asks
-- BigQuery about those streams rather than committing other ones.
ALTER TABLE staging_streams ADD COLUMN direct_append BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE publications ADD COLUMN committed_streams TEXT[];
