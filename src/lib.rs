//! hookbox: a webhook receiver that verifies each delivery's signature, claims its event id with
//! a unique insert, processes it and stores the response in one transaction, and answers every
//! redelivery with the stored response.
//!
//! The path of a request: [`http`] reads the bytes, [`providers`] verify them, [`inbox`]
//! claims the event and runs its [`handlers::Handler`], and the stored response goes back out.
//! [`startup::Application`] puts it together; [`cli`] is the command line.

/// `println!` that cannot panic: when stdout is closed early (`| head`) or full (`> /dev/full`)
/// the line is lost and the command goes on, so its exit code still says how its work went.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `eprintln!` that cannot panic, as [`outln!`] for stdout.
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// This build's version: the package's, and the commit it was built from where the build saw
/// one (`0.1.0+d3770d2a1`), so two builds of one package version can be told apart.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), env!("HOOKBOX_COMMIT"));

/// The `User-Agent` of hookbox's own requests (forward attempts, `replay --to`).
pub const USER_AGENT: &str = concat!(
    "hookbox/",
    env!("CARGO_PKG_VERSION"),
    env!("HOOKBOX_COMMIT")
);

pub mod activity;
pub mod capture;
pub mod cli;
pub mod config;
pub mod db;
pub mod forward;
pub mod handlers;
pub mod http;
pub mod ids;
pub mod inbox;
pub mod metrics;
pub mod outage;
pub mod providers;
pub mod purge;
pub mod redact;
pub mod replay;
pub mod replay_counts;
pub mod retention;
pub mod retry;
pub mod routing;
pub mod secret;
pub mod send;
pub mod startup;
pub mod state;
pub mod store;
pub mod telemetry;

pub use config::Config;
pub use handlers::{AnyConnection, Event, Handler, Handlers, Response};
pub use startup::Application;
