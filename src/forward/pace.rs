//! `rate = "N/s"` or `"N/m"`: a target's attempts spread evenly, at most N started in any
//! sliding window of a second (or a minute).
//!
//! A token bucket of depth one (GCRA with no burst): an attempt may start once `per / N` has
//! passed since the one before it started. The gap is measured from the moment each attempt
//! actually started, not from when it was scheduled, so a dispatcher that falls behind (a busy
//! machine) never makes up for lost time by starting several at once. Waiters go in turn
//! (tokio's mutex is fair), each holding the gate while it waits for its moment.

use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::config::Rate;

/// How far ahead a paced target's rows are taken: as many as may start within this, so rows
/// wait in memory under their lease for a bounded time.
pub const HORIZON: Duration = Duration::from_secs(1);

/// The pace of one target, shared by every runner of the process.
pub struct Pace {
    /// The least time between two starts: the window over N.
    interval: Duration,
    /// When the next attempt may start (`None`: at once).
    next: Mutex<Option<Instant>>,
}

impl Pace {
    /// The pace of `rate`.
    pub fn new(rate: Rate) -> Pace {
        Pace {
            interval: rate.per / rate.count.max(1),
            next: Mutex::new(None),
        }
    }

    /// Waits for this attempt's turn; returns as it starts.
    pub async fn start(&self) {
        let mut next = self.next.lock().await;
        if let Some(at) = *next {
            tokio::time::sleep_until(at).await;
        }
        *next = Some(Instant::now() + self.interval);
    }

    /// How many taken rows may wait for their turn at once: those that can start within
    /// [`HORIZON`], and at least one.
    pub fn queue(&self) -> usize {
        let per_horizon = HORIZON.as_nanos() / self.interval.as_nanos().max(1);
        usize::try_from(per_horizon).unwrap_or(usize::MAX).max(1)
    }

    /// The longest a row taken within [`Pace::queue`] waits for its turn.
    pub fn longest_wait(&self) -> Duration {
        HORIZON.max(self.interval) + self.interval
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn starts_are_spread_a_window_over_n_apart_even_when_asked_at_once() {
        let pace = Pace::new("200/s".parse().expect("a rate"));
        let begin = Instant::now();
        let starts = futures_util::future::join_all((0..21).map(|_| async {
            pace.start().await;
            Instant::now() - begin
        }))
        .await;
        let mut starts = starts;
        starts.sort();
        for pair in starts.windows(2) {
            // Read just after each start, so a hair later than the gate did.
            assert!(
                pair[1] - pair[0] >= Duration::from_micros(4900),
                "{starts:?}"
            );
        }
        assert!(starts[20] >= Duration::from_millis(100), "{starts:?}");
        assert_eq!(pace.queue(), 200);
    }

    #[test]
    fn a_slow_rate_queues_one_row_and_waits_up_to_its_interval() {
        let pace = Pace::new("2/m".parse().expect("a rate"));
        assert_eq!(pace.queue(), 1);
        assert!(pace.longest_wait() >= Duration::from_secs(30));
    }
}
