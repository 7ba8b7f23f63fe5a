-- Several forward targets per source; see migrations/postgres. Rows queued before this are the
-- single-table target's, named `default`.
ALTER TABLE deliveries ADD COLUMN target TEXT NOT NULL DEFAULT 'default';

CREATE UNIQUE INDEX deliveries_event_row_target_idx ON deliveries (event_row, target);
DROP INDEX deliveries_event_row_idx;
