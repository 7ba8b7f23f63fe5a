-- The forward outbox: one row per stored event of a source with a forward target, written in
-- the claim transaction, so an event is queued if and only if it is stored. A dispatcher sends
-- it after commit and records the outcome here; rows are never deleted but with their event.
CREATE TABLE deliveries (
    id BIGSERIAL PRIMARY KEY,
    event_row BIGINT NOT NULL REFERENCES events (id) ON DELETE CASCADE,
    state TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'dead')),
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_status SMALLINT,
    last_error TEXT,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    delivered_at TIMESTAMPTZ
);

CREATE INDEX deliveries_due_idx ON deliveries (next_attempt_at) WHERE state = 'pending';
CREATE INDEX deliveries_dead_idx ON deliveries (id) WHERE state = 'dead';
CREATE INDEX deliveries_event_row_idx ON deliveries (event_row);

COMMENT ON TABLE deliveries IS 'hookbox: the forward outbox, one row per stored event to hand on downstream';
COMMENT ON COLUMN deliveries.next_attempt_at IS 'when a pending row is due; while an attempt is under way, the end of its lease, so no other dispatcher takes it meanwhile';
COMMENT ON COLUMN deliveries.attempts IS 'attempts started so far (also the X-Hookbox-Attempt of the latest)';
