//! What the two event-bus transports ([`super::nats`], [`super::amqp`]) share: the check as
//! the dispatcher starts, the event's names and media type, the wait before a dropped
//! connection is opened again, and failures told without the URL's secrets.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::transport::Handoff;
use super::{Link, Target};
use crate::db::deliveries::Due;
use crate::routing::Names;

/// The first reconnect waits about this long after a failure; each further one about twice
/// the last.
const RECONNECT_BASE: Duration = Duration::from_millis(250);

/// No reconnect waits longer than this.
const RECONNECT_CAP: Duration = Duration::from_secs(30);

/// The least time a bus connection may stay silent before it is opened again (see
/// [`silent_for`]).
const SILENT_LEAST: Duration = Duration::from_secs(10);

/// The most (the client libraries' own keepalives give up after 2-3 minutes).
const SILENT_MOST: Duration = Duration::from_secs(120);

/// The `n`th part of a target's `timeout`, to the whole millisecond: a connect's share of an
/// attempt, said in its error as `333ms` rather than `333ms 333us 333ns`.
pub fn share_of(timeout: Duration, n: u32) -> Duration {
    Duration::from_millis(u64::try_from((timeout / n).as_millis()).unwrap_or(u64::MAX))
}

/// How long a bus connection may stay silent, nothing heard from the broker though the client
/// asked (a NATS PING, an AMQP heartbeat), before it is taken as dropped and opened again: the
/// target's `timeout`, within 10 s and 2 minutes. A connection dropped without a word (a NAT
/// or a firewall that forgot it tells neither side) was otherwise noticed only when the
/// client libraries' keepalives gave up, after 2.5-3 minutes of attempts timing out. Not
/// under 10 s: the broker is asked every third of it at least, and RabbitMQ's docs find
/// heartbeats under 5 s (two missed make 10) prone to false alarms.
pub fn silent_for(timeout: Duration) -> Duration {
    timeout.clamp(SILENT_LEAST, SILENT_MOST)
}

/// What a bus target's startup check found ready.
pub struct Ready {
    /// What, in a few words, for the log.
    pub said: String,
    /// The JetStream streams that capture the target's subjects (none for RabbitMQ).
    pub streams: Vec<String>,
    /// The server that holds them, without credentials.
    pub server: String,
}

impl Ready {
    /// Ready, as `said`, with no stream to compare with other targets'.
    pub fn said(said: impl Into<String>) -> Ready {
        Ready {
            said: said.into(),
            streams: Vec::new(),
            server: String::new(),
        }
    }
}

/// Checks each bus target of `lanes` (source, target) once, as the dispatcher starts, each
/// within its `timeout`, and logs what it found: a wrong URL or login, a missing stream or
/// exchange shows at startup rather than at the first event; so do two NATS targets of one
/// source that may get the same events and publish into one stream. Holds nothing up:
/// deliveries wait in the outbox and are retried meanwhile, as always.
pub async fn check_targets(lanes: Vec<(String, Arc<Target>)>) {
    let checked =
        futures_util::future::join_all(lanes.into_iter().map(|(source, target)| async move {
            let check = async {
                match &target.link {
                    Link::Nats(nats) => Some(nats.check(&source).await),
                    Link::Amqp(amqp) => Some(amqp.check(&source).await),
                    Link::Http(_) => None,
                }
            };
            let found = match tokio::time::timeout(target.config.timeout, check).await {
                Ok(None) => return None,
                Ok(Some(found)) => found,
                Err(_) => Err(format!(
                    "no answer within the target's timeout ({})",
                    crate::config::Spelt(target.config.timeout)
                )),
            };
            let (name, url) = (&target.config.name, target.config.shown_url());
            match found {
                Ok(ready) => {
                    tracing::info!(
                        source = %source, target = %name, url = %url,
                        "forward target ready: {}", ready.said
                    );
                    Some((source, target, ready))
                }
                Err(why) => {
                    tracing::warn!(
                        source = %source, target = %name, url = %url,
                        "forward target not ready: {}. Its deliveries wait in the outbox and are \
                         retried until it is ready",
                        why.trim_end_matches('.')
                    );
                    None
                }
            }
        }))
        .await;
    let mut sharing: BTreeMap<(&str, &str, &str), Vec<&Target>> = BTreeMap::new();
    for (source, target, ready) in checked.iter().flatten() {
        for stream in &ready.streams {
            sharing
                .entry((source, &ready.server, stream))
                .or_default()
                .push(target);
        }
    }
    for ((source, _, stream), targets) in sharing {
        // Only targets that may get one event: the stream keeps one copy of it.
        let mut meet: Vec<&str> = Vec::new();
        for (i, a) in targets.iter().enumerate() {
            for b in &targets[i + 1..] {
                if a.config.may_share_events(&b.config) {
                    for name in [&a.config.name, &b.config.name] {
                        if !meet.contains(&name.as_str()) {
                            meet.push(name);
                        }
                    }
                }
            }
        }
        if meet.len() > 1 {
            tracing::warn!(
                source = %source, stream = %stream,
                "targets {} of source {source} publish into one stream, {stream}: each event's \
                 Nats-Msg-Id is the same for all its targets, so the stream takes the first \
                 target's publish and drops the others' as duplicates (retried until its \
                 duplicate window has passed). Give each NATS target of a source a stream of \
                 its own (subjects that do not overlap)",
                meet.join(", ")
            );
        }
    }
}

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
    /// `Err` with the last failure and when the next connect is made, while the wait runs.
    /// The time is said as a time of day (UTC), not as a wait: the error is kept as the
    /// delivery's `last_error` and read later, when "in 800 ms" no longer means anything.
    pub fn check(&self) -> Result<(), String> {
        match self.not_before {
            Some(at) if Instant::now() < at => {
                let left = at.saturating_duration_since(Instant::now());
                let next =
                    chrono::Utc::now() + chrono::Duration::from_std(left).unwrap_or_default();
                Err(format!(
                    "{}; the next connect is made at {}",
                    self.last_error,
                    next.format("%H:%M:%S%.3f UTC")
                ))
            }
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
    fn a_share_of_a_timeout_is_said_to_the_millisecond() {
        // A black-box run read `within 666ms 666us 666ns` in an error.
        let said = |timeout: u64, n| {
            crate::config::Spelt(share_of(Duration::from_secs(timeout), n)).to_string()
        };
        assert_eq!(said(2, 3), "666ms");
        assert_eq!(said(1, 3), "333ms");
        assert_eq!(said(3, 2), "1s 500ms");
    }

    #[test]
    fn failures_in_a_row_wait_longer_and_a_success_resets() {
        let mut reconnect = Reconnect::default();
        assert!(reconnect.check().is_ok());
        reconnect.failed("refused".to_owned());
        let error = reconnect.check().expect_err("waits after a failure");
        assert!(
            error.starts_with("refused; the next connect is made at "),
            "{error}"
        );
        assert!(error.ends_with(" UTC"), "{error}");
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
