ALTER TABLE instances DROP COLUMN locks_taken;
