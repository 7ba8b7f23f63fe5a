//! The overview's chart: one source's answers per minute as stacked bars in inline SVG. Each
//! minute with answers is a group carrying its counts (`data-*`) and a `<title>` tooltip.

use std::fmt::Write;

use chrono::DateTime;

use super::html::esc;
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

/// The chart of `minutes` (oldest first, one per minute) for `source`.
pub fn svg(source: &str, minutes: &[Minute]) -> String {
    let width = minutes.len() as i64 * BAR;
    let height = TOP + PLOT + BOTTOM;
    let peak = minutes.iter().map(Minute::total).max().unwrap_or(0).max(1);
    let mut out = String::with_capacity(4096);
    let _ = write!(
        out,
        "<svg class=\"chart\" data-source=\"{}\" viewBox=\"0 0 {width} {height}\" role=\"img\" \
         aria-label=\"{} deliveries per minute\" xmlns=\"http://www.w3.org/2000/svg\">\
         <text x=\"0\" y=\"9\">{peak}/min</text>\
         <line x1=\"0\" y1=\"{TOP}\" x2=\"{width}\" y2=\"{TOP}\" stroke-dasharray=\"2 3\"/>\
         <line x1=\"0\" y1=\"{base}\" x2=\"{width}\" y2=\"{base}\"/>",
        esc(source),
        esc(source),
        base = TOP + PLOT,
    );
    for (i, minute) in minutes.iter().enumerate() {
        let x = i as i64 * BAR;
        // A tick and the time every half hour (of the clock), the last minute labelled "now".
        if minute.at % 30 == 0 && i > 0 && i + 8 < minutes.len() {
            let _ = write!(
                out,
                "<line x1=\"{x}\" y1=\"{}\" x2=\"{x}\" y2=\"{}\"/>\
                 <text x=\"{x}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                TOP + PLOT,
                TOP + PLOT + 3.0,
                height - 2.0,
                clock(minute.at)
            );
        }
        if minute.total() == 0 {
            continue;
        }
        let [processed, replayed, rejected, failed] = counts(minute);
        let reasons = minute
            .reasons
            .iter()
            .map(|(code, n)| format!("{code} {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = write!(
            out,
            "<g data-minute=\"{}\" data-processed=\"{processed}\" data-replayed=\"{replayed}\" \
             data-rejected=\"{rejected}\" data-failed=\"{failed}\" data-reasons=\"{}\">\
             <title>{} UTC: {processed} processed, {replayed} replayed, {rejected} rejected, \
             {failed} failed{}</title>",
            clock(minute.at),
            esc(&reasons),
            clock(minute.at),
            if reasons.is_empty() {
                String::new()
            } else {
                format!(" ({})", esc(&reasons))
            }
        );
        let mut y = TOP + PLOT;
        for (class, n) in STACK.iter().zip(counts(minute)) {
            if n == 0 {
                continue;
            }
            // A single answer stays visible however tall the peak.
            let h = (n as f64 * PLOT / peak as f64).max(1.0);
            y -= h;
            let _ = write!(
                out,
                "<rect class=\"{class}\" x=\"{x}\" y=\"{y:.1}\" width=\"{}\" height=\"{h:.1}\"/>",
                BAR - 1
            );
        }
        out.push_str("</g>");
    }
    let _ = write!(
        out,
        "<text x=\"{width}\" y=\"{}\" text-anchor=\"end\">now</text></svg>",
        height - 2.0
    );
    out
}

/// The line under a chart: totals per outcome, with a swatch each, and refusals by code.
pub fn legend(minutes: &[Minute]) -> String {
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
    let mut out = String::from("<p class=\"legend\">");
    for (class, total) in STACK.iter().zip(totals) {
        let _ = write!(
            out,
            "<span data-outcome=\"{class}\" data-total=\"{total}\"><i class=\"sw {class}\"></i>{total} {class}</span>"
        );
    }
    if !reasons.is_empty() {
        reasons.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        let listed: Vec<String> = reasons
            .iter()
            .map(|(code, n)| format!("<code>{}</code> {n}", esc(code)))
            .collect();
        let _ = write!(
            out,
            "<span class=\"muted\">refused: {}</span>",
            listed.join(", ")
        );
    }
    out.push_str("</p>");
    out
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
        let svg = svg("stripe", &minutes);
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

        let legend = legend(&minutes);
        assert!(legend.contains("data-outcome=\"processed\" data-total=\"4\""));
        assert!(legend.contains("<code>invalid_signature</code> 1"));
    }
}
