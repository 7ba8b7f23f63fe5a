-- Several forward targets per source: one outbox row per (event, target) whose `events`
-- patterns match. Rows queued before this are the single-table target's, named `default`.
ALTER TABLE deliveries ADD COLUMN target TEXT NOT NULL DEFAULT 'default';

-- One row per (event, target); a redelivery re-queues the row rather than adding another. The
-- unique index also serves lookups by event, so the plain one goes.
CREATE UNIQUE INDEX deliveries_event_row_target_idx ON deliveries (event_row, target);
DROP INDEX deliveries_event_row_idx;

COMMENT ON COLUMN deliveries.target IS 'the forward target''s name within its source (default: the single-table [sources.X.forward])';
