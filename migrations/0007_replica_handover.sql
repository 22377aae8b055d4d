-- Replicas that forward and hand over (issue 12).
-- owner_url: where the owning replica takes forwarded requests (FILAMENT_ADVERTISE_URL), so any
-- replica can stream an execution's requests to the one whose memory holds its uploads.
-- handed_over: the owner shut down cleanly (every accepted row appended and acknowledged, each
-- stream's offset recorded below) and released the execution; the next replica that receives
-- one of its requests adopts it and goes on appending to the same PENDING streams. Ownership
-- thus moves only by the owner's own release, never by a claim over a live lease: a stalled
-- owner whose lease expired finds its execution failed (the sweep) and every later change
-- refused by the state checks, so no separate fencing token is needed.
ALTER TABLE executions ADD COLUMN owner_url TEXT, ADD COLUMN handed_over BOOLEAN NOT NULL DEFAULT false;
-- At hand-over: what commit needs of a stream whose lane ran on another replica (the
-- destination's columns; rows_acknowledged becomes the exact offset to resume at).
ALTER TABLE staging_streams ADD COLUMN destination_columns JSONB;
