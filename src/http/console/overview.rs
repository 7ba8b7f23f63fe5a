//! `GET /console`: answers per minute for each source over the last hours, the last purge,
//! and the forward outbox.

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};

use maud::{html, Markup};

use super::html::{link, page, respond, time};
use super::{chart, NoQuery, Refused, Session};
use crate::activity::{current_minute, HISTORY_MINUTES};
use crate::db::deliveries;
use crate::http::auth::Admin;
use crate::http::read_db;
use crate::metrics::UNKNOWN_SOURCE;
use crate::purge::PurgeResult;
use crate::state::AppState;

/// `GET /console`.
pub async fn show(
    state: web::Data<AppState>,
    Admin(session): Admin<Session>,
    _: web::Query<NoQuery>,
) -> Result<HttpResponse, Refused> {
    let outbox = read_db(&state, "console outbox count", deliveries::counts).await;
    let now = current_minute();
    let mut charts = Vec::new();
    let mut quiet = Vec::new();
    for source in state.activity.sources() {
        let minutes = state.activity.history(source, now);
        if minutes.iter().all(|m| m.total() == 0) {
            if source != UNKNOWN_SOURCE {
                quiet.push(source.as_str());
            }
            continue;
        }
        charts.push((source.as_str(), minutes));
    }
    let main = html! {
        h1 { "Overview" }
        div class="row" {
            (purge_card(&state))
            (outbox_card(outbox.ok()))
        }
        p class="muted" {
            "Webhook answers per minute over the last " (HISTORY_MINUTES / 60)
            " hours, as this process gave them (it started "
            (time(state.activity.started_at())) "); other instances keep their own."
        }
        @for (source, minutes) in &charts {
            section class="card" id={ "source-" (source) } {
                h2 { @if *source == UNKNOWN_SOURCE { "unknown sources" } @else { (source) } }
                (chart::svg(source, minutes))
                (chart::legend(minutes))
            }
        }
        @if !quiet.is_empty() {
            p class="muted" id="quiet" { "No deliveries in this window: " (quiet.join(", ")) "." }
        }
    };
    Ok(respond(
        StatusCode::OK,
        page("Overview", Some(&session), main),
    ))
}

/// When the last purge pass ended and what it did.
fn purge_card(state: &AppState) -> Markup {
    let last = state.last_purge.get();
    html! {
        section class="card" id="purge" {
            h2 { "Last purge" }
            @match last {
                None => p class="muted" { "No purge pass has ended since this process started." },
                Some(last) => {
                    p { (time(last.at)) ", " (last.took.as_millis()) " ms" }
                    @match last.result {
                        PurgeResult::Done { removed, interrupted } => {
                            @let total: u64 = removed.values().sum();
                            p {
                                "Removed " (total) " event" @if total != 1 { "s" }
                                @if !removed.is_empty() {
                                    " ("
                                    @for (i, (source, n)) in removed.iter().enumerate() {
                                        @if i > 0 { ", " }
                                        (source) " " (n)
                                    }
                                    ")"
                                }
                                @if interrupted { "; stopped early by shutdown" }
                                "."
                            }
                        }
                        PurgeResult::Skipped => {
                            p { "Skipped: another instance held the purge lock." }
                        }
                        PurgeResult::Failed(error) => p class="error" { "Failed: " (error) },
                    }
                }
            }
        }
    }
}

/// Pending and dead forward deliveries, or that the database did not say.
fn outbox_card(counts: Option<(i64, i64)>) -> Markup {
    html! {
        section class="card" id="outbox" {
            h2 { "Forward outbox" }
            @match counts {
                Some((pending, dead)) => {
                    p {
                        span id="outbox-pending" { (pending) } " pending, "
                        span id="outbox-dead" { (dead) } " dead"
                    }
                    @if dead > 0 {
                        p { a href=(link("/console/events", &[("dead", "1")])) { "Events with a dead delivery" } }
                    }
                }
                None => p class="error" { "Unknown: the database did not answer." },
            }
        }
    }
}
