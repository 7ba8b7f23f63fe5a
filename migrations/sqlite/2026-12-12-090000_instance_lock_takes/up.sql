-- `instances.locks_taken`: see migrations/postgres.
ALTER TABLE instances ADD COLUMN locks_taken BIGINT NOT NULL DEFAULT 0;
