COMMENT ON COLUMN deliveries.event_row IS NULL;

ALTER TABLE deliveries
    ADD CONSTRAINT deliveries_event_row_fkey FOREIGN KEY (event_row) REFERENCES events (id) ON DELETE CASCADE;
