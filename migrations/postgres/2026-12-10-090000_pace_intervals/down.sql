ALTER TABLE paces DROP COLUMN interval_us;
