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
use std::time::Instant;

use chrono::Utc;
use sandbase_api::internal::{UsageEvent, UsageSample};
use uuid::Uuid;

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
    /// Time spent paused before the current pause, and when the current one began.
    paused: Mutex<(u64, Option<Instant>)>,
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
            paused: Mutex::new((0, None)),
        }
    }

    /// The sandbox was frozen now (its wall time from here is charged as paused).
    pub fn paused(&self) {
        let mut paused = self.paused.lock().unwrap_or_else(|e| e.into_inner());
        paused.1.get_or_insert_with(Instant::now);
    }

    /// The sandbox was thawed now.
    pub fn resumed(&self) {
        let mut paused = self.paused.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(since) = paused.1.take() {
            paused.0 += since.elapsed().as_millis() as u64;
        }
    }

    /// Milliseconds spent paused so far, the current pause included.
    fn paused_ms(&self) -> u64 {
        let paused = self.paused.lock().unwrap_or_else(|e| e.into_inner());
        paused.0
            + paused
                .1
                .map_or(0, |since| since.elapsed().as_millis() as u64)
    }

    /// The next sample of sandbox `id`.
    pub fn sample(&self, id: Uuid, last: bool) -> UsageSample {
        let cpu = self
            .cgroup
            .as_ref()
            .and_then(cpu_usec)
            .map_or(0, |usec| usec.saturating_sub(self.cpu_base_usec));
        // Paused time first, so it never exceeds the wall time read after it.
        let paused_ms = self.paused_ms();
        UsageSample {
            sandbox: id,
            seq: self.seq.fetch_add(1, Ordering::AcqRel) + 1,
            uptime_ms: self.started.elapsed().as_millis() as u64,
            cpu_usec: cpu,
            paused_ms,
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

    /// A billable event (a sandbox's egress bytes of an interval, …). None is ever dropped:
    /// producers hold theirs back while [`Outbox::has_room_for_events`] says no (they fold
    /// what waits, so waiting costs no memory per event).
    pub fn push_event(&self, event: UsageEvent) {
        self.lock().events.push_back(event);
    }

    /// Whether producers may hand over more events (fewer than [`MAX_EVENTS`] wait).
    pub fn has_room_for_events(&self) -> bool {
        self.lock().events.len() < MAX_EVENTS
    }

    pub fn take(&self) -> Vec<UsageSample> {
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

    pub fn take_audit(&self) -> Vec<sandbase_api::internal::NodeAuditEvent> {
        self.lock().audit.drain(..).collect()
    }

    pub fn put_back_audit(&self, audit: Vec<sandbase_api::internal::NodeAuditEvent>) {
        let mut pending = self.lock();
        for event in audit.into_iter().rev() {
            pending.audit.push_front(event);
        }
        while pending.audit.len() > MAX_EVENTS {
            pending.audit.pop_front();
        }
    }

    pub fn take_events(&self) -> Vec<UsageEvent> {
        self.lock().events.drain(..).collect()
    }

    pub fn put_back(&self, samples: Vec<UsageSample>) {
        for sample in samples {
            self.push(sample);
        }
    }

    pub fn put_back_events(&self, events: Vec<UsageEvent>) {
        let mut pending = self.lock();
        for event in events.into_iter().rev() {
            pending.events.push_front(event);
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

/// Bytes preview connections carried, by sandbox, until they are made usage events.
#[derive(Default)]
pub struct PreviewMeter {
    bytes: Mutex<HashMap<Uuid, u64>>,
    counter: Mutex<u64>,
    run: std::sync::OnceLock<u128>,
}

impl PreviewMeter {
    pub fn add(&self, sandbox: Uuid, bytes: u64) {
        if bytes > 0 {
            *unpoisoned(&self.bytes).entry(sandbox).or_default() += bytes;
        }
    }

    /// One `egress_bytes` event per sandbox for what its previews carried since the last
    /// call; keys never repeat within this worker's run.
    pub fn take_usage(&self) -> Vec<UsageEvent> {
        let pending = std::mem::take(&mut *unpoisoned(&self.bytes));
        let run = *self.run.get_or_init(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|elapsed| elapsed.as_nanos())
                .unwrap_or_default()
        });
        pending
            .into_iter()
            .map(|(sandbox, bytes)| {
                let mut counter = unpoisoned(&self.counter);
                *counter += 1;
                UsageEvent {
                    key: format!("preview:{run}:{counter}"),
                    sandbox,
                    kind: "egress_bytes".to_owned(),
                    subject: String::new(),
                    quantity: bytes,
                    occurred_at: chrono::Utc::now(),
                }
            })
            .collect()
    }
}

fn unpoisoned<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
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
            paused_ms: 0,
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
        while start.elapsed() < std::time::Duration::from_millis(50) {
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

    #[test]
    fn preview_bytes_become_one_event_per_sandbox_with_fresh_keys() {
        let meter = PreviewMeter::default();
        let (a, b) = (Uuid::now_v7(), Uuid::now_v7());
        meter.add(a, 10);
        meter.add(a, 5);
        meter.add(b, 7);
        meter.add(b, 0);
        let mut events = meter.take_usage();
        events.sort_by_key(|event| event.quantity);
        assert_eq!(events.len(), 2);
        assert_eq!((events[0].sandbox, events[0].quantity), (b, 7));
        assert_eq!((events[1].sandbox, events[1].quantity), (a, 15));
        assert!(events.iter().all(|event| event.kind == "egress_bytes"));
        assert_ne!(events[0].key, events[1].key);
        assert!(meter.take_usage().is_empty());
        meter.add(a, 1);
        let later = meter.take_usage();
        assert!(!events.iter().any(|event| event.key == later[0].key));
    }
}
