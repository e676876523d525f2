//! The flow records the proxy reports, kept per sandbox (the last thousand), and what the
//! worker makes of what the proxy reports: `egress_bytes` usage from each sandbox's running
//! byte total (one event per sandbox per report interval, never one per connection, and
//! never dropped), and audit events for refusals (`sandbox.egress_denied`,
//! `sandbox.credential_leak_blocked`) folded by sandbox, action, host and mode with their
//! count, keyed so a resend adds nothing.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use sandbase_api::internal::{NodeAuditEvent, UsageEvent};
use sandbase_egress::proxy::{Decision, Flow};
use tokio::sync::mpsc;
use uuid::Uuid;

/// Flow records kept per sandbox.
const FLOWS_KEPT: usize = 1000;
/// Distinct refusals (host and mode) kept per sandbox between reports; the rest are
/// counted under host `*`.
const REFUSALS_PER_SANDBOX: usize = 100;

/// What a refusal is folded by: sandbox, action, host, mode.
type RefusalKey = (Uuid, &'static str, String, String);

#[derive(Default)]
pub(super) struct FlowBook {
    flows: Mutex<HashMap<String, VecDeque<Flow>>>,
    /// Each sandbox's running byte total as last reported by the proxy.
    totals: Mutex<HashMap<String, u64>>,
    /// Bytes not yet made usage, by sandbox.
    usage: Mutex<HashMap<Uuid, u64>>,
    /// Refusals not yet made audit events: the first one's details, and how many.
    refusals: Mutex<BTreeMap<RefusalKey, (NodeAuditEvent, u64)>>,
    /// Keys are `egress:<run>:<counter>`; the counter never repeats within a run.
    counter: Mutex<u64>,
    run: std::sync::OnceLock<u128>,
}

impl FlowBook {
    pub(super) async fn keep(self: Arc<Self>, mut receiver: mpsc::Receiver<Flow>) {
        while let Some(flow) = receiver.recv().await {
            self.record(flow);
        }
    }

    fn key(&self) -> String {
        let run = self.run.get_or_init(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|elapsed| elapsed.as_nanos())
                .unwrap_or_default()
        });
        let mut counter = lock(&self.counter);
        *counter += 1;
        format!("egress:{run}:{counter}")
    }

    /// A sandbox's running byte total from the proxy: what it adds since the last one is
    /// metered (a total below the last one is a new proxy process, counting from zero).
    pub(super) fn metered(&self, sandbox: &str, total: u64) {
        let mut totals = lock(&self.totals);
        let last = totals.insert(sandbox.to_owned(), total).unwrap_or(0);
        let added = if total >= last { total - last } else { total };
        drop(totals);
        if let (Ok(sandbox), true) = (sandbox.parse::<Uuid>(), added > 0) {
            *lock(&self.usage).entry(sandbox).or_default() += added;
        }
    }

    /// Forgets a removed sandbox's total (after its last report).
    pub(super) fn forget(&self, sandbox: &str) {
        lock(&self.totals).remove(sandbox);
    }

    fn record(&self, flow: Flow) {
        if let (Ok(sandbox), Decision::Denied(why)) = (flow.sandbox.parse::<Uuid>(), &flow.decision)
        {
            self.refused(sandbox, &flow, why);
        }
        let mut flows = lock(&self.flows);
        let list = flows.entry(flow.sandbox.clone()).or_default();
        if list.len() >= FLOWS_KEPT {
            list.pop_front();
        }
        list.push_back(flow);
    }

    fn refused(&self, sandbox: Uuid, flow: &Flow, why: &str) {
        let (action, mut details) = match &flow.leak {
            Some(credential) => (
                "sandbox.credential_leak_blocked",
                serde_json::json!({ "credential": credential }),
            ),
            None => ("sandbox.egress_denied", serde_json::json!({})),
        };
        let mut refusals = lock(&self.refusals);
        let distinct = refusals.keys().filter(|key| key.0 == sandbox).count();
        let host = if distinct >= REFUSALS_PER_SANDBOX {
            "*".to_owned()
        } else {
            flow.host.clone()
        };
        let key = (sandbox, action, host.clone(), flow.mode.clone());
        if let Some((_, count)) = refusals.get_mut(&key) {
            *count += 1;
            return;
        }
        details["host"] = host.into();
        details["port"] = flow.port.into();
        details["mode"] = flow.mode.clone().into();
        details["reason"] = why.into();
        let event = NodeAuditEvent {
            key: self.key(),
            sandbox,
            action: action.to_owned(),
            details,
            occurred_at: flow.started_at.into(),
        };
        refusals.insert(key, (event, 1));
    }

    /// One `egress_bytes` event per sandbox for what it moved since the last call.
    pub(super) fn take_usage(&self) -> Vec<UsageEvent> {
        let pending = std::mem::take(&mut *lock(&self.usage));
        pending
            .into_iter()
            .map(|(sandbox, bytes)| UsageEvent {
                key: self.key(),
                sandbox,
                kind: "egress_bytes".to_owned(),
                subject: String::new(),
                quantity: bytes,
                occurred_at: chrono::Utc::now(),
            })
            .collect()
    }

    /// The refusals since the last call, one event per sandbox, action, host and mode
    /// (`details.count`: how many).
    pub(super) fn take_audit(&self) -> Vec<NodeAuditEvent> {
        let refusals = std::mem::take(&mut *lock(&self.refusals));
        refusals
            .into_values()
            .map(|(mut event, count)| {
                event.details["count"] = count.into();
                event
            })
            .collect()
    }

    pub(super) fn flows(&self, sandbox: Uuid) -> Vec<Flow> {
        lock(&self.flows)
            .get(&sandbox.to_string())
            .map(|list| list.iter().cloned().collect())
            .unwrap_or_default()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn flow(sandbox: Uuid, host: &str, decision: Decision) -> Flow {
        Flow {
            sandbox: sandbox.to_string(),
            host: host.to_owned(),
            port: 443,
            mode: "connect".to_owned(),
            decision,
            intercepted: false,
            credentials: Vec::new(),
            leak: None,
            address: None,
            bytes_up: 10,
            bytes_down: 10,
            duration: Duration::ZERO,
            started_at: std::time::SystemTime::now(),
        }
    }

    #[test]
    fn bytes_are_metered_from_running_totals_and_refusals_folded() {
        let book = FlowBook::default();
        let (sandbox, other) = (Uuid::new_v4(), Uuid::new_v4());
        // Totals: the differences are metered, once, whatever repeats.
        for total in [100, 100, 250, 250] {
            book.metered(&sandbox.to_string(), total);
        }
        book.metered(&other.to_string(), 7);
        let mut usage = book.take_usage();
        usage.sort_by_key(|event| event.quantity);
        let amounts: Vec<(Uuid, u64)> = usage.iter().map(|e| (e.sandbox, e.quantity)).collect();
        assert_eq!(amounts, [(other, 7), (sandbox, 250)]);
        assert!(book.take_usage().is_empty());
        // A new proxy process counts from zero again.
        book.metered(&sandbox.to_string(), 30);
        assert_eq!(book.take_usage()[0].quantity, 30);
        // Flows themselves are never billed.
        book.record(flow(sandbox, "a.example.com", Decision::Allowed));
        assert!(book.take_usage().is_empty());

        // A flood of refusals: one event per host and mode, with its count; past the
        // distinct limit, the rest under `*`.
        for _ in 0..1000 {
            book.record(flow(
                sandbox,
                "denied.example.com",
                Decision::Denied("no".to_owned()),
            ));
        }
        for index in 0..(REFUSALS_PER_SANDBOX + 50) {
            book.record(flow(
                sandbox,
                &format!("{index}.example.com"),
                Decision::Denied("no".to_owned()),
            ));
        }
        let mut leak = flow(
            other,
            "evil.example.com",
            Decision::Denied("leak".to_owned()),
        );
        leak.leak = Some("github".to_owned());
        book.record(leak);
        let audit = book.take_audit();
        assert_eq!(audit.len(), REFUSALS_PER_SANDBOX + 2);
        let denied = audit
            .iter()
            .find(|event| event.details["host"] == "denied.example.com")
            .expect("folded");
        assert_eq!(denied.details["count"], 1000);
        let rest = audit
            .iter()
            .find(|event| event.details["host"] == "*")
            .expect("the rest");
        assert_eq!(rest.details["count"], 51);
        let leaked = audit
            .iter()
            .find(|event| event.action == "sandbox.credential_leak_blocked")
            .expect("the other sandbox's leak is kept");
        assert_eq!(leaked.details["credential"], "github");
        let mut keys: Vec<&str> = audit.iter().map(|e| e.key.as_str()).collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), audit.len());
        for _ in 0..FLOWS_KEPT + 5 {
            book.record(flow(sandbox, "a.example.com", Decision::Allowed));
        }
        assert_eq!(book.flows(sandbox).len(), FLOWS_KEPT);
    }
}
