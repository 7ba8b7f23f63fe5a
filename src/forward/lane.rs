//! A lane: one (source, target), with the limits this process keeps for it.
//!
//! `concurrency` bounds the attempts in flight (a fair semaphore of slots). A lane takes up to
//! as many rows again ahead of its slots, so the next rows are at hand while a take is under
//! way and no slot idles waiting for the database; the lease covers that wait. `rate` spreads
//! the starts ([`Pace`]) and bounds how many rows wait for one; `ordered` lets a lane hold one
//! row at a time, from its take until its outcome is committed, so the next take sees the head
//! as it stands. Every runner of the process (the dispatcher, and a test's
//! [`super::Outbox::pass`]) shares these counts: a take reserves room first and gives back what
//! it did not fill, so two runners never overfill a lane.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};

use super::pace::Pace;
use super::Target;
use crate::db::deliveries::Want;

/// A lease lasts the longest a taken row may wait for a slot and its turn under `rate`, the
/// attempt's timeout, and this, so a slow but live attempt is settled before another
/// dispatcher may take the row.
pub const LEASE_MARGIN: Duration = Duration::from_secs(5);

/// One (source, target) and its counts in this process.
pub struct Lane {
    /// The source's name.
    pub source: String,
    /// The target, with its config.
    pub target: Arc<Target>,
    /// Its `rate`, if it has one.
    pace: Option<Pace>,
    /// One permit per attempt in flight: `concurrency` of them.
    slots: Semaphore,
    /// Rows taken (or room reserved for a take) that have not started.
    waiting: AtomicUsize,
    /// Attempts under way.
    in_flight: AtomicUsize,
    /// Rows taken whose outcome is not yet committed.
    unsettled: AtomicUsize,
    /// Held while room is read and reserved, so two runners on two threads reserve in turn.
    reserving: Mutex<()>,
}

impl Lane {
    /// The lane of `source`'s `target`.
    pub fn new(source: String, target: Arc<Target>) -> Lane {
        let pace = target.config.rate.map(Pace::new);
        let slots = Semaphore::new(target.config.concurrency as usize);
        Lane {
            source,
            target,
            pace,
            slots,
            waiting: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            unsettled: AtomicUsize::new(0),
            reserving: Mutex::new(()),
        }
    }

    /// How long a row of this lane is leased when taken.
    pub fn lease(&self) -> Duration {
        let wait = self
            .pace
            .as_ref()
            .map_or(Duration::ZERO, Pace::longest_wait);
        self.target.config.timeout + wait + LEASE_MARGIN
    }

    /// How many rows a take may ask for now.
    fn room(&self) -> usize {
        let busy = self.waiting.load(Ordering::SeqCst) + self.in_flight.load(Ordering::SeqCst);
        let mut room = (self.target.config.concurrency as usize).saturating_sub(busy);
        if let Some(pace) = &self.pace {
            room = room.min(
                pace.queue()
                    .saturating_sub(self.waiting.load(Ordering::SeqCst)),
            );
        }
        if self.target.config.ordered && self.unsettled.load(Ordering::SeqCst) > 0 {
            room = 0;
        }
        if self.target.config.ordered {
            room = room.min(1);
        }
        room
    }

    /// Reserves the lane's room for a take and says what to ask for; `None` when it has none.
    /// The caller hands back what the take did not fill with [`Lane::taken`].
    pub fn reserve(&self) -> Option<Want> {
        let _turn = self.reserving.lock().unwrap_or_else(|e| e.into_inner());
        let room = self.room();
        if room == 0 {
            return None;
        }
        self.waiting.fetch_add(room, Ordering::SeqCst);
        self.unsettled.fetch_add(room, Ordering::SeqCst);
        Some(Want {
            source: self.source.clone(),
            target: self.target.config.name.clone(),
            limit: i64::try_from(room).unwrap_or(i64::MAX),
            ordered: self.target.config.ordered,
            lease: self.lease(),
        })
    }

    /// The take of a reservation of `reserved` rows brought `taken`: the rest is given back.
    pub fn taken(&self, reserved: usize, taken: usize) {
        let unused = reserved.saturating_sub(taken);
        self.waiting.fetch_sub(unused, Ordering::SeqCst);
        self.unsettled.fetch_sub(unused, Ordering::SeqCst);
    }

    /// Waits for a slot, then for the row's turn under `rate` (holding the slot, so the
    /// attempt starts the moment its turn comes), and counts it in flight. The slot is the
    /// attempt's until the permit is dropped, after [`Lane::finished`].
    pub async fn start(&self) -> SemaphorePermit<'_> {
        let slot = self
            .slots
            .acquire()
            .await
            .expect("a lane's semaphore is never closed");
        if let Some(pace) = &self.pace {
            pace.start().await;
        }
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.waiting.fetch_sub(1, Ordering::SeqCst);
        slot
    }

    /// An attempt ended (its outcome is not yet committed); its slot goes with `slot`.
    pub fn finished(&self, slot: SemaphorePermit<'_>) {
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        drop(slot);
    }

    /// `n` outcomes were committed, or failed to be (the rows' leases then run out).
    pub fn settled(&self, n: usize) {
        self.unsettled.fetch_sub(n, Ordering::SeqCst);
    }

    /// Rows taken whose outcome is not yet committed.
    pub fn unsettled(&self) -> usize {
        self.unsettled.load(Ordering::SeqCst)
    }

    /// Whether attempts are paced.
    pub fn paced(&self) -> bool {
        self.pace.is_some()
    }
}
