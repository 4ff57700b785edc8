//! Starts `iota-p2p` node processes on this machine and watches them through `/status`.
//!
//! Used by `local-swarm` and by the multi-node tests. Every node listens on 127.0.0.1 with an
//! OS-chosen port and serves its metrics on 127.0.0.1 too; the launcher learns both from the
//! `LISTEN` and `METRICS` lines the node prints. Every wait is bounded by a deadline, and a
//! dropped [`NodeProcess`] kills its process.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::time::Instant;

/// What to start: a name for logs, and the node's flags (besides `--listen`, `--metrics`).
#[derive(Debug, Clone)]
pub struct NodeSpec {
    /// Short name used in messages and the log file name.
    pub name: String,
    /// Flags passed to the binary, e.g. `--data-dir`, `--bootstrap`, `--validator`.
    pub args: Vec<String>,
    /// File the node's stderr (its log) is written to.
    pub log: PathBuf,
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
        let mut child = Command::new(binary)
            .args(&spec.args)
            .args([
                "--listen",
                "/ip4/127.0.0.1/tcp/0",
                "--metrics",
                "127.0.0.1:0",
            ])
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

    /// `GET /status` as JSON.
    pub async fn status(&self) -> anyhow::Result<serde_json::Value> {
        let body = http_get(format!("{}/status", self.metrics_url())).await?;
        serde_json::from_str(&body).with_context(|| format!("{}: /status is not JSON", self.name))
    }

    /// `GET /metrics` as Prometheus text.
    pub async fn metrics(&self) -> anyhow::Result<String> {
        http_get(format!("{}/metrics", self.metrics_url())).await
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
    tokio::task::spawn_blocking(move || -> anyhow::Result<String> {
        let response = ureq::get(&url)
            .timeout(Duration::from_secs(5))
            .call()
            .with_context(|| format!("GET {url}"))?;
        Ok(response.into_string()?)
    })
    .await?
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
