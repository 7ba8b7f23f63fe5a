//! What the operator watches during a replay, on stderr: a progress bar on a terminal, a plain
//! line every few seconds otherwise (a CI log or a file).

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use super::report::Tally;

/// How often the plain progress line is printed.
pub const PLAIN_EVERY: Duration = Duration::from_secs(5);

/// The bar, or the time of the last plain line.
#[derive(Debug)]
pub enum Progress {
    /// On a terminal: a bar over the entries counted up front.
    Bar(ProgressBar),
    /// Elsewhere: plain lines.
    Plain {
        /// When the last line was printed.
        last: Instant,
        /// The entries counted up front.
        total: u64,
    },
}

impl Progress {
    /// A bar over `total` entries, on a terminal; plain lines saying how many of `total` are
    /// done otherwise.
    pub fn new(total: u64, terminal: bool) -> Progress {
        match terminal {
            true => {
                let bar = ProgressBar::new(total);
                bar.set_style(
                    ProgressStyle::with_template("{elapsed:>4} [{bar:24}] {pos}/{len} {wide_msg}")
                        .expect("the template is valid")
                        .progress_chars("=> "),
                );
                Progress::Bar(bar)
            }
            false => Progress::Plain {
                last: Instant::now(),
                total,
            },
        }
    }

    /// Shows the tally: on the bar at once, as a plain line when one is due.
    pub fn update(&mut self, tally: &Tally) {
        match self {
            Progress::Bar(bar) => {
                // The bar shows how many are done; the message only how they went.
                bar.set_message(tally.outcomes());
                bar.set_position(tally.done());
            }
            Progress::Plain { last, total } => {
                if last.elapsed() >= PLAIN_EVERY {
                    errln!("replay: {}", tally.progress_line(*total));
                    *last = Instant::now();
                }
            }
        }
    }

    /// A line for the operator now, above the bar on a terminal.
    pub fn note(&self, line: &str) {
        match self {
            Progress::Bar(bar) => bar.println(format!("replay: {line}")),
            Progress::Plain { .. } => errln!("replay: {line}"),
        }
    }

    /// Clears the bar before the summary is printed.
    pub fn finish(&self) {
        if let Progress::Bar(bar) = self {
            bar.finish_and_clear();
        }
    }
}
