//! What the console learns from each webhook answer: its outcome and, for a refusal, its error
//! code (per-minute history, [`crate::activity::Activity`]), and for a replay, which event it
//! was ([`crate::replay_counts::ReplayCounts`]). Both are in memory; nothing here touches the
//! database.

use actix_web::{HttpMessage, HttpRequest, HttpResponse};

use crate::http::error::ErrorCode;
use crate::ids::EventId;
use crate::metrics::Outcome;
use crate::state::AppState;

/// The event a request turned out to carry, kept in the request's extensions.
struct Identified(EventId);

/// Notes on the request which event it carries, once its id is known.
pub(super) fn identified(request: &HttpRequest, event_id: &EventId) {
    request
        .extensions_mut()
        .insert(Identified(event_id.clone()));
}

/// Counts an answer to `source` (a configured name, or the unknown-source label).
pub(super) fn answered(
    state: &AppState,
    source: &str,
    outcome: Outcome,
    request: &HttpRequest,
    response: &HttpResponse,
) {
    let reason = response.extensions().get::<ErrorCode>().map(|code| code.0);
    state.activity.record(source, outcome, reason);
    if outcome == Outcome::Replayed {
        if let Some(Identified(event_id)) = request.extensions().get::<Identified>() {
            state.replay_counts.replayed(source, event_id.as_str());
        }
    }
}
