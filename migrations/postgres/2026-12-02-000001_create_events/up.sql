-- One row per claimed event: the claim, the payload and headers kept for export and the admin
-- API, and the response every later delivery is answered with. The claim and the response are
-- written in one transaction, so no other transaction ever sees a row without its response.
CREATE TABLE events (
    id BIGSERIAL PRIMARY KEY,
    source TEXT NOT NULL,
    event_id TEXT NOT NULL,
    event_type TEXT,
    fingerprint BYTEA NOT NULL,
    received_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    payload BYTEA NOT NULL,
    headers JSONB NOT NULL,
    response_status SMALLINT,
    response_content_type TEXT,
    response_body BYTEA,
    CONSTRAINT events_source_event_id_key UNIQUE (source, event_id)
);

CREATE INDEX events_received_at_idx ON events (received_at);

COMMENT ON TABLE events IS 'hookbox: one row per claimed webhook event; the unique (source, event_id) is the claim';
COMMENT ON COLUMN events.fingerprint IS 'SHA-256 of the payload, less fields a provider changes between deliveries; a different payload under the same id is refused';
COMMENT ON COLUMN events.payload IS 'the raw request body, byte for byte';
COMMENT ON COLUMN events.headers IS 'the headers the scheme needs, and content-type, lowercase names';
COMMENT ON COLUMN events.response_status IS 'the stored answer: set in the claim transaction, so never NULL once committed';
