//! The swarm with miners behind NATs, side by side in one run: what relaying and hole
//! punching cost in training throughput, how long a miner behind a NAT takes from its start to
//! its first sample, and how often a hole punch through a cone NAT succeeds.
//!
//! # What it measures
//!
//! 1. **Tokens/s** of the same run (tiny preset, 3 stages, a validator and 6 miners) in three
//!    scenarios, each on a fresh [`Topology`] with fresh nodes:
//!    - `public`: every node on the public segment;
//!    - `punched`: 4 public miners, and 2 miners behind their own cone NATs (hole punching
//!      gives them a direct connection to each other);
//!    - `relayed`: the same behind symmetric NATs (punching fails: their traffic to each other
//!      stays on a relay; to the public nodes they dial out directly).
//!
//!    The validator runs a relay server (its default) and so does the first public miner
//!    (`--relay-server on`), in every scenario, so that a NATed miner holds two reservations.
//!    Every node's link is limited to 100 Mbit/s in both directions (a token bucket on its
//!    interface and one on the far end of its veth pair, [`Topology::shape_both`]). Tokens/s
//!    is computed as `local-swarm` and the `wan` bench compute it: tokens of the trained
//!    epochs over the span from the first to the last loss record the validator heard. Each
//!    scenario must train: the bench fails when its held-out loss does not fall.
//! 2. **Spawn to first sample** of the last two miners started in each scenario (the NATed
//!    pair in `punched` and `relayed`, two public miners in `public` as the baseline): from
//!    spawning the process to `samples_processed > 0` in its `/status`, polled every 200 ms.
//! 3. **Hole punch success** over 20 tries: a public relay (an in-process node with a relay
//!    server) and two hosts behind two cone NATs. Each try starts two fresh in-process p2p
//!    nodes, one per NAT host, each on its own thread inside that host's namespace with a
//!    current-thread runtime, listening on TCP and QUIC at its LAN address with hole punching
//!    on. Both connect to the relay over QUIC first (the listener by reserving a slot, the
//!    dialer by dialling it) and wait until identify has told them how the relay sees them
//!    (their hole punch candidates). Then the dialer dials the listener's circuit address,
//!    and the try waits (at most 30 s) for either node to report a hole punch: succeeded (a
//!    direct connection; the time from the circuit dial is reported) or failed. The same 20
//!    tries behind two symmetric NATs are the control (expected: none succeeds).
//!
//! # Running it
//!
//! `cargo bench -p iota-tests --bench nat` (or `--profile dev`, which builds much faster and
//! runs the node binary of that profile), as root: it creates network namespaces, nftables
//! NAT rules and tc qdiscs ([`iota_tests::netns`]); without root, `ip`, `nft` or `tc` it says
//! so and exits non-zero. Addresses are `10.77.x.y` inside the namespaces only; nothing is
//! created in the root namespace. The namespaces are removed when each scenario ends, also on
//! failure or panic, and on SIGINT, SIGTERM or SIGHUP; a later run removes those of a killed
//! one.
//!
//! It prints Markdown tables and
//! `RESULT nat tokens_per_s_public=… tokens_per_s_punched=… tokens_per_s_relayed=…
//! ratio_punched=… ratio_relayed=…`, `RESULT nat-loss …` (held-out loss after the last
//! epoch), `RESULT nat-first-sample <scenario>_<miner>_s=…`, and
//! `RESULT nat-punch tries=… succeeded=… median_ms=…` (and `nat-punch-symmetric`).
//! `IOTA_BENCH_EPOCHS` (default 3), `IOTA_BENCH_SAMPLES` (samples per head per epoch, default
//! 50), `IOTA_BENCH_RATE_MBIT` (default 100), `IOTA_BENCH_TIMEOUT_SECS` (per scenario,
//! default 600), `IOTA_BENCH_PUNCH_TRIES` (default 20) and `IOTA_BENCH_PUNCH_CONTROL` (`0`
//! skips the symmetric control) change it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context};
use bootstrap::{ModelPreset, RunConfig};
use iota_p2p::launcher::{epoch_of, epoch_totals, stop_all, CpuWatch, EpochTotals, StopSignals};
use iota_tests::netns::{self, in_netns, start_on, Host, NatKind, Topology};
use iota_tests::{binary, keygen, run_files, wait_for, NodeProcess};
use p2p::multiaddr::Protocol;
use p2p::{Multiaddr, PeerId};

/// Miners of every scenario, and how many of them sit behind NATs in the NAT scenarios.
const MINERS: usize = 6;
const NATTED: usize = 2;
const STAGES: u32 = 3;
/// How often a watched miner's `/status` is read for its first sample.
const SAMPLE_POLL: Duration = Duration::from_millis(200);
/// The validator's epochs are read every this many sample polls (once a second).
const EPOCH_POLL_EVERY: u64 = 5;
/// How long a node gets to stop after SIGTERM.
const STOP_GRACE: Duration = Duration::from_secs(15);
/// Share of the CPUs other processes may use during a scenario before its row is called
/// incomparable.
const BUSY: f64 = 0.1;
/// How long a hole punch try waits for a result after the circuit dial.
const PUNCH_DEADLINE: Duration = Duration::from_secs(30);
/// How long each step before it (listening, reserving, meeting the relay) may take.
const PUNCH_SETUP: Duration = Duration::from_secs(20);
/// How often the punch tries read their nodes' connectivity.
const PUNCH_POLL: Duration = Duration::from_millis(20);
/// The relay's port, TCP and UDP (QUIC), in its own namespace.
const RELAY_PORT: u16 = 4001;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The bench's settings, from the environment.
#[derive(Debug, Clone)]
struct Knobs {
    epochs: u64,
    samples: u64,
    rate_mbit: u32,
    timeout: Duration,
    tries: usize,
    control: bool,
}

impl Knobs {
    fn from_env() -> Knobs {
        Knobs {
            epochs: env_or("IOTA_BENCH_EPOCHS", 3u64).max(1),
            samples: env_or("IOTA_BENCH_SAMPLES", 50u64).max(1),
            rate_mbit: env_or("IOTA_BENCH_RATE_MBIT", 100u32).max(1),
            timeout: Duration::from_secs(env_or("IOTA_BENCH_TIMEOUT_SECS", 600)),
            tries: env_or("IOTA_BENCH_PUNCH_TRIES", 20usize).max(1),
            control: env_or("IOTA_BENCH_PUNCH_CONTROL", 1u8) != 0,
        }
    }
}

/// One side of the throughput comparison.
#[derive(Debug, Clone, Copy)]
struct Scenario {
    /// `public`, `punched` or `relayed`: the RESULT fields' suffix and the topology's tag.
    key: &'static str,
    /// The NAT of each NATed miner; `None`: every miner is public.
    nat: Option<NatKind>,
    /// Name of the NATed miners, before their index.
    natted: &'static str,
}

const SCENARIOS: [Scenario; 3] = [
    Scenario {
        key: "public",
        nat: None,
        natted: "",
    },
    Scenario {
        key: "punched",
        nat: Some(NatKind::Cone),
        natted: "cone",
    },
    Scenario {
        key: "relayed",
        nat: Some(NatKind::Symmetric),
        natted: "sym",
    },
];

/// `cone` or `symmetric`.
fn kind_name(kind: NatKind) -> &'static str {
    match kind {
        NatKind::Cone => "cone",
        NatKind::Symmetric => "symmetric",
    }
}

/// What the validator's epochs say of a scenario's training.
type Training = EpochTotals;

fn num(row: &serde_json::Value, key: &str) -> Option<f64> {
    row[key].as_f64()
}

/// A watched miner (one of the last two started) at the end of its scenario.
#[derive(Debug, Clone)]
struct Watched {
    name: String,
    /// `public`, or the NAT it sits behind.
    place: String,
    seen: Milestones,
    stage: String,
    reachability: String,
    relays: usize,
    direct: usize,
    relayed: usize,
    /// How it reaches the other watched miner (`direct`, `relayed`, `none`).
    path_to_other: String,
    punches_ok: u64,
    punches_failed: u64,
}

/// When, after its start, a watched miner was first seen to have served a sample, to be
/// private with two relay reservations, to have hole-punched, and to be connected to the other
/// watched miner (and how).
#[derive(Debug, Clone, Default)]
struct Milestones {
    first_sample: Option<Duration>,
    reserved: Option<Duration>,
    punched: Option<Duration>,
    met: Option<(Duration, String)>,
}

impl Milestones {
    /// Notes what `status` shows at `since` after the start; whether it shows the first
    /// sample for the first time.
    fn note(&mut self, status: &serde_json::Value, other: &str, since: Duration) -> bool {
        let nat = &status["nat"];
        if self.reserved.is_none()
            && nat["reachability"] == "private"
            && nat["relays"].as_array().map_or(0, Vec::len) >= 2
        {
            self.reserved = Some(since);
        }
        if self.punched.is_none() && nat["hole_punches_succeeded"].as_u64().unwrap_or(0) >= 1 {
            self.punched = Some(since);
        }
        if self.met.is_none() && !other.is_empty() {
            if let Some(path) = nat["peer_paths"][other].as_str() {
                self.met = Some((since, path.to_string()));
            }
        }
        let first =
            self.first_sample.is_none() && status["samples_processed"].as_u64().unwrap_or(0) > 0;
        if first {
            self.first_sample = Some(since);
        }
        first
    }
}

/// The figures of one scenario.
#[derive(Debug, Clone)]
struct Outcome {
    scenario: Scenario,
    training: Training,
    watched: Vec<Watched>,
    wall: Duration,
    /// Share of the machine's CPU time that processes other than this bench and its nodes
    /// used during the scenario (the machine may be shared).
    other_cpu: f64,
}

fn run_config(knobs: &Knobs, scenario: &Scenario) -> RunConfig {
    RunConfig {
        run_name: format!("nat-{}", scenario.key),
        preset: ModelPreset::Tiny,
        stages: STAGES,
        epoch_samples: knobs.samples,
        lr_decay_epochs: knobs.epochs,
        ..RunConfig::default()
    }
}

/// Prints the epochs the validator has finished since the last call (`printed` of them so
/// far).
fn print_epochs(rows: &[serde_json::Value], printed: &mut u64, epochs: u64) {
    while *printed < epochs {
        let Some(row) = rows.iter().find(|r| epoch_of(r) == *printed) else {
            return;
        };
        let Some(val) = rows
            .iter()
            .find(|r| epoch_of(r) == *printed + 1)
            .and_then(|r| num(r, "val_loss"))
        else {
            return;
        };
        let secs =
            num(row, "last_record_s").unwrap_or(0.0) - num(row, "first_record_s").unwrap_or(0.0);
        println!(
            "  epoch {:>2}  train loss {:.3}  held-out loss {val:.3}  {:>6.0} tokens/s  {} samples ({} dropped)",
            *printed,
            num(row, "train_loss").unwrap_or(f64::NAN),
            row["tokens"].as_u64().unwrap_or(0) as f64 / secs,
            row["samples"].as_u64().unwrap_or(0),
            row["dropped"].as_u64().unwrap_or(0),
        );
        *printed += 1;
    }
}

/// One scenario on a fresh topology: starts the nodes, follows the run to its last epoch
/// while watching the last two miners for their first sample, and stops everything.
async fn run_scenario(knobs: &Knobs, scenario: Scenario) -> anyhow::Result<Outcome> {
    let natted = if scenario.nat.is_some() { NATTED } else { 0 };
    let kinds: Vec<NatKind> = scenario.nat.into_iter().cycle().take(natted).collect();
    // Declared before the nodes, so dropped after them: a failed scenario's processes are
    // killed before its namespaces go.
    let mut topo = Topology::create(scenario.key, &kinds)?;
    let dir = iota_tests::scratch_dir(&format!("bench-nat-{}", scenario.key));
    let validator_host = topo.add_public("validator")?;
    let mut miners: Vec<(String, Host, String)> = Vec::new();
    for i in 0..MINERS - natted {
        let name = format!("pub{i}");
        let host = topo.add_public(&name)?;
        miners.push((name, host, "public".into()));
    }
    for (i, kind) in kinds.iter().enumerate() {
        let name = format!("{}{i}", scenario.natted);
        let host = topo.add_behind_nat(i + 1, &name)?;
        miners.push((name, host, format!("{} NAT {}", kind_name(*kind), i + 1)));
    }
    for host in std::iter::once(&validator_host).chain(miners.iter().map(|(_, h, _)| h)) {
        topo.shape_both(host, knobs.rate_mbit)?;
    }
    println!(
        "nat: scenario {}: validator and {MINERS} miners, {}, {} Mbit/s per node each way, {} epochs of {} samples per head",
        scenario.key,
        scenario.nat.map_or("all public".to_string(), |k| format!(
            "{natted} behind {} NATs",
            kind_name(k)
        )),
        knobs.rate_mbit,
        knobs.epochs,
        knobs.samples
    );

    let mut neurons = vec![(keygen(&dir, "validator"), 100, true)];
    for (name, _, _) in &miners {
        neurons.push((keygen(&dir, name), 0, false));
    }
    let files = run_files(&dir, &neurons, &run_config(knobs, &scenario));

    let started = Instant::now();
    let cpu_watch = CpuWatch::start();
    let mut nodes: Vec<NodeProcess> = Vec::new();
    let mut validator_args = files.clone();
    validator_args.push("--validator".into());
    nodes.push(start_on(&dir, &validator_host, "validator", &validator_args).await?);
    let boot = nodes[0].listen_addr();
    let mut spawned_at: BTreeMap<String, Instant> = BTreeMap::new();
    for (i, (name, host, _)) in miners.iter().enumerate() {
        let mut args = files.clone();
        args.extend(["--bootstrap".to_string(), boot.clone()]);
        if i == 0 {
            args.extend(["--relay-server".to_string(), "on".to_string()]);
        }
        spawned_at.insert(name.clone(), Instant::now());
        nodes.push(start_on(&dir, host, name, &args).await?);
    }
    let watched: Vec<String> = miners
        .iter()
        .skip(MINERS - NATTED)
        .map(|(name, _, _)| name.clone())
        .collect();
    let node = |name: &str| -> anyhow::Result<&NodeProcess> {
        nodes
            .iter()
            .find(|n| n.name == name)
            .with_context(|| format!("no node {name}"))
    };

    // Poll every 200 ms: the watched miners until each has served a sample (and once a
    // second after that, for how they are reached), the validator once a second until the
    // last epoch's held-out loss is in.
    let deadline = started + knobs.timeout;
    let mut seen: BTreeMap<String, Milestones> = BTreeMap::new();
    let mut peer_ids: BTreeMap<String, String> = BTreeMap::new();
    let mut rows: Vec<serde_json::Value> = Vec::new();
    let mut printed = 0u64;
    let mut ticker = tokio::time::interval(SAMPLE_POLL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut tick = 0u64;
    loop {
        ticker.tick().await;
        let every_second = tick % EPOCH_POLL_EVERY == 0;
        for (i, name) in watched.iter().enumerate() {
            let m = seen.entry(name.clone()).or_default();
            if m.first_sample.is_some() && !every_second {
                continue;
            }
            let Ok(status) = node(name)?.status().await else {
                continue;
            };
            if let Some(peer) = status["peer_id"].as_str() {
                peer_ids.insert(name.clone(), peer.to_string());
            }
            let other = peer_ids
                .get(&watched[(i + 1) % watched.len()])
                .cloned()
                .unwrap_or_default();
            let since = spawned_at
                .get(name)
                .map_or(Duration::ZERO, Instant::elapsed);
            if m.note(&status, &other, since) {
                println!(
                    "  {name}: first sample {:.1} s after its start",
                    since.as_secs_f64()
                );
            }
        }
        if every_second {
            if let Ok(status) = nodes[0].status().await {
                rows = status["epochs"].as_array().cloned().unwrap_or_default();
                print_epochs(&rows, &mut printed, knobs.epochs);
            }
        }
        tick += 1;
        let trained = rows
            .iter()
            .any(|r| epoch_of(r) == knobs.epochs && num(r, "val_loss").is_some());
        if trained {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the run did not finish {} epochs within {:?} ({printed} reported); logs in {}",
            knobs.epochs,
            knobs.timeout,
            dir.display()
        );
    }
    let wall = started.elapsed();
    let training = epoch_totals(&rows, knobs.epochs)?;

    // How the watched miners ended up reached.
    let mut statuses = BTreeMap::new();
    for name in &watched {
        statuses.insert(name.clone(), node(name)?.status().await?);
    }
    let mut report = Vec::new();
    for (i, name) in watched.iter().enumerate() {
        let s = &statuses[name];
        let other = &statuses[&watched[(i + 1) % watched.len()]];
        let nat = &s["nat"];
        let paths: Vec<&str> = nat["peer_paths"]
            .as_object()
            .map(|m| m.values().filter_map(|v| v.as_str()).collect())
            .unwrap_or_default();
        let place = miners
            .iter()
            .find(|(n, _, _)| n == name)
            .map_or(String::new(), |(_, _, p)| p.clone());
        report.push(Watched {
            name: name.clone(),
            place,
            seen: seen.get(name).cloned().unwrap_or_default(),
            stage: s["stage"].to_string(),
            reachability: nat["reachability"].as_str().unwrap_or("?").to_string(),
            relays: nat["relays"].as_array().map_or(0, Vec::len),
            direct: paths.iter().filter(|p| **p == "direct").count(),
            relayed: paths.iter().filter(|p| **p == "relayed").count(),
            path_to_other: other["peer_id"]
                .as_str()
                .and_then(|peer| nat["peer_paths"][peer].as_str())
                .unwrap_or("none")
                .to_string(),
            punches_ok: nat["hole_punches_succeeded"].as_u64().unwrap_or(0),
            punches_failed: nat["hole_punches_failed"].as_u64().unwrap_or(0),
        });
    }

    let other_cpu = cpu_watch.others_share(&nodes);
    let failed = stop_all(&mut nodes, STOP_GRACE, "nat").await;
    drop(topo);
    ensure!(failed == 0, "{failed} node(s) did not stop cleanly");
    println!(
        "  {:.0} tokens/s, held-out loss {:.4} → {:.4}, {:.0} s; other processes used {:.0} % of the CPUs{}",
        training.tokens_per_s,
        training.val_start.1,
        training.val_end.1,
        wall.as_secs_f64(),
        100.0 * other_cpu,
        if other_cpu > BUSY {
            " (a busy machine: this row is not comparable)"
        } else {
            ""
        }
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(Outcome {
        scenario,
        training,
        watched: report,
        wall,
        other_cpu,
    })
}

/// An in-process p2p node on a thread of its own inside a network namespace, driven by a
/// current-thread runtime there, so that all of its sockets are in that namespace.
struct NsNode {
    client: p2p::Client,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
}

impl NsNode {
    /// Spawns a node with a fresh identity and `config` in namespace `ns`.
    async fn start(ns: &str, config: p2p::Config) -> anyhow::Result<NsNode> {
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<p2p::Client>();
        let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
        let name = ns.to_string();
        let thread = std::thread::Builder::new()
            .name(format!("p2p in {ns}"))
            .spawn(move || -> anyhow::Result<()> {
                in_netns(&name, move || -> anyhow::Result<()> {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .context("building the node's runtime")?;
                    runtime.block_on(async move {
                        let keypair = p2p::identity::Keypair::generate_ed25519();
                        let (client, mut events, task) =
                            p2p::spawn(keypair, config, p2p::Metrics::unregistered())
                                .context("spawning the node")?;
                        let _ = ready_tx.send(client.clone());
                        // Events are read and dropped until the bench stops the node.
                        loop {
                            tokio::select! {
                                _ = &mut stop_rx => break,
                                event = events.recv() => {
                                    if event.is_none() {
                                        break;
                                    }
                                }
                            }
                        }
                        client.shutdown().await;
                        drop(events);
                        tokio::time::timeout(Duration::from_secs(5), task)
                            .await
                            .context("the node's event loop did not stop within 5 s")?
                            .context("the node's event loop failed")
                    })
                })?
            })
            .context("spawning a node thread")?;
        match tokio::time::timeout(PUNCH_SETUP, ready_rx).await {
            Ok(Ok(client)) => Ok(NsNode {
                client,
                stop: Some(stop_tx),
                thread: Some(thread),
            }),
            // The thread ended before it handed over a client: its error says why.
            Ok(Err(_)) => {
                let error = match tokio::task::spawn_blocking(move || thread.join()).await? {
                    Ok(Err(error)) => error,
                    Ok(Ok(())) => anyhow!("the node stopped at once"),
                    Err(_) => anyhow!("the node's thread panicked"),
                };
                Err(error.context(format!("starting a node in {ns}")))
            }
            Err(_) => {
                let _ = stop_tx.send(());
                let _ = tokio::task::spawn_blocking(move || thread.join()).await;
                bail!("a node in {ns} did not start within {PUNCH_SETUP:?}")
            }
        }
    }

    fn peer_id(&self) -> PeerId {
        self.client.local_peer_id()
    }

    /// Stops the node and waits for its thread.
    async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.thread.take() {
            Some(thread) => tokio::task::spawn_blocking(move || thread.join())
                .await?
                .map_err(|_| anyhow!("a node's thread panicked"))?,
            None => Ok(()),
        }
    }
}

impl Drop for NsNode {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Whether `addr` is a QUIC address.
fn is_quic(addr: &Multiaddr) -> bool {
    addr.iter().any(|p| matches!(p, Protocol::QuicV1))
}

/// A node behind a NAT: TCP and QUIC on its LAN address, hole punching on.
fn natted_config(host: &Host) -> anyhow::Result<p2p::Config> {
    Ok(p2p::Config {
        listen: vec![
            format!("/ip4/{}/tcp/0", host.addr).parse()?,
            format!("/ip4/{}/udp/0/quic-v1", host.addr).parse()?,
        ],
        hole_punch: true,
        ..p2p::Config::default()
    })
}

/// Waits until `node` listens on QUIC (its dials then leave from that socket, the port its
/// NAT maps and a hole punch aims at).
async fn wait_listening(node: &NsNode) -> anyhow::Result<()> {
    wait_for("a QUIC listener", PUNCH_SETUP, PUNCH_POLL, || async {
        let addrs = node.client.listen_addrs().await?;
        Ok((addrs.iter().any(is_quic), format!("{addrs:?}")))
    })
    .await
    .map(drop)
}

/// Waits until `node` has identified the relay (it is in its routing table), and so has
/// learnt the address the relay sees it at, and, with `reserved`, holds a reservation on it.
async fn wait_relay_known(node: &NsNode, relay: PeerId, reserved: bool) -> anyhow::Result<()> {
    wait_for(
        "the relay to be identified",
        PUNCH_SETUP,
        PUNCH_POLL,
        || async {
            let known = node.client.routing_table_peers().await?.contains(&relay);
            let relays = node.client.connectivity().await?.relays;
            let held = !reserved || relays.contains(&relay);
            Ok((
                known && held,
                format!("identified {known}, reservations {relays:?}"),
            ))
        },
    )
    .await
    .map(drop)
}

/// How one hole punch try ended.
#[derive(Debug, Clone)]
struct Try {
    /// Time from the circuit dial to the reported hole punch, when it succeeded.
    direct_after: Option<Duration>,
    /// Why it failed, in a few words.
    failure: Option<String>,
    /// Time from the circuit dial to the reported failure, when a hole punch failed.
    failed_after: Option<Duration>,
}

/// One try: fresh listener behind NAT 1 and dialer behind NAT 2; see the module docs.
async fn punch_try(
    topo_hosts: &(Host, Host),
    relay: PeerId,
    relay_quic: &Multiaddr,
) -> anyhow::Result<Try> {
    let (a, b) = topo_hosts;
    let listener = NsNode::start(&a.ns, natted_config(a)?).await?;
    let dialer = NsNode::start(&b.ns, natted_config(b)?).await?;
    let outcome = async {
        wait_listening(&listener).await?;
        wait_listening(&dialer).await?;
        let via_relay = relay_quic.clone().with(Protocol::P2p(relay));
        listener
            .client
            .listen_on(via_relay.clone().with(Protocol::P2pCircuit))
            .await?;
        dialer.client.dial(via_relay.clone()).await?;
        wait_relay_known(&listener, relay, true)
            .await
            .context("listener")?;
        wait_relay_known(&dialer, relay, false)
            .await
            .context("dialer")?;
        let circuit = via_relay
            .with(Protocol::P2pCircuit)
            .with(Protocol::P2p(listener.peer_id()));
        let dialled = Instant::now();
        dialer.client.dial(circuit).await?;
        let mut ticker = tokio::time::interval(PUNCH_POLL);
        loop {
            ticker.tick().await;
            let d = dialer.client.connectivity().await?;
            let l = listener.client.connectivity().await?;
            if d.hole_punches_succeeded + l.hole_punches_succeeded >= 1 {
                return Ok(Try {
                    direct_after: Some(dialled.elapsed()),
                    failure: None,
                    failed_after: None,
                });
            }
            let path = d
                .peers
                .get(&listener.peer_id())
                .map_or("not connected", |p| p.as_str());
            if d.hole_punches_failed + l.hole_punches_failed >= 1 {
                return Ok(Try {
                    direct_after: None,
                    failure: Some(format!("hole punch failed (path {path})")),
                    failed_after: Some(dialled.elapsed()),
                });
            }
            if dialled.elapsed() >= PUNCH_DEADLINE {
                return Ok(Try {
                    direct_after: None,
                    failed_after: None,
                    failure: Some(format!(
                        "no hole punch within {PUNCH_DEADLINE:?} (path {path})"
                    )),
                });
            }
        }
    }
    .await
    .unwrap_or_else(|error: anyhow::Error| Try {
        direct_after: None,
        failure: Some(format!("setup: {error:#}")),
        failed_after: None,
    });
    listener.stop().await?;
    dialer.stop().await?;
    Ok(outcome)
}

/// `tries` hole punch tries between two hosts behind NATs of `kind`, through one relay.
async fn punch_series(kind: NatKind, tries: usize) -> anyhow::Result<Vec<Try>> {
    let tag = format!("punch_{}", kind_name(kind));
    let mut topo = Topology::create(&tag, &[kind, kind])?;
    let relay_host = topo.add_public("relay")?;
    let hosts = (topo.add_behind_nat(1, "a")?, topo.add_behind_nat(2, "b")?);
    let relay_tcp: Multiaddr = format!("/ip4/{}/tcp/{RELAY_PORT}", relay_host.addr).parse()?;
    let relay_quic: Multiaddr =
        format!("/ip4/{}/udp/{RELAY_PORT}/quic-v1", relay_host.addr).parse()?;
    // The operator's external addresses make the relay serve from the start (no AutoNAT
    // round needed).
    let relay = NsNode::start(
        &relay_host.ns,
        p2p::Config {
            listen: vec![relay_tcp.clone(), relay_quic.clone()],
            external: vec![relay_tcp, relay_quic.clone()],
            relay_server: Some(p2p::RelayLimits::default()),
            ..p2p::Config::default()
        },
    )
    .await?;
    wait_listening(&relay).await?;
    println!(
        "nat: {tries} hole punch tries behind two {} NATs",
        kind_name(kind)
    );
    let mut results = Vec::new();
    for i in 0..tries {
        let t = punch_try(&hosts, relay.peer_id(), &relay_quic).await?;
        match (&t.direct_after, &t.failure) {
            (Some(after), _) => println!(
                "  try {:>2}: direct after {:.0} ms",
                i + 1,
                after.as_secs_f64() * 1e3
            ),
            (None, why) => println!(
                "  try {:>2}: {}{}",
                i + 1,
                why.as_deref().unwrap_or("?"),
                t.failed_after.map_or(String::new(), |d| format!(
                    " after {:.0} ms",
                    d.as_secs_f64() * 1e3
                ))
            ),
        }
        results.push(t);
    }
    relay.stop().await?;
    drop(topo);
    Ok(results)
}

/// Successes, median and range of the times to a direct connection, and the failures by
/// reason.
struct PunchSummary {
    tries: usize,
    succeeded: usize,
    median_ms: Option<f64>,
    min_ms: Option<f64>,
    max_ms: Option<f64>,
    /// Median time from the circuit dial to a reported failure.
    median_failed_ms: Option<f64>,
    failures: BTreeMap<String, usize>,
}

/// The median of `values` (sorted here).
fn median(values: &mut [f64]) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => None,
        n if n % 2 == 1 => Some(values[n / 2]),
        n => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

fn summarise_punches(tries: &[Try]) -> PunchSummary {
    let mut ms: Vec<f64> = tries
        .iter()
        .filter_map(|t| t.direct_after)
        .map(|d| d.as_secs_f64() * 1e3)
        .collect();
    let median_ms = median(&mut ms);
    let mut failed_ms: Vec<f64> = tries
        .iter()
        .filter_map(|t| t.failed_after)
        .map(|d| d.as_secs_f64() * 1e3)
        .collect();
    let mut failures = BTreeMap::new();
    for why in tries.iter().filter_map(|t| t.failure.as_ref()) {
        *failures.entry(why.clone()).or_insert(0) += 1;
    }
    PunchSummary {
        tries: tries.len(),
        succeeded: ms.len(),
        median_ms,
        min_ms: ms.first().copied(),
        max_ms: ms.last().copied(),
        median_failed_ms: median(&mut failed_ms),
        failures,
    }
}

fn ms_cell(v: Option<f64>) -> String {
    v.map_or("–".to_string(), |v| format!("{v:.0}"))
}

/// The scenarios, the hole punch tries, then the tables and the RESULT lines.
async fn bench() -> anyhow::Result<()> {
    let knobs = Knobs::from_env();
    let began = Instant::now();
    let mut outcomes: Vec<Outcome> = Vec::new();
    for scenario in SCENARIOS {
        let outcome = run_scenario(&knobs, scenario)
            .await
            .with_context(|| format!("scenario {}", scenario.key))?;
        outcomes.push(outcome);
    }
    let cone = punch_series(NatKind::Cone, knobs.tries).await?;
    let symmetric = if knobs.control {
        Some(punch_series(NatKind::Symmetric, knobs.tries).await?)
    } else {
        None
    };

    let public = outcomes
        .iter()
        .find(|o| o.scenario.key == "public")
        .map_or(f64::NAN, |o| o.training.tokens_per_s);
    println!();
    println!("| scenario | miners | tokens/s | vs all public | held-out loss start → end | samples (dropped) | span of the loss records | wall | CPU used by other processes |");
    println!("|---|---|---:|---:|---|---:|---:|---:|---:|");
    for o in &outcomes {
        let t = &o.training;
        let miners = match o.scenario.nat {
            None => format!("{MINERS} public"),
            Some(kind) => format!(
                "{} public, {NATTED} behind {} NATs",
                MINERS - NATTED,
                kind_name(kind)
            ),
        };
        println!(
            "| {} | {miners} | {:.0} | {:.2} | {:.4} → {:.4} | {} ({}) | {:.1} s | {:.0} s | {:.0} %{} |",
            o.scenario.key,
            t.tokens_per_s,
            t.tokens_per_s / public,
            t.val_start.1,
            t.val_end.1,
            t.samples,
            t.dropped,
            t.span,
            o.wall.as_secs_f64(),
            100.0 * o.other_cpu,
            if o.other_cpu > BUSY { " (not comparable)" } else { "" }
        );
    }
    println!();
    println!("| scenario | miner | where | stage | spawn → first sample | private with 2 reservations | first connected to the other | first hole punch | at the end: reachability, reservations, peers direct / relayed, path to the other, punches ok / failed |");
    println!("|---|---|---|---:|---:|---:|---|---:|---|");
    let secs =
        |d: Option<Duration>| d.map_or("–".to_string(), |d| format!("{:.1} s", d.as_secs_f64()));
    for o in &outcomes {
        for w in &o.watched {
            let m = &w.seen;
            println!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {}, {}, {} / {}, {}, {} / {} |",
                o.scenario.key,
                w.name,
                w.place,
                w.stage,
                secs(m.first_sample),
                secs(m.reserved),
                m.met.as_ref().map_or("–".to_string(), |(at, path)| format!(
                    "{:.1} s, {path}",
                    at.as_secs_f64()
                )),
                secs(m.punched),
                w.reachability,
                w.relays,
                w.direct,
                w.relayed,
                w.path_to_other,
                w.punches_ok,
                w.punches_failed,
            );
        }
    }
    let mut punches = vec![("cone", summarise_punches(&cone))];
    if let Some(symmetric) = &symmetric {
        punches.push(("symmetric", summarise_punches(symmetric)));
    }
    println!();
    println!(
        "| NATs | tries | succeeded | median ms to direct | fastest – slowest ms | failures | median ms to a failure |"
    );
    println!("|---|---:|---:|---:|---|---|---:|");
    for (kind, p) in &punches {
        let failures: Vec<String> = p
            .failures
            .iter()
            .map(|(why, n)| format!("{n}× {why}"))
            .collect();
        println!(
            "| {kind} | {} | {} | {} | {} – {} | {} | {} |",
            p.tries,
            p.succeeded,
            ms_cell(p.median_ms),
            ms_cell(p.min_ms),
            ms_cell(p.max_ms),
            if failures.is_empty() {
                "–".to_string()
            } else {
                failures.join("; ")
            },
            ms_cell(p.median_failed_ms)
        );
    }
    println!();
    let field = |key: &str, value: fn(&Outcome) -> f64, digits: usize, name: &str| -> String {
        outcomes
            .iter()
            .find(|o| o.scenario.key == key)
            .map_or(String::new(), |o| {
                format!(" {name}_{key}={:.digits$}", value(o))
            })
    };
    let ratio = |key: &str| -> String {
        outcomes
            .iter()
            .find(|o| o.scenario.key == key)
            .map_or(String::new(), |o| {
                format!(" ratio_{key}={:.3}", o.training.tokens_per_s / public)
            })
    };
    println!(
        "RESULT nat{}{}{}{}{}",
        field("public", |o| o.training.tokens_per_s, 1, "tokens_per_s"),
        field("punched", |o| o.training.tokens_per_s, 1, "tokens_per_s"),
        field("relayed", |o| o.training.tokens_per_s, 1, "tokens_per_s"),
        ratio("punched"),
        ratio("relayed")
    );
    println!(
        "RESULT nat-loss{}{}{}",
        field("public", |o| o.training.val_end.1, 4, "val_loss"),
        field("punched", |o| o.training.val_end.1, 4, "val_loss"),
        field("relayed", |o| o.training.val_end.1, 4, "val_loss")
    );
    let firsts: String = outcomes
        .iter()
        .flat_map(|o| {
            o.watched.iter().map(move |w| {
                format!(
                    " {}_{}_s={}",
                    o.scenario.key,
                    w.name,
                    w.seen
                        .first_sample
                        .map_or("none".to_string(), |d| format!("{:.1}", d.as_secs_f64()))
                )
            })
        })
        .collect();
    println!("RESULT nat-first-sample{firsts}");
    for (kind, p) in &punches {
        let name = if *kind == "cone" {
            "nat-punch".to_string()
        } else {
            format!("nat-punch-{kind}")
        };
        println!(
            "RESULT {name} tries={} succeeded={} median_ms={}",
            p.tries,
            p.succeeded,
            p.median_ms
                .map_or("none".to_string(), |m| format!("{m:.0}"))
        );
    }
    println!("nat: {:.0} s in all", began.elapsed().as_secs_f64());
    let untrained: Vec<&str> = outcomes
        .iter()
        .filter(|o| o.training.val_end.1 >= o.training.val_start.1)
        .map(|o| o.scenario.key)
        .collect();
    ensure!(
        untrained.is_empty(),
        "the held-out loss did not fall in: {}",
        untrained.join(", ")
    );
    Ok(())
}

async fn main_async() -> anyhow::Result<()> {
    let mut signals = StopSignals::install()?;
    // On a signal the bench's future is dropped: its nodes, then its topology, with it.
    tokio::select! {
        result = bench() => result,
        name = signals.first() => Err(anyhow!("interrupted by {name}")),
    }
}

/// Root, `ip`, `nft` (what [`netns::available`] checks) and `tc`.
fn preflight() -> anyhow::Result<()> {
    ensure!(
        netns::available()?,
        "this benchmark cannot run here: it needs what the network namespace tests need (the line above)"
    );
    let tc = Command::new("tc")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ensure!(tc, "this benchmark needs `tc` (iproute2) on PATH");
    Ok(())
}

fn main() -> ExitCode {
    if let Err(error) = preflight() {
        eprintln!("nat: {error:#}");
        return ExitCode::FAILURE;
    }
    // Builds the node binary of this profile before anything is timed.
    let node: PathBuf = binary().to_path_buf();
    println!("nat: node binary {}", node.display());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("the async runtime starts");
    match runtime.block_on(main_async()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("nat: {error:#}");
            ExitCode::FAILURE
        }
    }
}
