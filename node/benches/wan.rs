//! The swarm on bandwidth-limited links: tokens per second of the same run with f32
//! activations and no bottleneck, with the project's default (bottleneck + bf16), and with the
//! most compressed setting the code supports, at 100 Mbit/s and at 1 Gbit/s per node, side by
//! side in one run.
//!
//! # Topology
//!
//! Every node (1 validator, 6 miners: 3 stages of 2 replicas, tiny preset) runs in a network
//! namespace of its own, `iota-wan-<pid>-n<i>`, with one interface, `wan0`, addressed
//! `10.77.0.<i + 1>/24`. Its peer end, `n<i>`, lives in a hub namespace,
//! `iota-wan-<pid>-hub`, where a bridge joins all of them. The pairs are created directly
//! between the node namespaces and the hub, so the root namespace gets no interface and no
//! address. Both ends of every pair are rate-limited with a token bucket (`tc … tbf`): `wan0`'s
//! egress is the node's upload, `n<i>`'s egress its download. The kernel here has no `netem`,
//! so the links emulate bandwidth only, not latency.
//!
//! Each node runs as `ip netns exec <namespace> iota-p2p …`, started through the node's own
//! launcher as `local-swarm` starts its nodes (same identities, stake snapshot and run file).
//! It listens on its namespace address (`--listen /ip4/10.77.0.<i + 1>/tcp/<port>`), and the
//! others bootstrap from the validator's. The launcher also gives every node a listener and
//! its `/status` server on 127.0.0.1, which inside a namespace is that namespace's own
//! loopback, reachable from nowhere else; the bench reads the validator's `/status` from a
//! thread that enters the validator's namespace.
//!
//! Tokens/s and the held-out losses are computed as `local-swarm` computes them: tokens of the
//! trained epochs over the span from the first to the last loss record the validator heard,
//! so merges and evaluations between epochs are inside it. Each setting must still train:
//! the bench fails when a run's held-out loss does not fall. Beside them the table gives,
//! per run, the link direction that carried the most bytes (from the qdiscs' counters: its
//! mean rate over the run and how often the bucket held packets back), and the share of the
//! CPUs that processes other than the bench and its nodes used meanwhile: on a shared
//! machine a row where that is above 10 % is marked as not comparable.
//!
//! # Running it
//!
//! `cargo bench -p iota-p2p --bench wan`, as root (it creates namespaces and qdiscs; without
//! root, `ip` or `tc` it says so and exits non-zero). It removes its namespaces on exit, also
//! on failure, panic, SIGINT, SIGTERM or SIGHUP, and at start removes those an earlier,
//! killed run left behind (killing what still ran in them). It prints a Markdown table and
//! `RESULT wan-<rate> tokens_per_s_f32=… tokens_per_s_default=… tokens_per_s_best=…` per
//! rate, with the held-out losses after the last epoch in `RESULT wan-<rate>-loss`. The most
//! compressed setting is bottleneck 1 with bf16: 1 is the narrowest width, and at that width
//! bf16 (2 bytes a token) is smaller than int8 (1 byte plus a 2-byte scale per token).
//! `IOTA_BENCH_EPOCHS` (default 3), `IOTA_BENCH_SAMPLES` (samples per head per epoch,
//! default 50), `IOTA_BENCH_RATES` (comma-separated `tc` rates, `none` for an unlimited link;
//! default `100mbit,1gbit`), `IOTA_BENCH_BEST` (`BOTTLENECK:WIRE` of the most compressed
//! setting, default `1:bf16`) and `IOTA_BENCH_TIMEOUT_SECS` (per run, default 600) change it;
//! `IOTA_BENCH_KEEP_LOGS=1` keeps the nodes' logs (with `RUST_LOG=…miner::task=debug`, their
//! epoch phases give each merge's duration).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use anyhow::{anyhow, bail, ensure, Context};
use bootstrap::{LocalNeuron, Metagraph, ModelPreset, PeerIdStr, RunConfig, WireFormat};
use iota_p2p::launcher::{
    epoch_of, epoch_totals, stop_all, wait_for, CpuWatch, NodeProcess, NodeSpec, StopSignals,
};

/// Every namespace this bench creates starts with this, then `<pid>-`.
const PREFIX: &str = "iota-wan-";
/// The node namespaces' /24 (private; it exists only inside them).
const SUBNET: &str = "10.77.0";
/// Validators, miners and stages of every run.
const VALIDATORS: usize = 1;
const MINERS: usize = 6;
const STAGES: u32 = 3;
/// How long a node gets to print its addresses, and to stop after SIGTERM.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_GRACE: Duration = Duration::from_secs(15);
/// Share of the CPUs other processes may use during a run before its row is called
/// incomparable.
const BUSY: f64 = 0.1;
/// Queue a token bucket may hold before it drops, as time at its rate.
const TBF_LATENCY: &str = "50ms";

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs `program args…` to completion; its stdout, or an error with its stderr.
fn cmd(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    ensure!(
        output.status.success(),
        "`{program} {}` failed ({}): {}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Runs `line`, a command whose arguments hold no spaces (`ip …`, `tc …`).
fn sh(line: &str) -> anyhow::Result<String> {
    let mut words = line.split_whitespace();
    let program = words.next().context("an empty command")?;
    cmd(program, &words.collect::<Vec<_>>())
}

/// Root, `ip` and `tc`: what the bench cannot run without.
fn preflight() -> anyhow::Result<()> {
    let status = std::fs::read_to_string("/proc/self/status").context("reading /proc/self")?;
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .and_then(|id| id.parse::<u32>().ok())
        .context("no effective uid in /proc/self/status")?;
    ensure!(
        euid == 0,
        "this benchmark needs root (effective uid {euid}): it creates network namespaces, veth \
         pairs and tc qdiscs; run it as root, e.g. `sudo -E cargo bench -p iota-p2p --bench wan`"
    );
    for tool in ["ip", "tc"] {
        cmd(tool, &["-V"]).with_context(|| {
            format!("this benchmark needs `{tool}` (iproute2) on PATH, and root")
        })?;
    }
    Ok(())
}

/// Process ids running in namespace `ns`.
fn pids_in(ns: &str) -> Vec<i32> {
    sh(&format!("ip netns pids {ns}"))
        .map(|out| {
            out.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Kills (SIGKILL) what still runs in `ns`, waits (bounded) for it to go, and deletes `ns`.
fn delete_namespace(ns: &str) -> anyhow::Result<()> {
    for _ in 0..50 {
        let pids = pids_in(ns);
        if pids.is_empty() {
            break;
        }
        for pid in pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    sh(&format!("ip netns del {ns}")).map(drop)
}

/// Names of the network namespaces that exist.
fn namespaces() -> Vec<String> {
    sh("ip netns list")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Removes the namespaces of earlier runs of this bench whose process is gone.
fn remove_stale() {
    for ns in namespaces().into_iter().filter(|n| n.starts_with(PREFIX)) {
        let pid = ns[PREFIX.len()..].split('-').next().unwrap_or_default();
        let alive = pid != std::process::id().to_string()
            && std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("wan"));
        if alive {
            println!("wan: leaving {ns}: the run that made it (pid {pid}) still runs");
            continue;
        }
        match delete_namespace(&ns) {
            Ok(()) => println!("wan: removed {ns}, left behind by an earlier run"),
            Err(error) => eprintln!("wan: cannot remove stale {ns}: {error:#}"),
        }
    }
}

/// A link rate: what `tc` is given, or no limit.
#[derive(Debug, Clone)]
struct Rate {
    /// As written (`100mbit`), used in the RESULT name.
    label: String,
    /// Bits per second; `None` for an unlimited link.
    bits: Option<u64>,
}

impl Rate {
    fn parse(text: &str) -> anyhow::Result<Rate> {
        let label = text.trim().to_ascii_lowercase();
        if label == "none" {
            return Ok(Rate { label, bits: None });
        }
        let split = label
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(label.len());
        let (number, unit) = label.split_at(split);
        let scale = match unit {
            "kbit" => 1_000,
            "mbit" => 1_000_000,
            "gbit" => 1_000_000_000,
            _ => bail!("rate {text:?}: expected e.g. 100mbit, 1gbit or none"),
        };
        let n: u64 = number
            .parse()
            .map_err(|_| anyhow!("rate {text:?}: expected e.g. 100mbit, 1gbit or none"))?;
        ensure!(n > 0, "rate {text:?} is zero");
        Ok(Rate {
            label,
            bits: Some(n * scale),
        })
    }
}

/// The namespaces, veth pairs and bridge of the bench; dropping it removes them all.
struct Topology {
    /// `iota-wan-<pid>`.
    prefix: String,
    nodes: usize,
    /// Namespaces created so far, in order.
    created: Vec<String>,
}

impl Topology {
    fn hub(&self) -> String {
        format!("{}-hub", self.prefix)
    }

    fn ns(&self, i: usize) -> String {
        format!("{}-n{i}", self.prefix)
    }

    fn addr(i: usize) -> String {
        format!("{SUBNET}.{}", i + 1)
    }

    fn add_ns(&mut self, ns: String) -> anyhow::Result<()> {
        sh(&format!("ip netns add {ns}"))?;
        self.created.push(ns);
        Ok(())
    }

    /// Creates the hub with its bridge and one namespace per node, joined to the hub by a
    /// veth pair. On error, what was made is removed when the value is dropped.
    fn create(nodes: usize) -> anyhow::Result<Topology> {
        let mut topo = Topology {
            prefix: format!("{PREFIX}{}", std::process::id()),
            nodes,
            created: Vec::new(),
        };
        let hub = topo.hub();
        topo.add_ns(hub.clone())?;
        sh(&format!("ip -n {hub} link add br0 type bridge"))?;
        sh(&format!("ip -n {hub} link set br0 up"))?;
        for i in 0..nodes {
            let ns = topo.ns(i);
            topo.add_ns(ns.clone())?;
            // Both ends are born in their namespaces: nothing appears in the root one.
            sh(&format!(
                "ip link add wan0 netns {ns} type veth peer name n{i} netns {hub}"
            ))?;
            sh(&format!("ip -n {hub} link set n{i} master br0"))?;
            sh(&format!("ip -n {hub} link set n{i} up"))?;
            sh(&format!(
                "ip -n {ns} addr add {}/24 dev wan0",
                Self::addr(i)
            ))?;
            sh(&format!("ip -n {ns} link set wan0 up"))?;
            sh(&format!("ip -n {ns} link set lo up"))?;
        }
        Ok(topo)
    }

    /// Limits both directions of every node's link to `rate` (or lifts the limit).
    fn set_rate(&self, rate: &Rate) -> anyhow::Result<()> {
        for i in 0..self.nodes {
            // The node's end carries its upload, the hub's end its download.
            for (ns, dev) in [
                (self.ns(i), "wan0".to_string()),
                (self.hub(), format!("n{i}")),
            ] {
                match rate.bits {
                    Some(bits) => {
                        // 10 ms of the rate, and at least one 64 KiB GSO packet.
                        let burst = (bits / 8 / 100).max(64 << 10);
                        sh(&format!(
                            "tc -n {ns} qdisc replace dev {dev} root tbf rate {bits}bit burst {burst} latency {TBF_LATENCY}"
                        ))?;
                    }
                    // No root qdisc yet is fine.
                    None => drop(sh(&format!("tc -n {ns} qdisc del dev {dev} root"))),
                }
            }
        }
        Ok(())
    }

    /// Bytes, overlimits and drops of the root qdisc of every link direction:
    /// `(node, "up" | "down", [bytes, overlimits, drops])`, zeros where there is none.
    fn counters(&self) -> Vec<(usize, &'static str, [u64; 3])> {
        let mut out = Vec::new();
        for i in 0..self.nodes {
            for (ns, dev, dir) in [
                (self.ns(i), "wan0".to_string(), "up"),
                (self.hub(), format!("n{i}"), "down"),
            ] {
                let stats = sh(&format!("tc -n {ns} -s -j qdisc show dev {dev} root"))
                    .ok()
                    .and_then(|json| serde_json::from_str::<serde_json::Value>(&json).ok())
                    .unwrap_or_default();
                let field = |key: &str| stats[0][key].as_u64().unwrap_or(0);
                out.push((
                    i,
                    dir,
                    [field("bytes"), field("overlimits"), field("drops")],
                ));
            }
        }
        out
    }

    /// Removes every namespace made (idempotent): the veth pairs and the bridge go with them.
    fn remove(&mut self) {
        let count = self.created.len();
        let mut failed = 0;
        while let Some(ns) = self.created.pop() {
            if let Err(error) = delete_namespace(&ns) {
                failed += 1;
                eprintln!("wan: cannot remove {ns}: {error:#}");
            }
        }
        if count > 0 {
            println!(
                "wan: removed {} of {count} network namespaces ({}-*)",
                count - failed,
                self.prefix
            );
        }
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        self.remove();
    }
}

/// `GET url` from inside namespace `ns`, on a thread of its own (a thread's network
/// namespace is its own; the others stay in the root one).
async fn get_in(ns: &str, url: &str) -> anyhow::Result<String> {
    let (path, url) = (format!("/run/netns/{ns}"), url.to_string());
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let _ = tx.send(get_from(&path, &url));
    });
    rx.await.context("the status thread died")?
}

/// Moves this thread into the network namespace at `path`, then `GET url`.
fn get_from(path: &str, url: &str) -> anyhow::Result<String> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {path}"))?;
    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
        .with_context(|| format!("entering {path}"))?;
    let response = ureq::get(url)
        .timeout(Duration::from_secs(5))
        .call()
        .with_context(|| format!("GET {url}"))?;
    Ok(response.into_string()?)
}

/// One side of the comparison.
#[derive(Debug, Clone)]
struct Setting {
    /// `f32`, `default` or `best`: the RESULT field's suffix.
    key: &'static str,
    bottleneck: u32,
    wire: WireFormat,
}

fn parse_wire(name: &str) -> anyhow::Result<WireFormat> {
    let text = format!("wire_format = \"{name}\"");
    Ok(RunConfig::from_toml_str(&text)
        .with_context(|| format!("wire format {name:?}: expected f32, bf16 or int8"))?
        .wire_format)
}

/// The settings compared: f32 without a bottleneck, the run configuration's default, and
/// `best` (`BOTTLENECK:WIRE`).
fn settings(best: &str) -> anyhow::Result<Vec<Setting>> {
    let default = RunConfig::default();
    let (b, wire) = best
        .split_once(':')
        .with_context(|| format!("IOTA_BENCH_BEST={best:?}: expected BOTTLENECK:WIRE"))?;
    Ok(vec![
        Setting {
            key: "f32",
            bottleneck: 0,
            wire: WireFormat::F32,
        },
        Setting {
            key: "default",
            bottleneck: default.bottleneck,
            wire: default.wire_format,
        },
        Setting {
            key: "best",
            bottleneck: b
                .parse()
                .with_context(|| format!("IOTA_BENCH_BEST={best:?}: bad bottleneck"))?,
            wire: parse_wire(wire)?,
        },
    ])
}

/// What the bench needs of a run.
#[derive(Debug, Clone)]
struct Bench {
    binary: PathBuf,
    base: PathBuf,
    epochs: u64,
    samples: u64,
    timeout: Duration,
    /// Every node's identity, the validator's first.
    keys: Vec<Key>,
    metagraph: PathBuf,
}

/// A node's name, the directory holding its identity, and its peer id.
#[derive(Debug, Clone)]
struct Key {
    name: String,
    dir: PathBuf,
    peer: String,
}

/// The figures of one run.
#[derive(Debug, Clone)]
struct Outcome {
    tokens_per_s: f64,
    val_start: (u64, f64),
    val_end: (u64, f64),
    /// Activation bytes the miners sent per sample per stage boundary.
    bytes_per_sample_boundary: f64,
    samples: u64,
    dropped: u64,
    /// Seconds from the first to the last loss record.
    span: f64,
    wall: Duration,
    /// The link direction that carried the most bytes during the run, if the links are
    /// limited.
    busiest: Option<LinkLoad>,
    /// Share of the machine's CPU time that processes other than this bench and its nodes
    /// used during the run (the machine may be shared: a busy one makes rows incomparable).
    other_cpu: f64,
}

/// What one direction of a node's link carried during a run.
#[derive(Debug, Clone)]
struct LinkLoad {
    /// `miner-2 up` (its upload) or `miner-2 down`.
    link: String,
    bytes: u64,
    /// Times the token bucket held a packet back, and packets it dropped.
    overlimits: u64,
    drops: u64,
}

fn num(row: &serde_json::Value, key: &str) -> Option<f64> {
    row[key].as_f64()
}

/// Sums up the validator's epochs as `local-swarm`'s report does.
fn summarise(rows: &[serde_json::Value], epochs: u64, wall: Duration) -> anyhow::Result<Outcome> {
    let totals = epoch_totals(rows, epochs)?;
    let trained: Vec<&serde_json::Value> = rows.iter().filter(|r| epoch_of(r) < epochs).collect();
    // Each miner reports its cumulative activation bytes at every merge: the latest is its
    // total.
    let mut latest: BTreeMap<String, u64> = BTreeMap::new();
    for row in &trained {
        if let Some(bytes) = row["wire_bytes"].as_object() {
            for (miner, n) in bytes {
                latest.insert(miner.clone(), n.as_u64().unwrap_or(0));
            }
        }
    }
    let wire: u64 = latest.values().sum();
    let boundaries = u64::from(STAGES.saturating_sub(1)).max(1);
    Ok(Outcome {
        tokens_per_s: totals.tokens_per_s,
        val_start: totals.val_start,
        val_end: totals.val_end,
        bytes_per_sample_boundary: wire as f64 / (totals.samples.max(1) * boundaries) as f64,
        samples: totals.samples,
        dropped: totals.dropped,
        span: totals.span,
        wall,
        busiest: None,
        other_cpu: 0.0,
    })
}

/// Writes the run files, starts the nodes in their namespaces (pushing each into `nodes`),
/// follows the run to its last epoch and stops the nodes.
async fn run_one(
    bench: &Bench,
    topo: &Topology,
    rate: &Rate,
    setting: &Setting,
    port: u16,
    nodes: &mut Vec<NodeProcess>,
) -> anyhow::Result<Outcome> {
    let dir = bench.base.join(format!("{}-{}", rate.label, setting.key));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let run = RunConfig {
        run_name: format!("wan-{}-{}", rate.label, setting.key),
        preset: ModelPreset::Tiny,
        stages: STAGES,
        bottleneck: setting.bottleneck,
        wire_format: setting.wire,
        epoch_samples: bench.samples,
        lr_decay_epochs: bench.epochs,
        ..RunConfig::default()
    };
    let run_path = dir.join("run.toml");
    std::fs::write(&run_path, run.to_toml_string()?)?;
    println!(
        "wan: {} per node, {} (bottleneck {}, {}): {} epochs of {} samples per head",
        rate.label,
        setting.key,
        setting.bottleneck,
        setting.wire.name(),
        bench.epochs,
        bench.samples
    );
    let counters_before = topo.counters();
    let cpu_watch = CpuWatch::start();
    let started = tokio::time::Instant::now();
    let mut bootstrap = None::<String>;
    for (
        i,
        Key {
            name,
            dir: keys,
            peer,
        },
    ) in bench.keys.iter().enumerate()
    {
        let data = dir.join(name);
        std::fs::create_dir_all(&data)?;
        for entry in std::fs::read_dir(keys)? {
            let entry = entry?;
            std::fs::copy(entry.path(), data.join(entry.file_name()))?;
        }
        let ns = topo.ns(i);
        let listen = format!("/ip4/{}/tcp/{port}", Topology::addr(i));
        let mut args: Vec<String> = ["netns", "exec", ns.as_str()].map(String::from).into();
        args.push(bench.binary.display().to_string());
        args.extend(["--data-dir".to_string(), data.display().to_string()]);
        args.extend(["--metagraph".into(), bench.metagraph.display().to_string()]);
        args.extend(["--run".into(), run_path.display().to_string()]);
        args.extend(["--listen".into(), listen.clone()]);
        if i < VALIDATORS {
            args.push("--validator".into());
        }
        if let Some(addr) = &bootstrap {
            args.extend(["--bootstrap".into(), addr.clone()]);
        }
        let spec = NodeSpec {
            name: name.clone(),
            args,
            log: dir.join(format!("{name}.log")),
            netns: None,
            listen: None,
        };
        let node = NodeProcess::spawn(Path::new("ip"), spec, READY_TIMEOUT).await?;
        let announced = format!("LISTEN {listen}/p2p/{peer}");
        nodes.push(node);
        let node = nodes.last().context("a node was just started")?;
        wait_for(
            &format!("{name} to listen on {listen}"),
            READY_TIMEOUT,
            Duration::from_millis(100),
            || async { Ok((node.stdout_lines().contains(&announced), String::new())) },
        )
        .await?;
        bootstrap.get_or_insert_with(|| format!("{listen}/p2p/{peer}"));
    }
    let watcher = nodes.first().context("no node started")?;
    let url = format!("{}/status", watcher.metrics_url());
    let validator_ns = topo.ns(0);
    let rows = std::cell::RefCell::new(Vec::<serde_json::Value>::new());
    let printed = std::cell::Cell::new(0u64);
    let epochs = bench.epochs;
    wait_for(
        "the run to finish its epochs",
        bench.timeout,
        Duration::from_secs(1),
        || async {
            let status: serde_json::Value = serde_json::from_str(&get_in(&validator_ns, &url).await?)?;
            let got = status["epochs"].as_array().cloned().unwrap_or_default();
            for row in &got {
                let next_val = got
                    .iter()
                    .find(|r| epoch_of(r) == epoch_of(row).wrapping_add(1))
                    .and_then(|r| num(r, "val_loss"));
                if epoch_of(row) == printed.get() && printed.get() < epochs {
                    if let Some(val) = next_val {
                        let secs = num(row, "last_record_s").unwrap_or(0.0)
                            - num(row, "first_record_s").unwrap_or(0.0);
                        println!(
                            "  epoch {:>2}  train loss {:.3}  held-out loss {val:.3}  {:>6.0} tokens/s  {} samples ({} dropped)",
                            printed.get(),
                            num(row, "train_loss").unwrap_or(f64::NAN),
                            row["tokens"].as_u64().unwrap_or(0) as f64 / secs,
                            row["samples"].as_u64().unwrap_or(0),
                            row["dropped"].as_u64().unwrap_or(0),
                        );
                        printed.set(printed.get() + 1);
                    }
                }
            }
            let done = got
                .iter()
                .any(|r| epoch_of(r) == epochs && num(r, "val_loss").is_some());
            *rows.borrow_mut() = got;
            Ok((done, format!("{} of {epochs} epochs reported", printed.get())))
        },
    )
    .await?;
    let mut outcome = summarise(&rows.into_inner(), epochs, started.elapsed())?;
    outcome.other_cpu = cpu_watch.others_share(nodes);
    if rate.bits.is_some() {
        let names: Vec<&str> = bench.keys.iter().map(|k| k.name.as_str()).collect();
        outcome.busiest = topo
            .counters()
            .into_iter()
            .zip(counters_before)
            .map(|((i, dir, after), (_, _, before))| LinkLoad {
                link: format!("{} {dir}", names.get(i).copied().unwrap_or("?")),
                bytes: after[0].saturating_sub(before[0]),
                overlimits: after[1].saturating_sub(before[1]),
                drops: after[2].saturating_sub(before[2]),
            })
            .max_by_key(|l| l.bytes);
    }
    let failed = stop_all(nodes, STOP_GRACE, "wan").await;
    ensure!(failed == 0, "{failed} node(s) did not stop cleanly");
    Ok(outcome)
}

/// Identities and the stake snapshot shared by every run.
fn prepare(base: &Path, binary: &Path) -> anyhow::Result<(Vec<Key>, PathBuf)> {
    let names: Vec<String> = (0..VALIDATORS)
        .map(|i| format!("validator-{i}"))
        .chain((0..MINERS).map(|i| format!("miner-{i}")))
        .collect();
    let mut keys = Vec::new();
    let mut neurons = Vec::new();
    for (i, name) in names.into_iter().enumerate() {
        let dir = base.join("keys").join(&name);
        let dir_arg = dir.display().to_string();
        let out = cmd(
            &binary.display().to_string(),
            &["keygen", "--data-dir", &dir_arg],
        )?;
        let peer = out.lines().last().unwrap_or_default().trim().to_string();
        let validator = i < VALIDATORS;
        neurons.push(LocalNeuron {
            peer_id: PeerIdStr::parse(&peer)?,
            stake: if validator {
                100 * bootstrap::RAO_PER_TAO / (i as u64 + 1)
            } else {
                0
            },
            validator_permit: validator,
        });
        keys.push(Key { name, dir, peer });
    }
    let metagraph = base.join("metagraph.json");
    std::fs::write(&metagraph, Metagraph::for_local_run(neurons)?.to_json())?;
    Ok((keys, metagraph))
}

/// The busiest link direction of a run, for the table.
fn load_cell(o: &Outcome, rate: &Rate) -> String {
    match (&o.busiest, rate.bits) {
        (Some(l), Some(bits)) => {
            let mean = l.bytes as f64 * 8.0 / o.span.max(1e-9);
            format!(
                "{}: {:.1} MB, {:.1} Mbit/s ({:.0} % of the rate), {} / {}",
                l.link,
                l.bytes as f64 / 1e6,
                mean / 1e6,
                100.0 * mean / bits as f64,
                l.overlimits,
                l.drops
            )
        }
        _ => "–".to_string(),
    }
}

/// Every rate × setting, then the table and the RESULT lines.
async fn bench(topo: &Topology, nodes: &mut Vec<NodeProcess>) -> anyhow::Result<()> {
    let rates: Vec<Rate> = env_or("IOTA_BENCH_RATES", "100mbit,1gbit".to_string())
        .split(',')
        .filter(|r| !r.trim().is_empty())
        .map(Rate::parse)
        .collect::<anyhow::Result<_>>()?;
    let settings = settings(&env_or("IOTA_BENCH_BEST", "1:bf16".to_string()))?;
    let base = std::env::temp_dir().join(format!("iota-bench-wan-{}", std::process::id()));
    let binary = PathBuf::from(env!("CARGO_BIN_EXE_iota-p2p"));
    let (keys, metagraph) = prepare(&base, &binary)?;
    let bench = Bench {
        binary,
        base: base.clone(),
        epochs: env_or("IOTA_BENCH_EPOCHS", 3),
        samples: env_or("IOTA_BENCH_SAMPLES", 50),
        timeout: Duration::from_secs(env_or("IOTA_BENCH_TIMEOUT_SECS", 600)),
        keys,
        metagraph,
    };
    let raw = {
        let run = RunConfig::default();
        let preset: training::Preset = ModelPreset::Tiny.name().parse()?;
        f64::from(run.batch_size * run.seq_len) * preset.config().d_model as f64 * 4.0
    };
    let mut results: Vec<(Rate, Setting, Outcome)> = Vec::new();
    let mut port = 4100u16;
    for rate in &rates {
        topo.set_rate(rate)?;
        for setting in &settings {
            port += 1;
            let outcome = run_one(&bench, topo, rate, setting, port, nodes)
                .await
                .with_context(|| {
                    format!(
                        "{} / {}: node logs in {}",
                        rate.label,
                        setting.key,
                        bench.base.display()
                    )
                })?;
            println!(
                "  {:.0} tokens/s, held-out loss {:.4} → {:.4}, {:.0} s; other processes used {:.0} % of the CPUs{}",
                outcome.tokens_per_s,
                outcome.val_start.1,
                outcome.val_end.1,
                outcome.wall.as_secs_f64(),
                100.0 * outcome.other_cpu,
                if outcome.other_cpu > BUSY {
                    " (a busy machine: this row is not comparable)"
                } else {
                    ""
                }
            );
            results.push((rate.clone(), setting.clone(), outcome));
        }
    }
    println!();
    println!("| link per node | setting | bottleneck | wire | activation B/sample/boundary | compression | tokens/s | held-out loss start → end | samples (dropped) | busiest link direction: MB, mean over the span, packets held back / dropped | CPU used by other processes |");
    println!("|---|---|---:|---|---:|---:|---:|---|---:|---|---:|");
    for (rate, setting, o) in &results {
        let epochs = if o.val_start.0 != 0 || o.val_end.0 != bench.epochs {
            format!(" (epochs {}→{})", o.val_start.0, o.val_end.0)
        } else {
            String::new()
        };
        println!(
            "| {} | {} | {} | {} | {:.0} | {:.1}× | {:.0} | {:.4} → {:.4}{epochs} | {} ({}) | {} | {:.0} % |",
            rate.label,
            setting.key,
            if setting.bottleneck == 0 {
                "none".to_string()
            } else {
                setting.bottleneck.to_string()
            },
            setting.wire.name(),
            o.bytes_per_sample_boundary,
            raw / o.bytes_per_sample_boundary,
            o.tokens_per_s,
            o.val_start.1,
            o.val_end.1,
            o.samples,
            o.dropped,
            load_cell(o, rate),
            100.0 * o.other_cpu
        );
    }
    println!();
    for rate in &rates {
        let fields = |name: &str, value: fn(&Outcome) -> f64, digits: usize| -> String {
            ["f32", "default", "best"]
                .iter()
                .filter_map(|key| {
                    let (_, _, o) = results
                        .iter()
                        .find(|(r, s, _)| r.label == rate.label && s.key == *key)?;
                    Some(format!(" {name}_{key}={:.digits$}", value(o)))
                })
                .collect()
        };
        println!(
            "RESULT wan-{}{}",
            rate.label,
            fields("tokens_per_s", |o| o.tokens_per_s, 1)
        );
        println!(
            "RESULT wan-{}-loss{}",
            rate.label,
            fields("val_loss", |o| o.val_end.1, 4)
        );
    }
    let untrained: Vec<String> = results
        .iter()
        .filter(|(_, _, o)| o.val_end.1 >= o.val_start.1)
        .map(|(r, s, _)| format!("{} / {}", r.label, s.key))
        .collect();
    ensure!(
        untrained.is_empty(),
        "the held-out loss did not fall in: {}",
        untrained.join(", ")
    );
    if std::env::var_os("IOTA_BENCH_KEEP_LOGS").is_some() {
        println!("node logs kept in {}", base.display());
    } else {
        let _ = std::fs::remove_dir_all(&base);
    }
    Ok(())
}

async fn main_async() -> anyhow::Result<()> {
    // Handlers first, so that a signal from here on ends in the cleanup below.
    let mut signals = StopSignals::install()?;
    remove_stale();
    let mut nodes: Vec<NodeProcess> = Vec::new();
    let mut topo = Topology::create(VALIDATORS + MINERS)?;
    println!(
        "wan: {} namespaces {}-{{hub,n0..n{}}} on {SUBNET}.0/24",
        topo.created.len(),
        topo.prefix,
        topo.nodes - 1
    );
    let outcome = tokio::select! {
        result = bench(&topo, &mut nodes) => result,
        name = signals.first() => Err(anyhow!("interrupted by {name}")),
    };
    if !nodes.is_empty() {
        println!("wan: stopping {} node(s)", nodes.len());
        stop_all(&mut nodes, STOP_GRACE, "wan").await;
    }
    topo.remove();
    outcome
}

fn main() -> ExitCode {
    if let Err(error) = preflight() {
        eprintln!("wan: {error:#}");
        return ExitCode::FAILURE;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("the async runtime starts");
    match runtime.block_on(main_async()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("wan: {error:#}");
            ExitCode::FAILURE
        }
    }
}
