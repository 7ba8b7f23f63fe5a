-- The outbox rows' foreign key to their event goes: its check ran once per row in every
-- forwarding claim (a lookup and a lock of the event row just inserted in the same statement),
-- the largest single part of what an outbox row cost PostgreSQL. What it guarded is kept by
-- hookbox itself: a claim inserts its rows in its event's own statement; a redeliver or a
-- requeue inserts rows only for an event it reads FOR KEY SHARE; and the retention purge
-- deletes a batch's outbox rows in the transaction that deletes its events, after them.
-- (SQLite keeps its foreign key: there the check costs nothing worth a table rebuild.)
ALTER TABLE deliveries DROP CONSTRAINT deliveries_event_row_fkey;

COMMENT ON COLUMN deliveries.event_row IS 'the event''s row (events.id); no foreign key: the claim, redeliver and the purge keep it pointing at a stored event';
