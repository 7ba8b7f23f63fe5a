//! `hookbox serve` with a custom handler: Stripe payments booked into a ledger exactly once.
//!
//! Run it with a config that has a `[sources.stripe]`:
//!
//! ```text
//! cargo run --example payments_ledger -- hookbox.toml
//! ```

mod ledger;

use hookbox::{Application, Config, Handlers};

fn main() -> anyhow::Result<()> {
    hookbox::telemetry::init();
    let path = std::env::args().nth(1).map(std::path::PathBuf::from);
    let config = Config::load(path.as_deref(), &hookbox::config::ProcessEnv)?;
    actix_web::rt::System::new().block_on(async move {
        let handlers = Handlers::default().with("stripe", ledger::Ledger);
        Application::build(config, handlers)?
            .run_until_stopped()
            .await?;
        Ok(())
    })
}
