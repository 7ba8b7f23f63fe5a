-- `transmissions` bound each id to an event id, per source; a body forged to a 503'd delivery's
-- CRC32 that kept its event id, or a genuine delivery sent to a second source with the same
-- webhook_id, got through. Each id is now bound to the one source, event id and body (its
-- SHA-256) it may carry, keyed by the id alone (the provider's, unique across its webhooks).
-- The old bindings are dropped with the old table: they cover only deliveries within the
-- tolerance window (five minutes by default) of the upgrade.
DROP TABLE IF EXISTS transmissions;

CREATE TABLE transmissions (
    transmission_id TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    event_id TEXT NOT NULL,
    body_sha256 BYTEA NOT NULL,
    seen_at TIMESTAMPTZ NOT NULL
);

CREATE INDEX transmissions_source_seen_at_idx ON transmissions (source, seen_at);

COMMENT ON TABLE transmissions IS 'hookbox: each transmission id (PayPal) bound to the one source, event id and body it may carry; purged with the source''s events';
