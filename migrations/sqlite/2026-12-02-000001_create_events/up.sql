-- The embedded store: the same tables as on PostgreSQL (see migrations/postgres), in SQLite's
-- types. Times are TEXT in one format, 'YYYY-MM-DD HH:MM:SS[.ffffff]+00:00', always UTC, so
-- they compare in time order as strings. Ids are never reused (AUTOINCREMENT), as with
-- BIGSERIAL, so a handler table that references events (id) never meets a recycled id.
CREATE TABLE events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    source TEXT NOT NULL,
    event_id TEXT NOT NULL,
    event_type TEXT,
    fingerprint BLOB NOT NULL,
    received_at TEXT NOT NULL,
    payload BLOB NOT NULL,
    headers TEXT NOT NULL,
    response_status INTEGER,
    response_content_type TEXT,
    response_body BLOB,
    replays INTEGER NOT NULL DEFAULT 0,
    CONSTRAINT events_source_event_id_key UNIQUE (source, event_id)
);

CREATE INDEX events_received_at_idx ON events (received_at);
CREATE INDEX events_source_received_at_idx ON events (source, received_at);

-- The forward outbox; see migrations/postgres. A row goes with its event (foreign keys are
-- switched on for every connection).
CREATE TABLE deliveries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    event_row INTEGER NOT NULL REFERENCES events (id) ON DELETE CASCADE,
    state TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'dead')),
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f+00:00', 'now')),
    last_status INTEGER,
    last_error TEXT,
    created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f+00:00', 'now')),
    delivered_at TEXT
);

CREATE INDEX deliveries_due_idx ON deliveries (next_attempt_at) WHERE state = 'pending';
CREATE INDEX deliveries_dead_idx ON deliveries (id) WHERE state = 'dead';
CREATE INDEX deliveries_event_row_idx ON deliveries (event_row);
