-- One row per transmission id of a scheme whose signature covers one beside only a checksum of
-- the body (PayPal: the transmission id, time and webhook id, and the body's CRC32), bound to the
-- event id of the first delivery that came with it. Every delivery with that id must carry the
-- same event: another body under a genuine delivery's headers (forged to its CRC32) is refused.
-- Written for every delivery whose signature matched (a replay too) and for one whose check
-- waited on a certificate that could not be fetched; removed with the source's events, by the
-- same retention window.
CREATE TABLE transmissions (
    source TEXT NOT NULL,
    transmission_id TEXT NOT NULL,
    event_id TEXT NOT NULL,
    seen_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (source, transmission_id)
);

CREATE INDEX transmissions_source_seen_at_idx ON transmissions (source, seen_at);

COMMENT ON TABLE transmissions IS 'hookbox: each transmission id (PayPal) bound to the one event id it may carry; purged with the source''s events';
