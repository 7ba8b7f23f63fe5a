//! `POST /webhooks/{source}`: request bytes → verified delivery → claim → HTTP answer.

use std::sync::Arc;
use std::time::Instant;

use actix_web::error::PayloadError;
use actix_web::http::header::{self, HeaderMap};
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use futures_util::StreamExt;

use crate::ids::{EventId, EventType};
use crate::inbox::{self, BatchOutcome, Cached, ClaimError, Delivery, Outcome, StoredResponse};
use crate::metrics::{self, Outcome as Counted};
use crate::providers::{
    certs, unix_now, Answer, Headers, Inbound, Item, Provider, Received, Refusal, SignatureError,
};
use crate::state::{AppState, Source};
use crate::telemetry::OncePerMinute;

use super::ApiError;

/// Lets the providers read actix's headers.
struct RequestHeaders<'a>(&'a HeaderMap);

impl Headers for RequestHeaders<'_> {
    /// A header the scheme reads that is there more than once counts as absent: a proxy in
    /// front might pick another of the values than hookbox would.
    fn get(&self, name: &str) -> Option<&[u8]> {
        let mut values = self.0.get_all(name);
        let first = values.next()?;
        values.next().is_none().then(|| first.as_bytes())
    }

    /// Every line of a header a provider repeats on purpose, in order.
    fn all(&self, name: &str) -> Vec<&[u8]> {
        self.0.get_all(name).map(|value| value.as_bytes()).collect()
    }
}

/// Whether a request is for a source whose provider sends a `GET` handshake (Braintree's
/// `bt_challenge`), so the route takes its `GET`.
pub fn answers_get(ctx: &actix_web::guard::GuardContext<'_>) -> bool {
    let Some(name) = ctx.head().uri.path().strip_prefix("/webhooks/") else {
        return false;
    };
    ctx.app_data::<web::Data<AppState>>()
        .and_then(|state| state.sources.get(name).cloned())
        .is_some_and(|source| source.provider.answers_get())
}

/// A method the webhook route does not take: 404 `unknown_source` for a source that is not
/// configured (as a `POST` there is), else 405 `method_not_allowed` naming the methods the
/// source takes. Not counted as a delivery.
pub async fn other_method(
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    match state.sources.get(path.as_str()) {
        None => Err(ApiError::UnknownSource),
        Some(source) if source.provider.answers_get() => {
            Err(ApiError::MethodNotAllowed("GET, POST"))
        }
        Some(_) => Err(ApiError::MethodNotAllowed("POST")),
    }
}

/// When a delivery whose connection ended mid-body was last said at INFO.
static INCOMPLETE_SAID: OncePerMinute = OncePerMinute::new();

/// A refused or failed delivery, and what caused it where the answer does not say.
struct Failed {
    error: ApiError,
    /// The underlying failure (a handler's error, a database's), for the log line only.
    cause: Option<String>,
}

impl From<ApiError> for Failed {
    fn from(error: ApiError) -> Failed {
        Failed { error, cause: None }
    }
}

impl Failed {
    fn because(error: ApiError, cause: impl std::fmt::Display) -> Failed {
        Failed {
            error,
            cause: Some(cause.to_string()),
        }
    }

    /// The failure's one log line, written where it is answered: `info` for a refusal (4xx),
    /// `error` for a handler that failed (500), `warn` for the database (503).
    fn log(&self) {
        let status = self.error.status_code();
        let (error, cause) = (self.error.code(), self.cause.as_deref());
        let code = status.as_u16();
        if matches!(self.error, ApiError::ProcessingFailed) {
            tracing::error!(
                status = code,
                error,
                cause,
                "delivery failed; nothing was stored"
            );
        } else if matches!(self.error, ApiError::Unanswered) {
            // The claim's transaction goes on, and may still commit.
            tracing::warn!(
                status = code,
                error,
                cause,
                "delivery not answered in time; its claim may still be stored, and a retry then gets the stored answer"
            );
        } else if matches!(self.error, ApiError::StoreGone) {
            // Claimed into the file serve opened, which no longer has a path.
            tracing::warn!(
                status = code,
                error,
                cause,
                "delivery failed: stored only in a file that is gone once serve stops"
            );
        } else if status.is_server_error() {
            tracing::warn!(
                status = code,
                error,
                cause,
                "delivery failed; nothing was stored"
            );
        } else if matches!(self.error, ApiError::CutShort) {
            // Not a refusal of what a provider sent: its connection was lost (a client that
            // gave up, a proxy that cut it), and the provider retries what it did not see
            // answered. A flood of them (a black-box run: 1,600 in 17 minutes) is said once a
            // minute, with how many were not; each at DEBUG.
            tracing::debug!(status = code, error, "delivery incomplete");
            if let Some(not_shown_since_last) = INCOMPLETE_SAID.due() {
                tracing::info!(
                    status = code,
                    error,
                    not_shown_since_last,
                    "delivery incomplete: the connection ended before the whole body arrived; nothing was stored (at most one such line a minute; RUST_LOG=debug shows each)"
                );
            }
        } else {
            tracing::info!(status = code, error, cause, "delivery refused");
        }
    }
}

/// Receives one delivery and answers it, counting the outcome.
// At ERROR level, like the request's span, so that `source` and `event.id` are on every line
// whatever level `RUST_LOG` lets through.
#[tracing::instrument(
    name = "webhook",
    level = "error",
    skip_all,
    fields(
        source = %crate::ids::ClientText::new(path.as_str(), 64),
        event.id = tracing::field::Empty
    )
)]
pub async fn receive(
    state: web::Data<AppState>,
    path: web::Path<String>,
    request: HttpRequest,
    payload: web::Payload,
) -> HttpResponse {
    let started = Instant::now();
    let source_name = path.into_inner();
    let answered = answer(&state, &source_name, &request, payload)
        .await
        .and_then(|answer| kept_where_serve_opened_it(&state, answer));
    let (response, counted) = match answered {
        Ok(answer) => {
            if matches!(answer.1, Counted::Processed) {
                if let Some((lasted, failed)) = state.store_failing.stored() {
                    tracing::info!(
                        failed,
                        lasted = %crate::config::Spelt(crate::outage::round_to_seconds(lasted)),
                        "the store takes deliveries again: this one was stored after {failed} \
                         that it failed (answered 503 unavailable)"
                    );
                }
            }
            answer
        }
        Err(failed) => {
            failed.log();
            if failed.error.is_the_stores() {
                state.store_failing.failed();
            }
            if matches!(failed.error, ApiError::Database(crate::db::Failure::Full))
                && state.disk_full.noticed()
            {
                // Each delivery's own WARN quotes the database; what it means and what to do
                // is said once a spell (a black-box run: 4,052 WARNs naming no file).
                let disk = state.store_file.as_ref().map_or_else(
                    || "the database server's disk".to_owned(),
                    |file| format!("the disk of {}", file.path().display()),
                );
                tracing::error!(
                    "the database's disk is full ({disk}): every delivery that needs room is \
                     answered 503 and /readyz says not ready until space is freed there; hookbox \
                     purge cannot free it (its deletes need room too): free space by other means \
                     (said once while it lasts)"
                );
            }
            let counted = if matches!(failed.error, ApiError::CutShort) {
                Counted::Incomplete
            } else if failed.error.status_code().is_server_error() {
                Counted::Failed
            } else {
                Counted::Rejected
            };
            (failed.error.error_response(), counted)
        }
    };
    let label = if state.sources.contains_key(&source_name) {
        source_name.as_str()
    } else {
        metrics::UNKNOWN_SOURCE
    };
    state.metrics.record(label, counted, started.elapsed());
    super::observe::answered(&state, label, counted, &request, &response);
    response
}

/// A delivery stored (or answered from what is stored) is answered so only while the SQLite
/// file serve opened is still the one at its path: deleted or replaced under a running `serve`,
/// it goes on taking writes through the open handle and they are gone when serve stops, so the
/// provider is told to retry (503 `unavailable`) until serve runs on the file to keep. Checked
/// after the claim, so a file removed while it ran is seen too.
fn kept_where_serve_opened_it(
    state: &AppState,
    (response, counted): (HttpResponse, Counted),
) -> Result<(HttpResponse, Counted), Failed> {
    match state.store_file.as_ref() {
        Some(file)
            if matches!(counted, Counted::Processed | Counted::Replayed) && !file.still_there() =>
        {
            Err(Failed::because(
                ApiError::StoreGone,
                format_args!(
                    "the SQLite file {} was deleted or replaced while serve runs; restart serve on the file to keep",
                    file.path().display()
                ),
            ))
        }
        _ => Ok((response, counted)),
    }
}

async fn answer(
    state: &web::Data<AppState>,
    source_name: &str,
    request: &HttpRequest,
    payload: web::Payload,
) -> Result<(HttpResponse, Counted), Failed> {
    let source = state
        .sources
        .get(source_name)
        .ok_or(ApiError::UnknownSource)?
        .clone();
    // A client that dribbles its body, or a database that stops answering (a stalled
    // connection blocks the claim's thread), must not hold the request open for ever.
    let deadline = tokio::time::Instant::now() + state.request_timeout;
    let mut payload = payload;
    let read = tokio::time::timeout_at(
        deadline,
        read_body(request, &mut payload, state.max_body_bytes),
    )
    .await;
    // A body left unread is closed after the answer (see `http::unread`).
    let body = match read {
        Ok(body) => body?,
        Err(_) => return Err(ApiError::RequestTimeout.into()),
    };
    let headers = RequestHeaders(request.headers());
    let inbound = Inbound {
        method: request.method().as_str(),
        query: request.query_string(),
        headers: &headers,
        body: &body,
        now: unix_now(),
    };
    // A provider that fetches a certificate to check the signature waits within the deadline.
    // The 503 line says so; the fetch's own warning (logged once per fetch, however many
    // deliveries wait for it) has the URL and the reason.
    let received = tokio::time::timeout_at(deadline, source.provider.receive(&inbound))
        .await
        .map_err(|_| {
            Failed::because(
                ApiError::NotFetched(
                    "the provider's certificate the signature check needs was not fetched in time; nothing was stored, retry later",
                ),
                "the certificate the signature check needs was not fetched within the request timeout",
            )
        })?;
    let binds = source.provider.transmission_id(&headers).is_some();
    if binds && matches!(received, Err(Refusal::Unavailable)) {
        // Its headers are out in the world with a signature that verifies once the certificate
        // can be had: a transmission id (PayPal's) is bound to its delivery now (unless the
        // database is down too), so that they never carry another body.
        let json: Option<serde_json::Value> = serde_json::from_slice(&body).ok();
        let identity = source
            .provider
            .identify_body(&headers, &body, json.as_ref());
        if let Some(event_id) = identity.event_id {
            let fingerprint =
                inbox::fingerprint(source.provider.volatile_fields(), &body, json.as_ref());
            let delivery = (event_id.as_str(), &body[..], fingerprint);
            bind_transmission(state, &source, &headers, delivery, deadline).await?;
        }
    }
    let received = received.map_err(|refusal| {
        let error = refused_by(source.provider.as_ref(), refusal);
        match refusal {
            Refusal::Unavailable => Failed::because(
                error,
                "the certificate the signature check needs could not be fetched; the warning \"certificate fetch failed\" says why",
            ),
            // The signed time is judged by this host's clock: the line says what it read, so a
            // clock that is off shows beside the provider's time.
            Refusal::Signature(SignatureError::Stale) => Failed::because(
                error,
                format_args!(
                    "the signed time is judged against this host's clock, which read {}; if every delivery is stale, check the clock",
                    chrono::DateTime::from_timestamp(inbound.now, 0)
                        .map_or_else(|| inbound.now.to_string(), |t| t.to_rfc3339())
                ),
            ),
            Refusal::Signature(SignatureError::Credentials(what)) => {
                Failed::because(error, format_args!("the signature matched, but {what}"))
            }
            Refusal::Signature(SignatureError::Untrusted(what)) => Failed::because(
                error,
                format_args!("the signing certificate is not one to trust: {what}"),
            ),
            _ => Failed::from(error),
        }
    })?;
    let incoming = match received {
        Received::Event(incoming) => incoming,
        Received::Batch(items) => return batch(state, &source, request, items, deadline).await,
        Received::Handshake(answer) => return Ok((handshake(answer), Counted::Handshake)),
        Received::Confirm(confirmation) => {
            // One GET, within the same deadline; a failure is 503, so the provider sends the
            // handshake again.
            let unconfirmed = ApiError::NotFetched(
                "the subscription could not be confirmed (the request to its SubscribeURL failed); nothing was stored, retry later",
            );
            match tokio::time::timeout_at(deadline, certs::visit(&confirmation.url)).await {
                Ok(Ok(())) => {}
                Ok(Err(certs::Unavailable)) => {
                    return Err(Failed::because(
                        unconfirmed,
                        "the confirmation request failed",
                    ))
                }
                Err(_) => {
                    return Err(Failed::because(
                        unconfirmed,
                        "the confirmation request did not finish within the request timeout",
                    ))
                }
            }
            return Ok((handshake(confirmation.answer), Counted::Handshake));
        }
    };
    let json = incoming.json;
    // Filtered on as kept (cut, controls escaped), as the admin API and the header show it.
    let event_type = incoming.event_type.map(EventType::from);
    let targets = targets_for(&source, event_type.as_ref());
    let event_id = EventId::try_from(incoming.event_id).map_err(ApiError::InvalidEventId)?;
    super::observe::identified(request, &event_id);
    tracing::Span::current().record("event.id", tracing::field::display(event_id.logged()));
    let fingerprint = inbox::fingerprint(source.provider.volatile_fields(), &body, json.as_ref());
    // Before any answer from the cache: a replay brings a transmission id of its own.
    let delivery = (event_id.as_str(), &body[..], fingerprint);
    bind_transmission(state, &source, &headers, delivery, deadline).await?;
    let cached = state.replays.get(
        source.name.as_str(),
        event_id.as_str(),
        &fingerprint,
        source.retention,
    );
    match cached {
        Some(Cached::Replay(stored)) => {
            return Ok((respond(&source, stored, true), Counted::Replayed))
        }
        Some(Cached::Mismatch) => return Err(ApiError::EventIdReused.into()),
        None => {}
    }

    let remember = |stored: &StoredResponse, event_id: &EventId| {
        state.replays.put(
            source.name.as_str(),
            event_id.as_str(),
            fingerprint,
            stored.clone(),
        );
    };
    let dedupe_key = source.dedupe_body.then(|| {
        source
            .provider
            .signed_payload_key(&inbound)
            .unwrap_or(fingerprint)
    });
    let delivery = Delivery {
        fingerprint,
        headers: kept_headers(&source, request.headers()),
        source: source.name.clone(),
        event_id: event_id.clone(),
        event_type,
        body,
        json,
        forward: targets,
        deadline: Instant::now() + state.in_flight_wait,
        answer_by: deadline.into_std(),
        dedupe_key,
    };
    let answer_by = deadline.into_std();
    let outcome =
        tokio::time::timeout_at(deadline, claim(state, source.clone(), delivery, answer_by))
            .await
            .map_err(|_| {
                // The claim's thread goes on; if its transaction still commits, the provider's
                // retry gets the stored answer.
                Failed::because(
                    ApiError::Unanswered,
                    "the database did not answer within the request timeout",
                )
            })??;
    match outcome {
        Outcome::Claimed(stored) => {
            remember(&stored, &event_id);
            tracing::debug!("processed");
            Ok((respond(&source, stored, false), Counted::Processed))
        }
        Outcome::Replay(stored) => {
            remember(&stored, &event_id);
            Ok((respond(&source, stored, true), Counted::Replayed))
        }
        Outcome::BodyReplay {
            first_event_id,
            stored,
        } => {
            // Not remembered under this id, where nothing is stored: the replay counts, and
            // the console's per-event count, go to the event stored first.
            tracing::info!(
                first.event.id = %crate::ids::ClientText::new(&first_event_id, usize::MAX),
                "payload already stored under another event id (dedupe = \"body\"): answered as its replay"
            );
            if let Ok(first) = EventId::try_from(first_event_id) {
                super::observe::identified(request, &first);
            }
            Ok((respond(&source, stored, true), Counted::Replayed))
        }
        Outcome::InFlight => Err(ApiError::InProgress(state.in_flight_wait).into()),
        Outcome::Busy => Err(ApiError::StoreBusy(state.in_flight_wait).into()),
        Outcome::Locked => Err(ApiError::TablesLocked.into()),
        Outcome::Mismatch => Err(ApiError::EventIdReused.into()),
    }
}

/// A delivery of several events (a batch): each item identified and fingerprinted on its own,
/// all claimed in one transaction, and answered once for the delivery.
async fn batch(
    state: &web::Data<AppState>,
    source: &Arc<Source>,
    request: &HttpRequest,
    items: Vec<Item>,
    deadline: tokio::time::Instant,
) -> Result<(HttpResponse, Counted), Failed> {
    let headers = kept_headers(source, request.headers());
    let in_flight_deadline = Instant::now() + state.in_flight_wait;
    let mut deliveries = Vec::with_capacity(items.len());
    for item in items {
        let event_id = EventId::try_from(item.event_id).map_err(ApiError::InvalidEventId)?;
        let fingerprint = inbox::fingerprint(
            source.provider.volatile_fields(),
            &item.payload,
            Some(&item.json),
        );
        let event_type = item.event_type.map(EventType::from);
        let forward = targets_for(source, event_type.as_ref());
        deliveries.push(Delivery {
            fingerprint,
            headers: headers.clone(),
            source: source.name.clone(),
            event_id,
            event_type,
            body: web::Bytes::from(item.payload),
            json: Some(item.json),
            forward,
            deadline: in_flight_deadline,
            answer_by: deadline.into_std(),
            dedupe_key: source.dedupe_body.then_some(fingerprint),
        });
    }
    let queues = deliveries.iter().any(|d| !d.forward.is_empty());
    // The first item names the delivery in the log and the console.
    if let Some(first) = deliveries.first() {
        super::observe::identified(request, &first.event_id);
        tracing::Span::current()
            .record("event.id", tracing::field::display(first.event_id.logged()));
    }

    // Every item answered from the cache of committed answers: a replay, with no database.
    let mut cached = Vec::with_capacity(deliveries.len());
    for delivery in &deliveries {
        match state.replays.get(
            source.name.as_str(),
            delivery.event_id.as_str(),
            &delivery.fingerprint,
            source.retention,
        ) {
            Some(Cached::Replay(stored)) => cached.push(stored),
            Some(Cached::Mismatch) => return Err(ApiError::EventIdReused.into()),
            None => break,
        }
    }
    if cached.len() == deliveries.len() {
        return Ok((respond_batch(source, cached, true), Counted::Replayed));
    }

    let deliveries = Arc::new(deliveries);
    let outcome = in_time(state, deadline, {
        let deliveries = deliveries.clone();
        let source = source.clone();
        move |conn| inbox::claim_batch(conn, &deliveries, source.handler.as_ref())
    })
    .await?;
    let remember = |answers: &[StoredResponse]| {
        for (delivery, stored) in deliveries.iter().zip(answers) {
            state.replays.put(
                source.name.as_str(),
                delivery.event_id.as_str(),
                delivery.fingerprint,
                stored.clone(),
            );
        }
    };
    match outcome {
        BatchOutcome::Claimed(answers) => {
            if queues {
                state.forward.queued();
            }
            remember(&answers);
            tracing::debug!(items = answers.len(), "processed");
            Ok((respond_batch(source, answers, false), Counted::Processed))
        }
        BatchOutcome::Replay(answers) => {
            remember(&answers);
            Ok((respond_batch(source, answers, true), Counted::Replayed))
        }
        BatchOutcome::InFlight => Err(ApiError::InProgress(state.in_flight_wait).into()),
        BatchOutcome::Busy => Err(ApiError::StoreBusy(state.in_flight_wait).into()),
        BatchOutcome::Locked => Err(ApiError::TablesLocked.into()),
        BatchOutcome::Mismatch => Err(ApiError::EventIdReused.into()),
    }
}

/// Runs the claim transaction on a blocking thread with a pooled connection. Nothing is logged
/// here: the failure goes up with its cause to [`receive`], which logs it once.
async fn claim(
    state: &web::Data<AppState>,
    source: Arc<Source>,
    delivery: Delivery,
    answer_by: Instant,
) -> Result<Outcome, Failed> {
    // The claim writers wake the dispatcher for what they queue (or hand over); a claim in a
    // transaction of its own is woken for here.
    let outcome = if inbox::needs_transaction(&delivery, source.handler.as_ref()) {
        let queues = !delivery.forward.is_empty();
        let outcome = claim_in_transaction(state, source, delivery, answer_by).await?;
        if queues && matches!(outcome, Ok(Outcome::Claimed(_))) {
            state.forward.queued();
        }
        outcome
    } else {
        state.claims.claim(delivery, source.handler.clone()).await
    };
    outcome.map_err(claim_failed)
}

/// The answer to a claim that failed, with its cause for the log: the handler's failure (500),
/// the database's (503).
fn claim_failed(e: ClaimError) -> Failed {
    match e {
        ClaimError::Handler(e) => Failed::because(
            ApiError::ProcessingFailed,
            format_args!("the handler failed: {e:#}"),
        ),
        ClaimError::Database(e) => {
            let error = match crate::db::Failure::of(&e) {
                crate::db::Failure::Unreachable => ApiError::Unavailable,
                failure => ApiError::Database(failure),
            };
            Failed::because(error, format_args!("database error: {e}"))
        }
        ClaimError::TooLate => Failed::because(
            ApiError::Unavailable,
            "the claim was ready to commit only after the request timeout, and was rolled back",
        ),
    }
}

/// The names of the source's forward targets whose `events` patterns match an event of this
/// type (as kept): the claim queues one outbox row for each.
fn targets_for(source: &Source, event_type: Option<&EventType>) -> Vec<String> {
    source
        .forward
        .iter()
        .filter(|t| t.config.wants(event_type.map(EventType::as_str)))
        .map(|t| t.config.name.clone())
        .collect()
}

/// A claim whose handler writes (or whose source dedupes by body): one transaction on a blocking
/// thread with a pooled connection. `answer_by` is when the request is answered 503 if the
/// claim has not finished: a claim on a dead connection is tried again on a fresh one only
/// before then, so a delivery already answered 503 is not stored by a second try behind it.
async fn claim_in_transaction(
    state: &web::Data<AppState>,
    source: Arc<Source>,
    delivery: Delivery,
    answer_by: Instant,
) -> Result<Result<Outcome, ClaimError>, Failed> {
    claim_blocking(state, answer_by, move |conn| {
        inbox::claim(conn, &delivery, source.handler.as_ref())
    })
    .await
}

/// For a scheme whose signature covers a transmission id but not the whole body (PayPal's):
/// binds the delivery's transmission id to its source, event id and body (see
/// [`crate::db::transmissions`]), or refuses it (401 `invalid_signature`) when the id is bound
/// to another: another body under a genuine delivery's headers (forged to its checksum,
/// whatever event id it names), or a genuine delivery sent to another source. Nothing for other
/// schemes.
async fn bind_transmission(
    state: &web::Data<AppState>,
    source: &Arc<Source>,
    headers: &RequestHeaders<'_>,
    (event_id, body, fingerprint): (&str, &[u8], [u8; 32]),
    deadline: tokio::time::Instant,
) -> Result<(), Failed> {
    use sha2::Digest;
    let Some(transmission) = source.provider.transmission_id(headers) else {
        return Ok(());
    };
    let delivery = crate::db::transmissions::Bound {
        source: source.name.as_str().to_owned(),
        event_id: event_id.to_owned(),
        body_sha256: sha2::Sha256::digest(body).to_vec(),
    };
    // An older release's binding (in its event's row) is compared by the payload's
    // `fingerprint`, as that release stored it.
    // Looked for under every source of this scheme, as the new bindings are one per id.
    let alike = source.same_scheme.clone();
    let (transmission, asked) = (transmission.to_owned(), delivery.clone());
    let bound = in_time(state, deadline, move |conn| {
        let older =
            crate::db::transmissions::bound_by_an_older_release(conn, &alike, &transmission)
                .map_err(ClaimError::Database)?;
        match older {
            // Refused without a binding of its own, which would hold the genuine delivery's
            // id to this body.
            Some((source, stored))
                if source != asked.source
                    || stored.event_id != asked.event_id
                    || stored.fingerprint != fingerprint =>
            {
                Ok(crate::db::transmissions::Bound {
                    source,
                    event_id: stored.event_id,
                    body_sha256: Vec::new(),
                })
            }
            _ => crate::db::transmissions::bind(conn, &transmission, &asked, crate::db::now())
                .map_err(ClaimError::Database),
        }
    })
    .await?;
    if bound == delivery {
        return Ok(());
    }
    let other = if bound.source != delivery.source {
        format!("to source {:?}", bound.source)
    } else if bound.event_id != delivery.event_id {
        format!("with event {:?}", bound.event_id)
    } else {
        "with another body of this event".to_owned()
    };
    Err(Failed::because(
        ApiError::InvalidSignature,
        format_args!(
            "the transmission id came before {other}; the signature covers the body only by a checksum, so this is another body (or another source) under a genuine delivery's headers"
        ),
    ))
}

/// [`claim_blocking`] within `deadline`: past it, 503 `unavailable` saying the database did not
/// answer in time (whatever it does afterwards may still commit); a failure as
/// [`claim_failed`] says.
async fn in_time<T: Send + 'static>(
    state: &web::Data<AppState>,
    deadline: tokio::time::Instant,
    work: impl Fn(&mut crate::db::Conn) -> Result<T, ClaimError> + Send + 'static,
) -> Result<T, Failed> {
    tokio::time::timeout_at(deadline, claim_blocking(state, deadline.into_std(), work))
        .await
        .map_err(|_| {
            Failed::because(
                ApiError::Unanswered,
                "the database did not answer within the request timeout",
            )
        })??
        .map_err(claim_failed)
}

/// Runs `claim` on a blocking thread with a pooled connection, and once more on a fresh one
/// when the pooled one turns out dead before anything committed, if that is before
/// `answer_by` (when the request is answered 503 without it).
async fn claim_blocking<T: Send + 'static>(
    state: &web::Data<AppState>,
    answer_by: Instant,
    claim: impl Fn(&mut crate::db::Conn) -> Result<T, ClaimError> + Send + 'static,
) -> Result<Result<T, ClaimError>, Failed> {
    let state = state.clone();
    let result = web::block(move || {
        let checkout = || {
            state.pool.get().map_err(|e| {
                Failed::because(
                    ApiError::Unavailable,
                    format_args!("no database connection: {e}"),
                )
            })
        };
        // A claim that waited past its answer (for a thread, or a connection, behind a
        // database that stalled) is not made: its delivery was answered 503 already, and
        // claimed late it stored an event its provider was told was not taken, minutes after,
        // under the received time it had then (see `inbox::batch`, `still_waited_for`).
        let too_late = || {
            (Instant::now() >= answer_by).then(|| {
                Failed::because(
                    ApiError::Unavailable,
                    "the claim's turn came after the request timeout; it was not made",
                )
            })
        };
        if let Some(late) = too_late() {
            return Err(late);
        }
        let mut conn = checkout()?;
        if let Some(late) = too_late() {
            return Err(late);
        }
        let mut outcome = claim(&mut conn);
        // A pooled connection can have died since its last use (the database restarted).
        // Claiming again on a fresh one is safe whatever the dead one managed to commit: a
        // committed claim comes back as a replay of the same stored bytes.
        if let Err(ClaimError::Database(e)) = &outcome {
            if conn.note(e) && Instant::now() < answer_by {
                drop(conn);
                conn = checkout()?;
                if Instant::now() >= answer_by {
                    return Err(Failed::because(
                        ApiError::Unavailable,
                        "the connection died and no fresh one came before the request timeout",
                    ));
                }
                outcome = claim(&mut conn);
                if let Err(ClaimError::Database(e)) = &outcome {
                    conn.note(e);
                }
            }
        }
        Ok(outcome)
    })
    .await;
    match result {
        Ok(outcome) => outcome,
        Err(_) => Err(Failed::because(
            ApiError::ProcessingFailed,
            "the claim's thread panicked",
        )),
    }
}

/// The stored answer, byte for byte, or where the handler succeeded and the provider expects an
/// answer of its own (Adyen's `[accepted]`), that one; a replay says so in
/// `Idempotent-Replayed`.
fn respond(source: &Source, stored: StoredResponse, replayed: bool) -> HttpResponse {
    let (status, content_type, body) = match source.provider.answer() {
        Some(own) if (200..300).contains(&stored.status) => (
            own.status,
            own.content_type.to_owned(),
            web::Bytes::from(own.body),
        ),
        _ => (stored.status, stored.content_type, stored.body),
    };
    let status = actix_web::http::StatusCode::from_u16(status)
        .unwrap_or(actix_web::http::StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = HttpResponse::build(status);
    response.insert_header((header::CONTENT_TYPE, content_type));
    if replayed {
        response.insert_header(("Idempotent-Replayed", "true"));
    }
    response.body(body)
}

/// A batch's one answer, from its items' answers (in the delivery's order): the first that is
/// not a success, else the first, answered as [`respond`] answers one event.
fn respond_batch(
    source: &Source,
    mut answers: Vec<StoredResponse>,
    replayed: bool,
) -> HttpResponse {
    let chosen = answers
        .iter()
        .position(|stored| !(200..300).contains(&stored.status))
        .unwrap_or(0);
    respond(source, answers.swap_remove(chosen), replayed)
}

/// Reads the body, refusing more than `limit` bytes before reading them where the client
/// announced its length, and as soon as the limit is passed otherwise.
async fn read_body(
    request: &HttpRequest,
    payload: &mut web::Payload,
    limit: usize,
) -> Result<web::Bytes, ApiError> {
    let announced = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|length| length > limit as u64) {
        return Err(ApiError::PayloadTooLarge(limit));
    }
    let mut body =
        web::BytesMut::with_capacity(announced.map_or(8 * 1024, |length| length as usize));
    while let Some(chunk) = payload.next().await {
        // A body of announced length that ends early was cut short (the connection ended). A
        // chunked one is read as a chunked encoding that broke: actix reports a bad chunk and a
        // lost connection alike there.
        let chunk = chunk.map_err(|error| match error {
            PayloadError::Incomplete(_) if announced.is_some() => ApiError::CutShort,
            _ => ApiError::UnreadableBody,
        })?;
        if body.len() + chunk.len() > limit {
            return Err(ApiError::PayloadTooLarge(limit));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// The headers kept with the event: the scheme's and `Content-Type`, lowercase names. A header
/// sent on several lines is kept folded into one, comma-separated (RFC 9110 5.3), so a replay
/// carries every value. A value in UTF-8 is kept as it came, letters beyond ASCII included (an
/// event id `café_1` the event is stored under); one that is not UTF-8 cannot be kept as text,
/// and is left out.
fn kept_headers(source: &Source, headers: &HeaderMap) -> serde_json::Value {
    let kept = source
        .kept_headers
        .iter()
        .filter_map(|name| {
            let values = headers
                .get_all(name.as_str())
                .map(|value| std::str::from_utf8(value.as_bytes()).ok())
                .collect::<Option<Vec<&str>>>()?;
            (!values.is_empty())
                .then(|| (name.clone(), serde_json::Value::String(values.join(", "))))
        })
        .collect();
    serde_json::Value::Object(kept)
}

/// The answer to a request `provider` refused: [`refused`], with the provider's own status for
/// it where it asks for one (GoCardless's `498`). Public so the vector tests judge a refusal as
/// the server answers it.
pub fn refused_by(provider: &dyn Provider, refusal: Refusal) -> ApiError {
    let error = refused(refusal);
    match provider
        .refusal_status(refusal)
        .and_then(|status| actix_web::http::StatusCode::from_u16(status).ok())
    {
        Some(status) => ApiError::ProviderStatus {
            error: Box::new(error),
            status,
        },
        None => error,
    }
}

/// The answer to a refused request: the one mapping from a [`Refusal`] to the contract's status
/// and error code.
pub fn refused(refusal: Refusal) -> ApiError {
    match refusal {
        Refusal::Signature(
            SignatureError::Invalid
            | SignatureError::Credentials(_)
            | SignatureError::Untrusted(_),
        ) => ApiError::InvalidSignature,
        Refusal::Signature(SignatureError::Stale) => ApiError::StaleTimestamp,
        Refusal::MalformedPayload => ApiError::MalformedPayload,
        Refusal::MissingEventId => ApiError::MissingEventId,
        Refusal::Unavailable => ApiError::NotFetched(
            "the provider's certificate the signature check needs could not be fetched; nothing was stored, retry later",
        ),
        Refusal::Forbidden(why) => ApiError::Forbidden(why),
        Refusal::Malformed(why) => ApiError::Malformed(why),
    }
}

/// A handshake's answer, as the provider expects it; nothing is stored.
fn handshake(answer: Answer) -> HttpResponse {
    let status = actix_web::http::StatusCode::from_u16(answer.status)
        .unwrap_or(actix_web::http::StatusCode::OK);
    HttpResponse::build(status)
        .insert_header((header::CONTENT_TYPE, answer.content_type))
        // An echoed challenge is the client's text: never read as another type than it says.
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .body(answer.body)
}
