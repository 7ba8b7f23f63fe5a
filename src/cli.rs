//! The command line: `hookbox serve` and `hookbox migrate`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};

use crate::config::{Config, ProcessEnv};
use crate::retention::{self, Plan};
use crate::startup::{Application, Handlers};

/// hookbox: a webhook receiver that processes every event exactly once.
///
/// It verifies each delivery's signature (Stripe, Standard Webhooks, GitHub, Shopify, Slack or a
/// generic HMAC), claims the event id with a unique insert in PostgreSQL, processes the event and
/// stores the response in one transaction, and answers every redelivery with the stored response.
#[derive(Parser, Debug)]
#[command(name = "hookbox", version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the receiver: apply pending migrations, then serve POST /webhooks/{source}.
    ///
    /// Listens on [server].listen (or HOOKBOX_LISTEN) and stops gracefully on SIGTERM or
    /// Ctrl-C, letting in-flight deliveries finish.
    Serve(ConfigArg),
    /// Apply pending database migrations and exit.
    ///
    /// Instances take turns through an advisory lock, so running this while servers start is
    /// safe. Needs only [database].url or DATABASE_URL.
    Migrate(ConfigArg),
    /// Run one retention purge pass now; print what it removed per source and in total.
    ///
    /// Without --older-than, each source keeps its own window (sources.NAME.retention, else
    /// [retention].window), exactly as the scheduled purge inside `serve` does. Waits for
    /// nothing: if another hookbox is purging at this moment, it says so and exits 1.
    Purge(PurgeArgs),
}

#[derive(Args, Debug)]
struct PurgeArgs {
    #[command(flatten)]
    config: ConfigArg,
    /// Remove events of every source received longer ago than this (e.g. 30d), instead of
    /// each source's window
    #[arg(long, value_name = "DURATION", value_parser = crate::config::parse_duration)]
    older_than: Option<Duration>,
    /// Count what would be removed, and remove nothing
    #[arg(long)]
    dry_run: bool,
}

#[derive(Args, Debug)]
struct ConfigArg {
    /// The config file [default: $HOOKBOX_CONFIG, then ./hookbox.toml]
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

/// Runs the command line and returns the exit code: 0 success, 1 runtime failure, 2 bad usage
/// or bad config.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    crate::telemetry::init();
    let config_path = match &cli.command {
        Command::Serve(arg) | Command::Migrate(arg) => arg.config.as_deref(),
        Command::Purge(args) => args.config.config.as_deref(),
    };
    let config = match Config::load(config_path, &ProcessEnv) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("hookbox: config error: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Serve(_) => serve(config),
        Command::Migrate(_) => migrate(&config),
        Command::Purge(args) => purge(&config, &args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hookbox: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn serve(config: Config) -> anyhow::Result<()> {
    actix_web::rt::System::new().block_on(async move {
        let app = Application::build(config, Handlers::default())?;
        app.run_until_stopped().await?;
        Ok(())
    })
}

fn migrate(config: &Config) -> anyhow::Result<()> {
    let applied = crate::db::migrate(&config.database, |_| Ok(()))?;
    if applied.is_empty() {
        println!(
            "database schema is up to date ({})",
            config.database.display_url()
        );
    } else {
        println!(
            "applied {} migration(s) to {}: {}",
            applied.len(),
            config.database.display_url(),
            applied.join(", ")
        );
    }
    Ok(())
}

fn purge(config: &Config, args: &PurgeArgs) -> anyhow::Result<()> {
    use anyhow::Context;
    let plan = match args.older_than {
        Some(window) => Plan::older_than(window),
        None => Plan::from_config(config),
    };
    let mut conn = crate::db::connect(&config.database)?;
    let started = Instant::now();
    let hint = "is the schema there? run hookbox migrate";
    let (report, verb) = if args.dry_run {
        let report = retention::dry_run(&mut conn, &plan).context(hint)?;
        (report, "would remove")
    } else {
        let mut last_progress = Instant::now();
        let mut progress = |so_far: &retention::Report| {
            if last_progress.elapsed() >= Duration::from_secs(2) {
                eprintln!("purging: {} removed so far", so_far.total());
                last_progress = Instant::now();
            }
        };
        let pass =
            retention::purge_logged(&mut conn, &plan, &AtomicBool::new(false), &mut progress)
                .context(hint)?;
        let Some(report) = pass else {
            anyhow::bail!(
                "another hookbox is purging right now; nothing was removed (try again in a moment)"
            );
        };
        (report, "removed")
    };
    for (source, n) in &report.removed {
        println!("{verb} {n} from {source}");
    }
    println!(
        "{verb} {} in total ({} ms){}",
        report.total(),
        started.elapsed().as_millis(),
        if args.dry_run {
            "; dry run, nothing was deleted"
        } else {
            ""
        }
    );
    Ok(())
}
