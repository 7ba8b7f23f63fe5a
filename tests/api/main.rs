//! hookbox's integration tests: the real server on a real port against a real PostgreSQL,
//! one fresh database per test. Point `DATABASE_URL` at another server to run them there.

mod admin;
mod bad_config;
mod browser;
mod cluster;
mod concurrency;
mod console;
mod dead_connections;
mod dedupe;
mod downstream;
mod export;
mod faults;
mod forward;
mod fuzz;
mod handler_failures;
mod helpers;
mod hostile;
mod in_flight;
mod intake;
mod ops;
mod outage;
mod own_provider;
mod provider;
mod provider_vectors;
mod proxy;
mod raw;
mod redaction;
mod replay;
mod retention;
mod schemes;
mod security;
mod send;
mod storable;
mod stores;
mod vectors;
mod webdriver;
