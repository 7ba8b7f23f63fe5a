//! The dispatcher's core, whatever the transport: take due rows lane by lane, start each when
//! its lane's pace allows, hand it over within the target's timeout, judge the outcome, and
//! record outcomes in batches.
//!
//! One task takes rows; each taken row is a task of its own (pace → hand-off → outcome); one
//! more task commits the outcomes in batches: the first outcome waits up to [`GATHER_FOR`] for
//! others (not one of an ordered lane, whose next row waits for it), and whatever ended while
//! the last batch was being written goes in the next, in one transaction. The taker sleeps
//! until a claim commits, an attempt starts or ends, a batch of outcomes commits (an ordered
//! lane's next row may be taken), a retry of its own comes due, an ordered lane's rows queued
//! here settle (`ORDER_SETTLE` after they were received), or the poll (rows queued or released
//! by other instances).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use tokio::time::Instant;

use super::lane::Lane;
use super::transport::{Handoff, Step, Transport, Transports};
use super::{Outbox, Wake};
use crate::db::deliveries::{Due, Settle, Settled};
use crate::ids::ClientText;
use crate::metrics::ForwardResult;
use crate::retry;

/// How often the outbox is looked at when nothing wakes the dispatcher: rows claimed by another
/// instance, or released by one (an ordered lane's head delivered there), are picked up within
/// this.
const POLL_EVERY: Duration = Duration::from_millis(250);

/// How long the first outcome of a batch waits for others to be recorded with it, unless an
/// ordered lane's is among them (its next row waits for it). Each batch is a statement and a
/// commit; recording outcomes the moment they end made batches of a few rows under load. An
/// outcome recorded later holds nothing back: a lane's room counts attempts, not records.
const GATHER_FOR: Duration = Duration::from_millis(20);

/// A batch of outcomes stops gathering at this many.
const GATHER_AT_MOST: usize = 1024;

/// How often this instance looks for instances that died, whose leased rows it takes back.
const INSTANCES_EVERY: Duration = Duration::from_secs(2);

/// How often the outbox gauges are recounted.
const GAUGES_EVERY: Duration = Duration::from_secs(5);

/// The first retry waits about this long; each further one about twice the last.
const BACKOFF_BASE: Duration = Duration::from_secs(1);

/// No backoff waits longer than this.
const BACKOFF_CAP: Duration = Duration::from_secs(3600);

/// A `Retry-After` is honoured up to this: a retry never comes sooner than the downstream asked,
/// unless it asked for more than a week (a value that large is a mistake, and would leave the
/// row pending past any retention window).
const RETRY_AFTER_CAP: Duration = Duration::from_secs(7 * 24 * 3600);

/// What one thread's attempts go through: each lane's transport (built on this thread).
pub struct Runner {
    outbox: Outbox,
    transports: Vec<Rc<dyn Transport>>,
}

impl Runner {
    /// The runner of `outbox`'s lanes, on this thread.
    pub fn new(outbox: &Outbox) -> Runner {
        let transports = Transports::new(outbox.lanes.iter().map(|lane| &lane.target));
        Runner {
            outbox: outbox.clone(),
            transports: outbox
                .lanes
                .iter()
                .map(|lane| transports.for_target(&lane.target))
                .collect(),
        }
    }

    /// Takes what every lane that may have rows in the outbox has room for; each row comes
    /// with its lane's index and the latest its attempt may start ([`Lane::start_by`]).
    pub async fn take(&self) -> Vec<(usize, Due, Instant)> {
        let reserved: Vec<(usize, usize, crate::db::deliveries::Want)> = self
            .outbox
            .lanes
            .iter()
            .enumerate()
            .filter(|(_, lane)| lane.worth_a_take())
            .filter_map(|(i, lane)| {
                lane.reserve()
                    .map(|want| (i, usize::try_from(want.limit).unwrap_or(0), want))
            })
            .collect();
        if reserved.is_empty() {
            return Vec::new();
        }
        let wants: Vec<_> = reserved.iter().map(|(_, _, want)| want.clone()).collect();
        // Before the statement that writes the leases goes: they end no sooner than a lease
        // from here.
        let asked = Instant::now();
        let Some((due, held)) = self.outbox.take(wants).await else {
            // The outbox could not be read: the lanes' backlogs stand, so claims keep queuing
            // rows the normal way until a take has read it.
            for (i, reserved, _) in &reserved {
                self.outbox.lanes[*i].give_back(*reserved);
            }
            return Vec::new();
        };
        let mut by_lane: Vec<(usize, Due, Instant)> = Vec::with_capacity(due.len());
        for due in due {
            match self.outbox.lane_of(&due.source, &due.target) {
                Some(i) => by_lane.push((i, due, self.outbox.lanes[i].start_by(asked))),
                // Only configured lanes are asked for, so this cannot come back; were it to,
                // the row's lease runs out and it waits for its target again.
                None => tracing::error!(
                    source = %due.source, target = %due.target,
                    "the outbox gave a row of a lane not asked for"
                ),
            }
        }
        for (i, reserved, _) in &reserved {
            let taken = by_lane.iter().filter(|(lane, _, _)| lane == i).count();
            self.outbox.lanes[*i].taken(*reserved, taken);
        }
        for (asked_for, (i, _, want)) in reserved.iter().enumerate() {
            if want.ordered {
                self.outbox.lanes[*i].held_elsewhere(held.contains(&asked_for), asked);
            }
        }
        by_lane
    }

    /// One attempt of a taken row: waits for a slot and its turn, hands it over, judges the
    /// outcome, and counts it. `started` is told when a paced one starts (its lane has room again).
    /// A row whose turn comes after `start_by` is not sent (see [`Lane::start_by`]): it goes
    /// back to the outbox untried, unless another instance has taken it since.
    pub async fn attempt(
        &self,
        lane: usize,
        due: Due,
        start_by: Instant,
        started: &Wake,
    ) -> Settled {
        let transport = self.transports[lane].clone();
        let lane = &self.outbox.lanes[lane];
        let booking = |want| self.outbox.book(lane, want);
        let start = lane.start(booking);
        tokio::pin!(start);
        let started_or_stopped = tokio::select! {
            // A slot free and no pace to wait for: it starts, even while stopping.
            biased;
            start = &mut start => Some(start),
            () = started.until_stopped() => None,
        };
        let slot = match started_or_stopped {
            Some(Ok(slot)) => slot,
            // The stop came while it waited for a slot or its turn: it goes back to the outbox
            // untried, due at once, for another instance (or this one restarted) to send.
            None => {
                started.poke();
                return untried(&due, Duration::ZERO);
            }
            Some(Err(after)) => {
                // Other instances booked the target's schedule beyond what this row may wait
                // for: it goes back, due when there is room, not counted as an attempt.
                started.poke();
                return untried(&due, after);
            }
        };
        if lane.pace().is_some() {
            // Fewer rows wait for a turn now: the lane may take more.
            started.poke();
        }
        if Instant::now() > start_by {
            lane.finished(slot);
            tracing::warn!(
                source = %due.source,
                target = %due.target,
                event.id = %ClientText::new(&due.event_id, usize::MAX),
                attempt = due.attempt,
                "not sent: this delivery's lease ran out before its turn came (the process was \
                 stopped or starved for a while, or, for a paced target, other instances held \
                 its schedule, or the database did not answer its booking, that long), so \
                 another instance may have taken it; it goes back to the outbox unless one has"
            );
            started.poke();
            return untried(&due, Duration::ZERO);
        }
        started.attempt_started(due.id);
        let outcome = attempt(&self.outbox, lane, &*transport, &due).await;
        lane.finished(slot);
        Settled {
            id: due.id,
            attempt: due.attempt,
            series: due.series,
            outcome,
        }
    }
}

/// A row that goes back to the outbox without an attempt, due in `after`.
fn untried(due: &Due, after: Duration) -> Settled {
    Settled {
        id: due.id,
        attempt: due.attempt,
        series: due.series,
        outcome: Settle::Untried { after },
    }
}

/// `handoff`, if it ends within `timeout`. When the time is up, it gets a last look after the
/// runtime has read what came meanwhile: a process stopped (SIGSTOP, a frozen VM) past the
/// timeout wakes to its timer and the answer that came while it slept at once, and the timer
/// alone would have the attempt sent again though it was answered.
async fn within<F: std::future::Future>(timeout: Duration, handoff: F) -> Option<F::Output> {
    let mut handoff = std::pin::pin!(handoff);
    if let Ok(done) = tokio::time::timeout(timeout, handoff.as_mut()).await {
        return Some(done);
    }
    tokio::task::yield_now().await;
    futures_util::FutureExt::now_or_never(handoff)
}

/// Sends one attempt within the target's timeout, judges it, logs it and counts it.
// At ERROR level, so that its fields are on every line whatever level `RUST_LOG` lets through.
#[tracing::instrument(
    name = "forward",
    level = "error",
    skip_all,
    fields(
        source = %due.source,
        target = %due.target,
        event.id = %ClientText::new(&due.event_id, usize::MAX),
        attempt = due.attempt
    )
)]
async fn attempt(outbox: &Outbox, lane: &Lane, transport: &dyn Transport, due: &Due) -> Settle {
    let config = &lane.target.config;
    let started = std::time::Instant::now();
    let step = Step::default();
    let handoff = match within(config.timeout, transport.hand_off(due, &step)).await {
        Some(handoff) => handoff,
        None => Handoff::Failed {
            status: None,
            error: format!(
                "no answer within {}{}{}",
                crate::config::Spelt(config.timeout),
                match step.now() {
                    "" => String::new(),
                    doing => format!(" (the attempt was {doing})"),
                },
                transport
                    .trouble()
                    .map_or(String::new(), |trouble| format!("; {trouble}"))
            ),
            retry_after: None,
        },
    };
    if let Handoff::NotSent { error } = &handoff {
        tracing::warn!(
            error = %error,
            retry_in_ms = NOT_SENT_PAUSE.as_millis() as u64,
            "forward attempt not made; it is not counted against max_attempts"
        );
    }
    let outcome = settle_of(handoff, due.attempt, config.max_attempts);
    let elapsed = started.elapsed();
    let result = match &outcome {
        Settle::Delivered { status } => {
            lane.attempt_delivered();
            tracing::info!(
                status,
                duration_ms = elapsed.as_millis() as u64,
                "forwarded"
            );
            ForwardResult::Delivered
        }
        Settle::Retry {
            status,
            error,
            after,
        } => {
            lane.attempt_failed(*status, error);
            tracing::warn!(
                error = %error,
                retry_in_ms = after.as_millis() as u64,
                "forward attempt failed; will retry"
            );
            ForwardResult::Retried
        }
        Settle::Dead { status, error } => {
            // Its last attempt failed as the ones before did (no answer, 5xx, 429): the target
            // is still down. Left out, a target whose every event died before the run reached
            // FAILING_TOLD_AFTER was never said down (a black-box run). A final 3xx or 4xx is
            // an answer: the target is up.
            if matches!(status, None | Some(429 | 500..)) {
                lane.attempt_failed(*status, error);
            }
            tracing::error!(error = %error, "forward gave up; the delivery is dead-lettered");
            ForwardResult::Dead
        }
        // Never the judgement of an answer (`settle_of` makes none): nothing was sent.
        Settle::Untried { .. } => return outcome,
    };
    outbox
        .metrics
        .record_forward(&due.source, &due.target, result, elapsed);
    if result == ForwardResult::Delivered {
        let lag_micros = crate::db::now_micros() - due.queued_at_micros;
        outbox.metrics.record_lag(
            &due.source,
            &due.target,
            Duration::from_micros(u64::try_from(lag_micros).unwrap_or(0)),
        );
    }
    outcome
}

/// The row's next state after a hand-off: a failure is retried after the backoff (and never
/// sooner than the target asked), unless it was the last allowed attempt.
fn settle_of(handoff: Handoff, attempt: i32, max_attempts: u32) -> Settle {
    let last = attempt >= i32::try_from(max_attempts).unwrap_or(i32::MAX);
    match handoff {
        Handoff::Accepted { status } => Settle::Delivered { status },
        Handoff::Refused { status, error } => Settle::Dead { status, error },
        Handoff::NotSent { .. } => Settle::Untried {
            after: NOT_SENT_PAUSE,
        },
        Handoff::Failed { status, error, .. } if last => Settle::Dead {
            status,
            error: match attempt {
                1 => format!("{error}; gave up after 1 attempt"),
                _ => format!("{error}; gave up after {attempt} attempts"),
            },
        },
        Handoff::Failed {
            status,
            error,
            retry_after,
        } => Settle::Retry {
            status,
            error,
            after: backoff(attempt)
                .min(BACKOFF_CAP)
                .max(retry_after.unwrap_or_default().min(RETRY_AFTER_CAP)),
        },
    }
}

/// How long an attempt this process could not make waits before it is tried again.
const NOT_SENT_PAUSE: Duration = Duration::from_secs(5);

/// The wait before retry `attempt` of a delivery.
fn backoff(attempt: i32) -> Duration {
    retry::backoff(
        BACKOFF_BASE,
        BACKOFF_CAP,
        u32::try_from(attempt).unwrap_or(0),
    )
}

/// Outcomes waiting to be committed, and when the earliest retry this process scheduled
/// comes due.
#[derive(Default)]
struct Outcomes {
    ended: RefCell<Vec<(usize, Settled)>>,
    ready: tokio::sync::Notify,
    next_retry: Cell<Option<Instant>>,
}

/// Starts one attempt of a taken or handed-over row; its outcome goes to `outcomes`.
fn spawn_attempt(
    runner: &Rc<Runner>,
    outcomes: &Rc<Outcomes>,
    wake: &Wake,
    (lane, due, start_by): (usize, Due, Instant),
) {
    let (runner, outcomes, wake) = (runner.clone(), outcomes.clone(), wake.clone());
    actix_web::rt::spawn(async move {
        let settled = runner.attempt(lane, due, start_by, &wake).await;
        outcomes.ended.borrow_mut().push((lane, settled));
        outcomes.ready.notify_one();
    });
}

/// Starts every row claims have handed over since the last call.
fn start_handed(runner: &Rc<Runner>, outcomes: &Rc<Outcomes>, wake: &Wake) {
    let handed = std::mem::take(
        &mut *runner
            .outbox
            .handed
            .lock()
            .unwrap_or_else(|e| e.into_inner()),
    );
    for row in handed {
        spawn_attempt(runner, outcomes, wake, row);
    }
}

/// The dispatcher: runs until `wake` says stop.
pub async fn run(outbox: Outbox, wake: Wake) {
    let runner = Rc::new(Runner::new(&outbox));
    let outcomes = Rc::new(Outcomes::default());
    let recorder = actix_web::rt::spawn(record(runner.clone(), outcomes.clone(), wake.clone()));
    // The gauges are counted at once, then every GAUGES_EVERY: a backlog left from before this
    // process started shows from the start.
    let mut gauges_at: Option<Instant> = None;
    actix_web::rt::spawn(look_after_instances(outbox.clone(), wake.clone()));
    actix_web::rt::spawn(super::bus::check_targets(
        outbox
            .lanes
            .iter()
            .map(|lane| (lane.source.clone(), lane.target.clone()))
            .collect(),
    ));
    // The first look is at every lane: rows may be waiting from before this process started.
    let mut look = true;
    let mut poll = false;
    let mut next_poll = Instant::now() + POLL_EVERY;
    while !wake.stopping() {
        start_handed(&runner, &outcomes, &wake);
        if wake.take_look() {
            look = true;
        }
        // The poll: rows queued or released by other instances, leases run out, retries come
        // due. It comes every POLL_EVERY however often something else wakes the dispatcher:
        // under load a wake-up comes every few milliseconds, and a poll that waited for a
        // quiet moment would leave those rows until the load stopped.
        if Instant::now() >= next_poll {
            next_poll = Instant::now() + POLL_EVERY;
            poll = true;
        }
        for lane in outbox.lanes.iter() {
            if look {
                lane.look_again();
            }
            if poll {
                lane.poll();
            }
        }
        for row in runner.take().await {
            spawn_attempt(&runner, &outcomes, &wake, row);
        }
        if gauges_at.is_none_or(|at| at.elapsed() >= GAUGES_EVERY) {
            gauges_at = Some(Instant::now());
            outbox.refresh_gauges().await;
        }
        look = false;
        poll = false;
        let mut wait_until = next_poll;
        if let Some(retry) = outcomes.next_retry.get() {
            // A retry of this process's coming due is a poll.
            if retry <= Instant::now() {
                outcomes.next_retry.set(None);
                poll = true;
                continue;
            }
            wait_until = wait_until.min(retry);
        }
        // An ordered lane's rows settling: taken then, not at the next poll.
        let now = Instant::now();
        let mut settled = false;
        for lane in outbox.lanes.iter() {
            match lane.settle_look(now) {
                Some(at) if at <= now => settled = true,
                Some(at) => wait_until = wait_until.min(at),
                None => {}
            }
        }
        if settled {
            continue;
        }
        tokio::select! {
            _ = wake.notified() => {}
            _ = tokio::time::sleep_until(wait_until) => {}
        }
    }
    // Attempts under way finish and their outcomes are recorded by `record`, which also starts
    // rows still being handed over; rows still waiting for a slot or a turn go back untried.
    outcomes.ready.notify_one();
    let _ = recorder.await;
    tracing::info!("forward dispatcher stopped");
}

/// Registers this instance, and takes back the rows of instances that died, at once and then
/// every [`INSTANCES_EVERY`] for as long as the process runs (see `db::instances`); rows taken
/// back are looked for at once. It outlives a stopping dispatcher on purpose: attempts still
/// under way then are this instance's, and its lock says so until the process ends. A task of
/// its own: a database that hangs holds up this look, not the dispatcher's takes.
/// A look that fails is a WARN the first time in a row, and each after it a DEBUG.
async fn look_after_instances(outbox: Outbox, wake: Wake) {
    let registration = outbox.registration();
    let mut failing = false;
    loop {
        match outbox.look_after_instances(&registration).await {
            Ok(took_back) => {
                failing = false;
                if took_back {
                    wake.queued();
                }
            }
            Err(error) if failing => {
                tracing::debug!(%error, "cannot look after this instance's registration")
            }
            Err(error) => {
                failing = true;
                tracing::warn!(
                    %error,
                    "cannot register this instance or look for instances that died; tried \
                     again every 2 s. Meanwhile, should an instance die, its deliveries under \
                     way wait for their leases to run out (twice the target's timeout and 5 s) \
                     instead of being taken back at once"
                );
            }
        }
        tokio::time::sleep(INSTANCES_EVERY).await;
    }
}

/// Commits outcomes in batches ([`gather`]), whatever ended while the last batch was written
/// going in the next. Ends once the dispatcher stops and no taken row is left unsettled.
async fn record(runner: Rc<Runner>, outcomes: Rc<Outcomes>, wake: Wake) {
    let outbox = runner.outbox.clone();
    loop {
        if wake.stopping() {
            // Rows a claim handed over as the dispatcher stopped are attempted still: they are
            // counted unsettled, and leased to this process.
            start_handed(&runner, &outcomes, &wake);
        }
        let mut batch: Vec<(usize, Settled)> = outcomes.ended.take();
        if batch.is_empty() {
            let left: usize = outbox.lanes.iter().map(|lane| lane.unsettled()).sum();
            if wake.stopping() && left == 0 {
                return;
            }
            // While stopping, look again now and then: the last attempts may end without a
            // batch to wake this.
            tokio::select! {
                _ = outcomes.ready.notified() => {}
                _ = tokio::time::sleep(POLL_EVERY), if wake.stopping() => {}
            }
            continue;
        }
        gather(&runner.outbox, &outcomes, &wake, &mut batch).await;
        let rows: Vec<Settled> = batch.iter().map(|(_, s)| s.clone()).collect();
        let stored = outbox.settle(rows).await;
        wake.written(batch.iter().map(|(_, s)| s.id));
        if stored {
            for (_, settled) in &batch {
                if let Settle::Retry { after, .. } | Settle::Untried { after } = &settled.outcome {
                    let due = Instant::now() + *after;
                    let next = outcomes.next_retry.get().map_or(due, |n| n.min(due));
                    outcomes.next_retry.set(Some(next));
                }
            }
        }
        let mut per_lane: HashMap<usize, usize> = HashMap::new();
        for (lane, _) in &batch {
            *per_lane.entry(*lane).or_default() += 1;
        }
        for (lane, n) in per_lane {
            outbox.lanes[lane].settled(n);
        }
        wake.poke();
    }
}

/// Adds to `batch` the outcomes that end within [`GATHER_FOR`] of now, unless one of an
/// ordered lane is (or comes) in it, the dispatcher is stopping, or it reaches
/// [`GATHER_AT_MOST`].
async fn gather(
    outbox: &Outbox,
    outcomes: &Outcomes,
    wake: &Wake,
    batch: &mut Vec<(usize, Settled)>,
) {
    let ordered = |outcomes: &[(usize, Settled)]| {
        outcomes
            .iter()
            .any(|(lane, _)| outbox.lanes[*lane].target.config.ordered)
    };
    // Only the outcomes added since are looked at again, not the whole batch each time.
    let mut urgent = ordered(batch);
    let until = Instant::now() + GATHER_FOR;
    while !urgent && !wake.stopping() && batch.len() < GATHER_AT_MOST {
        let before = batch.len();
        tokio::select! {
            _ = outcomes.ready.notified() => batch.extend(outcomes.ended.take()),
            _ = tokio::time::sleep_until(until) => {
                batch.extend(outcomes.ended.take());
                return;
            }
        }
        urgent = ordered(&batch[before..]);
    }
}

/// Runs one pass on this thread: takes what is due, sends it, commits the outcomes in one
/// batch, and returns how many rows were sent.
pub async fn pass(outbox: &Outbox) -> usize {
    let runner = Runner::new(outbox);
    for lane in outbox.lanes.iter() {
        lane.look_again();
    }
    let due = runner.take().await;
    let sent = due.len();
    let quiet = Wake::default();
    let settled = futures_util::future::join_all(due.into_iter().map(|(lane, due, start_by)| {
        let (runner, quiet) = (&runner, &quiet);
        async move { (lane, runner.attempt(lane, due, start_by, quiet).await) }
    }))
    .await;
    let rows: Vec<Settled> = settled.iter().map(|(_, s)| s.clone()).collect();
    outbox.settle(rows).await;
    for (lane, _) in &settled {
        outbox.lanes[*lane].settled(1);
    }
    sent
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(retry_after: Option<Duration>) -> Handoff {
        Handoff::Failed {
            status: Some(503),
            error: "the downstream answered 503".to_owned(),
            retry_after,
        }
    }

    #[test]
    fn an_attempt_this_process_could_not_make_is_given_back_uncounted_even_the_last() {
        let not_sent = || Handoff::NotSent {
            error: "cannot open a connection".to_owned(),
        };
        for (attempt, max) in [(1, 12), (12, 12)] {
            assert!(
                matches!(
                    settle_of(not_sent(), attempt, max),
                    Settle::Untried { after } if after == NOT_SENT_PAUSE
                ),
                "attempt {attempt} of {max}"
            );
        }
    }

    #[test]
    fn a_failure_is_retried_after_the_backoff_and_never_sooner_than_asked() {
        let Settle::Retry { after, status, .. } = settle_of(failed(None), 1, 12) else {
            panic!("a 503 is retried");
        };
        assert_eq!(status, Some(503));
        assert!(after <= BACKOFF_BASE, "{after:?}");
        let Settle::Retry { after, .. } = settle_of(failed(Some(Duration::from_secs(30))), 1, 12)
        else {
            panic!("a 503 is retried");
        };
        assert!(after >= Duration::from_secs(30));
        let Settle::Retry { after, .. } =
            settle_of(failed(Some(Duration::from_secs(86_400))), 1, 12)
        else {
            panic!("a 503 is retried");
        };
        assert_eq!(after, Duration::from_secs(86_400), "a day is honoured");
        let Settle::Retry { after, .. } =
            settle_of(failed(Some(Duration::from_secs(365 * 86_400))), 1, 12)
        else {
            panic!("a 503 is retried");
        };
        assert_eq!(after, RETRY_AFTER_CAP);
        let Settle::Retry { after, .. } = settle_of(failed(None), 40, 50) else {
            panic!("a 503 is retried");
        };
        assert!(after <= BACKOFF_CAP, "{after:?}");
    }

    #[test]
    fn the_last_allowed_attempt_is_dead_not_retried() {
        assert!(matches!(
            settle_of(failed(None), 2, 3),
            Settle::Retry { .. }
        ));
        let Settle::Dead { status, error } = settle_of(failed(None), 3, 3) else {
            panic!("out of attempts");
        };
        assert_eq!(status, Some(503));
        assert!(error.ends_with("gave up after 3 attempts"), "{error}");
    }

    #[test]
    fn accepted_is_delivered_and_refused_is_dead_at_once() {
        assert_eq!(
            settle_of(Handoff::Accepted { status: Some(204) }, 1, 1),
            Settle::Delivered { status: Some(204) }
        );
        assert!(matches!(
            settle_of(
                Handoff::Refused {
                    status: Some(410),
                    error: "gone".to_owned()
                },
                1,
                12
            ),
            Settle::Dead {
                status: Some(410),
                ..
            }
        ));
    }
}
