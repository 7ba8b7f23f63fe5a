-- What `attempts` and `next_attempt_at` alone could not tell apart.
--
-- `series` counts the attempt series of a row: a requeue or redeliver starts a new one (and
-- resets `attempts`), and so does taking a dead instance's row back (which numbers its attempt
-- again), so an outcome names (id, series, attempt) and one that comes back late, from a
-- series since replaced, changes nothing.
--
-- `leased_until` is set when a dispatcher takes the row for an attempt: the end of its lease,
-- as `next_attempt_at` is then; a failed attempt's outcome clears it, so a row waiting out a
-- backoff has it NULL. An ordered lane gives its head only while none of its rows is leased, so
-- an older event redelivered while a later one is in flight at another instance waits for it.
-- (Rows a claim hands straight to its dispatcher keep it NULL: only unordered lanes hand over,
-- and nothing reads it there.)
--
-- `leased_by` names the instance (a row of `instances`) whose attempt a row is waiting for:
-- set by a take and by a claim that hands the row over, cleared by a failed attempt's outcome.
-- When an instance is found dead (its lock is free), another takes its rows back at once,
-- rather than waiting for their leases to run out.
ALTER TABLE deliveries
    ADD COLUMN series INTEGER NOT NULL DEFAULT 0,
    ADD COLUMN leased_until TIMESTAMPTZ,
    ADD COLUMN leased_by BIGINT;

COMMENT ON COLUMN deliveries.series IS 'attempt series: 0 when queued, one more at each requeue, redeliver or take-back from a dead instance; an outcome applies only to the series it was sent in';
COMMENT ON COLUMN deliveries.leased_until IS 'the end of the lease of the attempt a take started (read while the row is pending); NULL while the row waits for its next attempt, and on rows a claim handed over';
COMMENT ON COLUMN deliveries.leased_by IS 'the instance (instances.id) whose attempt this pending row waits for; NULL while it waits for its next attempt';

-- The dispatchers running on this database. Each holds a session advisory lock,
-- (1751868024, id), for as long as it runs; a row whose lock is free is an instance that died.
CREATE TABLE instances (
    id BIGINT PRIMARY KEY,
    host TEXT NOT NULL,
    pid BIGINT NOT NULL,
    started_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

COMMENT ON TABLE instances IS 'hookbox: the running dispatchers, each alive while it holds its advisory lock (1751868024, id)';
