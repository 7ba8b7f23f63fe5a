//! The admin API: stored events, behind a bearer token ([`Admin<Bearer>`]). Off (404) while no
//! token is set.

use actix_web::{web, HttpResponse};
use base64::Engine;
use chrono::{DateTime, Utc};
use diesel::QueryResult;
use serde::Deserialize;

use crate::config::parse_time_or_ago;
use crate::db::deliveries::{self, DeliveryView};
use crate::db::{self, AnyConnection};
use crate::http::auth::{Admin, Bearer};
use crate::http::{read_db, with_db, ApiError};
use crate::state::AppState;

/// A POST route's empty body. The admin API's POST routes take what they act on in the path
/// and the query string only; a request with a body is refused (400 `invalid_query`) rather
/// than served, since filters sent as JSON or a form would be ignored and a bulk requeue would
/// widen to every dead delivery.
pub struct NoBody;

impl actix_web::FromRequest for NoBody {
    type Error = ApiError;
    type Future = futures_util::future::LocalBoxFuture<'static, Result<Self, ApiError>>;

    /// Reads what body there is, and refuses any byte of one: a client may send an empty body
    /// chunked (`Transfer-Encoding: chunked` and no chunk), which is no body.
    /// Within `[server].request_timeout`, as a delivery's body: a body announced and never
    /// sent is 408, not a connection held for ever.
    fn from_request(
        request: &actix_web::HttpRequest,
        payload: &mut actix_web::dev::Payload,
    ) -> Self::Future {
        use futures_util::StreamExt;
        let within = crate::http::body_timeout(request);
        let mut payload = payload.take();
        Box::pin(async move {
            let read = async {
                while let Some(chunk) = payload.next().await {
                    if !matches!(chunk, Ok(bytes) if bytes.is_empty()) {
                        return Err(ApiError::InvalidQuery(
                            "this endpoint takes no body: give its parameters in the path and \
                             the query string; nothing was done"
                                .to_owned(),
                        ));
                    }
                }
                Ok(NoBody)
            };
            tokio::time::timeout(within, read)
                .await
                .unwrap_or(Err(ApiError::RequestTimeout))
        })
    }
}

const DEFAULT_LIMIT: i64 = 100;
const MAX_LIMIT: i64 = 1000;

/// `GET /admin/events` query. A parameter it does not take is refused, not ignored: a list
/// that silently skipped `until=` or a misspelt `soruce=` would look filtered and not be.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    source: Option<String>,
    since: Option<String>,
    limit: Option<String>,
    /// The `next_before` of the page before: the events listed after it.
    before: Option<String>,
}

/// Parses `since`: an RFC 3339 time, or a duration meaning that long ago.
fn parse_since(text: &str) -> Result<DateTime<Utc>, ApiError> {
    parse_time_or_ago(text, db::now()).map_err(|e| ApiError::InvalidQuery(format!("since: {e}")))
}

/// A query value as a filter: an empty one (`?source=&since=`, as the routes are written) is
/// the same as none.
fn given(value: Option<String>) -> Option<String> {
    // Empty only: a value of spaces is a value (a filter of spaces matched nothing, yet was
    // taken as no filter: a bulk requeue of ` ` re-queued every target's, found by a
    // black-box run).
    value.filter(|v| !v.is_empty())
}

/// The 404 of an admin route naming an event: which one is not stored, and where to look.
fn no_event(source: &str, event_id: &str) -> ApiError {
    ApiError::NotStored(format!(
        "no event {event_id:?} of source {source:?} is stored (never received, or purged; \
         GET /admin/events?source={source} lists what is)"
    ))
}

/// `GET /admin/events?source=&since=&limit=[&before=]`: newest first, with `next_before`
/// naming where the next page starts (`null` on the last page).
pub async fn list_events(
    state: web::Data<AppState>,
    _: Admin<Bearer>,
    query: web::Query<ListQuery>,
) -> Result<HttpResponse, ApiError> {
    let query = query.into_inner();
    let since = given(query.since).as_deref().map(parse_since).transpose()?;
    let limit = match given(query.limit) {
        None => DEFAULT_LIMIT,
        Some(text) => text.trim().parse().unwrap_or(0),
    };
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::InvalidQuery(format!(
            "limit must be between 1 and {MAX_LIMIT}"
        )));
    }
    let before = match given(query.before) {
        None => None,
        Some(text) => Some(db::events::parse_cursor(&text).ok_or_else(|| {
            ApiError::InvalidQuery(
                "before: not a next_before this API gave; leave it out to start from the newest"
                    .to_owned(),
            )
        })?),
    };
    let filter = db::events::Filter {
        source: given(query.source),
        since,
        before,
        ..Default::default()
    };
    // One more than asked, to tell whether there is a next page.
    let mut rows = read_db(&state, "admin query", move |conn| {
        db::events::page(conn, filter.clone(), limit + 1)
    })
    .await?;
    let more = rows.len() as i64 > limit;
    rows.truncate(usize::try_from(limit).expect("limit checked positive above"));
    let next_before = rows
        .last()
        .filter(|_| more)
        .map(|(row, _, _, _, received_at, _, _)| db::events::cursor(*received_at, *row));
    let events: Vec<_> = rows
        .into_iter()
        .map(
            |(_, source, event_id, event_type, received_at, status, _)| {
                serde_json::json!({
                    "source": source,
                    "event_id": event_id,
                    "event_type": event_type,
                    "received_at": db::shown_time(received_at),
                    "status": status,
                })
            },
        )
        .collect();
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "events": events,
        "next_before": next_before,
    })))
}

/// `GET /admin/events/{source}/{event_id}`: the stored event and its stored answer.
pub async fn get_event(
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    _: Admin<Bearer>,
    _: web::Query<NoQuery>,
) -> Result<HttpResponse, ApiError> {
    let (source, event_id) = path.into_inner();
    let stored = read_db(&state, "admin query", {
        let (source, event_id) = (source.clone(), event_id.clone());
        move |conn| db::events::find(conn, &source, &event_id)
    })
    .await?
    .ok_or_else(|| no_event(&source, &event_id))?;
    let mut event = serde_json::json!({
        "source": source,
        "event_id": event_id,
        "event_type": stored.event_type,
        "received_at": db::shown_time(stored.received_at),
        "headers": stored.headers,
        "status": stored.status,
        "content_type": stored.content_type,
    });
    let fields = event.as_object_mut().expect("built as an object above");
    let answered = state
        .sources
        .get(&source)
        .and_then(|configured| configured.answered_instead(stored.status));
    if let Some(answered) = answered {
        let mut answer = serde_json::Map::new();
        answer.insert("status".to_owned(), answered.status.into());
        answer.insert("content_type".to_owned(), answered.content_type.into());
        put_bytes(&mut answer, "body", answered.body);
        fields.insert("answered".to_owned(), answer.into());
    }
    put_bytes(fields, "payload", stored.payload);
    put_bytes(fields, "body", stored.body.unwrap_or_default());
    Ok(HttpResponse::Ok().json(event))
}

/// Bytes as a string under `name`, or as base64 under `name_base64` when they are not UTF-8.
fn put_bytes(fields: &mut serde_json::Map<String, serde_json::Value>, name: &str, bytes: Vec<u8>) {
    match String::from_utf8(bytes) {
        Ok(text) => fields.insert(name.to_owned(), text.into()),
        Err(e) => fields.insert(
            format!("{name}_base64"),
            base64::engine::general_purpose::STANDARD
                .encode(e.into_bytes())
                .into(),
        ),
    };
}

/// `GET /admin/events/{source}/{event_id}/deliveries`: the event's forward deliveries.
pub async fn event_deliveries(
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    _: Admin<Bearer>,
    _: web::Query<NoQuery>,
) -> Result<HttpResponse, ApiError> {
    let (source, event_id) = path.into_inner();
    let missing = no_event(&source, &event_id);
    let found = read_db(&state, "admin query", move |conn| {
        deliveries_of(conn, &source, &event_id)
    })
    .await?;
    let deliveries = found.ok_or(missing)?;
    Ok(HttpResponse::Ok().json(serde_json::json!({ "deliveries": deliveries })))
}

/// The forward deliveries of a stored event; `None` when no such event is stored.
pub(super) fn deliveries_of(
    conn: &mut AnyConnection,
    source: &str,
    event_id: &str,
) -> QueryResult<Option<Vec<DeliveryView>>> {
    db::events::row_of(conn, source, event_id)?
        .map(|row| deliveries::of_event(conn, row))
        .transpose()
}

/// `POST /admin/events/{source}/{event_id}/redeliver` query; nothing else is taken.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedeliverQuery {
    target: Option<String>,
}

/// `POST /admin/events/{source}/{event_id}/redeliver[?target=NAME]`: a new attempt series for
/// each delivered or dead delivery of the event (to one target, if named), with the same key.
/// 202 `{"requeued": N}`; 404 when no such event is stored.
pub async fn redeliver_event(
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    _: Admin<Bearer>,
    _: NoBody,
    query: web::Query<RedeliverQuery>,
) -> Result<HttpResponse, ApiError> {
    let (source, event_id) = path.into_inner();
    let missing = no_event(&source, &event_id);
    // An empty `target=` (a script's unset variable) would widen a redeliver to one target to
    // every target: refused, as a misspelt parameter is.
    let target = match query.into_inner().target {
        Some(name) if name.trim().is_empty() => {
            return Err(ApiError::InvalidQuery(
                "target= is empty: give a target's name, or leave target out to redeliver to \
                 every target of the event"
                    .to_owned(),
            ))
        }
        target => target,
    };
    let requeued = redeliver(&state, source, event_id, target, "the admin API")
        .await?
        .ok_or(missing)?;
    Ok(HttpResponse::Accepted().json(serde_json::json!({ "requeued": requeued })))
}

/// Re-queues the stored event's delivered and dead deliveries to the source's configured
/// targets (to `target` only, if given) and wakes the dispatcher. `None`: no such event. `by`
/// names who asked, for the log.
///
/// # Errors
/// [`ApiError::UnknownTarget`] for a `target` the source's config does not have: a delivery
/// re-queued to it would wait for a target no instance sends to. A delivery to a target since
/// removed is left as it is for the same reason.
pub(super) async fn redeliver(
    state: &web::Data<AppState>,
    source: String,
    event_id: String,
    target: Option<String>,
    by: &'static str,
) -> Result<Option<usize>, ApiError> {
    let configured: Vec<String> = state
        .sources
        .get(source.as_str())
        .map(|s| s.forward.iter().map(|t| t.config.name.clone()).collect())
        .unwrap_or_default();
    let targets = match &target {
        Some(name) if !configured.contains(name) => {
            return Err(ApiError::UnknownTarget(if configured.is_empty() {
                format!("source {source:?} forwards to no target in the config")
            } else {
                format!(
                    "source {source:?} has no forward target {name:?} in the config (its \
                     targets: {})",
                    configured.join(", ")
                )
            }))
        }
        Some(name) => vec![name.clone()],
        None => configured,
    };
    let (logged_source, logged_id, logged_target) =
        (source.clone(), event_id.clone(), target.clone());
    let found = with_db(state, "redeliver", move |conn| {
        let Some(row) = db::events::row_of(conn, &source, &event_id)? else {
            return Ok(None);
        };
        let rows: Vec<i64> = deliveries::of_event(conn, row)?
            .iter()
            .map(|d| d.id)
            .collect();
        Ok(Some((row, rows)))
    })
    .await?;
    let Some((row, rows)) = found else {
        return Ok(None);
    };
    // An attempt of the event that just ended is delivered or dead once its outcome is
    // written; an attempt of another event is not waited for.
    state.forward.outcomes_written(Some(&rows)).await;
    let requeued = with_db(state, "redeliver", move |conn| {
        deliveries::redeliver(conn, row, &targets).map(Some)
    })
    .await?;
    if let Some(n) = requeued.filter(|n| *n > 0) {
        tracing::info!(
            source = %logged_source,
            event.id = %crate::ids::ClientText::new(&logged_id, usize::MAX),
            target = logged_target.as_deref().unwrap_or("*"),
            requeued = n,
            "event redelivered by {by}"
        );
        state.forward.queued();
    }
    Ok(requeued)
}

/// `POST /admin/deliveries/requeue` query. A misspelt filter is refused: ignored, it would
/// widen the requeue to every dead delivery.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequeueQuery {
    source: Option<String>,
    target: Option<String>,
    since: Option<String>,
}

/// `POST /admin/deliveries/requeue?source=&target=&since=`: every dead delivery that matches
/// (of that source's events, to targets of that name, queued since then; each only if given)
/// becomes pending again. 202 `{"requeued": N}`.
pub async fn requeue_dead(
    state: web::Data<AppState>,
    _: Admin<Bearer>,
    _: NoBody,
    query: web::Query<RequeueQuery>,
) -> Result<HttpResponse, ApiError> {
    let query = query.into_inner();
    let (source, target, since_text) =
        (given(query.source), given(query.target), given(query.since));
    let since = since_text.as_deref().map(parse_since).transpose()?;
    let requeued = requeue_all_dead(
        &state,
        source,
        target,
        since.map(|since| (since, since_text.unwrap_or_default())),
        "the admin API",
    )
    .await?;
    Ok(HttpResponse::Accepted().json(serde_json::json!({ "requeued": requeued })))
}

/// Every dead delivery that matches (of `source`'s events, to targets named `target`, queued
/// since then; each only if given) becomes pending again, logged as done `by` (the admin API,
/// the console). Returns how many.
pub(crate) async fn requeue_all_dead(
    state: &web::Data<AppState>,
    source: Option<String>,
    target: Option<String>,
    since: Option<(DateTime<Utc>, String)>,
    by: &'static str,
) -> Result<usize, ApiError> {
    let configured: std::collections::HashSet<(String, String)> =
        state.forward_targets().into_keys().collect();
    // A target no source (or not the one named) has in the config: as for a redeliver, 404
    // rather than a count of rows no instance would send.
    if let Some(name) = &target {
        let known = configured
            .iter()
            .any(|(s, t)| t == name && source.as_ref().is_none_or(|source| source == s));
        if !known {
            let whose = match &source {
                Some(s) if !state.sources.contains_key(s.as_str()) => {
                    format!(" (no source {s:?} is either)")
                }
                Some(s) => format!(" for source {s:?}"),
                None => String::new(),
            };
            return Err(ApiError::UnknownTarget(format!(
                "no forward target {name:?} is in the config{whose}: its dead deliveries stay \
                 dead, as no instance would send them"
            )));
        }
    }
    let (logged_source, logged_target) = (source.clone(), target.clone());
    let logged_since = since.as_ref().map(|(_, text)| text.clone());
    let since = since.map(|(since, _)| since);
    // An attempt that just ended is dead once its outcome is written.
    state.forward.outcomes_written(None).await;
    let requeued = with_db(state, "bulk requeue", move |conn| {
        let configured = |source: &str, target: &str| {
            configured.contains(&(source.to_owned(), target.to_owned()))
        };
        deliveries::requeue_dead(
            conn,
            source.as_deref(),
            target.as_deref(),
            since,
            &configured,
        )
    })
    .await?;
    tracing::info!(
        source = logged_source.as_deref().unwrap_or("*"),
        target = logged_target.as_deref().unwrap_or("*"),
        since = logged_since.as_deref().unwrap_or("-"),
        requeued,
        "dead deliveries re-queued by {by}"
    );
    if requeued > 0 {
        state.forward.queued();
    }
    Ok(requeued)
}

/// The query of a route that takes none: a parameter is refused (400 `invalid_query`), as on
/// the routes that take some, rather than ignored.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoQuery {}

/// `POST /admin/deliveries/{id}/requeue`: a dead delivery becomes pending again, due now. An
/// id that is not a delivery's number is a delivery that does not exist: 404, after the token
/// is checked like on every admin route.
pub async fn requeue_delivery(
    state: web::Data<AppState>,
    path: web::Path<String>,
    _: Admin<Bearer>,
    _: NoBody,
    _: web::Query<NoQuery>,
) -> Result<HttpResponse, ApiError> {
    let text = path.into_inner();
    let missing = || {
        ApiError::NotStored(format!("no delivery {text:?} is stored (a delivery's id is the number the deliveries list shows)"))
    };
    let id: i64 = text.parse().map_err(|_| missing())?;
    match requeue(&state, id, "the admin API").await? {
        None => Err(missing()),
        Some(Err(state)) => Err(ApiError::NotDead(state)),
        Some(Ok(delivery)) => Ok(HttpResponse::Ok().json(delivery)),
    }
}

/// Makes dead delivery `id` pending again and wakes the dispatcher. `None`: no such delivery;
/// `Some(Err(state))`: it is not dead. `by` names who asked, for the log.
pub(super) async fn requeue(
    state: &web::Data<AppState>,
    id: i64,
    by: &'static str,
) -> Result<Option<Result<DeliveryView, String>>, ApiError> {
    // A delivery to a target since removed from the config stays dead: no instance would
    // send it.
    let lane = with_db(state, "requeue", move |conn| deliveries::lane_of(conn, id)).await?;
    if let Some((source, target)) = lane {
        if !state
            .forward_targets()
            .contains_key(&(source.clone(), target.clone()))
        {
            return Err(ApiError::UnknownTarget(format!(
                "delivery {id} is to forward target {target:?} of source {source:?}, which is \
                 not in the config any more: no instance would send it, so it stays dead"
            )));
        }
    }
    // An attempt that just ended is dead once its outcome is written.
    state.forward.outcomes_written(Some(&[id])).await;
    let result = with_db(state, "requeue", move |conn| deliveries::requeue(conn, id)).await?;
    if let Some(Ok(_)) = &result {
        tracing::info!(delivery = id, "dead delivery re-queued by {by}");
        state.forward.queued();
    }
    Ok(result)
}
