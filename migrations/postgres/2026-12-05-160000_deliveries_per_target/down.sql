CREATE INDEX deliveries_event_row_idx ON deliveries (event_row);
DROP INDEX deliveries_event_row_target_idx;
ALTER TABLE deliveries DROP COLUMN target;
