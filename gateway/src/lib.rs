//! The SandBase gateway: the public HTTP API.
//!
//! `startup::Application` builds and runs it; `config::Settings` is its configuration.
//! `http` is the only module that knows HTTP; the others are the domain it serves. See
//! ARCHITECTURE.md for the map.
//!
//! The crate's surface is this file: the configuration, the application, and the few
//! operator actions the CLI runs against the database directly. Every other module is the
//! crate's own, so the compiler reports what nothing uses.

pub mod config;
pub mod operator;
#[cfg(feature = "testing")]
pub mod testing;

mod accounts;
mod admin;
mod audit;
mod auth;
mod credits;
mod error;
mod failed_auth;
mod harness;
mod http;
mod invitations;
mod ip_guard;
mod jobs;
mod keys;
mod mail;
mod outbound;
mod ratelimit;
mod runs;
mod sandboxes;
mod secrets;
mod startup;
mod state;
mod store;
mod stripe;
mod teams;
mod templates;
mod text_enum;
mod usage;
mod verification;
mod workers;

pub use config::Settings;
pub use http::openapi_document;
pub use startup::{Application, connect_database, connect_redis, migrate};
