//! `GET /console/events`: stored events newest first, filtered by source, type, time range,
//! exact id and a dead delivery, in keyset pages of [`PAGE_SIZE`] by `(received_at, id)`.

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use diesel::prelude::*;
use serde::Deserialize;

use maud::{html, Markup};

use super::html::{link, page, redirect, respond, time, visible};
use super::{check_csrf, check_fields, field, FormBody, NoQuery, Refused, Session};
use crate::config::parse_time_or_ago;
use crate::db::events::{self, Filter, Listed};
use crate::db::AnyConnection;
use crate::http::auth::Admin;
use crate::http::read_db;
use crate::ids::EventType;
use crate::metrics::UNKNOWN_SOURCE;
use crate::state::AppState;

/// Events per page.
const PAGE_SIZE: i64 = 50;

/// The filters, as the form sends them (empty fields mean "any"). A parameter the form never
/// sends is refused, not ignored: a list that skipped a misspelt filter would look filtered.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Filters {
    #[serde(default)]
    source: String,
    #[serde(default, rename = "type")]
    event_type: String,
    #[serde(default)]
    since: String,
    #[serde(default)]
    until: String,
    #[serde(default)]
    id: String,
    #[serde(default)]
    dead: String,
    /// The cursor: `{received_at in µs}.{row id}` of the last row of the previous page.
    #[serde(default)]
    before: String,
    /// After the bulk re-queue: how many it re-queued (shown only under a valid `seal`).
    requeued: Option<u64>,
    /// The session's seal over `source` and `requeued` (see [`requeued_link`]).
    #[serde(default)]
    seal: String,
}

impl Filters {
    /// The filters as query pairs, for the next page's link.
    fn pairs(&self) -> [(&'static str, &str); 6] {
        [
            ("source", &self.source),
            ("type", &self.event_type),
            ("since", &self.since),
            ("until", &self.until),
            ("id", &self.id),
            ("dead", &self.dead),
        ]
    }
}

/// The filters, read and checked.
#[derive(Clone)]
struct Query {
    source: Option<String>,
    event_type: Option<String>,
    since: Option<DateTime<Utc>>,
    until: Option<DateTime<Utc>>,
    id: Option<String>,
    dead: bool,
    before: Option<(DateTime<Utc>, i64)>,
}

fn given(text: &str) -> Option<String> {
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

/// A time as [`parse_time_or_ago`] reads it (the one reading `export` and the admin API
/// share), or nothing when the field is empty.
fn parse_when(name: &str, text: &str) -> Result<Option<DateTime<Utc>>, String> {
    let Some(text) = given(text) else {
        return Ok(None);
    };
    parse_time_or_ago(&text, crate::db::now())
        .map(Some)
        .map_err(|e| format!("{name}: {e}"))
}

fn parse_cursor(text: &str) -> Result<Option<(DateTime<Utc>, i64)>, String> {
    if given(text).is_none() {
        return Ok(None);
    }
    events::parse_cursor(text)
        .map(Some)
        .ok_or_else(|| "the page cursor is not valid; start from the newest".to_owned())
}

impl Filters {
    /// Whether the dead filter's box was ticked: it sends "1" ("on", a box without a value).
    /// The box is shown ticked only then, on the list and on the page that refuses another
    /// value (`dead=0` shown ticked, filtered again, asked for the opposite).
    fn dead_ticked(&self) -> bool {
        matches!(self.dead.as_str(), "1" | "on")
    }

    fn check(&self) -> Result<Query, String> {
        Ok(Query {
            source: given(&self.source),
            event_type: given(&self.event_type),
            since: parse_when("since", &self.since)?,
            until: parse_when("until", &self.until)?,
            id: given(&self.id),
            // The checkbox sends "1" (a box without a value, "on") and an unticked one
            // nothing: any other value is a query the console never makes (`dead=0` was read
            // as ticked, found by a black-box run).
            dead: match self.dead.as_str() {
                "" => false,
                _ if self.dead_ticked() => true,
                _ => return Err("dead: the filter takes 1 (ticked) or nothing".to_owned()),
            },
            before: parse_cursor(&self.before)?,
        })
    }
}

fn load(conn: &mut AnyConnection, query: Query) -> QueryResult<Vec<Listed>> {
    // A type is matched in the form it is stored in.
    let filter = Filter {
        source: query.source,
        event_type: query
            .event_type
            .map(|t| EventType::from(t).as_str().to_owned()),
        since: query.since,
        until: query.until,
        event_id: query.id,
        dead: query.dead,
        before: query.before,
    };
    events::page(conn, filter, PAGE_SIZE + 1)
}

fn filter_form(state: &AppState, filters: &Filters) -> Markup {
    let chosen = filters.source.trim();
    let sources: Vec<&str> = state
        .activity
        .sources()
        .iter()
        .map(String::as_str)
        .filter(|source| *source != UNKNOWN_SOURCE)
        .collect();
    // A source no longer configured, whose events the purge has not removed yet.
    let unlisted = !chosen.is_empty() && !sources.contains(&chosen);
    let input = |name: &str, label: &str, value: &str, hint: &str| {
        html! {
            label {
                (label)
                input name=(name) id={ "filter-" (name) } value=(value) placeholder=(hint);
            }
        }
    };
    html! {
        form class="filters" method="get" action="/console/events" {
            label {
                "Source"
                select name="source" id="filter-source" {
                    option value="" { "any" }
                    @for source in &sources {
                        option selected[*source == chosen] { (source) }
                    }
                    @if unlisted {
                        option selected { (chosen) }
                    }
                }
            }
            (input("id", "Event id (exact)", &filters.id, "evt_..."))
            (input("type", "Event type", &filters.event_type, "charge.succeeded"))
            (input("since", "Since", &filters.since, "1h or 2026-12-02 09:00"))
            (input("until", "Until", &filters.until, "2026-12-02T10:00:00Z"))
            label {
                span {
                    input type="checkbox" name="dead" value="1" id="filter-dead"
                        checked[filters.dead_ticked()];
                    " with a dead delivery"
                }
            }
            button type="submit" id="filter-submit" { "Filter" }
            " "
            a href="/console/events" { "clear" }
        }
    }
}

/// `GET /console/events`.
pub async fn list(
    state: web::Data<AppState>,
    filters: web::Query<Filters>,
    Admin(session): Admin<Session>,
) -> Result<HttpResponse, Refused> {
    let filters = filters.into_inner();
    let form = filter_form(&state, &filters);
    let query = match filters.check() {
        Ok(query) => query,
        Err(problem) => {
            let main = html! {
                h1 { "Events" }
                (form)
                p class="error" { (problem) }
            };
            return Ok(respond(
                StatusCode::BAD_REQUEST,
                page("Events", Some(&session), main),
            ));
        }
    };
    let mut rows = read_db(&state, "console event list", move |conn| {
        load(conn, query.clone())
    })
    .await?;
    let more = rows.len() as i64 > PAGE_SIZE;
    rows.truncate(PAGE_SIZE as usize);
    let older = match (more, rows.last()) {
        (true, Some((id, .., received_at, _, _))) => {
            let cursor = events::cursor(*received_at, *id);
            let mut pairs = filters.pairs().to_vec();
            pairs.push(("before", &cursor));
            Some(link("/console/events", &pairs))
        }
        _ => None,
    };

    // With the dead filter on, one button re-queues them all (the admin API's bulk requeue):
    // after a downstream is mended, rather than one event page at a time.
    let dead_source = filters.source.trim().to_owned();
    let requeue_all = (filters.dead_ticked() && !rows.is_empty()).then(|| {
        html! {
            form method="post" action="/console/deliveries/requeue" id="requeue-dead" {
                input type="hidden" name="csrf" value=(session.csrf());
                input type="hidden" name="source" value=(dead_source);
                button type="submit" class="requeue" id="requeue-all" {
                    @if dead_source.is_empty() {
                        "Re-queue every dead delivery"
                    } @else {
                        "Re-queue every dead delivery of " (dead_source)
                    }
                }
            }
        }
    });
    let main = html! {
        h1 { "Events" }
        @if let Some(text) = requeued_notice(&filters, &session) {
            p class="notice" id="notice" { (text) }
        }
        (form)
        @if let Some(requeue_all) = requeue_all {
            (requeue_all)
        }
        @if rows.is_empty() {
            p class="muted" id="no-events" { "No stored event matches." }
        } @else {
            table id="events" {
                thead {
                    tr {
                        th { "Received" } th { "Source" } th { "Event id" } th { "Type" }
                        th class="num" { "Status" }
                        th class="num" title="Deliveries answered with the stored response" {
                            "Replays"
                        }
                    }
                }
                tbody {
                    @for (_, source, event_id, event_type, received_at, status, replays) in &rows {
                        tr {
                            td { (time(*received_at)) }
                            td { (source) }
                            td {
                                a class="event-link"
                                    href=(link("/console/event", &[("source", source), ("id", event_id)])) {
                                    (visible(event_id))
                                }
                            }
                            td { (visible(event_type.as_deref().unwrap_or(""))) }
                            td class="num" { @if let Some(status) = status { (status) } }
                            td class="num" {
                                (*replays as u64 + state.replay_counts.unflushed_replays(source, event_id))
                            }
                        }
                    }
                }
            }
        }
        nav class="pages" {
            @if !filters.before.is_empty() {
                a href=(link("/console/events", &filters.pairs())) { "Newest" }
            }
            @if let Some(older) = older {
                a href=(older) id="older" { "Older →" }
            }
        }
        p class="muted" {
            "Times are UTC. Replays count deliveries answered with the stored response; each \
             instance adds its count to the database every few seconds, so the newest replays \
             of other instances may not show yet."
        }
    };
    Ok(respond(
        StatusCode::OK,
        page("Events", Some(&session), main),
    ))
}

/// The dead-filtered list's address with the bulk re-queue's count on it, sealed by the
/// session so that only the form's own redirect shows the count.
fn requeued_link(session: &Session, source: &str, requeued: u64) -> String {
    let count = requeued.to_string();
    let seal = session.seal(&["requeued", source, &count]);
    link(
        "/console/events",
        &[
            ("source", source),
            ("dead", "1"),
            ("requeued", &count),
            ("seal", &seal),
        ],
    )
}

/// What the bulk re-queue did, when the address carries its count under this session's seal.
fn requeued_notice(filters: &Filters, session: &Session) -> Option<String> {
    let requeued = filters.requeued?;
    let source = filters.source.trim();
    if !session.sealed(&["requeued", source, &requeued.to_string()], &filters.seal) {
        return None;
    }
    let whose = if source.is_empty() {
        "every source".to_owned()
    } else {
        format!("source {source}")
    };
    Some(match requeued {
        0 if source.is_empty() => "No dead delivery of any source was left to re-queue.".to_owned(),
        0 => format!("No dead delivery of {whose} was left to re-queue."),
        1 => format!(
            "1 dead delivery of {whose} is pending again; it is sent as its target takes it, \
             with the same Idempotency-Key."
        ),
        n => format!(
            "{n} dead deliveries of {whose} are pending again; each is sent as its target \
             takes it, with the same Idempotency-Key."
        ),
    })
}

/// `POST /console/deliveries/requeue` with `csrf` and `source` (empty: every source): every
/// dead delivery of those events becomes pending again; then (303) back to the dead-filtered
/// list saying how many, so that a refresh does not post it again.
pub async fn requeue_dead(
    state: web::Data<AppState>,
    FormBody(body): FormBody,
    Admin(session): Admin<Session>,
    _: web::Query<NoQuery>,
) -> Result<HttpResponse, Refused> {
    check_csrf(&session, &body)?;
    check_fields(&body, &["csrf", "source"])?;
    let source = field(&body, "source").trim().to_owned();
    let requeued = crate::http::admin::requeue_all_dead(
        &state,
        Some(source.clone()).filter(|s| !s.is_empty()),
        None,
        None,
        "the console",
    )
    .await?;
    Ok(redirect(&requeued_link(&session, &source, requeued as u64)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_read_as_rfc3339_durations_or_utc_without_a_zone() {
        let at = |text| parse_when("since", text).expect("a time").expect("given");
        assert_eq!(
            at("2026-12-02T09:00:00Z").to_rfc3339(),
            "2026-12-02T09:00:00+00:00"
        );
        assert_eq!(
            at("2026-12-02 09:30").to_rfc3339(),
            "2026-12-02T09:30:00+00:00"
        );
        assert_eq!(
            at("2026-12-02T09:30").to_rfc3339(),
            "2026-12-02T09:30:00+00:00"
        );
        assert_eq!(at("2026-12-02").to_rfc3339(), "2026-12-02T00:00:00+00:00");
        let an_hour_ago = at("1h");
        assert_eq!((Utc::now() - an_hour_ago).num_minutes(), 60);
        assert_eq!(parse_when("since", "  ").expect("empty is fine"), None);
        assert!(parse_when("since", "yesterday-ish")
            .expect_err("not a time")
            .starts_with("since: "));
    }

    #[test]
    fn the_cursor_round_trips_micros_and_row_id() {
        let (at, id) = parse_cursor("1764666000123456.42")
            .expect("valid")
            .expect("given");
        assert_eq!((at.timestamp_micros(), id), (1764666000123456, 42));
        assert!(parse_cursor("nope").is_err());
        // Years no store holds: a hand-made cursor, refused rather than a failed query.
        for far in ["-210866803200000001.1", "253402300800000000.1"] {
            assert!(parse_cursor(far).is_err(), "{far}");
        }
        assert!(parse_cursor("253402300799999999.1").is_ok());
        assert!(parse_cursor("").expect("empty").is_none());
    }
}
