-- The outbox rows' foreign key to their event goes: its check ran once per row in every
-- forwarding claim (a lookup and a lock of the event row just inserted in the same statement),
-- the largest single part of what an outbox row cost PostgreSQL. What it guarded is kept by
-- hookbox itself: every outbox row is inserted in the transaction that inserts its event (the
-- claim), redeliver and requeue only update rows that exist, and the retention purge deletes a
-- batch's outbox rows in the transaction that deletes its events, after them.
-- (SQLite keeps its foreign key: there the check costs nothing worth a table rebuild.)
ALTER TABLE deliveries DROP CONSTRAINT deliveries_event_row_fkey;

COMMENT ON COLUMN deliveries.event_row IS 'the event''s row (events.id); no foreign key: rows are inserted with their event and deleted with it by the purge';
