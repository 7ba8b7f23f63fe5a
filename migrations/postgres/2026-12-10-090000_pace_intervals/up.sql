-- The interval (microseconds between starts, from the target's `rate`) of the instance that
-- booked a target's schedule last. An instance whose own interval differs, booking after
-- another more than once, warns that the instances sharing this database disagree on the
-- target's `rate`. 0: not known (booked before this column).
ALTER TABLE paces ADD COLUMN interval_us BIGINT NOT NULL DEFAULT 0;

COMMENT ON COLUMN paces.interval_us IS 'microseconds between starts in the rate of the instance that booked last (0: unknown); an instance with another rate warns';
