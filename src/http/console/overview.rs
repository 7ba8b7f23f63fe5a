//! `GET /console`: answers per minute for each source over the last hours, the last purge,
//! and the forward outbox.

use std::fmt::Write;

use actix_web::http::StatusCode;
use actix_web::{web, HttpResponse};

use super::html::{esc, link, page, respond, time};
use super::{chart, Refused, Session};
use crate::activity::{current_minute, PurgeResult, HISTORY_MINUTES};
use crate::forward;
use crate::http::auth::Admin;
use crate::http::with_db;
use crate::metrics::UNKNOWN_SOURCE;
use crate::startup::AppState;

/// `GET /console`.
pub async fn show(
    state: web::Data<AppState>,
    Admin(session): Admin<Session>,
) -> Result<HttpResponse, Refused> {
    let outbox = with_db(&state, "console outbox count", forward::store::counts).await;

    let mut main = String::from("<h1>Overview</h1><div class=\"row\">");
    main.push_str(&purge_card(&state));
    main.push_str(&outbox_card(outbox.ok()));
    let _ = write!(
        main,
        "</div><p class=\"muted\">Webhook answers per minute over the last {} hours, as this \
         process gave them (it started {}); other instances keep their own.</p>",
        HISTORY_MINUTES / 60,
        esc(&time(state.activity.started_at()))
    );
    let now = current_minute();
    let mut quiet = Vec::new();
    for source in state.activity.sources() {
        let minutes = state.activity.history(source, now);
        if minutes.iter().all(|m| m.total() == 0) {
            if source != UNKNOWN_SOURCE {
                quiet.push(esc(source).to_string());
            }
            continue;
        }
        let name = if source == UNKNOWN_SOURCE {
            "unknown sources"
        } else {
            source
        };
        let _ = write!(
            main,
            "<section class=\"card\" id=\"source-{}\"><h2>{}</h2>{}{}</section>",
            esc(source),
            esc(name),
            chart::svg(source, &minutes),
            chart::legend(&minutes)
        );
    }
    if !quiet.is_empty() {
        let _ = write!(
            main,
            "<p class=\"muted\" id=\"quiet\">No deliveries in this window: {}.</p>",
            quiet.join(", ")
        );
    }
    Ok(respond(
        StatusCode::OK,
        page("Overview", Some(&session), &main),
    ))
}

/// When the last purge pass ended and what it did.
fn purge_card(state: &AppState) -> String {
    let mut out = String::from("<section class=\"card\" id=\"purge\"><h2>Last purge</h2>");
    let Some(last) = state.activity.last_purge() else {
        out.push_str(
            "<p class=\"muted\">No purge pass has ended since this process started.</p></section>",
        );
        return out;
    };
    let when = format!("{}, {} ms", time(last.at), last.took.as_millis());
    let _ = match last.result {
        PurgeResult::Done {
            removed,
            interrupted,
        } => {
            let total: u64 = removed.values().sum();
            let by_source: Vec<String> = removed
                .iter()
                .map(|(source, n)| format!("{} {n}", esc(source)))
                .collect();
            write!(
                out,
                "<p>{}</p><p>Removed {total} event{}{}{}.</p>",
                esc(&when),
                if total == 1 { "" } else { "s" },
                if by_source.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", by_source.join(", "))
                },
                if interrupted {
                    "; stopped early by shutdown"
                } else {
                    ""
                }
            )
        }
        PurgeResult::Skipped => write!(
            out,
            "<p>{}</p><p>Skipped: another instance held the purge lock.</p>",
            esc(&when)
        ),
        PurgeResult::Failed(error) => write!(
            out,
            "<p>{}</p><p class=\"error\">Failed: {}</p>",
            esc(&when),
            esc(&error)
        ),
    };
    out.push_str("</section>");
    out
}

/// Pending and dead forward deliveries, or that the database did not say.
fn outbox_card(counts: Option<(i64, i64)>) -> String {
    let mut out = String::from("<section class=\"card\" id=\"outbox\"><h2>Forward outbox</h2>");
    let _ = match counts {
        Some((pending, dead)) => write!(
            out,
            "<p><span id=\"outbox-pending\">{pending}</span> pending, \
             <span id=\"outbox-dead\">{dead}</span> dead</p>{}",
            if dead > 0 {
                format!(
                    "<p><a href=\"{}\">Events with a dead delivery</a></p>",
                    esc(&link("/console/events", &[("dead", "1")]))
                )
            } else {
                String::new()
            }
        ),
        None => write!(
            out,
            "<p class=\"error\">Unknown: the database did not answer.</p>"
        ),
    };
    out.push_str("</section>");
    out
}
