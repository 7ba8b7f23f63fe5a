//! `GET /console`: answers per minute for each source over the last hours, the last purge,
//! and the forward outbox.

use std::fmt::Write;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};

use super::html::{esc, link, page, respond, time};
use super::{chart, gate, Refused};
use crate::activity::{current_minute, PurgeResult, HISTORY_MINUTES};
use crate::forward;
use crate::http::with_db;
use crate::metrics::UNKNOWN_SOURCE;
use crate::startup::AppState;

/// `GET /console`.
pub async fn show(
    state: web::Data<AppState>,
    request: HttpRequest,
) -> Result<HttpResponse, Refused> {
    let session = gate(&state, &request)?;
    let outbox = with_db(&state, "console outbox count", forward::store::counts).await;

    let mut main = String::from("<h1>Overview</h1>");
    let _ = write!(
        main,
        "<p class=\"muted\">Webhook answers per minute over the last {} hours, as this process \
         gave them (it started {}). Other instances keep their own.</p>",
        HISTORY_MINUTES / 60,
        esc(&time(state.activity.started_at()))
    );
    let now = current_minute();
    for source in state.activity.sources() {
        let minutes = state.activity.history(source, now);
        let quiet = minutes.iter().all(|m| m.total() == 0);
        if source == UNKNOWN_SOURCE && quiet {
            continue;
        }
        let name = if source == UNKNOWN_SOURCE {
            "unknown sources".to_owned()
        } else {
            source.clone()
        };
        let _ = write!(
            main,
            "<section class=\"card\" id=\"source-{}\"><h2>{}</h2>",
            esc(source),
            esc(&name)
        );
        if quiet {
            main.push_str("<p class=\"muted\">No deliveries in this window.</p>");
        } else {
            main.push_str(&chart::svg(source, &minutes));
            main.push_str(&chart::legend(&minutes));
        }
        main.push_str("</section>");
    }

    main.push_str("<section class=\"card\" id=\"purge\"><h2>Last purge</h2>");
    match state.activity.last_purge() {
        None => main
            .push_str("<p class=\"muted\">No purge pass has ended since this process started.</p>"),
        Some(last) => {
            let when = format!("{}, {} ms", time(last.at), last.took.as_millis());
            match last.result {
                PurgeResult::Done {
                    removed,
                    interrupted,
                } => {
                    let total: u64 = removed.values().sum();
                    let by_source: Vec<String> = removed
                        .iter()
                        .map(|(source, n)| format!("{} {n}", esc(source)))
                        .collect();
                    let _ = write!(
                        main,
                        "<p>{}: removed {total} event{}{}{}.</p>",
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
                    );
                }
                PurgeResult::Skipped => {
                    let _ = write!(
                        main,
                        "<p>{}: skipped, another instance held the purge lock.</p>",
                        esc(&when)
                    );
                }
                PurgeResult::Failed(error) => {
                    let _ = write!(
                        main,
                        "<p class=\"error\">{}: failed: {}</p>",
                        esc(&when),
                        esc(&error)
                    );
                }
            }
        }
    }
    main.push_str("</section><section class=\"card\" id=\"outbox\"><h2>Forward outbox</h2>");
    match outbox {
        Ok((pending, dead)) => {
            let _ = write!(
                main,
                "<p><span id=\"outbox-pending\">{pending}</span> pending, \
                 <span id=\"outbox-dead\">{dead}</span> dead{}</p>",
                if dead > 0 {
                    format!(
                        " (<a href=\"{}\">events with a dead delivery</a>)",
                        esc(&link("/console/events", &[("dead", "1")]))
                    )
                } else {
                    String::new()
                }
            );
        }
        Err(_) => main.push_str("<p class=\"error\">Unknown: the database did not answer.</p>"),
    }
    main.push_str("</section>");
    Ok(respond(
        StatusCode::OK,
        page("Overview", Some(&session), &main),
    ))
}
