-- `series`, `leased_until`, `leased_by` and `instances`: see migrations/postgres. Here an
-- instance is alive while it holds an exclusive lock on its file beside the database
-- (`<database>-hookbox-<id>.lock`).
ALTER TABLE deliveries ADD COLUMN series INTEGER NOT NULL DEFAULT 0;
ALTER TABLE deliveries ADD COLUMN leased_until TEXT;
ALTER TABLE deliveries ADD COLUMN leased_by BIGINT;

CREATE TABLE instances (
    id BIGINT PRIMARY KEY,
    host TEXT NOT NULL,
    pid BIGINT NOT NULL,
    started_at TEXT NOT NULL
);
