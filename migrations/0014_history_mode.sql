-- Write mode `history` (issue 25): every version of each key, with its validity interval.
ALTER TABLE resources DROP CONSTRAINT resources_write_mode_check;
ALTER TABLE resources ADD CONSTRAINT resources_write_mode_check CHECK (write_mode IN ('full_replace', 'full_append',
    'full_upsert', 'incremental_append', 'incremental_upsert', 'incremental_delete', 'cdc_append', 'cdc_merge', 'history'));
