//! What the two event-bus transports ([`super::nats`], [`super::amqp`]) share: the event's
//! names and media type, the wait before a dropped connection is opened again, and failures
//! told without the URL's secrets.

use std::time::{Duration, Instant};

use super::transport::Handoff;
use crate::db::deliveries::Due;
use crate::routing::Names;

/// The first reconnect waits about this long after a failure; each further one about twice
/// the last.
const RECONNECT_BASE: Duration = Duration::from_millis(250);

/// No reconnect waits longer than this.
const RECONNECT_CAP: Duration = Duration::from_secs(30);

/// The event's names, for a subject or routing key template.
pub fn names(due: &Due) -> Names<'_> {
    Names {
        source: &due.source,
        event_id: &due.event_id,
        event_type: due.event_type.as_deref(),
    }
}

/// The body's media type, as the HTTP transport sends it.
pub fn content_type(due: &Due) -> &str {
    due.content_type.as_deref().unwrap_or("application/json")
}

/// A failed hand-off that may succeed later (the bus is down, the stream or route is missing),
/// told without the secrets of `url`.
pub fn failed(error: &str, url: &str) -> Handoff {
    Handoff::Failed {
        status: None,
        error: crate::redact::message_about(error, url),
        retry_after: None,
    }
}

/// A hand-off that can never succeed (the message cannot be carried as it is).
pub fn refused(error: &str, url: &str) -> Handoff {
    Handoff::Refused {
        status: None,
        error: crate::redact::message_about(error, url),
    }
}

/// When a connection that failed may be tried again: each failure in a row doubles the wait
/// (with jitter), and a success resets it. Attempts in between fail at once, so a dead bus
/// costs no connect per delivery.
#[derive(Debug, Default)]
pub struct Reconnect {
    failures: u32,
    not_before: Option<Instant>,
    last_error: String,
}

impl Reconnect {
    /// `Err` with the last failure and the time left while the wait runs.
    pub fn check(&self) -> Result<(), String> {
        match self.not_before {
            Some(at) if Instant::now() < at => Err(format!(
                "{}; connecting again in {} ms",
                self.last_error,
                at.saturating_duration_since(Instant::now()).as_millis()
            )),
            _ => Ok(()),
        }
    }

    /// A connect failed: wait longer before the next.
    pub fn failed(&mut self, error: String) {
        self.failures = self.failures.saturating_add(1);
        self.not_before = Some(
            Instant::now() + crate::retry::backoff(RECONNECT_BASE, RECONNECT_CAP, self.failures),
        );
        self.last_error = error;
    }

    /// A connect succeeded.
    pub fn connected(&mut self) {
        *self = Reconnect::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_in_a_row_wait_longer_and_a_success_resets() {
        let mut reconnect = Reconnect::default();
        assert!(reconnect.check().is_ok());
        reconnect.failed("refused".to_owned());
        let error = reconnect.check().expect_err("waits after a failure");
        assert!(error.starts_with("refused; connecting again in"), "{error}");
        for _ in 0..10 {
            reconnect.failed("refused".to_owned());
        }
        let left = reconnect
            .not_before
            .expect("a wait")
            .saturating_duration_since(Instant::now());
        assert!(left > RECONNECT_BASE && left <= RECONNECT_CAP, "{left:?}");
        reconnect.connected();
        assert!(reconnect.check().is_ok());
    }
}
