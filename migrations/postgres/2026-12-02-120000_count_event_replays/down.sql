ALTER TABLE events DROP COLUMN replays;
