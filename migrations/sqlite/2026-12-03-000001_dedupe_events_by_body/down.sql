DROP INDEX events_source_dedupe_key_idx;
ALTER TABLE events DROP COLUMN dedupe_key;
