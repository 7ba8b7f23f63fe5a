-- How many times an instance took its lock again after its lock connection broke. Another
-- instance that found the lock free restarts its wait when this changes: a lock taken again
-- and lost again between two of its looks is not a lock free all along.
ALTER TABLE instances ADD COLUMN locks_taken BIGINT NOT NULL DEFAULT 0;

COMMENT ON COLUMN instances.locks_taken IS 'times this instance took its lock again after its lock connection broke; another instance waiting to take it for dead starts its wait over when this changes';
