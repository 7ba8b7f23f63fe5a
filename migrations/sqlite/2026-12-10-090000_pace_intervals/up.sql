-- `paces.interval_us`: see migrations/postgres.
ALTER TABLE paces ADD COLUMN interval_us BIGINT NOT NULL DEFAULT 0;
