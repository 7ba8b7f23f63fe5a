//! `--rate`: deliveries start at a steady pace, one every `1/rate` seconds, never in a burst.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, Instant};

/// A delivery rate, from `--rate`: `50/s`, `600/m`, or a plain number per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    per_second: f64,
}

impl Rate {
    /// The gap between two starts.
    pub fn interval(self) -> Duration {
        Duration::from_secs_f64(1.0 / self.per_second)
    }
}

impl FromStr for Rate {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        let (count, per) = match text.split_once('/') {
            Some((count, unit)) => {
                let seconds = match unit.trim().to_ascii_lowercase().as_str() {
                    "s" | "sec" | "second" => 1.0,
                    "m" | "min" | "minute" => 60.0,
                    "h" | "hour" => 3600.0,
                    other => {
                        return Err(format!(
                            "unknown rate unit {other:?}; write it like 50/s, 600/m or 60/h"
                        ))
                    }
                };
                (count.trim(), seconds)
            }
            None => (text, 1.0),
        };
        let count: f64 = count
            .parse()
            .map_err(|_| format!("{text:?} is not a rate; write it like 50/s, 600/m or 60/h"))?;
        let per_second = count / per;
        // Slower than one an hour is a typo; faster than a million a second cannot be paced.
        if !(per_second.is_finite() && (1.0 / 3600.0..=1e6).contains(&per_second)) {
            return Err(format!(
                "{text:?} is out of range; give between 1/h and 1000000/s"
            ));
        }
        Ok(Rate { per_second })
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/s", self.per_second)
    }
}

/// How far behind its schedule a pacer may catch up, in intervals (and at most [`MAX_SLACK`]):
/// a hiccup of a few milliseconds on a busy machine is made good, so the rate holds over a
/// run, while a long stall (a slow receiver holding every place in flight) is not followed by
/// a burst: what is made up is 50 ms at most, so a window of a second never holds more than
/// the rate and the starts of 50 ms more (at 20/s, one; a second's worth, as before, let 30
/// start in a second after a stall).
const CATCH_UP_INTERVALS: u32 = 10;
const MAX_SLACK: Duration = Duration::from_millis(50);

/// Hands out start times one `interval` apart, from the first delivery on.
#[derive(Debug)]
pub struct Pacer {
    interval: Duration,
    slack: Duration,
    next: Option<Instant>,
}

impl Pacer {
    /// A pacer for `rate`.
    pub fn new(rate: Rate) -> Pacer {
        let interval = rate.interval();
        Pacer {
            interval,
            slack: (interval * CATCH_UP_INTERVALS).min(MAX_SLACK),
            next: None,
        }
    }

    /// When the next delivery may start, given that it is ready at `now`. A slot already
    /// past is given at once; one more than the slack past is moved up to the slack.
    pub fn slot(&mut self, now: Instant) -> Instant {
        let at = match self.next {
            None => now,
            Some(next) => next.max(now.checked_sub(self.slack).unwrap_or(now)),
        };
        self.next = Some(at + self.interval);
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_read_per_second_minute_or_hour() {
        let interval = |text: &str| text.parse::<Rate>().map(Rate::interval);
        assert_eq!(interval("50/s"), Ok(Duration::from_millis(20)));
        assert_eq!(interval("120/m"), Ok(Duration::from_millis(500)));
        assert_eq!(interval("4"), Ok(Duration::from_millis(250)));
        assert_eq!(interval("60/h"), Ok(Duration::from_secs(60)));
        assert_eq!(
            interval("50/S"),
            Ok(Duration::from_millis(20)),
            "either case"
        );
        for bad in ["", "fast", "0/s", "-5/s", "10/fortnight", "inf"] {
            assert!(bad.parse::<Rate>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn slots_are_one_interval_apart_and_a_long_stall_does_not_burst() {
        let mut pacer = Pacer::new("10/s".parse().expect("valid"));
        let start = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(pacer.slot(start), start);
        assert_eq!(pacer.slot(start), start + ms(100));
        assert_eq!(pacer.slot(start + ms(50)), start + ms(200));
        // A little late: the missed slot is taken at once, and the schedule keeps its beat.
        assert_eq!(pacer.slot(start + ms(350)), start + ms(300));
        assert_eq!(pacer.slot(start + ms(350)), start + ms(400));
        // Ready long after its slot: at most 50 ms (the slack) is caught up, one slot here.
        assert_eq!(pacer.slot(start + ms(5000)), start + ms(4950));
        assert_eq!(
            pacer.slot(start + ms(5000)),
            start + ms(5050),
            "then the beat again"
        );
        // At 1000/s the slack is ten intervals: ten slots come at once after a stall, no more.
        let mut fast = Pacer::new("1000/s".parse().expect("valid"));
        fast.slot(start);
        let mut burst = 0;
        while fast.slot(start + ms(5000)) < start + ms(5000) {
            burst += 1;
        }
        assert_eq!(burst, 10, "the catch-up is bounded");
    }
}
