//! When to try again: exponential backoff with jitter, and the `Retry-After` a server sends. One
//! home for both, shared by the forward dispatcher and the `send`/`replay` client.

use std::time::{Duration, SystemTime};

use rand::RngExt;

/// Exponential backoff with "equal jitter": the wait before retry `attempt` (1 for the first
/// retry) is `base · 2^(attempt-1)`, capped at `cap`, of which the first half is fixed and the
/// second half random. Gaps grow with each attempt, and clients retrying together drift apart
/// instead of arriving in lockstep.
pub fn backoff(base: Duration, cap: Duration, attempt: u32) -> Duration {
    let exponent = attempt.saturating_sub(1).min(30);
    let step = base.saturating_mul(1u32 << exponent).min(cap);
    let half = step / 2;
    half + half.mul_f64(rand::rng().random::<f64>())
}

/// A `Retry-After` value (RFC 9110 §10.2.3) as a wait from `now`: either delay-seconds or an
/// HTTP date. A date in the past is no wait; anything else unreadable is `None`.
pub fn retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Delay-seconds too large for a u64 still asks for the longest wait, not none.
        return Some(Duration::from_secs(
            value.parse::<u64>().unwrap_or(u64::MAX),
        ));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: Duration = Duration::from_secs(1);
    const CAP: Duration = Duration::from_secs(3600);

    #[test]
    fn each_wait_lies_in_the_upper_half_of_its_step_and_the_steps_double() {
        for attempt in 1..=6u32 {
            let step = BASE * 2u32.pow(attempt - 1);
            for _ in 0..50 {
                let wait = backoff(BASE, CAP, attempt);
                assert!(
                    wait >= step / 2 && wait <= step,
                    "attempt {attempt}: {wait:?}"
                );
            }
        }
        assert!(backoff(BASE, CAP, 40) <= CAP);
        assert!(
            backoff(BASE, CAP, 0) <= BASE,
            "attempt 0 counts as the first"
        );
        let waits: std::collections::HashSet<_> = (0..20).map(|_| backoff(BASE, CAP, 5)).collect();
        assert!(waits.len() > 1, "the jitter varies");
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = httpdate::parse_http_date("Wed, 21 Oct 2015 07:28:00 GMT").expect("date");
        assert_eq!(retry_after(" 30 ", now), Some(Duration::from_secs(30)));
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:28:10 GMT", now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            retry_after("Wed, 21 Oct 2015 07:27:00 GMT", now),
            Some(Duration::ZERO),
            "a date in the past asks for no wait"
        );
        assert_eq!(
            retry_after("99999999999999999999", now),
            Some(Duration::from_secs(u64::MAX)),
            "more seconds than a u64 holds is still the longest wait"
        );
        assert_eq!(retry_after("", now), None);
        assert_eq!(retry_after("soon", now), None);
        assert_eq!(retry_after("-5", now), None);
    }
}
