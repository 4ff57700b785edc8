//! Rogue peers against a live swarm: a stranger with a fresh key (an in-process node built on
//! the p2p crate, speaking the same protocols as the binary) attacks a 3-stage swarm of 6
//! miners and a validator. Every attack must be refused — a labelled rejection counter
//! rises — while every honest node stays up, epochs keep advancing well before the epoch
//! timeout, and the held-out loss the run reports is the one the honest evaluator measured.
//!
//! The test runs every attack before judging, and reports every failed expectation at once,
//! so a run on code without the defences lists all that got through.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bootstrap::RunConfig;
use iota_tests::{keygen, metric, run_files, scratch_dir, start_node, wait_for, NodeProcess};
use p2p::{identity::Keypair, Client, Config, Multiaddr, PeerId};
use tokio::task::JoinHandle;
use training::butterfly::{Commitment, Gossip, Hash};

const POLL: Duration = Duration::from_millis(500);
/// The epoch timeout of the test run: epochs must advance well before it.
const EPOCH_TIMEOUT_SECS: u64 = 120;
/// A held-out loss nobody honest measures.
const FORGED_LOSS: f64 = 0.1234;
/// Request-response tags of the node's services (node/src/wire/rpc.rs).
const FORWARD: u8 = 0x02;
const EVAL: u8 = 0x03;
const WEIGHTS: u8 = 0x04;
const ERROR: u8 = 0x00;
/// Fake miners that only send heartbeats.
const FAKE_MINERS: usize = 5;

fn test_run() -> RunConfig {
    RunConfig {
        run_name: "rogue-test".into(),
        epoch_samples: 12,
        epoch_timeout_secs: EPOCH_TIMEOUT_SECS,
        ..RunConfig::default()
    }
}

fn as_str(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// A stranger's node: fresh key, bootstrapped to the swarm, following the run's topics.
struct Stranger {
    client: Client,
    pump: JoinHandle<()>,
    event_loop: JoinHandle<()>,
}

impl Stranger {
    async fn spawn(boot: &str, run: &str) -> Stranger {
        let config = Config {
            bootstrap: vec![boot.parse::<Multiaddr>().unwrap()],
            topics: vec![
                format!("iota/{run}/heartbeat/1"),
                format!("iota/{run}/plan/2"),
                format!("iota/{run}/pipeline/1"),
            ],
            discovery_interval: Duration::from_millis(500),
            request_timeout: Duration::from_secs(30),
            ..Config::default()
        };
        let (client, mut events, event_loop) = p2p::spawn(
            Keypair::generate_ed25519(),
            config,
            p2p::Metrics::unregistered(),
        )
        .unwrap();
        // Drain events; a stranger validates nothing and relays nothing.
        let pump = tokio::spawn(async move { while events.recv().await.is_some() {} });
        Stranger {
            client,
            pump,
            event_loop,
        }
    }

    fn id(&self) -> String {
        self.client.local_peer_id().to_string()
    }

    async fn gossip(&self, run: &str, topic: &str, message: serde_json::Value) {
        let topic = format!("iota/{run}/{topic}/1");
        let bytes = serde_json::to_vec(&message).unwrap();
        // A publish may find no peer yet; the caller checks effects, not this.
        let _ = self.client.publish(&topic, bytes).await;
    }

    async fn stop(self) {
        self.client.shutdown().await;
        let _ = self.event_loop.await;
        self.pump.abort();
    }
}

/// A pipeline request body: tag, big-endian header length, JSON header, payload.
fn body(tag: u8, header: serde_json::Value, payload: &[u8]) -> Vec<u8> {
    let json = serde_json::to_vec(&header).unwrap();
    let mut out = vec![tag];
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(payload);
    out
}

/// An activation frame of `shape` made of zeros (it compresses to almost nothing).
fn zeros_frame(run: &RunConfig, sample: u64, shape: &[usize]) -> Vec<u8> {
    let mut id = [0u8; 8];
    id.copy_from_slice(&run.hash().as_bytes()[..8]);
    let meta = training::wire::FrameMeta {
        run: u64::from_le_bytes(id),
        sample,
        stage: 0,
        kind: training::wire::FrameKind::Activation,
    };
    let n = shape.iter().product();
    let codec = training::wire::Codec::new(training::WireDtype::Bf16);
    training::wire::encode(&codec, &meta, shape, &vec![0.0f32; n]).unwrap()
}

fn heartbeat(peer: &str, run: &RunConfig, counter: u64) -> serde_json::Value {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    serde_json::json!({
        "peer_id": peer,
        "role": "miner",
        "counter": counter,
        "sent_at_ms": now_ms,
        "run_hash": run.hash().to_hex(),
        "epoch": null,
        "stage": null,
    })
}

/// Resident memory of a process, in bytes.
fn rss(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

async fn epochs(validator: &NodeProcess) -> Vec<serde_json::Value> {
    validator
        .status()
        .await
        .ok()
        .and_then(|s| s["epochs"].as_array().cloned())
        .unwrap_or_default()
}

/// The validator's epoch (0 while it does not answer: the final checks say why).
async fn current_epoch(validator: &NodeProcess) -> u64 {
    validator
        .status()
        .await
        .ok()
        .and_then(|s| s["epoch"].as_u64())
        .unwrap_or(0)
}

/// How long until the validator knows the held-out loss at the start of `epoch`; `None` when
/// it did not within `timeout`.
async fn val_loss_within(
    validator: &NodeProcess,
    epoch: u64,
    timeout: Duration,
) -> Option<Duration> {
    wait_for(
        &format!("held-out loss at the start of epoch {epoch}"),
        timeout,
        POLL,
        || async {
            let rows = epochs(validator).await;
            let reached = rows
                .iter()
                .any(|r| r["epoch"] == epoch && r["val_loss"].is_number());
            Ok((
                reached,
                format!("latest {:?}", rows.last().map(|r| r["epoch"].clone())),
            ))
        },
    )
    .await
    .ok()
}

async fn wait_for_val_loss(validator: &NodeProcess, epoch: u64, timeout: Duration) -> Duration {
    val_loss_within(validator, epoch, timeout)
        .await
        .unwrap_or_else(|| panic!("no held-out loss for epoch {epoch} within {timeout:?}"))
}

/// Every `val_loss=` a node logged next to "held-out loss".
fn logged_val_losses(log: &str) -> Vec<f64> {
    log.lines()
        .filter(|l| l.contains("held-out loss"))
        .filter_map(|l| l.split("val_loss=").nth(1))
        .filter_map(|v| {
            v.split(|c: char| c.is_whitespace() || c == '\u{1b}')
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// One swarm at a time: two 7-node swarms on two cores would test the machine, not the
/// defences.
static ONE_SWARM: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A running swarm: 1 validator (stake 100) and 6 miners, all in the metagraph.
struct Swarm {
    /// Peer id of each node, by name (`validator`, `miner-0` … `miner-5`).
    ids: BTreeMap<String, String>,
    validator: NodeProcess,
    miners: Vec<NodeProcess>,
}

/// Starts the swarm of `run` under `dir`; `faults(name, peer id order)` gives a miner's
/// extra flags, where `order` is its rank among the miners' peer ids (stages are dealt in
/// that order: 0, 1, 2, 0, 1, 2).
async fn start_swarm(
    dir: &std::path::Path,
    run: &RunConfig,
    faults: impl Fn(usize) -> Vec<String>,
) -> Swarm {
    let names: Vec<String> = std::iter::once("validator".to_string())
        .chain((0..6).map(|i| format!("miner-{i}")))
        .collect();
    let ids: BTreeMap<String, String> = names.iter().map(|n| (n.clone(), keygen(dir, n))).collect();
    let neurons: Vec<(String, u64, bool)> = names
        .iter()
        .map(|n| {
            let v = n == "validator";
            (ids[n].clone(), if v { 100 } else { 0 }, v)
        })
        .collect();
    let common = run_files(dir, &neurons, run);
    let mut validator_args = common.clone();
    validator_args.push("--validator".into());
    let validator = start_node(dir, "validator", &as_str(&validator_args))
        .await
        .unwrap();
    let boot = validator.listen_addr();
    let mut by_id: Vec<&String> = names[1..].iter().collect();
    by_id.sort_by_key(|n| ids[*n].clone());
    let mut miners = Vec::new();
    for name in &names[1..] {
        let mut args = common.clone();
        args.extend(["--bootstrap".to_string(), boot.clone()]);
        let order = by_id.iter().position(|n| *n == name).unwrap_or(0);
        args.extend(faults(order));
        miners.push(start_node(dir, name, &as_str(&args)).await.unwrap());
    }
    Swarm {
        ids,
        validator,
        miners,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stranger_cannot_steer_or_exhaust_the_swarm() {
    let _swarm = ONE_SWARM.lock().await;
    let dir = scratch_dir("rogue");
    let run = test_run();
    let Swarm {
        ids,
        validator,
        miners,
    } = start_swarm(&dir, &run, |_| Vec::new()).await;
    let boot = validator.listen_addr();
    let miner_names: Vec<String> = miners.iter().map(|m| m.name.clone()).collect();
    wait_for_val_loss(&validator, 1, Duration::from_secs(240)).await;

    let stranger = Stranger::spawn(&boot, &run.run_name).await;
    let fakes: Vec<Stranger> = {
        let mut v = Vec::new();
        for _ in 0..FAKE_MINERS {
            v.push(Stranger::spawn(&boot, &run.run_name).await);
        }
        v
    };
    let me = stranger.id();
    // Wait until the stranger is connected to every honest node.
    let honest: BTreeSet<PeerId> = ids.values().map(|p| p.parse().unwrap()).collect();
    wait_for(
        "the stranger connects to every honest node",
        Duration::from_secs(60),
        POLL,
        || async {
            let connected: BTreeSet<PeerId> = stranger
                .client
                .connected_peers()
                .await?
                .into_iter()
                .collect();
            let missing = honest.difference(&connected).count();
            Ok((missing == 0, format!("{missing} missing")))
        },
    )
    .await
    .unwrap();

    let mut failures: Vec<String> = Vec::new();
    let epoch = current_epoch(&validator).await;
    let mut stage_of = BTreeMap::new();
    for m in &miners {
        let s = m.status().await.unwrap();
        stage_of.insert(m.name.clone(), s["stage"].as_u64());
    }
    let stage1 = miners
        .iter()
        .find(|m| stage_of[&m.name] == Some(1))
        .expect("a miner holds stage 1");
    let stage1_peer: PeerId = ids[&stage1.name].parse().unwrap();
    let metrics_before = validator.metrics().await.unwrap();
    let miner_metrics_before = stage1.metrics().await.unwrap();
    let all_miners: Vec<&NodeProcess> = miners.iter().collect();
    let butterfly_label = "reason=\"butterfly_not_member\"";
    let butterfly_before = metric_sum(
        &all_miners,
        "iota_gossip_rejected_total",
        &[butterfly_label],
    )
    .await;

    // Gossip attacks, each a few times (gossip may race the mesh).
    for round in 0..3u64 {
        let e = current_epoch(&validator).await;
        stranger
            .gossip(
                &run.run_name,
                "pipeline",
                serde_json::json!({"ValLoss": {"epoch": e, "loss": FORGED_LOSS}}),
            )
            .await;
        stranger
            .gossip(
                &run.run_name,
                "pipeline",
                serde_json::json!({"Merged": {"epoch": u64::MAX - round, "stage": 0,
                    "hash": "00".repeat(32), "wire_bytes": 1}}),
            )
            .await;
        stranger
            .gossip(
                &run.run_name,
                "pipeline",
                serde_json::json!({"Losses": {"epoch": e, "tokens_per_sample": u64::MAX / 2,
                    "records": [{"sample": 7 + round, "pathway": [me, me, me], "loss": 0.01}]}}),
            )
            .await;
        stranger
            .gossip(
                &run.run_name,
                "pipeline",
                serde_json::json!({"HeadDone": {"epoch": e, "samples": 1, "dropped": u64::MAX}}),
            )
            .await;
        // Weights for the miners as if it were a validator: all on uid 1.
        stranger
            .gossip(
                &run.run_name,
                "pipeline",
                serde_json::json!({"Weights": {"epoch": e, "weights": [[1, 65535]]}}),
            )
            .await;
        // A commitment to the merge of stage 0 that closes this epoch, by a non-member:
        // it would enter the merge's pending buffer and be relayed to the stage.
        let commitment = Gossip::Commitment(Commitment {
            epoch: e,
            stage: 0,
            member: me.clone(),
            samples: 1,
            partition_hashes: vec![Hash([0; 32]); 2],
        });
        let _ = stranger
            .client
            .publish(
                &format!("iota/{}/butterfly/0/1", run.run_name),
                commitment.encode(),
            )
            .await;
        for future in 2..40u64 {
            stranger
                .gossip(
                    &run.run_name,
                    "pipeline",
                    serde_json::json!({"HeadDone": {"epoch": e + future * 1000 + round,
                        "samples": 1, "dropped": 0}}),
                )
                .await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await; // pacing the attacker, not a wait
    }

    // Request attacks on a stage-1 miner.
    let rss_before = stage1.pid().map_or(0, rss);
    let huge = zeros_frame(&run, 1, &[1024, 64, 32]);
    let forward = body(
        FORWARD,
        serde_json::json!({"epoch": epoch, "sample": 1, "pathway": [me], "deadline_ms": u64::MAX}),
        &huge,
    );
    let small = zeros_frame(&run, u64::MAX, &[16, 64, 32]);
    let eval = body(EVAL, serde_json::json!({"batch": 0}), &small);
    let weights = body(
        WEIGHTS,
        serde_json::json!({"stage": 1, "offset": 0, "count": 1024}),
        &[],
    );
    for (what, request) in [
        ("forward", &forward),
        ("eval", &eval),
        ("weights", &weights),
    ] {
        match stranger.client.request(stage1_peer, request.clone()).await {
            Ok(reply) if reply.first() == Some(&ERROR) => {}
            Ok(reply) => failures.push(format!(
                "{what} request from a stranger was served: {}",
                String::from_utf8_lossy(&reply[..reply.len().min(80)])
            )),
            Err(error) => failures.push(format!(
                "{what} request failed instead of a refusal: {error}"
            )),
        }
    }
    let grown = stage1.pid().map_or(0, rss).saturating_sub(rss_before);
    if grown > 200 << 20 {
        failures.push(format!(
            "a stage-1 miner grew by {} MB on one request",
            grown >> 20
        ));
    }

    // Fake miners heartbeat for a few epochs.
    let plan_epoch = current_epoch(&validator).await;
    let mut counter = 0;
    let mut largest_plan = 0u64;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while current_epoch(&validator).await < plan_epoch + 2 && tokio::time::Instant::now() < deadline
    {
        counter += 1;
        for fake in &fakes {
            let id = fake.id();
            fake.gossip(&run.run_name, "heartbeat", heartbeat(&id, &run, counter))
                .await;
        }
        let sizes = validator
            .status()
            .await
            .map(|s| s["stage_sizes"].clone())
            .unwrap_or_default();
        let total: u64 = sizes
            .as_array()
            .map(|a| a.iter().filter_map(|v| v.as_u64()).sum())
            .unwrap_or(0);
        largest_plan = largest_plan.max(total);
        tokio::time::sleep(Duration::from_millis(500)).await; // one heartbeat per 0.5 s
    }
    if largest_plan > 6 {
        failures.push(format!(
            "heartbeat-only strangers were given stages: {largest_plan} miners in a plan"
        ));
    }

    // The run goes on: two more epochs, each well before the timeout.
    let from = current_epoch(&validator).await;
    for e in from + 1..=from + 2 {
        match val_loss_within(&validator, e, Duration::from_secs(EPOCH_TIMEOUT_SECS)).await {
            Some(took) if took < Duration::from_secs(EPOCH_TIMEOUT_SECS / 2) => {}
            Some(took) => failures.push(format!(
                "epoch {e} took {took:?}: the run waited on something"
            )),
            None => {
                failures.push(format!("epoch {e} never reported a held-out loss"));
                break;
            }
        }
    }

    // What every node reports.
    // The validator scored the miners from the authenticated ledger only: every miner it
    // weighs is an honest one, and the stranger that forged loss records naming itself is
    // not among them.
    let honest_miner_ids: BTreeSet<String> = miner_names.iter().map(|n| ids[n].clone()).collect();
    let weights = validator.status().await.unwrap_or_default()["validator_weights"].clone();
    let weighed: Vec<String> = weights["miners"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|m| m["peer_id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    if weighed.is_empty() {
        failures.push(format!("the validator weighed no miner: {weights}"));
    }
    for peer in &weighed {
        if !honest_miner_ids.contains(peer) {
            failures.push(format!("the validator weighs {peer}, not an honest miner"));
        }
    }
    // Every miner combined the validators' weights into the same consensus, and only the
    // validator's vector is in it (the stranger's was refused). Polled: a new epoch's
    // vector may reach the miners a moment apart.
    let agreed = wait_for(
        "every miner holds the same consensus, of the validator's weights alone",
        Duration::from_secs(10),
        POLL,
        || async {
            let mut problems = Vec::new();
            let mut consensus = BTreeSet::new();
            for m in &miners {
                let status = m.status().await?;
                let heard: Vec<String> = status["weights"]["validators"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v["peer_id"].as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                if heard != vec![ids["validator"].clone()] {
                    problems.push(format!("{} combined the weights of {heard:?}", m.name));
                }
                consensus.insert(status["weights"].to_string());
            }
            if consensus.len() != 1 {
                problems.push(format!("{} different consensus views", consensus.len()));
            }
            Ok((problems.is_empty(), problems.join("; ")))
        },
    )
    .await;
    if let Err(error) = agreed {
        failures.push(format!("{error:#}"));
    }
    let rows = epochs(&validator).await;
    for row in &rows {
        let e = row["epoch"].as_u64().unwrap_or(u64::MAX);
        if e > from + 10 {
            failures.push(format!("an epoch from the future is reported: {e}"));
        }
        if let Some(loss) = row["val_loss"].as_f64() {
            if (loss - FORGED_LOSS).abs() < 1e-6 {
                failures.push(format!("epoch {e} reports the forged held-out loss"));
            }
        }
        if row["samples_by_miner"].get(&me).is_some() {
            failures.push(format!("epoch {e} credits the stranger with samples"));
        }
        if row["dropped"].as_u64().unwrap_or(0) > 1_000_000 {
            failures.push(format!(
                "epoch {e} dropped counter wrapped: {}",
                row["dropped"]
            ));
        }
        if row["tokens"].as_u64().unwrap_or(0) > 1 << 40 {
            failures.push(format!("epoch {e} tokens forged: {}", row["tokens"]));
        }
    }
    let honest_losses: Vec<f64> = miner_names
        .iter()
        .flat_map(|n| {
            logged_val_losses(&std::fs::read_to_string(dir.join(format!("{n}.log"))).unwrap())
        })
        .collect();
    for row in rows.iter().filter(|r| r["epoch"].as_u64() >= Some(epoch)) {
        if let Some(loss) = row["val_loss"].as_f64() {
            if !honest_losses.iter().any(|h| (h - loss).abs() < 1e-5) {
                failures.push(format!(
                    "epoch {}: reported held-out loss {loss} was measured by no honest head",
                    row["epoch"]
                ));
            }
        }
    }

    // Every attack was counted as refused.
    let metrics_after = validator.metrics().await.unwrap_or_default();
    for reason in [
        "val_loss_not_evaluator",
        "losses_not_tail",
        "head_done_not_head",
        "epoch_out_of_window",
        "miner_not_registered",
        "weights_not_validator",
    ] {
        let label = format!("reason=\"{reason}\"");
        let before = metric(&metrics_before, "iota_gossip_rejected_total", &[&label]);
        let after = metric(&metrics_after, "iota_gossip_rejected_total", &[&label]);
        if after <= before {
            failures.push(format!("validator counted no gossip rejected as {reason}"));
        }
    }
    let butterfly_after = metric_sum(
        &all_miners,
        "iota_gossip_rejected_total",
        &[butterfly_label],
    )
    .await;
    if butterfly_after <= butterfly_before {
        failures.push("no miner refused the stranger's butterfly commitment".into());
    }
    let miner_metrics_after = stage1.metrics().await.unwrap_or_default();
    for reason in ["not_previous_hop", "not_previous_stage", "not_a_replica"] {
        let label = format!("reason=\"{reason}\"");
        let before = metric(
            &miner_metrics_before,
            "iota_requests_rejected_total",
            &[&label],
        );
        let after = metric(
            &miner_metrics_after,
            "iota_requests_rejected_total",
            &[&label],
        );
        if after <= before {
            failures.push(format!(
                "stage-1 miner counted no request rejected as {reason}"
            ));
        }
    }

    // Every honest node is still up.
    let mut validator = validator;
    if let Ok(Some(status)) = validator.try_exit_status() {
        failures.push(format!("the validator exited: {status}"));
    }
    stranger.stop().await;
    for fake in fakes {
        fake.stop().await;
    }
    finish(failures, "attack(s) got through", miners, validator, &dir).await;
}

/// Adds a failure for every miner that exited, stops every node, and fails the test with
/// every failure at once (removing the test's directory only when it passes).
async fn finish(
    mut failures: Vec<String>,
    what: &str,
    mut miners: Vec<NodeProcess>,
    validator: NodeProcess,
    dir: &std::path::Path,
) {
    for node in miners.iter_mut() {
        if let Ok(Some(status)) = node.try_exit_status() {
            failures.push(format!("{} exited: {status}", node.name));
        }
    }
    for node in miners.into_iter().chain([validator]) {
        let _ = node.stop(Duration::from_secs(15)).await;
    }
    assert!(
        failures.is_empty(),
        "{} {what}:\n- {}",
        failures.len(),
        failures.join("\n- ")
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Sum of a metric over every node of `nodes`.
async fn metric_sum(nodes: &[&NodeProcess], name: &str, labels: &[&str]) -> f64 {
    let mut total = 0.0;
    for node in nodes {
        if let Ok(text) = node.metrics().await {
            total += metric(&text, name, labels);
        }
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_members_that_misbehave_are_refused_and_named() {
    let _swarm = ONE_SWARM.lock().await;
    let dir = scratch_dir("rogue-members");
    let run = RunConfig {
        run_name: "rogue-members".into(),
        ..test_run()
    };
    // The first miner in peer-id order is a head; the second holds stage 1.
    let fault = |flags: &str| vec!["--fault".to_string(), flags.to_string()];
    let Swarm {
        ids,
        validator,
        miners,
    } = start_swarm(&dir, &run, |order| match order {
        0 => fault("huge-frames,nan-merge"),
        1 => fault("inflate-samples"),
        _ => Vec::new(),
    })
    .await;
    let mut by_id: Vec<&String> = ids.keys().filter(|n| n.starts_with("miner")).collect();
    by_id.sort_by_key(|n| ids[*n].clone());
    let (huge, inflating) = (by_id[0].clone(), by_id[1].clone());
    let mut failures: Vec<String> = Vec::new();
    let last = 4;
    wait_for_val_loss(&validator, 1, Duration::from_secs(240)).await;
    for e in 2..=last {
        match val_loss_within(&validator, e, Duration::from_secs(EPOCH_TIMEOUT_SECS)).await {
            Some(took) if took < Duration::from_secs(EPOCH_TIMEOUT_SECS / 2) => {}
            Some(took) => failures.push(format!(
                "epoch {e} took {took:?}: the run waited on something"
            )),
            None => {
                failures.push(format!("epoch {e} never reported a held-out loss"));
                break;
            }
        }
    }
    let honest: Vec<&NodeProcess> = miners
        .iter()
        .filter(|m| m.name != huge && m.name != inflating)
        .collect();
    // Huge frames are refused on their header, by whoever receives them.
    let refused = metric_sum(
        &honest,
        "iota_requests_rejected_total",
        &["reason=\"frame_shape\""],
    )
    .await
        + metric_sum(
            &honest,
            "iota_responses_rejected_total",
            &["reason=\"frame_shape\""],
        )
        .await;
    if refused == 0.0 {
        failures.push("no honest miner refused a huge frame".into());
    }
    for m in &honest {
        let grown = m.pid().map_or(0, rss);
        if grown > 1 << 30 {
            failures.push(format!("{} holds {} MB", m.name, grown >> 20));
        }
    }
    // The NaN weights are left out of the merge and their sender named.
    let named = metric_sum(
        &honest,
        "iota_misbehaviour_reports_total",
        &["kind=\"non_finite\""],
    )
    .await;
    if named == 0.0 {
        failures.push("no honest miner named the NaN weights".into());
    }
    // The inflated sample count weighed only the plan's maximum, and was counted.
    let capped = metric_sum(&honest, "iota_butterfly_weights_capped_total", &[]).await;
    if capped == 0.0 {
        failures.push("no honest miner counted the inflated merge weight as capped".into());
    }
    // Every merge left the honest replicas of a stage with the same weights, and the
    // held-out loss fell: neither the NaN weights nor the inflated weight took the stage.
    let rows = epochs(&validator).await;
    let honest_ids: BTreeSet<String> = honest.iter().map(|m| ids[&m.name].clone()).collect();
    for row in rows
        .iter()
        .filter(|r| r["epoch"].as_u64().is_some_and(|e| e < last))
    {
        for (stage, replicas) in row["merged"].as_object().cloned().unwrap_or_default() {
            let hashes: BTreeSet<String> = replicas
                .as_object()
                .unwrap()
                .iter()
                .filter(|(peer, _)| honest_ids.contains(*peer))
                .filter_map(|(_, h)| h.as_str().map(str::to_string))
                .collect();
            if hashes.len() > 1 {
                failures.push(format!(
                    "epoch {} stage {stage}: honest replicas differ",
                    row["epoch"]
                ));
            }
        }
    }
    // The first epoch's evaluation can miss a replica that has not heard the plan yet (a
    // start-up race of its own): compare with the first epoch that reported one.
    let losses: Vec<(u64, f64)> = rows
        .iter()
        .filter_map(|r| Some((r["epoch"].as_u64()?, r["val_loss"].as_f64()?)))
        .collect();
    match (losses.first(), losses.iter().find(|(e, _)| *e == last)) {
        (Some(&(first, start)), Some(&(_, end))) if first < last => {
            if end >= start - 0.3 {
                failures.push(format!(
                    "held-out loss did not fall: {start} at epoch {first} -> {end} at epoch {last}"
                ));
            }
        }
        _ => failures.push(format!("too few held-out losses to compare: {losses:?}")),
    }
    finish(
        failures,
        "misbehaviour(s) got through",
        miners,
        validator,
        &dir,
    )
    .await;
}
