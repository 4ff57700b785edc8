//! Miners behind NATs train and are paid: nodes run in network namespaces, a validator and two
//! miners on a "public" segment, two miners behind their own cone NATs (hole punching works)
//! and two behind symmetric NATs (it cannot), every miner started with `--bootstrap` and
//! `--data-dir` alone. AutoNAT finds the NATed miners private, they reserve slots on the two
//! relays (the validator, and a public miner with `--relay-server on`), the cone pair ends up
//! with a hole-punched direct connection and the symmetric pair stays relayed; the swarm
//! trains (held-out loss falls) and every NATed miner processes samples and earns weight.
//!
//! Needs root, `ip` and `nft`: outside CI it says what is missing and passes without running;
//! under CI (`CI` set) it fails instead.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bootstrap::RunConfig;
use iota_p2p::launcher::NodeProcess;
use iota_tests::netns::{self, start_on, Host, NatKind, Topology};
use iota_tests::{keygen, metric, run_files, scratch_dir, wait_for};

const POLL: Duration = Duration::from_millis(500);

fn run() -> RunConfig {
    RunConfig {
        run_name: "nat-test".into(),
        epoch_samples: 12,
        epoch_timeout_secs: 60,
        ..RunConfig::default()
    }
}

/// The validator's epoch table.
async fn epochs(validator: &NodeProcess) -> anyhow::Result<Vec<serde_json::Value>> {
    Ok(validator.status().await?["epochs"]
        .as_array()
        .cloned()
        .unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn miners_behind_nats_train_through_relays_and_hole_punches() {
    if !netns::available().unwrap() {
        return;
    }
    let mut topo = Topology::create(
        "nat",
        &[
            NatKind::Cone,
            NatKind::Cone,
            NatKind::Symmetric,
            NatKind::Symmetric,
        ],
    )
    .unwrap();
    let dir = scratch_dir("nat");
    let validator_host = topo.add_public("validator").unwrap();
    let public: Vec<Host> = (0..2)
        .map(|i| topo.add_public(&format!("pub{i}")).unwrap())
        .collect();
    // cone0 and cone1 behind NATs 1 and 2, sym0 and sym1 behind NATs 3 and 4.
    let natted: Vec<(String, Host)> = ["cone0", "cone1", "sym0", "sym1"]
        .iter()
        .enumerate()
        .map(|(i, name)| (name.to_string(), topo.add_behind_nat(i + 1, name).unwrap()))
        .collect();

    // Every miner is in the stake snapshot (no stake, no permit): it may be given a stage.
    let mut neurons = vec![(keygen(&dir, "validator"), 100, true)];
    for name in ["pub0", "pub1", "cone0", "cone1", "sym0", "sym1"] {
        neurons.push((keygen(&dir, name), 0, false));
    }
    let files = run_files(&dir, &neurons, &run());
    let validator_args: Vec<String> = files
        .iter()
        .cloned()
        .chain(["--validator".to_string()])
        .collect();
    let validator = start_on(&dir, &validator_host, "validator", &validator_args)
        .await
        .unwrap();
    let boot = validator.listen_addr();
    assert!(boot.contains("/tcp/"), "the first address is TCP: {boot}");
    let join = |extra: &[&str]| -> Vec<String> {
        ["--bootstrap", boot.as_str()]
            .iter()
            .chain(extra)
            .map(|s| s.to_string())
            .collect()
    };

    let mut miners: Vec<NodeProcess> = Vec::new();
    // The first public miner is the second relay.
    miners.push(
        start_on(&dir, &public[0], "pub0", &join(&["--relay-server", "on"]))
            .await
            .unwrap(),
    );
    miners.push(
        start_on(&dir, &public[1], "pub1", &join(&[]))
            .await
            .unwrap(),
    );
    for (name, host) in &natted {
        miners.push(start_on(&dir, host, name, &join(&[])).await.unwrap());
    }
    let by_name = |name: &str| miners.iter().find(|m| m.name == name).unwrap();

    // Every NATed miner finds itself private and holds reservations on both relays.
    for (name, _) in &natted {
        let miner = by_name(name);
        wait_for(
            &format!("{name} to hold two relay reservations"),
            Duration::from_secs(90),
            POLL,
            || async {
                let nat = miner.status().await?["nat"].clone();
                let relays = nat["relays"].as_array().map_or(0, Vec::len);
                Ok((
                    nat["reachability"] == "private" && relays == 2,
                    format!("{nat}"),
                ))
            },
        )
        .await
        .unwrap();
    }
    let status = validator.status().await.unwrap();
    assert_eq!(status["nat"]["reachability"], "public", "{}", status["nat"]);

    // The swarm trains through three epochs.
    wait_for(
        "held-out loss at the start of epoch 3",
        Duration::from_secs(300),
        POLL,
        || async {
            let rows = epochs(&validator).await?;
            let reached = rows
                .iter()
                .any(|r| r["epoch"] == 3 && r["val_loss"].is_number());
            Ok((
                reached,
                format!("latest {:?}", rows.last().map(|r| &r["epoch"])),
            ))
        },
    )
    .await
    .unwrap();
    let rows = epochs(&validator).await.unwrap();
    let val = |e: u64| -> f64 {
        rows.iter()
            .find(|r| r["epoch"] == e)
            .and_then(|r| r["val_loss"].as_f64())
            .unwrap()
    };
    assert!(
        val(3) < val(0) - 0.3,
        "loss falls: {} -> {}",
        val(0),
        val(3)
    );

    // Every NATed miner has a stage, serves samples, and is paid: the validators' consensus
    // gives it weight in some epoch (CLASP may zero a miner in one epoch of a run this short).
    let mut peer_of = BTreeMap::new();
    for miner in &miners {
        let s = miner.status().await.unwrap();
        peer_of.insert(
            miner.name.clone(),
            s["peer_id"].as_str().unwrap().to_string(),
        );
    }
    let paid = std::sync::Mutex::new(BTreeSet::new());
    wait_for(
        "every NATed miner to serve samples and earn weight",
        Duration::from_secs(120),
        POLL,
        || async {
            let mut missing = Vec::new();
            for (name, _) in &natted {
                let s = by_name(name).status().await?;
                if !s["stage"].is_number() || s["samples_processed"].as_u64().unwrap_or(0) == 0 {
                    missing.push(format!(
                        "{name}: stage {} samples {}",
                        s["stage"], s["samples_processed"]
                    ));
                }
            }
            let weights = validator.status().await?["weights"]["miners"].clone();
            for m in weights.as_array().into_iter().flatten() {
                if m["weight"].as_f64().unwrap_or(0.0) > 0.0 {
                    paid.lock()
                        .unwrap()
                        .insert(m["peer_id"].as_str().unwrap_or_default().to_string());
                }
            }
            for (name, _) in &natted {
                if !paid.lock().unwrap().contains(&peer_of[name]) {
                    missing.push(format!("{name}: no weight yet"));
                }
            }
            Ok((missing.is_empty(), missing.join("; ")))
        },
    )
    .await
    .unwrap();

    // The cone pair talks over a hole-punched direct connection; the symmetric pair over a
    // relay.
    let path = |to: &str, status: &serde_json::Value| -> String {
        status["nat"]["peer_paths"][peer_of[to].as_str()]
            .as_str()
            .unwrap_or("none")
            .to_string()
    };
    let cone0 = by_name("cone0").status().await.unwrap();
    let sym0 = by_name("sym0").status().await.unwrap();
    assert_eq!(path("cone1", &cone0), "direct", "{}", cone0["nat"]);
    assert_eq!(path("sym1", &sym0), "relayed", "{}", sym0["nat"]);
    let mut punched = 0.0;
    let mut relayed = 0.0;
    let mut transports = BTreeMap::new();
    for miner in &miners {
        let text = miner.metrics().await.unwrap();
        if miner.name.starts_with("cone") {
            punched += metric(&text, "iota_hole_punches_total", &["result=\"ok\""]);
        }
        if miner.name.starts_with("sym") {
            relayed += metric(&text, "iota_peers_by_path", &["path=\"relayed\""]);
        }
        for t in ["tcp", "quic", "relayed"] {
            *transports.entry(t).or_insert(0.0) += metric(
                &text,
                "iota_connections_established_total",
                &[&format!("transport=\"{t}\"")],
            );
        }
    }
    assert!(punched >= 1.0, "the cone miners hole-punched");
    assert!(relayed >= 1.0, "the symmetric miners stay relayed");
    for t in ["tcp", "quic", "relayed"] {
        assert!(transports[t] >= 1.0, "{t} connections: {transports:?}");
    }
    drop(miners);
    drop(validator);
    drop(topo);
}
