-- The dispatcher takes rows per (source, target), a lane: each target's concurrency, rate and
-- order are its own. The event's source and received time are copied onto its rows so that a
-- lane's due rows, and the head of an ordered lane, come from one index each; `queued_at`
-- starts an attempt series' lag (commit to delivered), reset by a requeue or redeliver.
ALTER TABLE deliveries
    ADD COLUMN source TEXT,
    ADD COLUMN received_at TIMESTAMPTZ,
    ADD COLUMN queued_at TIMESTAMPTZ;

UPDATE deliveries d
SET source = e.source, received_at = e.received_at, queued_at = d.created_at
FROM events e
WHERE e.id = d.event_row;

ALTER TABLE deliveries
    ALTER COLUMN source SET NOT NULL,
    ALTER COLUMN received_at SET NOT NULL,
    ALTER COLUMN queued_at SET NOT NULL;

CREATE INDEX deliveries_lane_due_idx ON deliveries (source, target, next_attempt_at)
    WHERE state = 'pending';
CREATE INDEX deliveries_lane_order_idx ON deliveries (source, target, received_at, event_row)
    WHERE state = 'pending';
DROP INDEX deliveries_due_idx;

COMMENT ON COLUMN deliveries.source IS 'the event''s source, copied from events so a lane (source, target) is found from this table alone';
COMMENT ON COLUMN deliveries.received_at IS 'the event''s received time, copied from events: an ordered target gets its lane''s rows in (received_at, event_row) order';
COMMENT ON COLUMN deliveries.queued_at IS 'when this attempt series was queued: the claim''s commit, or the last requeue or redeliver (the start of hookbox_forward_lag_seconds)';
