-- dedupe = "body"; see migrations/postgres: the payload's fingerprint for a source that sets
-- it, NULL otherwise, unique per source where set.
ALTER TABLE events ADD COLUMN dedupe_key BLOB;

CREATE UNIQUE INDEX events_source_dedupe_key_idx ON events (source, dedupe_key)
    WHERE dedupe_key IS NOT NULL;
