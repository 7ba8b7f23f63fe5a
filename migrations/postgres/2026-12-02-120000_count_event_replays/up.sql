-- How often each event was answered with its stored response. Replays are counted in memory
-- and added here in batches every few seconds, so a replay costs no write of its own.
ALTER TABLE events ADD COLUMN replays BIGINT NOT NULL DEFAULT 0;

COMMENT ON COLUMN events.replays IS 'deliveries answered with the stored response (Idempotent-Replayed), added in batches by each serving process; approximate while a process has counts not yet flushed';
