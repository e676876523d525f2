//! Integration tests of the gateway over HTTP, against real PostgreSQL and Redis.

#![allow(clippy::unwrap_used)] // Tests panic on purpose when an expectation fails.

mod abuse;
mod accounts;
mod api_keys;
mod architecture;
mod audit;
mod bad_input;
mod billing;
mod dashboard;
mod egress;
mod egress_credentials;
mod egress_flood;
mod egress_readback;
mod flood;
mod helpers;
mod isolation;
mod key_cache;
mod key_lineage;
mod members;
mod node_hardening;
mod openapi;
mod operations;
mod pause;
mod previews;
mod rate_limit;
mod runs;
mod sandbox_attacks;
mod sandbox_credits;
mod sandbox_mounts;
mod sandboxes;
mod secrets;
mod sessions;
mod snapshots;
mod store;
mod store_budgets;
mod store_operator_secrets;
mod store_sandbox;
mod store_upstream;
mod stripe;
mod templates;
mod terminals;
mod testbed;
mod usage;
mod verification;
mod worker_credentials;
