-- `transmissions` per delivery: see migrations/postgres.
DROP TABLE IF EXISTS transmissions;

CREATE TABLE transmissions (
    transmission_id TEXT PRIMARY KEY NOT NULL,
    source TEXT NOT NULL,
    event_id TEXT NOT NULL,
    body_sha256 BLOB NOT NULL,
    seen_at TEXT NOT NULL
);

CREATE INDEX transmissions_source_seen_at_idx ON transmissions (source, seen_at);
