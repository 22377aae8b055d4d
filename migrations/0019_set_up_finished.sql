-- The timeline's `prepare_finished` event is `set_up_finished` (issue 56: operators see
-- set-up, as the code says, in settings, metrics and events alike). Rows written under the old
-- name are renamed; the store also reads the old name as the new one, for rows a replica of the
-- previous release writes during a rolling upgrade.
UPDATE execution_events SET kind = 'set_up_finished' WHERE kind = 'prepare_finished';
