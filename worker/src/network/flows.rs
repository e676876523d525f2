//! The flow records the proxy reports, kept per sandbox (the last thousand), and what the
//! worker makes of them: `egress_bytes` usage for allowed connections, audit events for
//! refusals (`sandbox.egress_denied`, `sandbox.credential_leak_blocked`), keyed so a resend
//! adds nothing.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use sandbase_api::internal::{NodeAuditEvent, UsageEvent};
use sandbase_egress::proxy::{Decision, Flow};
use tokio::sync::mpsc;
use uuid::Uuid;

/// Flow records kept per sandbox.
const FLOWS_KEPT: usize = 1000;
/// Refusals kept for the audit log while they wait to be reported.
const AUDIT_KEPT: usize = 10_000;

#[derive(Default)]
pub(super) struct FlowBook {
    flows: Mutex<HashMap<String, VecDeque<Flow>>>,
    /// Bytes of allowed connections, waiting to be reported as `egress_bytes` usage.
    usage: Mutex<Vec<UsageEvent>>,
    /// Refusals waiting to go to the audit log.
    audit: Mutex<Vec<NodeAuditEvent>>,
}

impl FlowBook {
    /// Records every flow the proxy reports until it stops reporting.
    pub(super) async fn keep(self: Arc<Self>, mut receiver: mpsc::Receiver<Flow>) {
        // Event keys: unique per worker run (its start time) and connection.
        let run = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|elapsed| elapsed.as_nanos())
            .unwrap_or_default();
        let mut counter = 0u64;
        while let Some(flow) = receiver.recv().await {
            self.record(flow, &format!("egress:{run}"), &mut counter);
        }
    }

    /// One flow: its audit event (a refusal), its usage (bytes moved), and the record.
    fn record(&self, flow: Flow, key_prefix: &str, counter: &mut u64) {
        if let (Ok(sandbox), Decision::Denied(why)) = (flow.sandbox.parse::<Uuid>(), &flow.decision)
        {
            *counter += 1;
            let (action, mut details) = match &flow.leak {
                Some(credential) => (
                    "sandbox.credential_leak_blocked",
                    serde_json::json!({ "credential": credential }),
                ),
                None => ("sandbox.egress_denied", serde_json::json!({})),
            };
            details["host"] = flow.host.clone().into();
            details["port"] = flow.port.into();
            details["mode"] = flow.mode.clone().into();
            details["reason"] = why.clone().into();
            let mut audit = lock(&self.audit);
            if audit.len() < AUDIT_KEPT {
                audit.push(NodeAuditEvent {
                    key: format!("{key_prefix}:{counter}"),
                    sandbox,
                    action: action.to_owned(),
                    details,
                    occurred_at: flow.started_at.into(),
                });
            }
        }
        let bytes = flow.bytes_up + flow.bytes_down;
        if let (Ok(sandbox), true) = (flow.sandbox.parse::<Uuid>(), bytes > 0) {
            *counter += 1;
            lock(&self.usage).push(UsageEvent {
                key: format!("{key_prefix}:{counter}"),
                sandbox,
                kind: "egress_bytes".to_owned(),
                subject: String::new(),
                quantity: bytes,
                occurred_at: flow.started_at.into(),
            });
        }
        let mut flows = lock(&self.flows);
        let list = flows.entry(flow.sandbox.clone()).or_default();
        if list.len() >= FLOWS_KEPT {
            list.pop_front();
        }
        list.push_back(flow);
    }

    pub(super) fn take_usage(&self) -> Vec<UsageEvent> {
        std::mem::take(&mut *lock(&self.usage))
    }

    pub(super) fn take_audit(&self) -> Vec<NodeAuditEvent> {
        std::mem::take(&mut *lock(&self.audit))
    }

    /// A sandbox's recent connections, oldest first.
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

    fn flow(sandbox: Uuid, decision: Decision, bytes: u64) -> Flow {
        Flow {
            sandbox: sandbox.to_string(),
            host: "api.example.com".to_owned(),
            port: 443,
            mode: "connect".to_owned(),
            decision,
            intercepted: false,
            credentials: Vec::new(),
            leak: None,
            address: None,
            bytes_up: bytes,
            bytes_down: bytes,
            duration: Duration::ZERO,
            started_at: std::time::SystemTime::now(),
        }
    }

    #[test]
    fn refusals_are_audited_bytes_are_metered_and_records_are_bounded() {
        let book = FlowBook::default();
        let sandbox = Uuid::new_v4();
        let mut counter = 0;
        book.record(
            flow(sandbox, Decision::Denied("no".to_owned()), 0),
            "egress:1",
            &mut counter,
        );
        let mut leak = flow(sandbox, Decision::Denied("leak".to_owned()), 0);
        leak.leak = Some("github".to_owned());
        book.record(leak, "egress:1", &mut counter);
        book.record(
            flow(sandbox, Decision::Allowed, 10),
            "egress:1",
            &mut counter,
        );
        let audit = book.take_audit();
        let actions: Vec<&str> = audit.iter().map(|event| event.action.as_str()).collect();
        assert_eq!(
            actions,
            ["sandbox.egress_denied", "sandbox.credential_leak_blocked"]
        );
        assert_eq!(audit[1].details["credential"], "github");
        let usage = book.take_usage();
        assert_eq!(usage.len(), 1);
        assert_eq!(
            (usage[0].kind.as_str(), usage[0].quantity),
            ("egress_bytes", 20)
        );
        // Keys never repeat within a run.
        let mut keys: Vec<&str> = audit
            .iter()
            .map(|e| e.key.as_str())
            .chain(usage.iter().map(|e| e.key.as_str()))
            .collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), 3);
        assert!(book.take_audit().is_empty() && book.take_usage().is_empty());
        for _ in 0..FLOWS_KEPT + 5 {
            book.record(
                flow(sandbox, Decision::Allowed, 0),
                "egress:1",
                &mut counter,
            );
        }
        assert_eq!(book.flows(sandbox).len(), FLOWS_KEPT);
        // Flows of something that is not a sandbox id are kept but neither billed nor audited.
        let mut other = flow(sandbox, Decision::Denied("no".to_owned()), 5);
        other.sandbox = "not-a-sandbox".to_owned();
        book.record(other, "egress:1", &mut counter);
        assert!(book.take_audit().is_empty() && book.take_usage().is_empty());
    }
}
