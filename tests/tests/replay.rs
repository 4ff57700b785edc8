//! A replayed heartbeat does not keep a dead orchestrator elected.
//!
//! Two validators (validator-a with the larger stake, validator-b) and one miner per stage
//! run epochs with validator-a as orchestrator. The test holds validator-a's key (keygen wrote
//! it into the data dir), so while validator-a is alive it "records" validator-a's heartbeats:
//! built as the node builds them (its counter, the current time, the run hash, its epoch) and
//! sealed in validator-a's signed envelope on the heartbeat topic — what validator-a publishes
//! at that moment. Then validator-a is killed and the recordings are re-published, once per
//! second for longer than the heartbeat timeout, on two paths:
//!
//! * by a stranger with its own key (as an attacker who captured the envelopes would): the
//!   envelope is signed by validator-a but gossipsub names the stranger as the source, so the
//!   p2p layer drops it as `author_mismatch`;
//! * by a node holding validator-a's identity, which stands for a relay re-injecting
//!   validator-a's own gossip messages: they open as validator-a's and reach the node's
//!   heartbeat gate, which refuses them as `replayed_heartbeat` (older than validator-a's last
//!   real heartbeat) or `stale_heartbeat` (sent more than the allowed skew ago).
//!
//! Right after the kill, validator-a's key also publishes a plan for epoch `u64::MAX` (as a
//! malicious orchestrator would on its way out): the honest nodes refuse it as
//! `plan_epoch_jump`, so validator-b can go on numbering epochs.
//!
//! Either way validator-b takes over within a few heartbeat timeouts, while the replay is
//! still going on, epochs keep advancing under it, the refusals are counted in
//! `iota_gossip_rejected_total{reason}` on the honest nodes, and no honest node goes down.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bootstrap::RunConfig;
use iota_tests::{
    keygen, metric, run_files, scratch_dir, start_node, strings, wait_for, NodeProcess,
};
use p2p::{identity::Keypair, Client, Config, Envelope, Heartbeat, Multiaddr, PeerId, Role};
use tokio::task::JoinHandle;
use tokio::time::Instant;

const POLL: Duration = Duration::from_millis(250);
/// The epoch timeout of the test run: the failover must come well before it.
const EPOCH_TIMEOUT_SECS: u64 = 20;
/// How long validator-b gets, from the kill, to be orchestrator on every honest node: the
/// heartbeat timeout (5 s) plus ticks and gossip, well below the epoch timeout.
const FAILOVER_DEADLINE: Duration = Duration::from_secs(10);
/// How long each epoch after the kill gets to open: below the epoch timeout, so an epoch that
/// only moves because its timeout ran out fails the test. (The new orchestrator publishes
/// its first plan the moment its own tick sees validator-a silent; a follower whose tick has
/// not caught up yet keeps that plan and checks it again, rather than dropping it and waiting
/// out the epoch timeout, as it once did in about half of the runs.)
const EPOCH_DEADLINE: Duration = Duration::from_secs(EPOCH_TIMEOUT_SECS - 5);
/// Rounds of replay, one per second: longer than the heartbeat timeout and the failover.
const REPLAY_ROUNDS: usize = 20;
/// Miners: one per stage of the default three.
const MINERS: usize = 3;
/// The heartbeat gate's refusals (node/src/services/consensus/validate.rs `HeartbeatGate`), counted as
/// `iota_gossip_rejected_total{reason}`.
const GATE: &[&str] = &["replayed_heartbeat", "stale_heartbeat"];

fn test_run() -> RunConfig {
    RunConfig {
        run_name: "replay-test".into(),
        epoch_samples: 8,
        epoch_timeout_secs: EPOCH_TIMEOUT_SECS,
        ..RunConfig::default()
    }
}

fn as_str(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn heartbeat_topic(run: &RunConfig) -> String {
    // node/src/wire/topics.rs
    format!("iota/{}/heartbeat/1", run.run_name)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// An in-process node on the p2p crate, following the run's heartbeat and plan topics, that
/// validates nothing and relays nothing: it only re-publishes what it is given.
struct Replayer {
    client: Client,
    pump: JoinHandle<()>,
    event_loop: JoinHandle<()>,
}

impl Replayer {
    fn spawn(key: Keypair, boots: &[String], run: &RunConfig) -> Replayer {
        let config = Config {
            bootstrap: boots
                .iter()
                .map(|b| b.parse::<Multiaddr>().unwrap())
                .collect(),
            topics: vec![
                heartbeat_topic(run),
                format!("iota/{}/plan/2", run.run_name),
            ],
            discovery_interval: Duration::from_millis(500),
            ..Config::default()
        };
        let (client, mut events, event_loop) =
            p2p::spawn(key, config, p2p::Metrics::unregistered()).unwrap();
        let pump = tokio::spawn(async move { while events.recv().await.is_some() {} });
        Replayer {
            client,
            pump,
            event_loop,
        }
    }

    /// Waits until this node is connected to every peer of `peers`.
    async fn wait_connected(&self, what: &str, peers: &[PeerId], timeout: Duration) {
        wait_for(what, timeout, POLL, || async {
            let connected = self.client.connected_peers().await?;
            let missing = peers.iter().filter(|p| !connected.contains(p)).count();
            Ok((missing == 0, format!("{missing} missing")))
        })
        .await
        .unwrap();
    }

    async fn stop(self) {
        self.client.shutdown().await;
        let _ = self.event_loop.await;
        self.pump.abort();
    }
}

/// `iota_gossip_rejected_total{reason}` summed over `nodes`, for each of `reasons`.
async fn rejected(nodes: &[&NodeProcess], reasons: &[&str]) -> f64 {
    let mut total = 0.0;
    for node in nodes {
        let text = node.metrics().await.unwrap();
        for reason in reasons {
            let label = format!("reason=\"{reason}\"");
            total += metric(&text, "iota_gossip_rejected_total", &[&label]);
        }
    }
    total
}

/// Waits until every node of `nodes` follows `orchestrator` at an epoch above `after` (any
/// epoch when `None`); returns the smallest epoch seen then.
async fn wait_for_epoch(
    what: &str,
    nodes: &[&NodeProcess],
    orchestrator: &str,
    after: Option<u64>,
    timeout: Duration,
) -> (u64, Duration) {
    let lowest = std::cell::Cell::new(0);
    let took = wait_for(what, timeout, POLL, || {
        let lowest = &lowest;
        async move {
            let mut problems = Vec::new();
            let mut low = u64::MAX;
            for node in nodes {
                let status = node.status().await?;
                if status["orchestrator"].as_str() != Some(orchestrator) {
                    problems.push(format!("{} follows {}", node.name, status["orchestrator"]));
                }
                match status["epoch"].as_u64() {
                    Some(e) if after.is_none_or(|a| e > a) => low = low.min(e),
                    other => problems.push(format!("{} at epoch {other:?}", node.name)),
                }
            }
            lowest.set(low);
            Ok((problems.is_empty(), problems.join("; ")))
        }
    })
    .await
    .unwrap();
    (lowest.get(), took)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_heartbeat_does_not_keep_a_dead_orchestrator_elected() {
    let started = Instant::now();
    let dir = scratch_dir("replay");
    let run = test_run();
    let topic = heartbeat_topic(&run);

    let miner_names: Vec<String> = (0..MINERS).map(|i| format!("miner-{i}")).collect();
    let id_a = keygen(&dir, "validator-a");
    let id_b = keygen(&dir, "validator-b");
    let mut neurons = vec![(id_a.clone(), 100, true), (id_b.clone(), 50, true)];
    for name in &miner_names {
        neurons.push((keygen(&dir, name), 0, false));
    }
    let common = run_files(&dir, &neurons, &run);
    // node/src/app/identity.rs: the protobuf-encoded keypair in <data dir>/identity.key.
    let key_a = Keypair::from_protobuf_encoding(
        &std::fs::read(dir.join("validator-a").join("identity.key")).unwrap(),
    )
    .unwrap();
    assert_eq!(key_a.public().to_peer_id().to_string(), id_a);

    let mut validator_args = common.clone();
    validator_args.push("--validator".into());
    let validator_a = start_node(&dir, "validator-a", &as_str(&validator_args))
        .await
        .unwrap();
    let boot = validator_a.listen_addr();
    let with_boot = |extra: &[&str]| -> Vec<String> {
        let mut args = common.clone();
        args.extend(["--bootstrap".to_string(), boot.clone()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let mut validator_b = start_node(&dir, "validator-b", &as_str(&with_boot(&["--validator"])))
        .await
        .unwrap();
    let mut miners = Vec::new();
    for name in &miner_names {
        miners.push(
            start_node(&dir, name, &as_str(&with_boot(&[])))
                .await
                .unwrap(),
        );
    }
    let honest: Vec<&NodeProcess> = std::iter::once(&validator_b).chain(&miners).collect();
    let honest_ids: Vec<PeerId> = honest
        .iter()
        .map(|n| iota_tests::peer_id_of(&n.listen_addr()).parse().unwrap())
        .collect();
    let honest_addrs: Vec<String> = honest.iter().map(|n| n.listen_addr()).collect();

    // validator-a orchestrates, and at least one epoch has run under it.
    let everyone: Vec<&NodeProcess> = std::iter::once(&validator_a)
        .chain(honest.clone())
        .collect();
    let (first, _) = wait_for_epoch(
        "every node follows validator-a",
        &everyone,
        &id_a,
        None,
        Duration::from_secs(60),
    )
    .await;
    let (ran, _) = wait_for_epoch(
        "an epoch ran under validator-a",
        &everyone,
        &id_a,
        Some(first),
        Duration::from_secs(60),
    )
    .await;
    assert_eq!(validator_a.status().await.unwrap()["is_orchestrator"], true);
    println!(
        "replay: validator-a orchestrates, epoch {ran} reached after {:?}",
        started.elapsed()
    );

    // A stranger with its own key joins before the kill, so its replays start at once.
    let stranger = Replayer::spawn(Keypair::generate_ed25519(), &honest_addrs, &run);
    stranger
        .wait_connected(
            "the stranger connects to every honest node",
            &honest_ids,
            Duration::from_secs(30),
        )
        .await;

    // Record validator-a's heartbeats while it is alive: two sets, one per replay path
    // (gossipsub message ids are the hash of the bytes, so each path needs its own).
    let mut recorded: Vec<Vec<u8>> = Vec::new();
    let mut last_counter = 0;
    for _ in 0..2 * REPLAY_ROUNDS {
        let status = validator_a.status().await.unwrap();
        last_counter = status["heartbeats_sent"].as_u64().unwrap();
        let beat = Heartbeat {
            peer_id: id_a.clone(),
            role: Role::Validator,
            counter: last_counter,
            sent_at_ms: now_ms(),
            run_hash: run.hash().to_hex(),
            metagraph_hash: None,
            epoch: status["epoch"].as_u64(),
            stage: status["stage"].as_u64().map(|s| s as u32),
            dashboard: None,
            binding: None,
            dataset: None,
            capacity: None,
            pathway_rate: None,
        };
        let envelope = Envelope::seal(&key_a, &topic, beat.to_bytes()).unwrap();
        recorded.push(envelope.encode());
        tokio::time::sleep(Duration::from_millis(50)).await; // distinct send times, not a wait
    }
    // validator-a goes on beating past the recording, as a live node does: its peers' last
    // heartbeat from it is then newer than anything recorded.
    wait_for(
        "validator-a sends three more heartbeats",
        Duration::from_secs(10),
        POLL,
        || async {
            let sent = validator_a.status().await?["heartbeats_sent"]
                .as_u64()
                .unwrap_or(0);
            Ok((sent >= last_counter + 3, format!("{sent} sent")))
        },
    )
    .await
    .unwrap();

    let mismatch_before = rejected(&honest, &["author_mismatch"]).await;
    // The gate refuses a few honest heartbeats too (a handful per run before the kill, as when
    // one arrives after a newer one of the same sender): count from here, node by node.
    let mut gate_before = Vec::new();
    for node in &honest {
        gate_before.push(rejected(&[*node], GATE).await);
    }
    let dropped_plans_before =
        rejected(&miners.iter().collect::<Vec<_>>(), &["not_orchestrator"]).await;
    let kill_epoch = validator_b.status().await.unwrap()["epoch"]
        .as_u64()
        .unwrap();

    // Kill validator-a as a crash would, and replay its recorded heartbeats at once.
    validator_a.kill().await.unwrap();
    let killed = Instant::now();
    let impersonator = Replayer::spawn(key_a.clone(), &honest_addrs, &run);

    // validator-a's last act, as a malicious orchestrator leaving: a plan for epoch
    // u64::MAX, correct in every other way (the run's seed for that epoch, the same miners,
    // a merge start of now), published before the others have seen it fall silent. Were it
    // accepted, no successor could ever plan a next epoch.
    impersonator
        .wait_connected(
            "validator-a's key reconnects to every honest node",
            &honest_ids,
            Duration::from_secs(3),
        )
        .await;
    let last_plan = bootstrap::EpochPlan::from_json(
        &std::fs::read(dir.join("validator-a").join("last-plan.json")).unwrap(),
    )
    .unwrap();
    let miners_in_plan: std::collections::BTreeSet<bootstrap::PeerIdStr> =
        last_plan.assignment.keys().cloned().collect();
    let jump_before = rejected(&honest, &["plan_epoch_jump"]).await;
    let plan_topic = format!("iota/{}/plan/2", run.run_name);
    for attempt in 0..3u64 {
        let mut forged = bootstrap::next_plan(
            &run,
            &bootstrap::PeerIdStr::parse(&id_a).unwrap(),
            Some(&last_plan),
            Some(u64::MAX - 1),
            &miners_in_plan,
        )
        .unwrap();
        assert_eq!(forged.epoch, u64::MAX);
        forged.merge =
            Some(serde_json::json!({ "merge_start_unix_ms": now_ms() + 1500 + attempt }));
        let envelope = Envelope::seal(&key_a, &plan_topic, forged.to_wire().unwrap()).unwrap();
        let _ = impersonator
            .client
            .publish_raw(&plan_topic, envelope.encode())
            .await;
    }
    let forged_at = killed.elapsed();
    let replay_topic = topic.clone();
    let replay = tokio::spawn(async move {
        let (mut by_stranger, mut by_impersonator) = (0usize, 0usize);
        for (round, pair) in recorded.chunks(2).enumerate() {
            if round > 0 {
                tokio::time::sleep(Duration::from_secs(1)).await; // one replay a second
            }
            if stranger
                .client
                .publish_raw(&replay_topic, pair[0].clone())
                .await
                .is_ok()
            {
                by_stranger += 1;
            }
            if impersonator
                .client
                .publish_raw(&replay_topic, pair[1].clone())
                .await
                .is_ok()
            {
                by_impersonator += 1;
            }
        }
        stranger.stop().await;
        impersonator.stop().await;
        (by_stranger, by_impersonator)
    });

    // validator-b takes over on every honest node, while the replay goes on.
    let failover = wait_for(
        "every honest node follows validator-b",
        FAILOVER_DEADLINE,
        POLL,
        || async {
            let mut problems = Vec::new();
            for node in &honest {
                let status = node.status().await?;
                if status["orchestrator"].as_str() != Some(id_b.as_str()) {
                    problems.push(format!("{} follows {}", node.name, status["orchestrator"]));
                }
                if strings(&status, "live_peers").contains(&id_a) {
                    problems.push(format!("{} still sees validator-a live", node.name));
                }
            }
            Ok((problems.is_empty(), problems.join("; ")))
        },
    )
    .await
    .unwrap();
    let replaying = !replay.is_finished();
    assert_eq!(validator_b.status().await.unwrap()["is_orchestrator"], true);
    println!("replay: validator-b orchestrates {failover:?} after the kill");

    // Epochs keep advancing past the one at the kill, under validator-b.
    let (next, next_took) = wait_for_epoch(
        "an epoch opens under validator-b",
        &honest,
        &id_b,
        Some(kill_epoch),
        EPOCH_DEADLINE,
    )
    .await;
    let (later, _) = wait_for_epoch(
        "another epoch opens under validator-b",
        &honest,
        &id_b,
        Some(next),
        EPOCH_DEADLINE,
    )
    .await;
    let dropped_plans = rejected(&miners.iter().collect::<Vec<_>>(), &["not_orchestrator"]).await
        - dropped_plans_before;
    println!(
        "replay: epochs {kill_epoch} (kill) -> {next} ({next_took:?} after the failover) -> \
         {later}, {:?} after the kill; miners held back {dropped_plans} plan(s) as not_orchestrator",
        killed.elapsed()
    );

    let (by_stranger, by_impersonator) = replay.await.unwrap();
    let replay_took = killed.elapsed();
    let mismatch = rejected(&honest, &["author_mismatch"]).await - mismatch_before;
    let mut gate_by_node = Vec::new();
    for (node, before) in honest.iter().zip(&gate_before) {
        gate_by_node.push((node.name.clone(), rejected(&[*node], GATE).await - before));
    }
    let gate: f64 = gate_by_node.iter().map(|(_, n)| n).sum();
    println!(
        "replay: {by_stranger} by the stranger + {by_impersonator} as validator-a published; \
         refused on the {} honest nodes: {mismatch} author_mismatch, {gate} by the gate \
         ({} replayed_heartbeat, {} stale_heartbeat in all, {} before the kill)",
        honest.len(),
        rejected(&honest, &["replayed_heartbeat"]).await,
        rejected(&honest, &["stale_heartbeat"]).await,
        gate_before.iter().sum::<f64>(),
    );
    assert!(
        replaying,
        "the failover came while the replay was still going on"
    );
    assert!(
        by_stranger > 0 && by_impersonator > 0,
        "the replays went out: {by_stranger} by the stranger, {by_impersonator} as validator-a"
    );
    assert!(
        replay_took > run.heartbeat_timeout(),
        "the replay outlasted the heartbeat timeout"
    );
    let jumps = rejected(&honest, &["plan_epoch_jump"]).await - jump_before;
    println!(
        "replay: the plan for epoch u64::MAX went out {forged_at:?} after the kill; refused as \
         plan_epoch_jump {jumps} time(s)"
    );
    assert!(
        jumps > 0.0,
        "the honest nodes refused validator-a's plan for epoch u64::MAX as plan_epoch_jump"
    );
    assert!(
        mismatch > 0.0,
        "the stranger's replays were refused as author_mismatch"
    );
    assert!(
        gate_by_node.iter().all(|(_, n)| *n > 0.0),
        "every honest node refused replays authored as validator-a in its heartbeat gate: \
         {gate_by_node:?}"
    );

    // Every honest node is still up, and stops cleanly.
    for node in std::iter::once(&mut validator_b).chain(miners.iter_mut()) {
        assert!(
            node.try_exit_status().unwrap().is_none(),
            "{} is still running",
            node.name
        );
    }
    for node in std::iter::once(validator_b).chain(miners) {
        let name = node.name.clone();
        let status = node.stop(Duration::from_secs(15)).await.unwrap();
        assert!(status.success(), "{name}: {status}");
    }
    println!("replay: done in {:?}", started.elapsed());
    let _ = std::fs::remove_dir_all(&dir);
}
