//! The HTTP transport: a `POST` of the original body, signed the Standard Webhooks way with
//! the target's secret, over the dispatcher's shared, kept-alive client.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use actix_web::http::header::HeaderValue;
use futures_util::future::LocalBoxFuture;

use super::transport::{hookbox_headers, idempotency_key, Handoff, Step, Transport};
use super::{Link, Target};
use crate::db::deliveries::Due;
use crate::providers::Provider;
use crate::retry;

/// The most of an answer's body read (and dropped), so the connection can be reused.
const ANSWER_LIMIT: usize = 64 * 1024;

/// An `http://` or `https://` target.
pub struct Http {
    client: awc::Client,
    target: Arc<Target>,
}

impl Http {
    /// The transport of `target`, over `client`.
    pub fn new(client: awc::Client, target: Arc<Target>) -> Http {
        Http { client, target }
    }

    async fn post(&self, due: &Due) -> Handoff {
        // On the database's clock, as hookbox's other times: a host whose clock is off signed
        // every attempt with a time the receiver's tolerance refused (a black-box run: all
        // dead at their first attempt, 401 "timestamp too new", with the clock WARN logged).
        let now = crate::db::now().timestamp();
        let mut request = self.client.post(&self.target.config.url);
        for (name, value) in headers(&self.target, due, now) {
            // An id may hold non-ASCII characters: sent as raw bytes, as HTTP allows.
            match HeaderValue::from_bytes(value.as_bytes()) {
                Ok(value) => request = request.insert_header((name, value)),
                Err(_) => {
                    return Handoff::Refused {
                        status: None,
                        error: format!("the {name} header cannot carry this event's value"),
                    }
                }
            }
        }
        let mut response = match request.send_body(due.payload.clone()).await {
            Ok(response) => response,
            Err(e) => {
                if let Some(shortage) = local_shortage(&e) {
                    return Handoff::NotSent { error: shortage };
                }
                return Handoff::Failed {
                    status: None,
                    error: unanswered(&e),
                    retry_after: None,
                };
            }
        };
        // The status line decides: a 2xx whose body is slow to come is delivered, not an
        // attempt that timed out and is sent again.
        let verdict = judge(
            response.status().as_u16(),
            response
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok()),
        );
        // Read (and drop) the body so the connection can be reused: at once when it is all
        // there (an empty answer), else on its own, within the target's timeout.
        let mut body = Box::pin(response.body().limit(ANSWER_LIMIT));
        if futures_util::FutureExt::now_or_never(&mut body).is_none() {
            let timeout = self.target.config.timeout;
            actix_web::rt::spawn(async move {
                let _ = actix_web::rt::time::timeout(timeout, body).await;
            });
        }
        verdict
    }
}

impl Transport for Http {
    // awc's one future connects, sends and reads the answer's head: no step of its own.
    fn hand_off<'a>(&'a self, due: &'a Due, _: &'a Step) -> LocalBoxFuture<'a, Handoff> {
        Box::pin(self.post(due))
    }
}

/// awc's TCP connector, setting `TCP_USER_TIMEOUT` on each connection it makes to its
/// target's `timeout`: data the target has not acknowledged within it ends the connection,
/// and what the kernel still held for it is dropped.
///
/// A request written into a path that went silent (a black hole: no answer, no reset) stayed
/// in the kernel's send queue when its attempt timed out and the connection was dropped, and
/// the kernel went on sending it; it reached the target once the path came back, a minute
/// later, after the attempts that followed it (a black-box run: an `ordered` target got an
/// old event after newer ones, and two at once). Only unacknowledged data counts: a target
/// that takes the request and is slow to answer is not cut off by this (the attempt's own
/// timeout is what bounds that). Targets that share a host and port share their connections:
/// the shortest of their timeouts.
#[derive(Clone)]
pub struct GiveUpWithTheAttempt {
    tcp: actix_tls::connect::ConnectorService,
    timeouts: std::rc::Rc<std::collections::HashMap<(String, u16), Duration>>,
}

impl GiveUpWithTheAttempt {
    /// The connector for the HTTP targets of `targets`.
    pub fn new<'a>(targets: impl IntoIterator<Item = &'a Arc<Target>>) -> GiveUpWithTheAttempt {
        let mut timeouts: std::collections::HashMap<(String, u16), Duration> =
            std::collections::HashMap::new();
        for target in targets {
            let Ok(uri) = target.config.url.parse::<awc::http::Uri>() else {
                continue;
            };
            let (Some(host), Some(port)) = (
                uri.host(),
                uri.port_u16().or(match uri.scheme_str() {
                    Some("https") => Some(443),
                    Some("http") => Some(80),
                    _ => None,
                }),
            ) else {
                continue;
            };
            let timeout = timeouts
                .entry((host.to_owned(), port))
                .or_insert(target.config.timeout);
            *timeout = (*timeout).min(target.config.timeout);
        }
        GiveUpWithTheAttempt {
            tcp: actix_tls::connect::Connector::default().service(),
            timeouts: std::rc::Rc::new(timeouts),
        }
    }
}

type Connected = actix_tls::connect::Connection<awc::http::Uri, actix_web::rt::net::TcpStream>;

impl actix_web::dev::Service<actix_tls::connect::ConnectInfo<awc::http::Uri>>
    for GiveUpWithTheAttempt
{
    type Response = Connected;
    type Error = actix_tls::connect::ConnectError;
    type Future = LocalBoxFuture<'static, Result<Connected, actix_tls::connect::ConnectError>>;

    fn poll_ready(
        &self,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        actix_web::dev::Service::<actix_tls::connect::ConnectInfo<awc::http::Uri>>::poll_ready(
            &self.tcp, context,
        )
    }

    fn call(&self, info: actix_tls::connect::ConnectInfo<awc::http::Uri>) -> Self::Future {
        let timeout = self
            .timeouts
            .get(&(info.hostname().to_owned(), info.port()))
            .copied();
        let connecting = self.tcp.call(info);
        Box::pin(async move {
            let connected = connecting.await?;
            if let Some(timeout) = timeout {
                // Best effort: a kernel without the option connects as before.
                let _ =
                    socket2::SockRef::from(connected.io_ref()).set_tcp_user_timeout(Some(timeout));
            }
            Ok(connected)
        })
    }
}

/// The headers of one attempt: the stable key, the Standard Webhooks signature, the original
/// `Content-Type` (none when the delivery had none: the body goes as it came), and the event's
/// identity.
fn headers(target: &Target, due: &Due, now: i64) -> Vec<(String, String)> {
    let key = idempotency_key(due);
    let mut headers = match &target.link {
        Link::Http(signer) => signer.sign(&due.payload, now, &key, None),
        // `Transports::for_target` builds this transport for HTTP targets alone.
        Link::Nats(_) | Link::Amqp(_) => Vec::new(),
    };
    headers.push(("Idempotency-Key".to_owned(), key));
    if let Some(content_type) = &due.content_type {
        headers.push(("Content-Type".to_owned(), content_type.clone()));
    }
    headers.extend(
        hookbox_headers(due)
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value)),
    );
    headers
}

/// Why an attempt got no answer, in words that point at the downstream: awc calls a connection
/// the peer closed after reading the request a failure "to connect".
fn unanswered(error: &awc::error::SendRequestError) -> String {
    use awc::error::{ConnectError, SendRequestError};
    match error {
        SendRequestError::Connect(ConnectError::Disconnected) => {
            "the downstream closed the connection without answering".to_owned()
        }
        SendRequestError::Connect(e) => format!("cannot reach the downstream: {e}"),
        SendRequestError::Send(e) => {
            format!("the connection to the downstream broke while sending: {e}")
        }
        SendRequestError::Response(e) => {
            format!("the downstream's answer is not HTTP that can be read: {e}")
        }
        SendRequestError::Timeout => "the downstream did not answer in time".to_owned(),
        e => format!("cannot reach the downstream: {e}"),
    }
}

/// Why this process could not open the attempt's connection, where the cause is its own and
/// not the downstream's: no file descriptor left (`EMFILE`, `ENFILE`), no buffer or memory for
/// a socket, no local port. A black-box run that used up the process's descriptors saw each
/// attempt charged to the target until its deliveries were dead.
fn local_shortage(error: &awc::error::SendRequestError) -> Option<String> {
    use awc::error::{ConnectError, SendRequestError};
    let io = match error {
        SendRequestError::Connect(ConnectError::Io(e)) => e,
        SendRequestError::Connect(ConnectError::Resolver(e)) => e.downcast_ref()?,
        _ => return None,
    };
    let shortage = match io.raw_os_error()? {
        libc::EMFILE => "this process has no file descriptor left (its open-files limit)",
        libc::ENFILE => "the system has no file descriptor left",
        libc::ENOBUFS | libc::ENOMEM => "the system has no memory left for another socket",
        libc::EADDRNOTAVAIL => "this host has no local port left for another connection",
        _ => return None,
    };
    Some(format!("cannot open a connection: {shortage} ({io})"))
}

/// What an HTTP answer means for the delivery.
fn judge(status: u16, retry_after: Option<&str>) -> Handoff {
    match status {
        200..=299 => Handoff::Accepted {
            status: Some(status),
        },
        410 => Handoff::Refused {
            status: Some(status),
            error: "the downstream answered 410 Gone; not retried".to_owned(),
        },
        429 | 500..=599 => Handoff::Failed {
            status: Some(status),
            error: format!("the downstream answered {status}"),
            retry_after: retry_after.and_then(|v| retry::retry_after(v, SystemTime::now())),
        },
        _ => Handoff::Refused {
            status: Some(status),
            error: format!("the downstream answered {status}; not retried"),
        },
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_connection_this_process_has_no_descriptor_for_is_its_own_shortage() {
        use awc::error::{ConnectError, SendRequestError};
        let io = |code| std::io::Error::from_raw_os_error(code);
        let connect = |code| SendRequestError::Connect(ConnectError::Io(io(code)));
        let shortage = super::local_shortage(&connect(libc::EMFILE)).expect("EMFILE is ours");
        assert!(shortage.contains("no file descriptor left"), "{shortage}");
        for ours in [
            libc::ENFILE,
            libc::ENOBUFS,
            libc::ENOMEM,
            libc::EADDRNOTAVAIL,
        ] {
            assert!(super::local_shortage(&connect(ours)).is_some(), "{ours}");
        }
        // A name that could not be looked up for want of a descriptor is ours too.
        let resolver =
            SendRequestError::Connect(ConnectError::Resolver(Box::new(io(libc::EMFILE))));
        assert!(super::local_shortage(&resolver).is_some());
        // The downstream's faults are not.
        for theirs in [
            libc::ECONNREFUSED,
            libc::ECONNRESET,
            libc::EHOSTUNREACH,
            libc::ETIMEDOUT,
        ] {
            assert!(
                super::local_shortage(&connect(theirs)).is_none(),
                "{theirs}"
            );
        }
        assert!(super::local_shortage(&SendRequestError::Timeout).is_none());
    }

    use super::*;
    use std::time::Duration;

    #[test]
    fn answers_are_judged_as_the_contract_says() {
        assert_eq!(judge(204, None), Handoff::Accepted { status: Some(204) });
        assert!(matches!(
            judge(410, None),
            Handoff::Refused {
                status: Some(410),
                ..
            }
        ));
        assert!(matches!(
            judge(404, None),
            Handoff::Refused {
                status: Some(404),
                ..
            }
        ));
        assert!(matches!(judge(302, None), Handoff::Refused { .. }));
        assert!(matches!(
            judge(503, None),
            Handoff::Failed {
                status: Some(503),
                retry_after: None,
                ..
            }
        ));
        assert!(matches!(judge(429, None), Handoff::Failed { .. }));
    }

    #[test]
    fn retry_after_is_read_in_seconds_or_as_a_date() {
        let Handoff::Failed { retry_after, .. } = judge(503, Some("30")) else {
            panic!("503 is retried");
        };
        assert_eq!(retry_after, Some(Duration::from_secs(30)));
        let Handoff::Failed { retry_after, .. } = judge(429, Some("Wed, 21 Oct 2015 07:28:00 GMT"))
        else {
            panic!("429 is retried");
        };
        assert_eq!(
            retry_after,
            Some(Duration::ZERO),
            "a date in the past asks no wait"
        );
    }
}
