-- `paces`: see migrations/postgres. Here `next_start` is on the clock of the one host that
-- every process sharing the file runs on.
CREATE TABLE paces (
    source TEXT NOT NULL,
    target TEXT NOT NULL,
    next_start BIGINT NOT NULL,
    PRIMARY KEY (source, target)
);
