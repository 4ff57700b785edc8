//! Stake from a (replayed) subtensor: hotkeys bound to peer ids elect the orchestrator and
//! register the miners, a validator's weights reach the chain as a signed `set_weights`, and
//! bad chain answers keep the last good stake without hurting the node.
//!
//! The chain is `iota_tests::chain_replay` serving the recorded mainnet answers of
//! `../shared/chain/netuid1.json` (head, header, runtime version, metadata), with one answer
//! of the test's own: the neurons of netuid 9, whose hotkeys the test creates (nobody here
//! holds the recorded neurons' keys).

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bootstrap::chain::{encode_neurons_lite, NeuronSpec};
use bootstrap::{Hotkey, RunConfig, RAO_PER_TAO};
use iota_p2p::chain::extrinsic::{decode_set_weights, ChainState, FINNEY_GENESIS_HASH};
use iota_tests::chain_replay::{fixtures_or_skip, Fallback, Fault, ReplayChain};
use iota_tests::{binary, metric, scratch_dir, start_node, wait_for, NodeProcess};
use serde_json::{json, Value};

const NETUID: u16 = 9;
const POLL: Duration = Duration::from_millis(250);

/// A node's identity and a test hotkey, made by `iota-p2p keygen`.
struct Keys {
    peer_id: String,
    hotkey: Hotkey,
    hotkey_file: PathBuf,
}

fn keygen_with_hotkey(dir: &Path, name: &str) -> Keys {
    let hotkey_file = dir
        .join("wallets")
        .join(name)
        .join("hotkeys")
        .join("default");
    let output = std::process::Command::new(binary())
        .args(["keygen", "--data-dir"])
        .arg(dir.join(name))
        .arg("--hotkey")
        .arg(&hotkey_file)
        .output()
        .expect("keygen runs");
    assert!(output.status.success(), "keygen failed: {output:?}");
    let text = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "peer id and hotkey: {text}");
    Keys {
        peer_id: lines[0].to_string(),
        hotkey: Hotkey::parse(lines[1]).unwrap(),
        hotkey_file,
    }
}

/// The recorded chain, with `neurons` as netuid 9's answer at the recorded head.
async fn chain(fixtures: &Path, neurons: &[NeuronSpec]) -> (ReplayChain, Value) {
    let replay = ReplayChain::with_fixtures(fixtures, &["netuid1.json"])
        .await
        .unwrap();
    let recorded: Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures.join("netuid1.json")).unwrap())
            .unwrap();
    let head = recorded["block_hash"].as_str().unwrap().to_string();
    replay.insert(
        "state_call",
        json!([
            "NeuronInfoRuntimeApi_get_neurons_lite",
            format!("0x{}", hex::encode(NETUID.to_le_bytes())),
            head
        ]),
        json!(format!(
            "0x{}",
            hex::encode(encode_neurons_lite(neurons, false))
        )),
    );
    // Not recorded: the genesis hash (finney's), the one derived answer the node needs.
    replay.insert(
        "chain_getBlockHash",
        json!([0]),
        json!(format!("0x{}", hex::encode(FINNEY_GENESIS_HASH))),
    );
    replay.set_fallback(Fallback::ByMethod);
    (replay, recorded)
}

fn neuron(uid: u16, keys: &Keys, tao: u64, permit: bool) -> NeuronSpec {
    NeuronSpec {
        uid,
        netuid: NETUID,
        hotkey: keys.hotkey.public_key(),
        coldkey: [uid as u8; 32],
        active: true,
        stake: tao * RAO_PER_TAO,
        validator_permit: permit,
        last_update: 0,
    }
}

fn run_file(dir: &Path) -> PathBuf {
    let run = RunConfig {
        run_name: "chain-test".into(),
        epoch_samples: 8,
        epoch_timeout_secs: 60,
        open_registration: 0,
        ..RunConfig::default()
    };
    let path = dir.join("run.toml");
    std::fs::write(&path, run.to_toml_string().unwrap()).unwrap();
    path
}

fn args(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

fn as_str(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bound_hotkeys_elect_and_register_and_the_validator_sets_weights_on_chain() {
    let Some(fixtures) = fixtures_or_skip("chain swarm", &["netuid1.json", "metadata_v14.json"])
    else {
        return;
    };
    let dir = scratch_dir("chain");
    let names = [
        "v300",
        "v200",
        "v-unbound",
        "miner-0",
        "miner-1",
        "miner-2",
        "stranger",
    ];
    let keys: BTreeMap<&str, Keys> = names
        .iter()
        .map(|n| (*n, keygen_with_hotkey(&dir, n)))
        .collect();
    // On chain: the richest validator's node runs without its hotkey, so nobody proves
    // its stake; the stranger mines with a hotkey the subnet has never registered.
    let neurons = [
        neuron(0, &keys["v300"], 300, true),
        neuron(1, &keys["v200"], 200, true),
        neuron(2, &keys["v-unbound"], 400, true),
        neuron(3, &keys["miner-0"], 0, false),
        neuron(4, &keys["miner-1"], 0, false),
        neuron(5, &keys["miner-2"], 0, false),
    ];
    let (replay, recorded) = chain(&fixtures, &neurons).await;
    let run = run_file(&dir);
    let run_hash = RunConfig::from_toml_str(&std::fs::read_to_string(&run).unwrap())
        .unwrap()
        .hash()
        .to_hex();
    // The validators are given the run configuration; the miners are not: each fetches the
    // one that validators with more than half of the chain's validator stake (300 + 200 of
    // 900, bound by their hotkeys) advertise in their heartbeats.
    let common = args(&[
        "--subtensor",
        &replay.ws_url(),
        "--netuid",
        &NETUID.to_string(),
        "--stake-refresh-secs",
        "2",
        "--weights-min-blocks",
        "0",
        "--chain-genesis",
        &format!("0x{}", hex::encode(FINNEY_GENESIS_HASH)),
    ]);
    let with_key = |name: &str, extra: &[&str]| -> Vec<String> {
        let mut a = common.clone();
        a.extend(args(&[
            "--hotkey",
            keys[name].hotkey_file.to_str().unwrap(),
        ]));
        a.extend(args(extra));
        a
    };

    let v300 = start_node(
        &dir,
        "v300",
        &as_str(&with_key(
            "v300",
            &["--validator", "--run", run.to_str().unwrap()],
        )),
    )
    .await
    .unwrap();
    let boot = v300.listen_addr();
    let mut nodes = vec![v300];
    for (name, extra) in [
        ("v200", vec!["--validator", "--run", run.to_str().unwrap()]),
        ("miner-0", vec![]),
        ("miner-1", vec![]),
        ("miner-2", vec![]),
        ("stranger", vec![]),
    ] {
        let mut extra = extra;
        extra.extend(["--bootstrap", boot.as_str()]);
        let a = with_key(name, &extra);
        nodes.push(start_node(&dir, name, &as_str(&a)).await.unwrap());
    }
    let mut unbound = common.clone();
    unbound.extend(args(&[
        "--validator",
        "--run",
        run.to_str().unwrap(),
        "--bootstrap",
        &boot,
    ]));
    nodes.push(
        start_node(&dir, "v-unbound", &as_str(&unbound))
            .await
            .unwrap(),
    );

    let miners: Vec<&str> = ["miner-0", "miner-1", "miner-2"]
        .iter()
        .map(|m| keys[m].peer_id.as_str())
        .collect();
    let everyone: Vec<&NodeProcess> = nodes.iter().collect();
    wait_for(
        "every node follows v300 with the three registered miners in stages 1/1/1",
        Duration::from_secs(60),
        POLL,
        || {
            let everyone = &everyone;
            let keys = &keys;
            let miners = &miners;
            async move {
                let mut problems = Vec::new();
                for node in everyone {
                    let status = node.status().await?;
                    if status["orchestrator"].as_str() != Some(keys["v300"].peer_id.as_str()) {
                        problems.push(format!("{} follows {}", node.name, status["orchestrator"]));
                    }
                    let staged: Vec<String> = status["stage_map"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .flat_map(|s| s.as_array().into_iter().flatten())
                        .filter_map(|p| p.as_str().map(str::to_string))
                        .collect();
                    let mut sorted_miners: Vec<String> =
                        miners.iter().map(|m| m.to_string()).collect();
                    sorted_miners.sort();
                    let mut sorted = staged.clone();
                    sorted.sort();
                    if sorted != sorted_miners {
                        problems.push(format!("{} stages {staged:?}", node.name));
                    }
                }
                Ok((problems.is_empty(), problems.join("; ")))
            }
        },
    )
    .await
    .unwrap();

    for node in nodes.iter().filter(|n| n.name.starts_with("miner")) {
        assert!(
            node.stdout_lines().contains(&format!("RUN {run_hash}")),
            "{} adopted the validators' run: {:?}",
            node.name,
            node.stdout_lines()
        );
    }

    // What the orchestrator verified: every bound hotkey of the subnet, none for the unbound
    // validator, and none kept for the stranger's hotkey, which the subnet does not hold.
    let status = nodes[0].status().await.unwrap();
    let bindings = status["bindings"].as_object().unwrap();
    assert!(!bindings.contains_key(keys["stranger"].hotkey.as_str()));
    for name in ["v300", "v200", "miner-0", "miner-1", "miner-2"] {
        assert_eq!(
            bindings[keys[name].hotkey.as_str()].as_str(),
            Some(keys[name].peer_id.as_str()),
            "{name}'s binding"
        );
    }
    assert!(!bindings.contains_key(keys["v-unbound"].hotkey.as_str()));
    let uids = status["uids"].as_object().unwrap();
    assert_eq!(uids[&keys["miner-1"].peer_id], 4);
    assert!(!uids.contains_key(&keys["stranger"].peer_id));
    let metrics = nodes[0].metrics().await.unwrap();
    assert_eq!(metric(&metrics, "iota_chain_bound_hotkeys", &[]), 5.0);
    assert_eq!(
        metric(&metrics, "iota_chain_stake_block", &[]),
        recorded["block_number"].as_f64().unwrap()
    );

    // The validators' weights reach the chain.
    let submitted = wait_for(
        "both bound validators submit set_weights",
        Duration::from_secs(120),
        POLL,
        || {
            let replay = &replay;
            async move {
                let n = replay.submitted().len();
                Ok((n >= 2, format!("{n} extrinsics submitted")))
            }
        },
    )
    .await;
    submitted.unwrap();
    // Metadata V15, as the node reads it (`Metadata_metadata_at_version(15)`): the node's
    // signatures commit to its metadata hash (CheckMetadataHash mode 1).
    let metadata = std::fs::read_to_string(fixtures.join("metadata_v15.json")).unwrap();
    let metadata: Value = serde_json::from_str(&metadata).unwrap();
    let answer = hex::decode(
        metadata["result"]
            .as_str()
            .unwrap()
            .trim_start_matches("0x"),
    )
    .unwrap();
    // `Option<Vec<u8>>`: 0x01, a compact length, the metadata.
    let (_, metadata_v15) = answer[1..].split_at(match answer[1] & 3 {
        0 => 1,
        1 => 2,
        2 => 4,
        _ => panic!("metadata too long for the fixture"),
    });
    let state = ChainState::from_metadata_bytes(
        metadata_v15,
        FINNEY_GENESIS_HASH,
        recorded["spec_version"].as_u64().unwrap() as u32,
        1,
    )
    .unwrap();
    assert!(
        state.metadata_hash().is_some(),
        "finney checks a metadata hash"
    );
    let mut head = [0u8; 32];
    let head_hex = recorded["block_hash"].as_str().unwrap();
    hex::decode_to_slice(head_hex.trim_start_matches("0x"), &mut head).unwrap();
    let mut signers = Vec::new();
    for extrinsic in replay.submitted() {
        let decoded = decode_set_weights(&state, &extrinsic, head).unwrap();
        assert!(decoded.signature_valid, "signature of {decoded:?}");
        assert_eq!(decoded.call.netuid, NETUID);
        let (name, dir_name) = if decoded.signer_pubkey == keys["v300"].hotkey.public_key() {
            ("v300", "v300")
        } else if decoded.signer_pubkey == keys["v200"].hotkey.public_key() {
            ("v200", "v200")
        } else {
            panic!("set_weights signed by an unknown key: {decoded:?}");
        };
        signers.push(name);
        // The weights are what the validator scored for an epoch it wrote down.
        let weights_dir = dir.join(dir_name).join("weights");
        let matching = std::fs::read_dir(&weights_dir)
            .unwrap()
            .filter_map(|e| std::fs::read_to_string(e.unwrap().path()).ok())
            .filter_map(|text| serde_json::from_str::<Value>(&text).ok())
            .any(|epoch| {
                let mut pairs: Vec<(u16, u16)> = epoch["miners"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| {
                        (
                            m["uid"].as_u64().unwrap() as u16,
                            m["weight"].as_u64().unwrap() as u16,
                        )
                    })
                    .filter(|(_, w)| *w > 0)
                    .collect();
                pairs.sort();
                let uids: Vec<u16> = pairs.iter().map(|p| p.0).collect();
                let weights: Vec<u16> = pairs.iter().map(|p| p.1).collect();
                uids == decoded.call.uids && weights == decoded.call.weights
            });
        assert!(
            matching,
            "{name}'s set_weights {:?} / {:?} matches none of its epochs' weights",
            decoded.call.uids, decoded.call.weights
        );
        assert!(
            decoded.call.uids.iter().all(|u| (3..=5).contains(u)),
            "only the miners' uids: {:?}",
            decoded.call.uids
        );
    }
    signers.sort();
    signers.dedup();
    assert_eq!(signers, ["v200", "v300"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_chain_answers_keep_the_last_good_stake() {
    let Some(fixtures) = fixtures_or_skip("chain faults", &["netuid1.json", "metadata_v14.json"])
    else {
        return;
    };
    let dir = scratch_dir("chain-faults");
    let v = keygen_with_hotkey(&dir, "validator");
    let (replay, recorded) = chain(&fixtures, &[neuron(0, &v, 100, true)]).await;
    let run = run_file(&dir);
    let a = args(&[
        "--validator",
        "--subtensor",
        &replay.http_url(),
        "--netuid",
        &NETUID.to_string(),
        "--run",
        run.to_str().unwrap(),
        "--stake-refresh-secs",
        "1",
        "--chain-timeout-secs",
        "1",
        "--hotkey",
        v.hotkey_file.to_str().unwrap(),
    ]);
    let node = start_node(&dir, "validator", &as_str(&a)).await.unwrap();
    wait_for(
        "the validator elects itself on its chain stake",
        Duration::from_secs(30),
        POLL,
        || {
            let node = &node;
            let me = v.peer_id.clone();
            async move {
                let status = node.status().await?;
                Ok((
                    status["orchestrator"].as_str() == Some(me.as_str()),
                    status["orchestrator"].to_string(),
                ))
            }
        },
    )
    .await
    .unwrap();

    let faults = [
        ("bad_scale", Fault::WrongShape, "state_call"),
        ("bad_scale", Fault::TruncatedResult, "state_call"),
        ("too_large", Fault::Oversized(17 << 20), "state_call"),
        (
            "rpc_error",
            Fault::RpcError {
                code: -32000,
                message: "replay: out of service".into(),
            },
            "state_call",
        ),
        ("timeout", Fault::NeverAnswer, "state_call"),
        ("bad_answer", Fault::TruncatedResponse, "chain_getHeader"),
    ];
    for (reason, fault, method) in faults {
        let before = metric(
            &node.metrics().await.unwrap(),
            "iota_chain_reads_failed_total",
            &[&format!("reason=\"{reason}\"")],
        );
        replay.set_fault(method, Some(fault.clone()));
        wait_for(
            &format!("{fault:?} on {method} counts as {reason}"),
            Duration::from_secs(30),
            POLL,
            || {
                let node = &node;
                async move {
                    let now = metric(
                        &node.metrics().await?,
                        "iota_chain_reads_failed_total",
                        &[&format!("reason=\"{reason}\"")],
                    );
                    Ok((now > before, format!("{now} failures")))
                }
            },
        )
        .await
        .unwrap();
        replay.set_fault(method, None);
        // The last good stake is still in force: the node still orchestrates on it.
        let status = node.status().await.unwrap();
        assert_eq!(
            status["orchestrator"].as_str(),
            Some(v.peer_id.as_str()),
            "after {fault:?}"
        );
        assert_eq!(status["uids"][&v.peer_id], 0, "after {fault:?}");
    }
    let metrics = node.metrics().await.unwrap();
    assert_eq!(
        metric(&metrics, "iota_chain_stake_block", &[]),
        recorded["block_number"].as_f64().unwrap()
    );
    let log = std::fs::read_to_string(node.log_path()).unwrap();
    assert!(
        log.contains("stake read from the chain failed; the last good snapshot stays in force"),
        "a clear log line"
    );
    // And after the faults, reads succeed again: the staleness gauge comes back down.
    wait_for("reads succeed again", Duration::from_secs(30), POLL, || {
        let node = &node;
        async move {
            let age = metric(&node.metrics().await?, "iota_chain_stake_age_seconds", &[]);
            Ok(((0.0..3.0).contains(&age), format!("age {age}")))
        }
    })
    .await
    .unwrap();
}

/// `iota-p2p metagraph` against one recorded chain state.
async fn metagraph_of(fixtures: &Path, file: &str, netuid: u16, json_out: bool) -> String {
    let replay = ReplayChain::with_fixtures(fixtures, &[file]).await.unwrap();
    replay.set_fallback(Fallback::ByMethod);
    let mut command = tokio::process::Command::new(binary());
    command.args([
        "metagraph",
        "--subtensor",
        &replay.ws_url(),
        "--netuid",
        &netuid.to_string(),
    ]);
    if json_out {
        command.arg("--json");
    }
    let output = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .expect("metagraph answers within a minute")
        .unwrap();
    assert!(output.status.success(), "metagraph failed: {output:?}");
    String::from_utf8(output.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metagraph_command_prints_the_recorded_subnets() {
    let Some(fixtures) = fixtures_or_skip(
        "metagraph command",
        &["netuid1.json", "netuid23.json", "metadata_v14.json"],
    ) else {
        return;
    };
    for (file, netuid, count) in [("netuid23.json", 23u16, 19usize), ("netuid1.json", 1, 1024)] {
        let recorded: Value =
            serde_json::from_str(&std::fs::read_to_string(fixtures.join(file)).unwrap()).unwrap();
        let out: Value =
            serde_json::from_str(&metagraph_of(&fixtures, file, netuid, true).await).unwrap();
        assert_eq!(out["netuid"], netuid);
        assert_eq!(out["block"], recorded["block_number"], "{file}");
        assert_eq!(out["wrapped"], recorded["wrapped_vec_u8"], "{file}");
        let neurons = out["neurons"].as_array().unwrap();
        assert_eq!(neurons.len(), count, "{file}");
        let uids: Vec<u64> = neurons.iter().map(|n| n["uid"].as_u64().unwrap()).collect();
        assert_eq!(uids, (0..count as u64).collect::<Vec<_>>(), "{file}");
        for n in neurons {
            Hotkey::parse(n["hotkey"].as_str().unwrap()).unwrap();
            assert!(n["peer_id"].is_null(), "nobody here is bound: {n}");
        }
        assert!(neurons.iter().any(|n| n["validator_permit"] == true));
        assert!(neurons.iter().any(|n| n["stake_rao"].as_u64().unwrap() > 0));

        let table = metagraph_of(&fixtures, file, netuid, false).await;
        let header = table.lines().next().unwrap();
        assert!(
            header.contains(&format!("netuid {netuid}"))
                && header.contains(&format!("neurons {count}")),
            "{header}"
        );
        assert_eq!(
            table.lines().count(),
            count + 2,
            "header, column names, rows"
        );
    }
}
