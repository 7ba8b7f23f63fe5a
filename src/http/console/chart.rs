//! The overview's chart: one source's answers per minute as stacked bars in inline SVG. Each
//! minute with answers is a group carrying its counts (`data-*`) and a `<title>` tooltip.

use chrono::DateTime;
use maud::{html, Markup};

use crate::activity::Minute;

/// Pixels per minute.
const BAR: i64 = 4;
/// Height of the plot area.
const PLOT: f64 = 110.0;
/// Room above the plot for the scale and below it for the time axis.
const TOP: f64 = 12.0;
const BOTTOM: f64 = 16.0;

/// The outcomes, bottom to top, with their CSS classes.
const STACK: [&str; 4] = ["processed", "replayed", "rejected", "failed"];

fn counts(minute: &Minute) -> [u64; 4] {
    [
        minute.processed,
        minute.replayed,
        minute.rejected,
        minute.failed,
    ]
}

/// `HH:MM` of a minute since the epoch, UTC.
fn clock(minute: i64) -> String {
    DateTime::from_timestamp(minute * 60, 0)
        .map(|t| t.format("%H:%M").to_string())
        .unwrap_or_default()
}

/// The chart of `minutes` (oldest first, one per minute) for `source`. Every element is
/// closed explicitly: inside `<svg>` an HTML parser keeps an unclosed `<line>` open.
pub fn svg(source: &str, minutes: &[Minute]) -> Markup {
    let width = minutes.len() as i64 * BAR;
    let height = TOP + PLOT + BOTTOM;
    let base = TOP + PLOT;
    let peak = minutes.iter().map(Minute::total).max().unwrap_or(0).max(1);
    html! {
        svg class="chart" data-source=(source) viewBox={ "0 0 " (width) " " (height) }
            role="img" aria-label={ (source) " deliveries per minute" }
            xmlns="http://www.w3.org/2000/svg" {
            text x="0" y="9" { (peak) "/min" }
            line x1="0" y1=(TOP) x2=(width) y2=(TOP) stroke-dasharray="2 3" {}
            line x1="0" y1=(base) x2=(width) y2=(base) {}
            @for (i, minute) in minutes.iter().enumerate() {
                @let x = i as i64 * BAR;
                // A tick and the time every half hour (of the clock), the last minute "now".
                @if minute.at % 30 == 0 && i > 0 && i + 8 < minutes.len() {
                    line x1=(x) y1=(base) x2=(x) y2=(base + 3.0) {}
                    text x=(x) y=(height - 2.0) text-anchor="middle" { (clock(minute.at)) }
                }
                @if minute.total() > 0 {
                    (bars(x, peak, minute))
                }
            }
            text x=(width) y=(height - 2.0) text-anchor="end" { "now" }
        }
    }
}

/// One minute's group: its counts, a tooltip, and a bar per outcome stacked bottom up.
fn bars(x: i64, peak: u64, minute: &Minute) -> Markup {
    let [processed, replayed, rejected, failed] = counts(minute);
    let reasons = minute
        .reasons
        .iter()
        .map(|(code, n)| format!("{code} {n}"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut y = TOP + PLOT;
    let stacked: Vec<(&str, f64, f64)> = STACK
        .iter()
        .zip(counts(minute))
        .filter(|(_, n)| *n > 0)
        .map(|(class, n)| {
            // A single answer stays visible however tall the peak.
            let h = (n as f64 * PLOT / peak as f64).max(1.0);
            y -= h;
            (*class, y, h)
        })
        .collect();
    html! {
        g data-minute=(clock(minute.at)) data-processed=(processed) data-replayed=(replayed)
            data-rejected=(rejected) data-failed=(failed) data-reasons=(reasons) {
            title {
                (clock(minute.at)) " UTC: " (processed) " processed, " (replayed) " replayed, "
                (rejected) " rejected, " (failed) " failed"
                @if !reasons.is_empty() { " (" (reasons) ")" }
            }
            @for (class, y, h) in stacked {
                rect class=(class) x=(x) y=(format!("{y:.1}")) width=(BAR - 1)
                    height=(format!("{h:.1}")) {}
            }
        }
    }
}

/// The line under a chart: totals per outcome, with a swatch each, and refusals by code.
pub fn legend(minutes: &[Minute]) -> Markup {
    let mut totals = [0u64; 4];
    let mut reasons: Vec<(&'static str, u64)> = Vec::new();
    for minute in minutes {
        for (total, n) in totals.iter_mut().zip(counts(minute)) {
            *total += n;
        }
        for (code, n) in &minute.reasons {
            match reasons.iter_mut().find(|(c, _)| c == code) {
                Some((_, total)) => *total += n,
                None => reasons.push((code, *n)),
            }
        }
    }
    reasons.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    html! {
        p class="legend" {
            @for (class, total) in STACK.iter().zip(totals) {
                span data-outcome=(class) data-total=(total) {
                    i class={ "sw " (class) } {} (total) " " (class)
                }
            }
            @if !reasons.is_empty() {
                span class="muted" {
                    "refused: "
                    @for (i, (code, n)) in reasons.iter().enumerate() {
                        @if i > 0 { ", " }
                        code { (code) } " " (n)
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minute(at: i64, processed: u64, rejected: u64) -> Minute {
        Minute {
            at,
            processed,
            rejected,
            reasons: if rejected > 0 {
                vec![("invalid_signature", rejected)]
            } else {
                Vec::new()
            },
            ..Minute::default()
        }
    }

    #[test]
    fn each_minute_with_answers_is_a_group_with_its_counts() {
        let minutes: Vec<Minute> = (1000..1180)
            .map(|at| match at {
                1100 => minute(at, 3, 1),
                1179 => minute(at, 1, 0),
                _ => minute(at, 0, 0),
            })
            .collect();
        let svg = svg("stripe", &minutes).into_string();
        assert!(svg.starts_with("<svg class=\"chart\" data-source=\"stripe\""));
        assert_eq!(svg.matches("<g ").count(), 2, "{svg}");
        assert!(svg.contains(
            "data-processed=\"3\" data-replayed=\"0\" data-rejected=\"1\" data-failed=\"0\" data-reasons=\"invalid_signature 1\""
        ));
        assert!(svg.contains("<title>18:20 UTC: 3 processed, 0 replayed, 1 rejected, 0 failed (invalid_signature 1)</title>"));
        assert!(
            svg.contains("<text x=\"0\" y=\"9\">4/min</text>"),
            "the peak"
        );
        // The peak minute's bars fill the plot: 3 processed and 1 rejected of 4.
        assert!(svg.contains("height=\"82.5\""));
        assert!(svg.contains("height=\"27.5\""));

        let legend = legend(&minutes).into_string();
        assert!(legend.contains("data-outcome=\"processed\" data-total=\"4\""));
        assert!(legend.contains("<code>invalid_signature</code> 1"));
    }
}
