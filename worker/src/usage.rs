//! Usage samples: each hosted sandbox's cumulative wall time (since it was handed to its
//! team) and CPU time (from its cgroup's `cpu.stat`), numbered per sandbox. Samples wait in
//! an outbox until the gateway acknowledges them (it does once they are in PostgreSQL);
//! since counters are cumulative, the outbox keeps only the newest sample of a sandbox
//! (plus every last sample taken at destroy), so it stays as small as the node while the
//! gateway is away, and a resend is harmless.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use chrono::Utc;
use sandbase_api::internal::{NODE_TOKEN_HEADER, UsageEvent, UsageReport, UsageSample};
use uuid::Uuid;

/// Most samples in one report.
const REPORT_CHUNK: usize = 2000;
/// Most last samples kept while the gateway is unreachable (the oldest go first).
const MAX_LAST_SAMPLES: usize = 100_000;
/// Most events kept while the gateway is unreachable (the oldest go first).
const MAX_EVENTS: usize = 100_000;

/// The counters of one hosted sandbox.
pub struct Meter {
    cgroup: Option<CpuCounter>,
    started: Instant,
    cpu_base_usec: u64,
    seq: AtomicU64,
}

impl Meter {
    /// Starts counting now; `pid` is the sandbox's first process on the host (its cgroup is
    /// read from `/proc`). Without a CPU counter, CPU time reads as zero.
    pub fn start(pid: Option<u32>) -> Meter {
        let cgroup = pid.and_then(cgroup_of);
        let cpu_base_usec = cgroup.as_ref().and_then(cpu_usec).unwrap_or(0);
        Meter {
            cgroup,
            started: Instant::now(),
            cpu_base_usec,
            seq: AtomicU64::new(0),
        }
    }

    /// The next sample of sandbox `id`.
    pub fn sample(&self, id: Uuid, last: bool) -> UsageSample {
        let cpu = self
            .cgroup
            .as_ref()
            .and_then(cpu_usec)
            .map_or(0, |usec| usec.saturating_sub(self.cpu_base_usec));
        UsageSample {
            sandbox: id,
            seq: self.seq.fetch_add(1, Ordering::AcqRel) + 1,
            uptime_ms: self.started.elapsed().as_millis() as u64,
            cpu_usec: cpu,
            last,
            sampled_at: Utc::now(),
        }
    }
}

/// Where a process's CPU time is counted: a cgroup v2 directory (`cpu.stat`), or on a
/// host with v1 hierarchies its `cpuacct` directory (`cpuacct.usage`, nanoseconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CpuCounter {
    V2(PathBuf),
    V1(PathBuf),
}

/// The CPU counter of a host process, read from `/proc/PID/cgroup`.
pub fn cgroup_of(pid: u32) -> Option<CpuCounter> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let root = Path::new("/sys/fs/cgroup");
    if root.join("cgroup.controllers").exists() {
        let path = text.lines().find_map(|line| line.strip_prefix("0::"))?;
        return Some(CpuCounter::V2(root.join(path.trim_start_matches('/'))));
    }
    text.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        if !controllers.split(',').any(|c| c == "cpuacct") {
            return None;
        }
        [controllers, "cpuacct", "cpu,cpuacct"]
            .iter()
            .map(|mount| root.join(mount).join(path.trim_start_matches('/')))
            .find(|dir| dir.join("cpuacct.usage").exists())
            .map(CpuCounter::V1)
    })
}

/// CPU time used in a cgroup, in microseconds.
pub fn cpu_usec(counter: &CpuCounter) -> Option<u64> {
    match counter {
        CpuCounter::V2(dir) => {
            let text = std::fs::read_to_string(dir.join("cpu.stat")).ok()?;
            text.lines()
                .find_map(|line| line.strip_prefix("usage_usec "))
                .and_then(|value| value.trim().parse().ok())
        }
        CpuCounter::V1(dir) => std::fs::read_to_string(dir.join("cpuacct.usage"))
            .ok()?
            .trim()
            .parse::<u64>()
            .ok()
            .map(|nanoseconds| nanoseconds / 1000),
    }
}

/// Samples not yet acknowledged.
#[derive(Default)]
pub struct Outbox {
    state: Mutex<Pending>,
    pub wake: tokio::sync::Notify,
}

#[derive(Default)]
struct Pending {
    newest: HashMap<Uuid, UsageSample>,
    last: Vec<UsageSample>,
    events: VecDeque<UsageEvent>,
    audit: VecDeque<sandbase_api::internal::NodeAuditEvent>,
}

impl Outbox {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn push(&self, sample: UsageSample) {
        let mut pending = self.lock();
        if sample.last {
            pending.newest.remove(&sample.sandbox);
            if pending.last.len() >= MAX_LAST_SAMPLES {
                pending.last.remove(0);
            }
            pending.last.push(sample);
            drop(pending);
            self.wake.notify_one();
            return;
        }
        if pending
            .last
            .iter()
            .any(|last| last.sandbox == sample.sandbox)
        {
            return;
        }
        match pending.newest.get(&sample.sandbox) {
            Some(newer) if newer.seq >= sample.seq => {}
            _ => {
                pending.newest.insert(sample.sandbox, sample);
            }
        }
    }

    /// An event (egress bytes of a connection, …); the oldest go first when the gateway
    /// has been away for long.
    pub fn push_event(&self, event: UsageEvent) {
        let mut pending = self.lock();
        if pending.events.len() >= MAX_EVENTS {
            pending.events.pop_front();
        }
        pending.events.push_back(event);
    }

    fn take(&self) -> Vec<UsageSample> {
        let mut pending = self.lock();
        let mut samples: Vec<UsageSample> = pending.newest.drain().map(|(_, s)| s).collect();
        samples.append(&mut pending.last);
        samples
    }

    /// An audit event; past [`MAX_EVENTS`] waiting, the oldest go.
    pub fn push_audit(&self, event: sandbase_api::internal::NodeAuditEvent) {
        let mut pending = self.lock();
        if pending.audit.len() >= MAX_EVENTS {
            pending.audit.pop_front();
        }
        pending.audit.push_back(event);
    }

    fn take_audit(&self) -> Vec<sandbase_api::internal::NodeAuditEvent> {
        self.lock().audit.drain(..).collect()
    }

    fn put_back_audit(&self, audit: Vec<sandbase_api::internal::NodeAuditEvent>) {
        let mut pending = self.lock();
        for event in audit.into_iter().rev() {
            pending.audit.push_front(event);
        }
        while pending.audit.len() > MAX_EVENTS {
            pending.audit.pop_front();
        }
    }

    fn take_events(&self) -> Vec<UsageEvent> {
        self.lock().events.drain(..).collect()
    }

    fn put_back(&self, samples: Vec<UsageSample>) {
        for sample in samples {
            self.push(sample);
        }
    }

    fn put_back_events(&self, events: Vec<UsageEvent>) {
        let mut pending = self.lock();
        for event in events.into_iter().rev() {
            pending.events.push_front(event);
        }
        while pending.events.len() > MAX_EVENTS {
            pending.events.pop_front();
        }
    }

    pub fn len(&self) -> usize {
        let pending = self.lock();
        pending.newest.len() + pending.last.len() + pending.events.len() + pending.audit.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where and how reports go.
#[derive(Debug, Clone)]
pub struct Reporter {
    pub gateway_url: String,
    pub node_token: String,
    pub worker_id: String,
    pub interval: Duration,
}

impl Reporter {
    /// Sends everything in the outbox; what the gateway did not acknowledge goes back in.
    pub async fn flush(&self, client: &reqwest::Client, outbox: &Outbox) -> anyhow::Result<()> {
        let mut samples = outbox.take();
        while !samples.is_empty() {
            let rest = samples.split_off(samples.len().min(REPORT_CHUNK));
            let chunk = std::mem::replace(&mut samples, rest);
            if let Err(error) = self.send(client, &chunk, &[], &[]).await {
                outbox.put_back(chunk);
                outbox.put_back(samples);
                return Err(error);
            }
        }
        let mut events = outbox.take_events();
        while !events.is_empty() {
            let rest = events.split_off(events.len().min(REPORT_CHUNK));
            let chunk = std::mem::replace(&mut events, rest);
            if let Err(error) = self.send(client, &[], &chunk, &[]).await {
                events.splice(0..0, chunk);
                outbox.put_back_events(events);
                return Err(error);
            }
        }
        let mut audit = outbox.take_audit();
        while !audit.is_empty() {
            let rest = audit.split_off(audit.len().min(REPORT_CHUNK));
            let chunk = std::mem::replace(&mut audit, rest);
            if let Err(error) = self.send(client, &[], &[], &chunk).await {
                audit.splice(0..0, chunk);
                outbox.put_back_audit(audit);
                return Err(error);
            }
        }
        Ok(())
    }

    async fn send(
        &self,
        client: &reqwest::Client,
        samples: &[UsageSample],
        events: &[UsageEvent],
        audit: &[sandbase_api::internal::NodeAuditEvent],
    ) -> anyhow::Result<()> {
        let answer = client
            .post(format!("{}/internal/v1/usage", self.gateway_url))
            .header(NODE_TOKEN_HEADER, &self.node_token)
            .json(&UsageReport {
                worker: self.worker_id.clone(),
                samples: samples.to_vec(),
                events: events.to_vec(),
                audit: audit.to_vec(),
            })
            .send()
            .await
            .context("reporting usage")?;
        let status = answer.status();
        if status.is_client_error() && status != reqwest::StatusCode::UNAUTHORIZED {
            // A report the gateway refuses as invalid would be refused forever.
            let body = answer.text().await.unwrap_or_default();
            tracing::error!(%status, body, "the gateway refused usage samples; dropped");
            return Ok(());
        }
        anyhow::ensure!(status.is_success(), "the gateway refused usage: {status}");
        Ok(())
    }

    /// Samples every hosted sandbox each interval (and sends at once when a sandbox was
    /// destroyed) until `stop` resolves.
    pub async fn run(
        self,
        node: std::sync::Arc<crate::node::Node>,
        stop: impl std::future::Future<Output = ()>,
    ) {
        let client = match reqwest::Client::builder()
            .timeout(Duration::from_secs(15))
            .build()
        {
            Ok(client) => client,
            Err(error) => {
                tracing::error!(error = %error, "no HTTP client for usage reports");
                return;
            }
        };
        tokio::pin!(stop);
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = &mut stop => return,
                _ = tick.tick() => node.sample_all(),
                () = node.usage().wake.notified() => {}
            }
            if let Err(error) = self.flush(&client, node.usage()).await {
                tracing::warn!(
                    error = format!("{error:#}"),
                    pending = node.usage().len(),
                    "usage report failed; kept for the next"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(sandbox: Uuid, seq: u64, last: bool) -> UsageSample {
        UsageSample {
            sandbox,
            seq,
            uptime_ms: seq * 1000,
            cpu_usec: seq,
            last,
            sampled_at: Utc::now(),
        }
    }

    #[test]
    fn a_busy_process_s_cgroup_counts_cpu_time() {
        let counter = cgroup_of(std::process::id()).expect("a cgroup with a CPU counter");
        let before = cpu_usec(&counter).expect("readable");
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(cpu_usec(&counter).unwrap() >= before + 20_000);
    }

    #[test]
    fn the_outbox_keeps_the_newest_sample_and_every_last_one() {
        let outbox = Outbox::default();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        outbox.push(sample(a, 1, false));
        outbox.push(sample(a, 3, false));
        outbox.push(sample(a, 2, false));
        outbox.push(sample(b, 1, false));
        outbox.push(sample(b, 2, true));
        // A sample older than the last one does not come back.
        outbox.push(sample(b, 1, false));
        let mut taken = outbox.take();
        taken.sort_by_key(|s| (s.sandbox == b, s.seq));
        let seqs: Vec<(bool, u64, bool)> = taken
            .iter()
            .map(|s| (s.sandbox == a, s.seq, s.last))
            .collect();
        assert!(seqs.contains(&(true, 3, false)));
        assert!(seqs.contains(&(false, 2, true)));
        assert_eq!(seqs.len(), 2);
        assert!(outbox.is_empty());
        outbox.put_back(taken);
        assert_eq!(outbox.len(), 2);
    }
}
