DROP TABLE instances;
ALTER TABLE deliveries DROP COLUMN leased_by;
ALTER TABLE deliveries DROP COLUMN leased_until;
ALTER TABLE deliveries DROP COLUMN series;
