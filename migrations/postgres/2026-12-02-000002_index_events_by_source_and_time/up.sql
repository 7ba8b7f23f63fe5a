-- The retention purge and export select a source's events by age; with each source on its own
-- window, an index on time alone would make every purge batch wade through other sources' rows.
CREATE INDEX events_source_received_at_idx ON events (source, received_at);
