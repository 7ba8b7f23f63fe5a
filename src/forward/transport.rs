//! How an attempt reaches its target: the one part of forwarding that differs by the target's
//! `url` scheme.
//!
//! The dispatcher (`dispatch.rs`) takes rows, paces them, bounds them per target, applies the
//! target's timeout, turns each [`Handoff`] into the row's next state (retry with backoff, dead
//! after `max_attempts`) and records it. A transport only hands one message over and says how
//! that went: HTTP (`http.rs`), NATS JetStream (`nats.rs`) or RabbitMQ (`amqp.rs`), picked in
//! [`Transports::for_target`].

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::LocalBoxFuture;

use super::http::Http;
use super::{Link, Target};
use crate::db::deliveries::Due;

/// How one hand-off went, in the transport's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handoff {
    /// The target took it (HTTP 2xx; a publish acknowledgement): delivered.
    Accepted {
        /// The target's status, where the transport has one.
        status: Option<u16>,
    },
    /// Not taken this time, and worth another attempt (5xx, 429, a lost connection): retried
    /// after the backoff, and never sooner than `retry_after`.
    Failed {
        /// The target's status, where it answered.
        status: Option<u16>,
        /// What went wrong, in a sentence.
        error: String,
        /// The least wait the target asked for (`Retry-After`).
        retry_after: Option<Duration>,
    },
    /// Never sent: this process could not make the attempt (out of file descriptors, of
    /// memory for a socket, of local ports). No fault of the target's, so it is given back
    /// without counting against `max_attempts`, and tried again after a pause.
    NotSent {
        /// What this process ran out of, in a sentence.
        error: String,
    },
    /// Refused for good (410, another 4xx): dead at once.
    Refused {
        /// The target's status, where it answered.
        status: Option<u16>,
        /// What went wrong, in a sentence.
        error: String,
    },
}

/// Where an attempt is, for the error of one that runs out of time: a bus attempt has steps
/// of its own (a connection to make, a channel to open, an acknowledgement to wait for), and
/// `no answer within 1s` alone did not say which never ended (a black-box run). The
/// dispatcher owns it, so it outlives the attempt's future, which a timeout drops.
#[derive(Debug, Default)]
pub struct Step(Cell<&'static str>);

impl Step {
    /// The attempt is now `doing` this (`"waiting for the broker's confirm"`).
    pub fn at(&self, doing: &'static str) {
        self.0.set(doing);
    }

    /// What the attempt was doing last; empty if its transport says nothing of its steps.
    pub fn now(&self) -> &'static str {
        self.0.get()
    }
}

/// Hands a taken delivery to its target.
///
/// A transport lives on the dispatcher's thread (the futures need not be `Send`), is built
/// once per target, and is called for any number of attempts at once, up to the target's
/// `concurrency`. The dispatcher bounds each call by the target's `timeout` (a call still
/// running then is dropped and retried), so a transport need not time itself out.
pub trait Transport {
    /// Hands `due` over once and says how it went, saying in `step` where it is as it goes.
    /// Never panics on what the target answers.
    fn hand_off<'a>(&'a self, due: &'a Due, step: &'a Step) -> LocalBoxFuture<'a, Handoff>;

    /// What is wrong with the transport's connection now, if it knows: said with an attempt
    /// that ran out of time, whose timeout alone cannot tell why.
    fn trouble(&self) -> Option<String> {
        None
    }
}

/// The value of `Idempotency-Key` (and `webhook-id`): the same on every attempt to every
/// target, so a receiver that honours it sees the effect once.
pub fn idempotency_key(due: &Due) -> String {
    format!("{}:{}", due.source, due.event_id)
}

/// The `X-Hookbox-*` values every transport carries (as headers, where it has them), all of
/// them on every attempt: an event without a type (a scheme that carries none) has an empty
/// `X-Hookbox-Event-Type`.
pub fn hookbox_headers(due: &Due) -> Vec<(&'static str, String)> {
    vec![
        ("X-Hookbox-Source", due.source.clone()),
        ("X-Hookbox-Target", due.target.clone()),
        ("X-Hookbox-Event-Id", due.event_id.clone()),
        (
            "X-Hookbox-Event-Type",
            due.event_type.clone().unwrap_or_default(),
        ),
        ("X-Hookbox-Attempt", due.attempt.to_string()),
    ]
}

/// Builds each target's transport, sharing what targets can share: one HTTP client, whose
/// pool keeps connections alive and holds enough of them for every target's `concurrency`.
/// One per dispatcher thread (awc's client belongs to the thread that made it).
pub struct Transports {
    http: awc::Client,
}

impl Transports {
    /// The transports of `targets`.
    pub fn new<'a>(targets: impl IntoIterator<Item = &'a Arc<Target>> + Clone) -> Transports {
        let connections: usize = targets
            .clone()
            .into_iter()
            .map(|t| t.config.concurrency as usize)
            .sum();
        let connector = awc::Connector::new()
            .connector(super::http::GiveUpWithTheAttempt::new(targets))
            // awc's default is 100 in all; each target may want its `concurrency` at once.
            .limit(connections.max(100));
        let http = awc::Client::builder()
            .connector(connector)
            // Named, as providers name their own (`Stripe/1.0`), for the downstream's logs.
            .add_default_header((actix_web::http::header::USER_AGENT, crate::USER_AGENT))
            .disable_redirects()
            // The dispatcher bounds each attempt by its target's own timeout.
            .disable_timeout()
            .finish();
        Transports { http }
    }

    /// The transport of `target`, by its URL's scheme. A bus target's connection is the
    /// target's own, shared by every thread and pass.
    pub fn for_target(&self, target: &Arc<Target>) -> Rc<dyn Transport> {
        match &target.link {
            Link::Http(_) => Rc::new(Http::new(self.http.clone(), target.clone())),
            Link::Nats(nats) => Rc::new(nats.clone()),
            Link::Amqp(amqp) => Rc::new(amqp.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hookbox_header_is_there_also_for_an_event_without_a_type() {
        let due = Due {
            id: 1,
            attempt: 2,
            series: 0,
            source: "acme".to_owned(),
            target: "default".to_owned(),
            event_id: "e-1".to_owned(),
            event_type: None,
            payload: Vec::new(),
            content_type: None,
            queued_at_micros: 0,
        };
        let headers = hookbox_headers(&due);
        let names: Vec<&str> = headers.iter().map(|(name, _)| *name).collect();
        assert_eq!(
            names,
            [
                "X-Hookbox-Source",
                "X-Hookbox-Target",
                "X-Hookbox-Event-Id",
                "X-Hookbox-Event-Type",
                "X-Hookbox-Attempt"
            ]
        );
        assert_eq!(headers[3].1, "");
        assert_eq!(headers[4].1, "2");
        assert_eq!(idempotency_key(&due), "acme:e-1");
    }
}
