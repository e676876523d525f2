//! Credits, as a double-entry ledger in PostgreSQL.
//!
//! Money is an integer number of micro-credits ([`Credits`]), never a float. Every change is
//! a ledger transaction whose entries sum to zero (a deferred constraint trigger refuses any
//! that does not), with an idempotency key so a retried grant or charge is booked once.
//! Grants (starter, purchase, admin) carry a priority, an effective time and an expiry; a
//! debit burns them in order (priority, earliest expiry, oldest) and its entries name the
//! grants drawn from; what a team spends beyond its grants is an overdraft entry. Expiry
//! moves what is left of a grant to the breakage account. `grants.remaining` is a
//! projection of the entries, which [`reconcile`] recomputes and compares.

pub mod ledger;
mod money;

pub use ledger::{
    Balance, Debit, DebitOutcome, GrantSource, GrantView, LedgerEntryView, LedgerTransactionView,
    Mismatch, NewGrant, balance, debit, expire_grants, grant, reconcile, transactions,
};
pub use money::{Credits, MICRO_PER_CREDIT};
