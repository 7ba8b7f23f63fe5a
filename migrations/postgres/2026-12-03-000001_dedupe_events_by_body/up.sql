-- dedupe = "body": for a source that sets it, each event row carries a key of its payload (its
-- fingerprint), and one payload is stored once per source: a delivery of a stored payload
-- under another event id conflicts here and is answered as a replay of the stored event.
-- Sources without it leave the key NULL, which the index leaves out.
ALTER TABLE events ADD COLUMN dedupe_key BYTEA;

COMMENT ON COLUMN events.dedupe_key IS 'the payload''s fingerprint, for a source with dedupe = "body"; NULL otherwise. Unique per source where set: a payload stored under one event id is answered as a replay under any other';

CREATE UNIQUE INDEX events_source_dedupe_key_idx ON events (source, dedupe_key)
    WHERE dedupe_key IS NOT NULL;
