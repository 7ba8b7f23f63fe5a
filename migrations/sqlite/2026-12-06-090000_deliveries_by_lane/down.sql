CREATE INDEX deliveries_due_idx ON deliveries (next_attempt_at) WHERE state = 'pending';
DROP INDEX deliveries_lane_order_idx;
DROP INDEX deliveries_lane_due_idx;
ALTER TABLE deliveries DROP COLUMN queued_at;
ALTER TABLE deliveries DROP COLUMN received_at;
ALTER TABLE deliveries DROP COLUMN source;
