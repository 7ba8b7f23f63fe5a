//! `GET /console/event?source=&id=`: one stored event whole (kept headers, body, stored
//! response, forward deliveries), and `POST /console/deliveries/{id}/requeue`.

use std::fmt::Write;

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use diesel::prelude::*;
use serde::Deserialize;

use super::html::{esc, link, page, redirect, respond, show_body, time};
use super::{check_csrf, field, message, Refused, Session};
use crate::db::AnyConnection;
use crate::forward::store::{self, DeliveryView};
use crate::http::admin::{self, StoredEvent};
use crate::http::auth::Admin;
use crate::http::with_db;
use crate::startup::AppState;

/// `GET /console/event` query: which event, and the outcome of a re-queue just made.
#[derive(Debug, Deserialize)]
pub struct Which {
    #[serde(default)]
    source: String,
    #[serde(default)]
    id: String,
    notice: Option<String>,
    delivery: Option<i64>,
}

fn load(
    conn: &mut AnyConnection,
    source: &str,
    event_id: &str,
) -> QueryResult<Option<(StoredEvent, Vec<DeliveryView>)>> {
    let Some(stored) = admin::stored_event(conn, source, event_id)? else {
        return Ok(None);
    };
    let deliveries = store::for_event(conn, source, event_id)?.unwrap_or_default();
    Ok(Some((stored, deliveries)))
}

/// A body in a `<pre>`, with what it is and its size.
fn body_block(id: &str, bytes: &[u8]) -> String {
    let shown = show_body(bytes);
    format!(
        "<p class=\"muted\">{} byte{}{}</p><pre id=\"{id}\">{}</pre>",
        bytes.len(),
        if bytes.len() == 1 { "" } else { "s" },
        shown
            .note
            .map_or_else(String::new, |note| format!(", {note}")),
        esc(&shown.text)
    )
}

fn notice(which: &Which) -> Option<(bool, String)> {
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
        "unavailable" => (
            false,
            "The database did not answer; nothing was re-queued.".to_owned(),
        ),
        _ => return None,
    };
    Some((ok, text))
}

fn deliveries_table(
    csrf: &str,
    source: &str,
    event_id: &str,
    deliveries: &[DeliveryView],
) -> String {
    let mut out = String::from(
        "<table id=\"deliveries\"><thead><tr><th>Delivery</th><th>State</th>\
         <th class=\"num\">Attempts</th><th class=\"num\">Last status</th><th>Last error</th>\
         <th>Queued</th><th>Next attempt</th><th>Delivered</th><th></th></tr></thead><tbody>",
    );
    let when = |at: Option<DateTime<Utc>>| at.map_or_else(String::new, time);
    for d in deliveries {
        let _ = write!(
            out,
            "<tr id=\"delivery-{}\"><td>{}</td><td class=\"state {}\">{}</td>\
             <td class=\"num\">{}</td><td class=\"num\">{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td><td>",
            d.id,
            d.id,
            esc(&d.state),
            esc(&d.state),
            d.attempts,
            d.last_status.map_or_else(String::new, |s| s.to_string()),
            esc(d.last_error.as_deref().unwrap_or("")),
            esc(&time(d.created_at)),
            esc(&when(d.next_attempt_at)),
            esc(&when(d.delivered_at)),
        );
        if d.state == "dead" {
            let _ = write!(
                out,
                "<form method=\"post\" action=\"/console/deliveries/{}/requeue\">\
                 <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
                 <input type=\"hidden\" name=\"source\" value=\"{}\">\
                 <input type=\"hidden\" name=\"event_id\" value=\"{}\">\
                 <button type=\"submit\" class=\"requeue\" id=\"requeue-{}\">Re-queue</button></form>",
                d.id,
                esc(csrf),
                esc(source),
                esc(event_id),
                d.id
            );
        }
        out.push_str("</td></tr>");
    }
    out.push_str("</tbody></table>");
    out
}

/// `GET /console/event?source=&id=`.
pub async fn show(
    state: web::Data<AppState>,
    which: web::Query<Which>,
    Admin(session): Admin<Session>,
) -> Result<HttpResponse, Refused> {
    let which = which.into_inner();
    let (source, event_id) = (which.source.clone(), which.id.clone());
    let found = with_db(&state, "console event", move |conn| {
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

    let replays =
        stored.replays as u64 + state.activity.unflushed_replays(&which.source, &which.id);
    let mut main = String::new();
    if let Some((ok, text)) = notice(&which) {
        let _ = write!(
            main,
            "<p class=\"{}\" id=\"notice\">{}</p>",
            if ok { "notice" } else { "error" },
            esc(&text)
        );
    }
    let _ = write!(
        main,
        "<h1 id=\"event-id\">{}</h1><dl class=\"facts\">\
         <dt>Source</dt><dd>{}</dd><dt>Type</dt><dd id=\"event-type\">{}</dd>\
         <dt>Received</dt><dd>{}</dd><dt>Stored status</dt><dd id=\"stored-status\">{}</dd>\
         <dt>Replays</dt><dd id=\"replays\">{replays}</dd></dl>\
         <p><a href=\"{}\">Other events from {}</a></p>",
        esc(&which.id),
        esc(&which.source),
        esc(stored.event_type.as_deref().unwrap_or("")),
        esc(&time(stored.received_at)),
        stored.status.map_or_else(String::new, |s| s.to_string()),
        esc(&link("/console/events", &[("source", &which.source)])),
        esc(&which.source),
    );

    main.push_str("<h2>Kept headers</h2><table id=\"headers\"><tbody>");
    if let Some(headers) = stored.headers.as_object() {
        for (name, value) in headers {
            let value = value
                .as_str()
                .map_or_else(|| value.to_string(), str::to_owned);
            let _ = write!(
                main,
                "<tr><th><code>{}</code></th><td><code>{}</code></td></tr>",
                esc(name),
                esc(&value)
            );
        }
    }
    main.push_str("</tbody></table><h2>Body</h2>");
    main.push_str(&body_block("payload", &stored.payload));
    let _ = write!(
        main,
        "<h2>Stored response</h2><p>Status <b>{}</b>, <code>{}</code></p>",
        stored.status.map_or_else(String::new, |s| s.to_string()),
        esc(stored.content_type.as_deref().unwrap_or(""))
    );
    main.push_str(&body_block(
        "response",
        stored.body.as_deref().unwrap_or_default(),
    ));
    main.push_str("<h2>Forward deliveries</h2>");
    if deliveries.is_empty() {
        main.push_str("<p class=\"muted\">None: this event's source does not forward.</p>");
    } else {
        main.push_str(&deliveries_table(
            session.csrf(),
            &which.source,
            &which.id,
            &deliveries,
        ));
        main.push_str(
            "<p class=\"muted\">The outbox keeps each delivery's latest attempt: its status, \
             error and the attempts made so far.</p>",
        );
    }
    Ok(respond(
        StatusCode::OK,
        page(&which.id, Some(&session), &main),
    ))
}

/// `POST /console/deliveries/{id}/requeue` with `csrf`, `source` and `event_id`: re-queues a
/// dead delivery, then back to its event's page with the outcome.
pub async fn requeue(
    state: web::Data<AppState>,
    path: web::Path<i64>,
    body: web::Bytes,
    Admin(session): Admin<Session>,
) -> Result<HttpResponse, Refused> {
    check_csrf(&session, &body)?;
    let id = path.into_inner();
    let outcome = match admin::requeue(&state, id, "the console").await {
        Ok(Some(Ok(_))) => "requeued",
        Ok(Some(Err(_))) => "not_dead",
        Ok(None) => "no_delivery",
        Err(_) => "unavailable",
    };
    let delivery = id.to_string();
    Ok(redirect(&link(
        "/console/event",
        &[
            ("source", &field(&body, "source")),
            ("id", &field(&body, "event_id")),
            ("notice", outcome),
            ("delivery", &delivery),
        ],
    )))
}
