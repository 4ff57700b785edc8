//! Starts `iota-p2p` node processes on this machine and watches them through `/status`.
//!
//! Used by `local-swarm` and by the multi-node tests. By default every node listens on
//! 127.0.0.1 (TCP and QUIC) with OS-chosen ports and serves its metrics on 127.0.0.1 too; the
//! launcher learns both from the `LISTEN` and `METRICS` lines the node prints. Every wait is
//! bounded by a deadline, and a dropped [`NodeProcess`] kills its process.
//!
//! A node can also run in a network namespace ([`NodeSpec::netns`]), as
//! `ip netns exec <namespace> <binary> …`, listening where [`NodeSpec::listen`] says. `ip`
//! execs the binary in place, so the process the launcher holds (and signals, and kills) is
//! the node itself. Its metrics address is still 127.0.0.1, that namespace's own loopback, so
//! [`NodeProcess::status`] and [`NodeProcess::metrics`] ask from a fresh thread that enters
//! the namespace first.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::time::Instant;

/// Where a node listens unless its [`NodeSpec`] says otherwise: TCP and QUIC on 127.0.0.1,
/// ports chosen by the OS.
pub const LOOPBACK_LISTEN: &str = "/ip4/127.0.0.1/tcp/0,/ip4/127.0.0.1/udp/0/quic-v1";

/// What to start: a name for logs, and the node's flags (besides `--listen`, `--metrics`).
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// Short name used in messages and the log file name.
    pub name: String,
    /// Flags passed to the binary, e.g. `--data-dir`, `--bootstrap`, `--validator`.
    pub args: Vec<String>,
    /// File the node's stderr (its log) is written to.
    pub log: PathBuf,
    /// Network namespace (a name under /var/run/netns) to run the node in, through
    /// `ip netns exec`; `None` runs it in this process's namespace.
    pub netns: Option<String>,
    /// The `--listen` multiaddrs (comma-separated); `None` is TCP and QUIC on 127.0.0.1
    /// ([`LOOPBACK_LISTEN`]), as the node's own default.
    pub listen: Option<String>,
}

/// What a node printed on start.
#[derive(Debug, Clone, Default)]
struct Announced {
    listen: Vec<String>,
    metrics: Option<String>,
    /// Every line of stdout, kept for callers that look for `RESULT` lines and the like.
    lines: Vec<String>,
}

/// A running node process.
#[derive(Debug)]
pub struct NodeProcess {
    /// Name given in the [`NodeSpec`].
    pub name: String,
    child: Child,
    announced: watch::Receiver<Announced>,
    log: PathBuf,
    /// The network namespace it runs in, when not this process's.
    netns: Option<String>,
}

impl NodeProcess {
    /// Starts `binary` with `spec` and waits (up to `ready_timeout`) until it prints its
    /// listen address and metrics address.
    pub async fn spawn(
        binary: &Path,
        spec: NodeSpec,
        ready_timeout: Duration,
    ) -> anyhow::Result<Self> {
        let log = std::fs::File::create(&spec.log)
            .with_context(|| format!("creating {}", spec.log.display()))?;
        let mut command = match &spec.netns {
            // `ip netns exec` enters the namespace and execs the binary (same pid).
            Some(ns) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", ns.as_str()]).arg(binary);
                command
            }
            None => Command::new(binary),
        };
        let listen = spec.listen.as_deref().unwrap_or(LOOPBACK_LISTEN);
        let mut child = command
            .args(&spec.args)
            .args(["--listen", listen, "--metrics", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow!("{}: no stdout", spec.name))?;
        let (tx, announced) = watch::channel(Announced::default());
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tx.send_modify(|a| {
                    if let Some(addr) = line.strip_prefix("LISTEN ") {
                        a.listen.push(addr.trim().to_string());
                    } else if let Some(url) = line.strip_prefix("METRICS ") {
                        a.metrics = Some(url.trim().to_string());
                    }
                    a.lines.push(line);
                });
            }
        });
        let mut node = NodeProcess {
            name: spec.name,
            child,
            announced,
            log: spec.log,
            netns: spec.netns,
        };
        let deadline = Instant::now() + ready_timeout;
        loop {
            {
                let a = node.announced.borrow();
                if !a.listen.is_empty() && a.metrics.is_some() {
                    break;
                }
            }
            if let Some(status) = node.child.try_wait()? {
                bail!(
                    "{} exited with {status} before it was ready; log: {}",
                    node.name,
                    node.log.display()
                );
            }
            if Instant::now() >= deadline {
                bail!(
                    "{} printed no LISTEN/METRICS lines within {ready_timeout:?}; log: {}",
                    node.name,
                    node.log.display()
                );
            }
            let _ =
                tokio::time::timeout(Duration::from_millis(200), node.announced.changed()).await;
        }
        Ok(node)
    }

    /// The first address the node listens on, ending in `/p2p/<peer id>`.
    pub fn listen_addr(&self) -> String {
        self.announced
            .borrow()
            .listen
            .first()
            .cloned()
            .unwrap_or_default()
    }

    /// Base URL of the node's HTTP server.
    pub fn metrics_url(&self) -> String {
        self.announced.borrow().metrics.clone().unwrap_or_default()
    }

    /// Lines the node has printed on stdout so far.
    pub fn stdout_lines(&self) -> Vec<String> {
        self.announced.borrow().lines.clone()
    }

    /// Path of the node's log.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// OS process id, while the process runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// The network namespace the node runs in, when it was given one.
    pub fn netns(&self) -> Option<&str> {
        self.netns.as_deref()
    }

    /// `GET path` from the node's HTTP server, from inside its namespace when it has one.
    async fn get(&self, path: &str) -> anyhow::Result<String> {
        let url = format!("{}{path}", self.metrics_url());
        match &self.netns {
            Some(ns) => http_get_in(ns.clone(), url).await,
            None => http_get(url).await,
        }
    }

    /// `GET /status` as JSON.
    pub async fn status(&self) -> anyhow::Result<serde_json::Value> {
        let body = self.get("/status").await?;
        serde_json::from_str(&body).with_context(|| format!("{}: /status is not JSON", self.name))
    }

    /// `GET /metrics` as Prometheus text.
    pub async fn metrics(&self) -> anyhow::Result<String> {
        self.get("/metrics").await
    }

    /// Whether the process has exited (and with what).
    pub fn try_exit_status(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        Ok(self.child.try_wait()?)
    }

    /// Sends SIGTERM and waits up to `grace` for a clean exit; kills it after that.
    pub async fn stop(mut self, grace: Duration) -> anyhow::Result<ExitStatus> {
        if let Some(pid) = self.child.id() {
            terminate(pid);
        }
        match tokio::time::timeout(grace, self.child.wait()).await {
            Ok(status) => Ok(status?),
            Err(_) => {
                self.child.start_kill()?;
                let status = self.child.wait().await?;
                bail!(
                    "{} did not stop within {grace:?} of SIGTERM and was killed ({status})",
                    self.name
                )
            }
        }
    }

    /// Kills the process at once (SIGKILL), as a crash would.
    pub async fn kill(mut self) -> anyhow::Result<()> {
        self.child.start_kill()?;
        self.child.wait().await?;
        Ok(())
    }
}

/// What a validator's epoch table (`/status` `epochs`) says of a run's first `epochs`
/// epochs, summed as `local-swarm`'s report sums them.
#[derive(Debug, Clone, Copy)]
pub struct EpochTotals {
    /// Tokens, samples and dropped samples of those epochs.
    pub tokens: u64,
    /// Samples processed.
    pub samples: u64,
    /// Samples dropped.
    pub dropped: u64,
    /// Seconds from the first to the last loss record the validator heard in them.
    pub span: f64,
    /// `tokens / span`.
    pub tokens_per_s: f64,
    /// The earliest and the latest held-out loss reported (epoch, nats), up to epoch
    /// `epochs` (its opening evaluation is the last trained epoch's result).
    pub val_start: (u64, f64),
    /// See `val_start`.
    pub val_end: (u64, f64),
}

/// The epoch of a row of the epoch table; `u64::MAX` when it has none.
pub fn epoch_of(row: &serde_json::Value) -> u64 {
    row["epoch"].as_u64().unwrap_or(u64::MAX)
}

/// Sums up the first `epochs` epochs of a validator's epoch table; an error when the
/// validator heard no span of loss records or no held-out loss in them.
pub fn epoch_totals(rows: &[serde_json::Value], epochs: u64) -> anyhow::Result<EpochTotals> {
    let num = |row: &serde_json::Value, key: &str| row[key].as_f64();
    let trained: Vec<&serde_json::Value> = rows.iter().filter(|r| epoch_of(r) < epochs).collect();
    let sum = |key: &str| -> u64 { trained.iter().filter_map(|r| r[key].as_u64()).sum() };
    let (tokens, samples, dropped) = (sum("tokens"), sum("samples"), sum("dropped"));
    let first = trained
        .iter()
        .filter_map(|r| num(r, "first_record_s"))
        .fold(f64::INFINITY, f64::min);
    let last = trained
        .iter()
        .filter_map(|r| num(r, "last_record_s"))
        .fold(0.0, f64::max);
    if last <= first {
        bail!("the validator heard no span of loss records ({samples} samples)");
    }
    let measured: Vec<(u64, f64)> = rows
        .iter()
        .filter(|r| epoch_of(r) <= epochs)
        .filter_map(|r| Some((epoch_of(r), num(r, "val_loss").filter(|l| l.is_finite())?)))
        .collect();
    let val_start = measured.iter().min_by_key(|(e, _)| *e).copied();
    let val_end = measured.iter().max_by_key(|(e, _)| *e).copied();
    let (Some(val_start), Some(val_end)) = (val_start, val_end) else {
        bail!("no held-out loss was reported in {epochs} epochs");
    };
    Ok(EpochTotals {
        tokens,
        samples,
        dropped,
        span: last - first,
        tokens_per_s: tokens as f64 / (last - first),
        val_start,
        val_end,
    })
}

/// SIGINT, SIGTERM and SIGHUP, caught from when [`StopSignals::install`] is called: a bench
/// waits on them beside its work, so that a signal ends in its cleanup (its nodes and
/// namespaces dropped) rather than in a killed process.
pub struct StopSignals([(tokio::signal::unix::Signal, &'static str); 3]);

impl StopSignals {
    /// Installs the handlers.
    pub fn install() -> std::io::Result<StopSignals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(StopSignals([
            (signal(SignalKind::interrupt())?, "SIGINT"),
            (signal(SignalKind::terminate())?, "SIGTERM"),
            (signal(SignalKind::hangup())?, "SIGHUP"),
        ]))
    }

    /// The name of the first of them to arrive.
    pub async fn first(&mut self) -> &'static str {
        let [(a, an), (b, bn), (c, cn)] = &mut self.0;
        tokio::select! {
            _ = a.recv() => an,
            _ = b.recv() => bn,
            _ = c.recv() => cn,
        }
    }
}

/// Stops `nodes` (SIGTERM, then SIGKILL after `grace`), all at once; how many did not stop
/// cleanly, each said on stderr after `tag`.
pub async fn stop_all(nodes: &mut Vec<NodeProcess>, grace: Duration, tag: &str) -> usize {
    let mut stopping = tokio::task::JoinSet::new();
    for node in nodes.drain(..) {
        stopping.spawn(async move {
            let name = node.name.clone();
            node.stop(grace).await.map_err(|e| (name, e))
        });
    }
    let mut failed = 0;
    while let Some(joined) = stopping.join_next().await {
        if let Ok(Err((name, error))) = joined {
            failed += 1;
            eprintln!("{tag}: {name}: {error:#}");
        }
    }
    failed
}

/// How much of the machine's CPU time processes other than a bench and its nodes took while
/// it ran (the machine may be shared): started before the nodes, read before they stop.
#[derive(Debug, Clone, Copy)]
pub struct CpuWatch {
    /// The machine's busy and total ticks at the start.
    machine: (u64, u64),
    /// This process's ticks at the start.
    own: u64,
}

impl CpuWatch {
    /// Starts watching, before the nodes start.
    pub fn start() -> CpuWatch {
        CpuWatch {
            machine: machine_jiffies(),
            own: process_jiffies("self"),
        }
    }

    /// The share (0 to 1) of the machine's CPU time since [`CpuWatch::start`] that neither
    /// this process nor `nodes` (all started after it) used.
    pub fn others_share(&self, nodes: &[NodeProcess]) -> f64 {
        let machine = machine_jiffies();
        let ours = process_jiffies("self").saturating_sub(self.own)
            + nodes
                .iter()
                .filter_map(NodeProcess::pid)
                .map(|pid| process_jiffies(&pid.to_string()))
                .sum::<u64>();
        let busy = machine.0.saturating_sub(self.machine.0);
        let total = machine.1.saturating_sub(self.machine.1);
        busy.saturating_sub(ours) as f64 / total.max(1) as f64
    }
}

/// CPU time (USER_HZ ticks since boot) the machine spent busy, and in all.
fn machine_jiffies() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|t| t.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let at = |i: usize| ticks.get(i).copied().unwrap_or(0);
    let busy = at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
    (busy, busy + at(3) + at(4))
}

/// User + system CPU time (USER_HZ ticks) of process `pid` (`self` for this one); 0 when
/// it is gone.
fn process_jiffies(pid: &str) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name, which may hold spaces: utime is field 14, stime 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|t| t.parse().ok())
        .collect();
    fields.iter().sum()
}

/// Sends SIGTERM to `pid`.
fn terminate(pid: u32) {
    match i32::try_from(pid) {
        Ok(pid) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        Err(_) => tracing::warn!(pid, "pid out of range; not signalled"),
    }
}

/// A plain `GET` with a short timeout, run off the async threads.
pub async fn http_get(url: String) -> anyhow::Result<String> {
    tokio::task::spawn_blocking(move || blocking_get(&url)).await?
}

/// `GET url` with a 5 s timeout, on the calling thread.
fn blocking_get(url: &str) -> anyhow::Result<String> {
    let response = ureq::get(url)
        .timeout(Duration::from_secs(5))
        .call()
        .with_context(|| format!("GET {url}"))?;
    Ok(response.into_string()?)
}

/// [`http_get`] from inside network namespace `ns` (a name under /var/run/netns): on a fresh
/// thread that enters it first, since a thread's network namespace is its own and a pooled
/// thread must not be moved.
pub async fn http_get_in(ns: String, url: String) -> anyhow::Result<String> {
    let path = format!("/var/run/netns/{ns}");
    let handle = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(format!("get in {ns}"))
        .spawn(move || {
            let got = nix::sched::setns(&handle, nix::sched::CloneFlags::CLONE_NEWNET)
                .with_context(|| format!("entering network namespace {ns}"))
                .and_then(|()| blocking_get(&url));
            let _ = tx.send(got);
        })
        .context("spawning a thread")?;
    rx.await
        .context("the GET's thread ended without an answer")?
}

/// Polls `check` every `every` until it returns `Ok(true)` or `deadline` passes. On timeout
/// the error carries the last description `check` gave of how far things got.
pub async fn wait_for<F, Fut>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut check: F,
) -> anyhow::Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<(bool, String)>>,
{
    let start = Instant::now();
    let deadline = start + timeout;
    loop {
        let last = match check().await {
            Ok((true, _)) => return Ok(start.elapsed()),
            Ok((false, progress)) => progress,
            Err(error) => format!("{error:#}"),
        };
        if Instant::now() >= deadline {
            bail!("{what}: not reached within {timeout:?}; last seen: {last}");
        }
        tokio::time::sleep(every).await;
    }
}

/// The peer id at the end of a `/p2p/<peer id>` multiaddr (empty when there is none).
pub fn peer_of(addr: &str) -> String {
    match addr.rsplit_once("/p2p/") {
        Some((_, peer)) => peer.to_string(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_totals_sum_the_trained_epochs_and_span_their_loss_records() {
        let rows: Vec<serde_json::Value> = serde_json::from_str(
            r#"[
                {"epoch": 0, "tokens": 1000, "samples": 10, "dropped": 1,
                 "first_record_s": 2.0, "last_record_s": 4.0, "val_loss": 5.5},
                {"epoch": 1, "tokens": 3000, "samples": 30, "dropped": 0,
                 "first_record_s": 5.0, "last_record_s": 7.0, "val_loss": 4.0},
                {"epoch": 2, "tokens": 9000, "samples": 90, "dropped": 0,
                 "first_record_s": 8.0, "last_record_s": 9.0, "val_loss": 3.0}
            ]"#,
        )
        .unwrap();
        let totals = epoch_totals(&rows, 2).unwrap();
        assert_eq!(
            (totals.tokens, totals.samples, totals.dropped),
            (4000, 40, 1)
        );
        assert_eq!(totals.span, 5.0);
        assert_eq!(totals.tokens_per_s, 800.0);
        // Epoch 2's held-out loss is the evaluation that closed epoch 1.
        assert_eq!((totals.val_start, totals.val_end), ((0, 5.5), (2, 3.0)));
        let silent: Vec<serde_json::Value> =
            serde_json::from_str(r#"[{"epoch": 0, "tokens": 10, "val_loss": 5.0}]"#).unwrap();
        assert!(epoch_totals(&silent, 1).is_err(), "no loss records heard");
    }
}
