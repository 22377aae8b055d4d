-- Checkpoints are the extractor's position in its source (LSNs, SCNs, offsets, decimal
-- cursors) and come back exactly as sent: JSON text kept verbatim (`json`, not `jsonb`, which
-- would reorder keys; the gateway never parses them into floating point either). The durable
-- checkpoint of a run is a copy of one of them.
ALTER TABLE checkpoints ALTER COLUMN value TYPE json USING value::json;
ALTER TABLE runs ALTER COLUMN durable_checkpoint TYPE json USING durable_checkpoint::json;
