//! The SandBase gateway: the public HTTP API.
//!
//! `startup::Application` builds and runs it; `config::Settings` is its configuration.
//! `http` is the only module that knows HTTP; the others are the domain it serves. See
//! ARCHITECTURE.md for the map.

pub mod accounts;
pub mod admin;
pub mod audit;
pub mod auth;
pub mod config;
pub mod credits;
pub mod error;
pub mod failed_auth;
pub mod http;
pub mod invitations;
pub mod ip_guard;
pub mod jobs;
pub mod keys;
pub mod mail;
pub mod ratelimit;
pub mod runs;
pub mod sandboxes;
pub mod secrets;
pub mod startup;
pub mod state;
pub mod store;
pub mod stripe;
pub mod teams;
pub mod templates;
#[cfg(feature = "testing")]
pub mod testing;
mod text_enum;
pub mod usage;
pub mod verification;
pub mod workers;

pub use config::Settings;
pub use startup::Application;
