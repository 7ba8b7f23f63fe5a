-- One row per paced forward target (`rate`): the moment from which its next attempt may start,
-- shared by every instance on this database, so that `rate` holds across all of them. An
-- instance books starts here (a few at a time, `interval` apart, never further ahead than it
-- can keep a row waiting under its lease) and starts each at its moment.
--
-- `next_start` is in microseconds since the Unix epoch, on the database server's clock
-- (`clock_timestamp()`), so instances on hosts whose clocks differ book one schedule.
CREATE TABLE paces (
    source TEXT NOT NULL,
    target TEXT NOT NULL,
    next_start BIGINT NOT NULL,
    PRIMARY KEY (source, target)
);

COMMENT ON TABLE paces IS 'hookbox: per paced forward target, the moment (microseconds since the Unix epoch, database clock) from which its next attempt may start, booked by every instance';
