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
use crate::http::{with_db, ApiError};
use crate::state::AppState;

const DEFAULT_LIMIT: i64 = 100;
const MAX_LIMIT: i64 = 1000;

/// `GET /admin/events` query.
#[derive(Deserialize)]
pub struct ListQuery {
    source: Option<String>,
    since: Option<String>,
    limit: Option<i64>,
}

/// Parses `since`: an RFC 3339 time, or a duration meaning that long ago.
fn parse_since(text: &str) -> Result<DateTime<Utc>, ApiError> {
    parse_time_or_ago(text, Utc::now()).map_err(|e| ApiError::InvalidQuery(format!("since: {e}")))
}

/// `GET /admin/events?source=&since=&limit=`: newest first.
pub async fn list_events(
    state: web::Data<AppState>,
    query: web::Query<ListQuery>,
    _: Admin<Bearer>,
) -> Result<HttpResponse, ApiError> {
    let query = query.into_inner();
    let since = query.since.as_deref().map(parse_since).transpose()?;
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::InvalidQuery(format!(
            "limit must be between 1 and {MAX_LIMIT}"
        )));
    }
    let rows = with_db(&state, "admin query", move |conn| {
        db::events::recent(conn, query.source.as_deref(), since, limit)
    })
    .await?;
    let events: Vec<_> = rows
        .into_iter()
        .map(|(source, event_id, event_type, received_at, status)| {
            serde_json::json!({
                "source": source,
                "event_id": event_id,
                "event_type": event_type,
                "received_at": received_at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                "status": status,
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(serde_json::json!({ "events": events })))
}

/// `GET /admin/events/{source}/{event_id}`: the stored event and its stored answer.
pub async fn get_event(
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    _: Admin<Bearer>,
) -> Result<HttpResponse, ApiError> {
    let (source, event_id) = path.into_inner();
    let stored = with_db(&state, "admin query", {
        let (source, event_id) = (source.clone(), event_id.clone());
        move |conn| db::events::find(conn, &source, &event_id)
    })
    .await?
    .ok_or(ApiError::NotFound)?;
    let mut event = serde_json::json!({
        "source": source,
        "event_id": event_id,
        "event_type": stored.event_type,
        "received_at": stored.received_at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        "headers": stored.headers,
        "status": stored.status,
        "content_type": stored.content_type,
    });
    let fields = event.as_object_mut().expect("built as an object above");
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
) -> Result<HttpResponse, ApiError> {
    let (source, event_id) = path.into_inner();
    let found = with_db(&state, "admin query", move |conn| {
        deliveries_of(conn, &source, &event_id)
    })
    .await?;
    let deliveries = found.ok_or(ApiError::NotFound)?;
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

/// `POST /admin/deliveries/{id}/requeue`: a dead delivery becomes pending again, due now.
pub async fn requeue_delivery(
    state: web::Data<AppState>,
    path: web::Path<i64>,
    _: Admin<Bearer>,
) -> Result<HttpResponse, ApiError> {
    match requeue(&state, path.into_inner(), "the admin API").await? {
        None => Err(ApiError::NotFound),
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
    let result = with_db(state, "requeue", move |conn| deliveries::requeue(conn, id)).await?;
    if let Some(Ok(_)) = &result {
        tracing::info!(delivery = id, "dead delivery re-queued by {by}");
        state.forward.queued();
    }
    Ok(result)
}
