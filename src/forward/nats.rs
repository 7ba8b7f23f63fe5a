//! The `nats://` transport: a JetStream publish per attempt.
//!
//! The body goes out as it came in, with `Nats-Msg-Id: {source}:{event_id}`, so JetStream's
//! duplicate window drops a repeat publish of the event (a retry after a lost acknowledgement,
//! a lease that ran out mid-publish, a redeliver); `Content-Type` and the `X-Hookbox-*` values
//! ride along as headers. Delivered means the stream's publish acknowledgement; no stream for
//! the subject, no acknowledgement in time, or a lost connection is a retry.
//!
//! One connection per target, opened when its first delivery is due (on the dispatcher's
//! runtime, never the provider-facing workers') and kept for the life of the process.
//! async-nats reopens it when it drops, with its own backoff (immediately, then doubling up to
//! 4 s); publishes made meanwhile wait in the client and time out as retries. A connection
//! the server has gone silent on is taken as dropped after [`bus::silent_for`] the target's
//! timeout: the client PINGs every third of that while it hears nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::header::{HeaderMap, HeaderValue};
use async_nats::jetstream::{self, context::PublishErrorKind};
use async_nats::{ConnectOptions, ServerAddr};
use futures_util::future::LocalBoxFuture;
use futures_util::StreamExt;
use tokio::sync::OnceCell;

use super::bus;
use super::transport::{hookbox_headers, idempotency_key, Handoff, Step, Transport};
use crate::db::deliveries::Due;
use crate::routing::{self, Template};
use crate::secret::Secret;

/// A target's JetStream: where it is, how to log in, and the subject template.
pub struct Nats {
    /// The configured URL, credentials included: only to scrub errors of them.
    url: String,
    /// The server, without credentials (async-nats takes them as options).
    server: ServerAddr,
    login: Login,
    subject: Template,
    timeout: Duration,
    /// Opened on the first delivery.
    jetstream: OnceCell<jetstream::Context>,
    /// What last went wrong with the connection (a refused login, a server gone), until it is
    /// up again: said with an attempt that timed out, whose own error cannot tell why.
    problem: Arc<std::sync::Mutex<Option<String>>>,
    /// The server refused the login at the last try, and the connection has not been up
    /// since: an attempt says so at once rather than waiting out its timeout.
    refused: Arc<AtomicBool>,
}

/// The credentials a NATS URL carries in its userinfo.
enum Login {
    None,
    /// `nats://user:password@host`
    Password(String, Secret),
    /// `nats://token@host`
    Token(Secret),
}

impl Nats {
    /// The transport of a target at `url` (checked by the config) publishing to `subject`;
    /// each attempt may take `timeout`.
    pub fn new(url: &str, subject: Template, timeout: Duration) -> Result<Nats, String> {
        let server: ServerAddr = url
            .parse()
            .map_err(|e: std::io::Error| crate::redact::message_about(&e.to_string(), url))?;
        let mut address = server.clone().into_inner();
        let decode = |text: &str| crate::redact::percent_decoded(text);
        let login = match (address.username(), address.password()) {
            ("", _) => Login::None,
            (user, Some(password)) => Login::Password(decode(user), Secret::new(decode(password))),
            (token, None) => Login::Token(Secret::new(decode(token))),
        };
        // Neither can fail on a URL with a host, which parsing it as a server address ensured.
        let _ = address.set_username("");
        let _ = address.set_password(None);
        let server = ServerAddr::from_url(address)
            .map_err(|e| crate::redact::message_about(&e.to_string(), url))?;
        Ok(Nats {
            url: url.to_owned(),
            server,
            login,
            subject,
            timeout,
            jetstream: OnceCell::new(),
            problem: Arc::default(),
            refused: Arc::default(),
        })
    }

    /// The JetStream context, its connection opened (in the background) on first use.
    async fn jetstream(&self) -> Result<&jetstream::Context, String> {
        self.jetstream
            .get_or_try_init(|| async {
                let (problem, refused) = (self.problem.clone(), self.refused.clone());
                let client = self
                    .options()
                    .event_callback(move |event| {
                        match &event {
                            async_nats::Event::Connected => refused.store(false, Ordering::SeqCst),
                            async_nats::Event::ServerError(
                                async_nats::ServerError::AuthorizationViolation,
                            ) => refused.store(true, Ordering::SeqCst),
                            // A reconnect's refused login comes as the client's error, in words.
                            async_nats::Event::ClientError(e)
                                if e.to_string()
                                    .to_ascii_lowercase()
                                    .contains("authorization violation") =>
                            {
                                refused.store(true, Ordering::SeqCst)
                            }
                            _ => {}
                        }
                        let seen = match event {
                            async_nats::Event::Connected => Some(None),
                            async_nats::Event::ServerError(_)
                            | async_nats::Event::ClientError(_) => Some(Some(event.to_string())),
                            _ => None,
                        };
                        if let Some(seen) = seen {
                            *problem.lock().unwrap_or_else(|e| e.into_inner()) = seen;
                        }
                        std::future::ready(())
                    })
                    .name("hookbox")
                    // async-nats drops the connection at the third tick with two PINGs
                    // unanswered, and every message from the server puts the tick back.
                    .ping_interval(bus::silent_for(self.timeout) / 3)
                    .retry_on_initial_connect()
                    .max_reconnects(None)
                    .connection_timeout(self.timeout)
                    .connect(self.server.clone())
                    .await
                    .map_err(|e| format!("cannot open the NATS connection: {e}"))?;
                Ok(jetstream::ContextBuilder::new()
                    .timeout(self.timeout)
                    .backpressure_on_inflight(true)
                    .build(client))
            })
            .await
    }

    /// How to log in, as the URL says.
    fn options(&self) -> ConnectOptions {
        match &self.login {
            Login::None => ConnectOptions::new(),
            Login::Password(user, password) => {
                ConnectOptions::with_user_and_password(user.clone(), password.expose().to_owned())
            }
            Login::Token(token) => ConnectOptions::with_token(token.expose().to_owned()),
        }
    }

    /// What last went wrong with the connection, while it is not up.
    fn trouble(&self) -> Option<String> {
        let problem = self
            .problem
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()?;
        Some(crate::redact::message_about(
            &format!("the connection's last error: {problem}"),
            &self.url,
        ))
    }

    /// Waits (within the target's timeout) for the connection to be up before a publish.
    /// Only then does the client know the server's `max_payload`: before, it takes the usual
    /// 1 MiB, so a message too large for a server that allows less was sent, the server closed
    /// the connection, and every publish in flight on it waited out its timeout. Once up, such
    /// a message is refused before it is sent (dead at once, as the docs say).
    async fn connected(&self, client: &async_nats::Client) -> Result<(), Failure> {
        use async_nats::connection::State;
        let deadline = tokio::time::Instant::now() + self.timeout;
        while client.connection_state() != State::Connected {
            if self.refused.load(Ordering::SeqCst) {
                return Err(Failure::Retry(
                    "the NATS server refuses the login the URL gives (its user and password, or \
                     token)"
                        .to_owned(),
                ));
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Failure::Retry(
                    "the connection to the NATS server is not up (is it running, and the network to it \
                     up?)".to_owned(),
                ));
            }
            tokio::time::sleep(CONNECTED_EVERY).await;
        }
        Ok(())
    }

    /// One attempt: publish the event and wait for the stream's acknowledgement. The
    /// dispatcher bounds it by the target's timeout, as the JetStream context bounds the wait
    /// for the acknowledgement.
    async fn publish(&self, due: &Due, step: &Step) -> Handoff {
        let subject = self.subject.render(bus::names(due));
        let mut headers = HeaderMap::new();
        let values = [
            ("Nats-Msg-Id".to_owned(), idempotency_key(due)),
            ("Content-Type".to_owned(), bus::content_type(due).to_owned()),
        ]
        .into_iter()
        .chain(
            hookbox_headers(due)
                .into_iter()
                .map(|(name, value)| (name.to_owned(), value)),
        );
        for (name, value) in values {
            match value.parse::<HeaderValue>() {
                Ok(value) => headers.insert(name.as_str(), value),
                Err(_) => {
                    return bus::refused(
                        &format!("the {name} header cannot carry this event's value"),
                        &self.url,
                    )
                }
            }
        }
        let published = async {
            step.at("waiting for the connection to the NATS server");
            let jetstream = self.jetstream().await.map_err(Failure::Retry)?;
            self.connected(&jetstream.client()).await?;
            let ack = async {
                step.at("publishing");
                let ack = jetstream
                    .publish_with_headers(subject.clone(), headers, due.payload.clone().into())
                    .await?;
                step.at("waiting for the stream's acknowledgement");
                ack.await
            }
            .await;
            let ack = match ack {
                Ok(ack) => ack,
                // No stream answered: none captures the subject, or the server has no
                // JetStream at all, whose mend is another.
                Err(e) if e.kind() == PublishErrorKind::StreamNotFound => {
                    return Err(match jetstream_missing(jetstream).await {
                        Some(why) => Failure::Retry(why),
                        None => Failure::from_publish(e.kind(), e.to_string()),
                    })
                }
                Err(e) => return Err(Failure::from_publish(e.kind(), e.to_string())),
            };
            let other = match ack.duplicate {
                true => {
                    step.at("looking up the stream's copy of a duplicate");
                    another_targets_copy(jetstream, &ack, due, &subject).await
                }
                false => None,
            };
            Ok((ack, other))
        };
        match published.await {
            Ok((ack, Some(other))) => bus::failed(
                &format!(
                    "JetStream dropped the publish on subject {subject} as a duplicate: stream \
                     {} holds this event's Nats-Msg-Id ({}) from {other} (sequence {}), so \
                     this target's consumers do not get it. Each NATS target of a source needs \
                     a stream of its own (streams whose subjects do not overlap); retried, \
                     and taken once the stream's duplicate window has passed",
                    ack.stream,
                    idempotency_key(due),
                    ack.sequence
                ),
                &self.url,
            ),
            Ok((ack, None)) => {
                tracing::debug!(
                    stream = %ack.stream,
                    sequence = ack.sequence,
                    duplicate = ack.duplicate,
                    "JetStream acknowledged the publish"
                );
                Handoff::Accepted { status: None }
            }
            Err(Failure::Retry(error)) => {
                let trouble = self.trouble().map_or(String::new(), |t| format!("; {t}"));
                bus::failed(
                    &format!(
                        "no JetStream acknowledgement for subject {subject}: {error}{trouble}"
                    ),
                    &self.url,
                )
            }
            Err(Failure::Dead(error)) => bus::refused(
                &format!("JetStream cannot take this event on subject {subject}: {error}"),
                &self.url,
            ),
        }
    }
}

impl Nats {
    /// Checks, as the dispatcher starts, that the server answers, takes the login, has
    /// JetStream, and holds a stream that captures `source`'s subjects: what is ready, or what
    /// is wrong. On a connection of its own, tried once and closed after: the deliveries'
    /// connection is opened by the first of them, as it would be without the check, and a
    /// refused login does not retry (and log) for ever with no event to send.
    pub async fn check(&self, source: &str) -> Result<bus::Ready, String> {
        let told = |error: String| crate::redact::message_about(&error, &self.url);
        // Each of the connect and the two requests may take a third of the target's timeout
        // (whole milliseconds), so that a login that may not use JetStream's API (whose
        // requests go unanswered) is said before the check's own time runs out.
        let third = bus::share_of(self.timeout, 3);
        let client = self
            .options()
            .name("hookbox (startup check)")
            .connection_timeout(third)
            .connect(self.server.clone())
            .await
            .map_err(|e| {
                use async_nats::ConnectErrorKind;
                told(match e.kind() {
                    ConnectErrorKind::AuthorizationViolation | ConnectErrorKind::Authentication => {
                        format!(
                            "the NATS server refuses the login the URL gives (its user and \
                             password, or token): {e}"
                        )
                    }
                    ConnectErrorKind::TimedOut => format!(
                        "the NATS server does not answer within {}",
                        crate::config::Spelt(third)
                    ),
                    _ => format!("cannot connect to the NATS server: {e}"),
                })
            })?;
        let server = client.server_info();
        let jetstream = jetstream::ContextBuilder::new()
            .timeout(third)
            .build(client);
        let checked = self
            .check_streams(&jetstream, source)
            .await
            .map(|ready| bus::Ready {
                // Streams are the cluster's (or the server's), however its URL is written.
                server: server.cluster.clone().unwrap_or(server.server_id.clone()),
                ..ready
            });
        // Closed now, not when the last clone of the client goes.
        let _ = jetstream.client().drain().await;
        checked
    }

    /// [`Nats::check`]'s look at JetStream and its streams.
    async fn check_streams(
        &self,
        jetstream: &jetstream::Context,
        source: &str,
    ) -> Result<bus::Ready, String> {
        let told = |error: String| crate::redact::message_about(&error, &self.url);
        if let Some(why) = jetstream_missing(jetstream).await {
            return Err(why);
        }
        let subjects = self.subject.subjects_of(source);
        let mut streams = jetstream.streams();
        // The streams that capture some of the target's subjects, and whether one captures all.
        let (mut capturing, mut whole) = (Vec::new(), false);
        while let Some(info) = streams.next().await {
            match info {
                Ok(info) => {
                    let theirs = &info.config.subjects;
                    if theirs
                        .iter()
                        .any(|s| routing::subjects_overlap(s, &subjects))
                    {
                        whole |= theirs.iter().any(|s| routing::subjects_cover(s, &subjects));
                        capturing.push(info.config.name);
                    }
                }
                // Listing streams may be denied to this login; publishing may still work.
                Err(e) => {
                    return Ok(bus::Ready::said(told(format!(
                        "JetStream answers (its streams could not be listed: {e})"
                    ))))
                }
            }
        }
        if capturing.is_empty() {
            return Err(format!(
                "no stream captures subjects like {subjects} (hookbox never creates streams; \
                 add the subjects to a stream, e.g. `nats stream add WEBHOOKS --subjects '{}' \
                 --dupe-window 1h`, the window as long as the target's retries: see \
                 docs/bus-targets.md)",
                routing::nats_pattern(&subjects)
            ));
        }
        let said = if whole {
            format!(
                "JetStream answers; stream {} captures subjects like {subjects}",
                capturing.join(", ")
            )
        } else {
            // Not a warning: the target's `events` filter may keep the others away.
            format!(
                "JetStream answers; stream {} captures some subjects like {subjects}, not all: \
                 an event whose subject no stream captures is retried, then dead",
                capturing.join(", ")
            )
        };
        Ok(bus::Ready {
            said,
            streams: capturing,
            server: String::new(),
        })
    }
}

/// When no stream took a publish: whether that is because the server (or the account) has no
/// JetStream, rather than no stream for the subject.
async fn jetstream_missing(jetstream: &jetstream::Context) -> Option<String> {
    use async_nats::jetstream::context::AccountErrorKind;
    match jetstream.query_account().await.map_err(|e| e.kind()) {
        Err(AccountErrorKind::JetStreamUnavailable) => Some(
            "the NATS server has no JetStream (start nats-server with -js, or enable \
             JetStream in its config)"
                .to_owned(),
        ),
        Err(AccountErrorKind::JetStream(error)) => Some(format!(
            "JetStream is not enabled for this connection's account ({error}): enable it for \
             the account in the server's config"
        )),
        _ => None,
    }
}

/// When JetStream says a publish is a duplicate, whose copy the stream holds: `None` when it
/// is this target's own (a repeat publish: a retry after a lost acknowledgement, a redeliver),
/// or when the copy cannot be read (removed by the stream's limits or a work queue's consumer);
/// else who published it (`target "audit"`, or `subject x.y`). The Nats-Msg-Id is the event's
/// (`{source}:{event_id}`, as the contract gives it), so two targets of one source whose
/// subjects land in one stream share it, and the stream keeps only the first.
async fn another_targets_copy(
    jetstream: &jetstream::Context,
    ack: &jetstream::publish::PublishAck,
    due: &Due,
    subject: &str,
) -> Option<String> {
    let stream = jetstream.get_stream_no_info(&ack.stream).await.ok()?;
    let original = stream.get_raw_message(ack.sequence).await.ok()?;
    match original.headers.get("X-Hookbox-Target") {
        Some(target) if target.as_str() == due.target => None,
        Some(target) => Some(format!("target {:?}", target.as_str())),
        // Not published by hookbox: told by its subject, then.
        None if original.subject.as_str() == subject => None,
        None => Some(format!("subject {}", original.subject)),
    }
}

/// How often an attempt looks whether the connection is up, while it is not.
const CONNECTED_EVERY: Duration = Duration::from_millis(5);

/// Shared by the target and every dispatcher thread's lane: one connection.
impl Transport for Arc<Nats> {
    fn hand_off<'a>(&'a self, due: &'a Due, step: &'a Step) -> LocalBoxFuture<'a, Handoff> {
        Box::pin(self.publish(due, step))
    }

    fn trouble(&self) -> Option<String> {
        Nats::trouble(self)
    }
}

/// Why a publish failed, and whether another attempt may do better.
enum Failure {
    Retry(String),
    Dead(String),
}

impl Failure {
    fn from_publish(kind: PublishErrorKind, error: String) -> Failure {
        match kind {
            PublishErrorKind::StreamNotFound => Failure::Retry(
                "no stream captures this subject (hookbox never creates streams; add the \
                 subject to a stream)"
                    .to_owned(),
            ),
            // The connection was up when the message went (see `connected`).
            PublishErrorKind::TimedOut => Failure::Retry(
                "no acknowledgement from JetStream within the target's timeout (the connection \
                 dropped meanwhile, the server is overloaded, or the stream that captures the \
                 subject does not acknowledge publishes: `no_ack`)"
                    .to_owned(),
            ),
            // The server's own limit: the event is too large for it, however often it is sent.
            PublishErrorKind::MaxPayloadExceeded => Failure::Dead(format!(
                "{error} (the event is larger than the NATS server's max_payload: raise it in \
                 the server's config, up to 64 MB, and redeliver the event)"
            )),
            _ => Failure::Retry(error),
        }
    }
}
