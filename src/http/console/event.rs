//! `GET /console/event?source=&id=`: one stored event whole (kept headers, body, stored
//! response, forward deliveries per target), `POST /console/deliveries/{id}/requeue` and
//! `POST /console/events/redeliver`.

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use diesel::prelude::*;
use serde::Deserialize;

use maud::{html, Markup};

use super::html::{link, page, redirect, respond, show_body, time, visible, visible_lines};
use super::{check_csrf, check_fields, field, message, FormBody, NoQuery, Refused, Session};
use crate::db::deliveries::DeliveryView;
use crate::db::events::{self, StoredEvent};
use crate::db::AnyConnection;
use crate::http::admin;
use crate::http::auth::Admin;
use crate::http::read_db;
use crate::state::AppState;

/// `GET /console/event` query: which event, and the outcome of a re-queue just made.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Which {
    #[serde(default)]
    source: String,
    #[serde(default)]
    id: String,
    notice: Option<String>,
    delivery: Option<i64>,
    /// After a redeliver: how many deliveries were re-queued.
    count: Option<usize>,
    /// The session's seal over the outcome (see [`outcome_link`]): without it, no notice.
    #[serde(default)]
    seal: String,
}

/// The event page's address with a form's outcome on it, sealed by the session so that only
/// the form's own redirect shows it.
fn outcome_link(
    session: &Session,
    source: &str,
    event_id: &str,
    notice: &str,
    delivery: &str,
    count: &str,
) -> String {
    let seal = session.seal(&[source, event_id, notice, delivery, count]);
    link(
        "/console/event",
        &[
            ("source", source),
            ("id", event_id),
            ("notice", notice),
            ("delivery", delivery),
            ("count", count),
            ("seal", &seal),
        ],
    )
}

fn load(
    conn: &mut AnyConnection,
    source: &str,
    event_id: &str,
) -> QueryResult<Option<(StoredEvent, Vec<DeliveryView>)>> {
    let Some(stored) = events::find(conn, source, event_id)? else {
        return Ok(None);
    };
    let deliveries = admin::deliveries_of(conn, source, event_id)?.unwrap_or_default();
    Ok(Some((stored, deliveries)))
}

/// A body in a `<pre>`, with what it is and its size.
fn body_block(id: &str, bytes: &[u8]) -> Markup {
    let shown = show_body(bytes);
    html! {
        p class="muted" {
            (bytes.len()) " byte" @if bytes.len() != 1 { "s" }
            @if let Some(note) = shown.note { ", " (note) }
        }
        pre id=(id) { (visible_lines(&shown.text)) }
    }
}

fn notice(which: &Which, session: &Session) -> Option<(bool, String)> {
    let text = |n: Option<String>| n.unwrap_or_default();
    let parts = [
        which.source.as_str(),
        which.id.as_str(),
        which.notice.as_deref()?,
        &text(which.delivery.map(|d| d.to_string())),
        &text(which.count.map(|c| c.to_string())),
    ];
    if !session.sealed(&parts, &which.seal) {
        return None;
    }
    if which.notice.as_deref() == Some("unavailable") {
        return Some((
            false,
            "The database did not answer; nothing was re-queued.".to_owned(),
        ));
    }
    if which.notice.as_deref() == Some("full") {
        return Some((
            false,
            "The database's disk is full; nothing was re-queued. Free space on its disk, then \
             try again."
                .to_owned(),
        ));
    }
    if which.notice.as_deref() == Some("refused") {
        return Some((
            false,
            "The database refused the write (a read-only file or role, or a failing or damaged \
             store: the log says which); nothing was re-queued."
                .to_owned(),
        ));
    }
    if which.notice.as_deref() == Some("unanswered") {
        // Asked, but not answered in time: it may yet be done, and a second click would
        // send the event again.
        return Some((
            false,
            "The database did not answer in time; the re-queue may still be made once it \
             does. Reload this page in a moment and check the deliveries before trying again."
                .to_owned(),
        ));
    }
    if which.notice.as_deref() == Some("busy") {
        return Some((
            false,
            "The store was busy with another write (another process or session holds its \
             lock); nothing was re-queued. Try again in a moment."
                .to_owned(),
        ));
    }
    if which.notice.as_deref() == Some("no_target") {
        return Some((
            false,
            "Nothing was re-queued: that target is not in this source's config (removed, or \
             never there), and no instance would send to it."
                .to_owned(),
        ));
    }
    if which.notice.as_deref() == Some("redelivered") {
        let count = which.count?;
        return Some(match count {
            0 => (
                false,
                "Nothing was re-queued: no delivery is delivered or dead (pending ones are \
                 under way)."
                    .to_owned(),
            ),
            1 => (
                true,
                "1 delivery is re-queued: a new attempt series, due now, with the same key."
                    .to_owned(),
            ),
            n => (
                true,
                format!("{n} deliveries are re-queued: a new attempt series each, due now, with the same key."),
            ),
        });
    }
    let delivery = which.delivery?;
    let (ok, text) = match which.notice.as_deref()? {
        "requeued" => (
            true,
            format!("Delivery {delivery} is re-queued: pending again and due now."),
        ),
        "not_dead" => (
            false,
            format!("Delivery {delivery} is not dead, so it was not re-queued."),
        ),
        "no_delivery" => (false, format!("There is no delivery {delivery}.")),
        _ => return None,
    };
    Some((ok, text))
}

fn deliveries_table(
    csrf: &str,
    source: &str,
    event_id: &str,
    deliveries: &[DeliveryView],
    configured: &[&str],
) -> Markup {
    let when = |at: Option<DateTime<Utc>>| at.map_or_else(String::new, time);
    html! {
        table id="deliveries" {
            thead {
                tr {
                    th { "Delivery" } th { "Target" } th { "State" } th class="num" { "Attempts" }
                    th class="num" { "Last status" } th { "Last error" } th { "Queued" }
                    th { "Next attempt" } th { "Delivered" } th {}
                }
            }
            tbody {
                @for d in deliveries {
                    tr id={ "delivery-" (d.id) } {
                        td { (d.id) }
                        td class="target" { (d.target) }
                        td class={ "state " (d.state) } { (d.state) }
                        td class="num" { (d.attempts) }
                        td class="num" { @if let Some(status) = d.last_status { (status) } }
                        td { (visible_lines(d.last_error.as_deref().unwrap_or(""))) }
                        td { (time(d.created_at)) }
                        td {
                            @if d.attempt_under_way {
                                span class="under-way" { "under way" }
                            } @else {
                                (when(d.next_attempt_at))
                            }
                        }
                        td { (when(d.delivered_at)) }
                        td {
                            @if !configured.contains(&d.target.as_str()) {
                                // Its buttons could only be refused: no instance sends to a
                                // target the config no longer names.
                                span class="muted gone" { "target not configured" }
                            } @else if d.state == "dead" {
                                form method="post" action={ "/console/deliveries/" (d.id) "/requeue" } {
                                    input type="hidden" name="csrf" value=(csrf);
                                    input type="hidden" name="source" value=(source);
                                    input type="hidden" name="event_id" value=(event_id);
                                    button type="submit" class="requeue" id={ "requeue-" (d.id) } {
                                        "Re-queue"
                                    }
                                }
                            }
                            @if configured.contains(&d.target.as_str())
                                && (d.state == "delivered" || d.state == "dead")
                            {
                                (redeliver_form(csrf, source, event_id, Some(&d.target)))
                            }
                        }
                    }
                }
            }
        }
    }
}

/// A form that redelivers the event: to `target`, or to every target when `None`.
fn redeliver_form(csrf: &str, source: &str, event_id: &str, target: Option<&str>) -> Markup {
    let id = match target {
        // Apart from the every-target button's, whatever the target is named (`all`).
        Some(target) => format!("redeliver-to-{target}"),
        None => "redeliver-all".to_owned(),
    };
    html! {
        form method="post" action="/console/events/redeliver" {
            input type="hidden" name="csrf" value=(csrf);
            input type="hidden" name="source" value=(source);
            input type="hidden" name="event_id" value=(event_id);
            @if let Some(target) = target {
                input type="hidden" name="target" value=(target);
            }
            button type="submit" class="redeliver" id=(id) {
                @if target.is_some() { "Redeliver" } @else { "Redeliver to every target" }
            }
        }
    }
}

/// The kept headers, name and value; a value that is not a string is shown as JSON, and a
/// signature only by its first characters (see [`shown_header`]).
fn headers_table(headers: &serde_json::Value) -> Markup {
    let rows: Vec<(&String, String)> = headers
        .as_object()
        .map(|headers| {
            headers
                .iter()
                .map(|(name, value)| {
                    let value = value
                        .as_str()
                        .map_or_else(|| value.to_string(), str::to_owned);
                    (name, shown_header(name, visible_lines(&value)))
                })
                .collect()
        })
        .unwrap_or_default();
    html! {
        table id="headers" {
            tbody {
                @for (name, value) in &rows {
                    tr { th { code { (name) } } td { code { (value) } } }
                }
            }
        }
    }
}

/// A kept header's value as the page shows it. A signature is cut to its first 8 characters: a
/// page is read over shoulders and in screenshots, and with a scheme that signs no timestamp
/// (GitHub's, Shopify's) the body and its signature are enough to post the event again under a
/// new delivery id. `hookbox export` and the admin API keep the whole value, for `replay`.
fn shown_header(name: &str, value: String) -> String {
    let name = name.to_ascii_lowercase();
    let signature = name.contains("signature") || name.contains("hmac") || name.ends_with("-sig");
    if !signature || value.chars().count() <= 8 {
        return value;
    }
    let start: String = value.chars().take(8).collect();
    format!("{start}… (signature hidden; hookbox export has it whole)")
}

/// `GET /console/event?source=&id=`.
pub async fn show(
    state: web::Data<AppState>,
    which: web::Query<Which>,
    Admin(session): Admin<Session>,
) -> Result<HttpResponse, Refused> {
    let which = which.into_inner();
    let (source, event_id) = (which.source.clone(), which.id.clone());
    let found = read_db(&state, "console event", move |conn| {
        load(conn, &source, &event_id)
    })
    .await?;
    let Some((stored, deliveries)) = found else {
        return Ok(message(
            StatusCode::NOT_FOUND,
            "No such event",
            &format!(
                "No event {:?} from source {:?} is stored (it may have been purged).",
                which.id, which.source
            ),
        ));
    };

    let replays = stored.replays as u64
        + state
            .replay_counts
            .unflushed_replays(&which.source, &which.id);
    let status = stored.status.map_or_else(String::new, |s| s.to_string());
    let configured = state.sources.get(&which.source);
    let answered = configured.and_then(|configured| configured.answered_instead(stored.status));
    let targets: Vec<&str> = configured.map_or_else(Vec::new, |configured| {
        configured
            .forward
            .iter()
            .map(|target| target.config.name.as_str())
            .collect()
    });
    // Why no delivery is listed: a source that forwards queues none for an event no target's
    // `events` patterns match, which "does not forward" misnamed.
    let none = match configured {
        None => "None: this event's source is not in the config.",
        Some(_) if targets.is_empty() => "None: this event's source does not forward.",
        Some(configured)
            if configured
                .forward
                .iter()
                .any(|target| target.config.wants(stored.event_type.as_deref())) =>
        {
            // A target added since is sent the events stored after it, not this one (a
            // black-box run: "no target takes events of this type" was false here).
            "None: it was stored before this source forwarded events of its type to a target \
             (a target added later is sent the events stored after it)."
        }
        Some(_) => {
            "None: no target of this source takes events of this type (its events patterns)."
        }
    };
    let main = html! {
        @if let Some((ok, text)) = notice(&which, &session) {
            p class=(if ok { "notice" } else { "error" }) id="notice" { (text) }
        }
        h1 id="event-id" { (visible(&which.id)) }
        dl class="facts" {
            dt { "Source" } dd { (which.source) }
            dt { "Type" } dd id="event-type" { (visible(stored.event_type.as_deref().unwrap_or(""))) }
            dt { "Received" } dd { (time(stored.received_at)) }
            dt { "Stored status" } dd id="stored-status" { (status) }
            dt { "Replays" } dd id="replays" { (replays) }
        }
        p {
            a href=(link("/console/events", &[("source", &which.source)])) {
                "Other events from " (which.source)
            }
        }
        h2 { "Kept headers" }
        (headers_table(&stored.headers))
        h2 { "Body" }
        (body_block("payload", &stored.payload))
        h2 { "Stored response" }
        p {
            "Status " b { (status) } ", " code { (stored.content_type.as_deref().unwrap_or("")) }
        }
        (body_block("response", stored.body.as_deref().unwrap_or_default()))
        @if let Some(answered) = &answered {
            p id="answered" {
                "The provider was answered with its own reply, not this one: status "
                b { (answered.status) } ", " code { (answered.content_type) } ", "
                code { (visible(&String::from_utf8_lossy(&answered.body))) }
                " (each delivery and redelivery of it alike)."
            }
        }
        h2 { "Forward deliveries" }
        @if deliveries.is_empty() {
            p class="muted" id="no-deliveries" { (none) }
        } @else {
            (deliveries_table(session.csrf(), &which.source, &which.id, &deliveries, &targets))
            @if deliveries
                .iter()
                .any(|d| d.state != "pending" && targets.contains(&d.target.as_str()))
            {
                (redeliver_form(session.csrf(), &which.source, &which.id, None))
            }
            p class="muted" {
                "One delivery per target whose event patterns match. The outbox keeps each \
                 delivery's latest attempt: its status, error and the attempts made so far. \
                 Redeliver sends a delivered or dead delivery again, as a new attempt series \
                 with the same Idempotency-Key."
            }
        }
    };
    Ok(respond(
        StatusCode::OK,
        page(&visible(&which.id), Some(&session), main),
    ))
}

/// `POST /console/deliveries/{id}/requeue` with `csrf`, `source` and `event_id`: re-queues a
/// dead delivery, then back to its event's page with the outcome.
pub async fn requeue(
    state: web::Data<AppState>,
    path: web::Path<i64>,
    FormBody(body): FormBody,
    Admin(session): Admin<Session>,
    _: web::Query<NoQuery>,
) -> Result<HttpResponse, Refused> {
    check_csrf(&session, &body)?;
    check_fields(&body, &["csrf", "source", "event_id"])?;
    let id = path.into_inner();
    let outcome = match admin::requeue(&state, id, "the console").await {
        Ok(Some(Ok(_))) => "requeued",
        Ok(Some(Err(_))) => "not_dead",
        Ok(None) => "no_delivery",
        Err(crate::http::ApiError::UnknownTarget(_)) => "no_target",
        Err(crate::http::ApiError::Busy) => "busy",
        Err(crate::http::ApiError::NoAnswer) => "unanswered",
        Err(e) => failed_notice(&e),
    };
    Ok(redirect(&outcome_link(
        &session,
        &field(&body, "source"),
        &field(&body, "event_id"),
        outcome,
        &id.to_string(),
        "",
    )))
}

/// The notice of a re-queue or redeliver the database failed: its cause where it answered
/// with one ("did not answer" sent an operator to look for an outage where the disk was
/// full, found by a black-box run).
fn failed_notice(error: &crate::http::ApiError) -> &'static str {
    match error {
        crate::http::ApiError::AdminDatabase(crate::db::Failure::Full) => "full",
        crate::http::ApiError::AdminDatabase(failure) if failure.refused_a_write() => "refused",
        _ => "unavailable",
    }
}

/// `POST /console/events/redeliver` with `csrf`, `source`, `event_id` and, optionally,
/// `target`: queues a new attempt series for the event's delivered or dead deliveries (to that
/// target only, if given), then back to its page with how many.
pub async fn redeliver(
    state: web::Data<AppState>,
    FormBody(body): FormBody,
    Admin(session): Admin<Session>,
    _: web::Query<NoQuery>,
) -> Result<HttpResponse, Refused> {
    check_csrf(&session, &body)?;
    check_fields(&body, &["csrf", "source", "event_id", "target"])?;
    let (source, event_id) = (field(&body, "source"), field(&body, "event_id"));
    // The console's own forms leave `target` out to redeliver to every target; one given
    // empty would widen a redeliver to one target to all of them, and is refused, as the
    // admin API refuses `target=` (a black-box run's hand-made form was taken as "every").
    let target = if form_urlencoded::parse(&body).any(|(name, _)| name == "target") {
        let target = field(&body, "target");
        if target.trim().is_empty() {
            return Err(Refused::NotMade(
                "the field \"target\" is empty: this form names a target, or leaves the field \
                 out to redeliver to every target"
                    .to_owned(),
            ));
        }
        Some(target)
    } else {
        None
    };
    let outcome = admin::redeliver(
        &state,
        source.clone(),
        event_id.clone(),
        target,
        "the console",
    )
    .await;
    let (notice, count) = match outcome {
        Ok(Some(n)) => ("redelivered", n.to_string()),
        // The event page says the event is not stored.
        Ok(None) => ("redelivered", "0".to_owned()),
        Err(crate::http::ApiError::UnknownTarget(_)) => ("no_target", String::new()),
        Err(crate::http::ApiError::Busy) => ("busy", String::new()),
        Err(crate::http::ApiError::NoAnswer) => ("unanswered", String::new()),
        Err(e) => (failed_notice(&e), String::new()),
    };
    Ok(redirect(&outcome_link(
        &session, &source, &event_id, notice, "", &count,
    )))
}
