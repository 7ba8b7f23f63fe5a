//! hookbox's integration tests: the real server on a real port against a real PostgreSQL,
//! one fresh database per test. Point `DATABASE_URL` at another server to run them there.

mod admin;
mod bad_config;
mod browser;
mod concurrency;
mod console;
mod downstream;
mod export;
mod forward;
mod handler_failures;
mod helpers;
mod intake;
mod ops;
mod outage;
mod proxy;
mod replay;
mod retention;
mod schemes;
mod send;
mod vectors;
mod webdriver;
