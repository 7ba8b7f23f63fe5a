-- Rows are taken per (source, target), a lane; see migrations/postgres. SQLite adds a NOT NULL
-- column only with a constant default, which the backfill below replaces on every row and
-- which hookbox's own inserts never use.
ALTER TABLE deliveries ADD COLUMN source TEXT NOT NULL DEFAULT '';
ALTER TABLE deliveries ADD COLUMN received_at TEXT NOT NULL DEFAULT '1970-01-01 00:00:00.000000+00:00';
ALTER TABLE deliveries ADD COLUMN queued_at TEXT NOT NULL DEFAULT '1970-01-01 00:00:00.000000+00:00';

UPDATE deliveries
SET source = (SELECT e.source FROM events e WHERE e.id = deliveries.event_row),
    received_at = (SELECT e.received_at FROM events e WHERE e.id = deliveries.event_row),
    queued_at = created_at;

CREATE INDEX deliveries_lane_due_idx ON deliveries (source, target, next_attempt_at)
    WHERE state = 'pending';
CREATE INDEX deliveries_lane_order_idx ON deliveries (source, target, received_at, event_row)
    WHERE state = 'pending';
DROP INDEX deliveries_due_idx;
