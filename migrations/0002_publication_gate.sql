-- When the current delivery's commit began publishing (its first destination job was about to
-- be submitted). An abort is accepted only before this moment: after it, destinations may have
-- changed, so the commit runs to its end (409 publication_in_progress). Reset by a redelivery.
ALTER TABLE executions ADD COLUMN publishing_at TIMESTAMPTZ;
