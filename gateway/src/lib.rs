//! The SandBase gateway: the public HTTP API.
//!
//! `startup::Application` builds and runs it; `config::Settings` is its configuration.
//! See ARCHITECTURE.md for the map.

pub mod accounts;
pub mod admin;
pub mod audit;
pub mod auth;
pub mod config;
pub mod credits;
pub mod error;
pub mod extract;
pub mod observe;
pub mod ratelimit;
pub mod request_id;
mod routes;
pub mod runs;
pub mod sandboxes;
pub mod startup;
pub mod state;
pub mod stripe;
pub mod templates;
#[cfg(feature = "testing")]
pub mod testing;
pub mod usage;
pub mod workers;

pub use config::Settings;
pub use startup::Application;
