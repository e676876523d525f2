//! The egress proxy process and its supervisor: orders go in on its standard input, flow
//! records and its log come out; when it dies another is started and every registration
//! sent again.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use sandbase_egress::process::{Envelope, Order, ProcessConfig, Registration, Report};
use sandbase_egress::proxy::Flow;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _};
use tokio::process::Command;
use tokio::sync::{mpsc, oneshot};
use zeroize::Zeroizing;

/// A running proxy process: its orders go in, its reports come out.
pub(super) struct ProxyProcess {
    child: tokio::process::Child,
    input: tokio::process::ChildStdin,
    output: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    pub(super) pid: u32,
}

impl ProxyProcess {
    /// Starts one and waits until it listens.
    pub(super) async fn start(
        program: &std::path::Path,
        config: &ProcessConfig,
    ) -> anyhow::Result<Self> {
        let mut child = Command::new(program)
            .arg("egress-proxy")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting the egress proxy ({})", program.display()))?;
        if let Some(log) = child.stderr.take() {
            tokio::spawn(relay_log(log));
        }
        let mut input = child.stdin.take().context("the proxy's standard input")?;
        let output = child.stdout.take().context("the proxy's standard output")?;
        let mut line = serde_json::to_vec(config)?;
        line.push(b'\n');
        input.write_all(&line).await?;
        input.flush().await?;
        let mut output = tokio::io::BufReader::new(output).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), output.next_line()).await;
        match first {
            Ok(Ok(Some(line))) => match serde_json::from_str::<Report>(&line) {
                Ok(Report::Ready { pid }) => Ok(ProxyProcess {
                    child,
                    input,
                    output,
                    pid,
                }),
                _ => anyhow::bail!("the egress proxy said something unexpected: {line}"),
            },
            _ => {
                let _ = child.start_kill();
                let status = child.wait().await.ok();
                anyhow::bail!(
                    "the egress proxy did not start (exit: {})",
                    status.map(|status| status.to_string()).unwrap_or_default()
                )
            }
        }
    }

    async fn send(&mut self, envelope: &Envelope) -> std::io::Result<()> {
        // The line may hold credential values: zeroed once written.
        let mut line = Zeroizing::new(serde_json::to_vec(envelope).map_err(std::io::Error::other)?);
        line.push(b'\n');
        self.input.write_all(&line).await?;
        self.input.flush().await
    }
}

/// The proxy's log lines (`LEVEL target: message fields`), logged as the worker's own under
/// the `egress_proxy` target, until the process closes its standard error.
async fn relay_log(log: tokio::process::ChildStderr) {
    let mut lines = tokio::io::BufReader::new(log).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let line = line.trim_start();
        let (level, rest) = line.split_once(' ').unwrap_or(("", line));
        let rest = rest.trim_start();
        match level {
            "ERROR" => tracing::error!(target: "egress_proxy", "{rest}"),
            "WARN" => tracing::warn!(target: "egress_proxy", "{rest}"),
            "INFO" => tracing::info!(target: "egress_proxy", "{rest}"),
            "DEBUG" => tracing::debug!(target: "egress_proxy", "{rest}"),
            "TRACE" => tracing::trace!(target: "egress_proxy", "{rest}"),
            // Not the proxy's logger (a panic, the C library): worth a look.
            _ => tracing::warn!(target: "egress_proxy", "{line}"),
        }
    }
}

/// Keeps a proxy process running and in step with the registrations.
pub(super) struct Supervisor {
    pub(super) program: PathBuf,
    pub(super) process: ProcessConfig,
    pub(super) restart_delay: Duration,
    pub(super) registrations: Arc<Mutex<HashMap<IpAddr, Registration>>>,
    pub(super) orders: mpsc::UnboundedReceiver<(Envelope, Option<oneshot::Sender<()>>)>,
    pub(super) flows: mpsc::Sender<Flow>,
    /// Where running byte totals go (straight, never through the flow channel, which may
    /// drop records when full).
    pub(super) book: Arc<super::flows::FlowBook>,
    pub(super) pid: Arc<AtomicU32>,
}

impl Supervisor {
    /// Until the network is dropped (its order queue closes).
    pub(super) async fn run(mut self, first: ProxyProcess) {
        let mut running = Some(first);
        loop {
            let mut process = match running.take() {
                Some(process) => process,
                None => match ProxyProcess::start(&self.program, &self.process).await {
                    Ok(mut process) => {
                        if self.replay(&mut process).await.is_err() {
                            self.pause().await;
                            continue;
                        }
                        tracing::info!(pid = process.pid, "the egress proxy is back");
                        process
                    }
                    Err(error) => {
                        tracing::error!(
                            error = format!("{error:#}"),
                            "restarting the egress proxy"
                        );
                        if self.pause().await {
                            return;
                        }
                        continue;
                    }
                },
            };
            self.pid.store(process.pid, Ordering::Relaxed);
            let mut waiting: HashMap<u64, oneshot::Sender<()>> = HashMap::new();
            loop {
                tokio::select! {
                    order = self.orders.recv() => {
                        let Some((envelope, done)) = order else {
                            // The network is gone: so is its proxy (killed on drop).
                            self.pid.store(0, Ordering::Relaxed);
                            return;
                        };
                        if process.send(&envelope).await.is_err() {
                            break;
                        }
                        if let Some(done) = done {
                            waiting.insert(envelope.id, done);
                        }
                    }
                    line = process.output.next_line() => {
                        let Ok(Some(line)) = line else { break };
                        match serde_json::from_str::<Report>(&line) {
                            Ok(Report::Done { id }) => {
                                if let Some(done) = waiting.remove(&id) {
                                    let _ = done.send(());
                                }
                            }
                            Ok(Report::Flow { flow }) => {
                                let _ = self.flows.try_send(*flow);
                            }
                            Ok(Report::Metered { sandbox, bytes }) => {
                                self.book.metered(&sandbox, bytes);
                            }
                            Ok(Report::Ready { .. }) | Err(_) => {}
                        }
                    }
                }
            }
            self.pid.store(0, Ordering::Relaxed);
            let _ = process.child.start_kill();
            let status = process.child.wait().await;
            tracing::error!(
                status = ?status,
                "the egress proxy exited: sandboxes reach nothing until another one runs"
            );
            if self.pause().await {
                return;
            }
        }
    }

    /// Everything registered, to a new process.
    async fn replay(&self, process: &mut ProxyProcess) -> std::io::Result<()> {
        let registrations: Vec<Registration> = self
            .registrations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for registration in registrations {
            let envelope = Envelope {
                id: 0,
                order: Order::Add(Box::new(registration)),
            };
            process.send(&envelope).await?;
        }
        Ok(())
    }

    /// Waits out the restart delay; `true` when the network is gone meanwhile.
    async fn pause(&self) -> bool {
        tokio::time::sleep(self.restart_delay).await;
        self.orders.is_closed()
    }
}
