//! Usage in (`ingest`), charges out (`charge`). Workers report samples (a sandbox's cumulative wall and CPU time,
//! numbered per sandbox) and events (egress bytes, API calls, model tokens); the gateway
//! acknowledges a report only once it is written to PostgreSQL. A charger turns what was
//! written into ledger debits in batches: a sandbox is charged for how far its highest
//! counters moved past what was charged before (so a resent or late sample adds nothing),
//! events at the price table's price. Each charged row names the debit that charged it and
//! each debit names its usage, so every charge is traceable both ways.

pub mod charge;
pub mod ingest;
