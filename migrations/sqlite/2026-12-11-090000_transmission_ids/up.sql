-- `transmissions`: see migrations/postgres.
CREATE TABLE transmissions (
    source TEXT NOT NULL,
    transmission_id TEXT NOT NULL,
    event_id TEXT NOT NULL,
    seen_at TEXT NOT NULL,
    PRIMARY KEY (source, transmission_id)
);

CREATE INDEX transmissions_source_seen_at_idx ON transmissions (source, seen_at);
