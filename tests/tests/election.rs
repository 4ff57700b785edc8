//! The orchestrator is elected by stake, fails over when it dies, and cannot be impersonated;
//! a node that joins with `--bootstrap` alone adopts what the stake majority of the
//! validators follows, not what a lying validator serves it.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use bootstrap::{LocalNeuron, Metagraph, PeerIdStr, RunConfig, RAO_PER_TAO};
use iota_tests::{keygen, metric, scratch_dir, start_node, wait_for, NodeProcess};

const POLL: Duration = Duration::from_millis(250);

/// Waits until every node reports `orchestrator == expected`, stage sizes 2/2/2, and an
/// epoch above `after` (when given). Returns the smallest epoch seen.
async fn wait_for_agreement(
    what: &str,
    nodes: &[&NodeProcess],
    expected: &str,
    after: Option<u64>,
    timeout: Duration,
) -> u64 {
    let min_epoch = std::cell::Cell::new(0);
    wait_for(what, timeout, POLL, || {
        let min_epoch = &min_epoch;
        async move {
            let mut problems = Vec::new();
            let mut lowest = u64::MAX;
            for node in nodes {
                let status = node.status().await?;
                if status["orchestrator"].as_str() != Some(expected) {
                    problems.push(format!("{} follows {}", node.name, status["orchestrator"]));
                }
                let sizes: Vec<u64> = status["stage_sizes"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|v| v.as_u64()).collect())
                    .unwrap_or_default();
                if sizes != [2, 2, 2] {
                    problems.push(format!("{} sees stages {sizes:?}", node.name));
                }
                match status["epoch"].as_u64() {
                    Some(e) if after.is_none_or(|a| e > a) => lowest = lowest.min(e),
                    other => problems.push(format!("{} at epoch {other:?}", node.name)),
                }
            }
            min_epoch.set(lowest);
            Ok((problems.is_empty(), problems.join("; ")))
        }
    })
    .await
    .unwrap();
    min_epoch.get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stake_elects_the_orchestrator_and_failover_keeps_epochs_moving() {
    let dir = scratch_dir("election");
    let validators = ["v100", "v50", "v10"];
    let stakes = [100u64, 50, 10];
    let miners: Vec<String> = (0..6).map(|i| format!("miner-{i}")).collect();
    let ids: std::collections::BTreeMap<String, String> = validators
        .iter()
        .map(|v| v.to_string())
        .chain(miners.iter().cloned())
        .chain([
            "rich-no-permit".to_string(),
            "unlisted".to_string(),
            "forger".to_string(),
            "liar".to_string(),
            "newcomer".to_string(),
        ])
        .map(|name| {
            let id = keygen(&dir, &name);
            (name, id)
        })
        .collect();

    // The stake snapshot: the richest validator has no permit, and one validator is missing.
    let mut neurons: Vec<LocalNeuron> = validators
        .iter()
        .zip(stakes)
        .map(|(v, tao)| LocalNeuron {
            peer_id: PeerIdStr::parse(&ids[*v]).unwrap(),
            stake: tao * RAO_PER_TAO,
            validator_permit: true,
        })
        .collect();
    neurons.push(LocalNeuron {
        peer_id: PeerIdStr::parse(&ids["rich-no-permit"]).unwrap(),
        stake: 1000 * RAO_PER_TAO,
        validator_permit: false,
    });
    // A validator with a permit and a minority of the stake (40 of 200), which will advertise
    // and serve another run configuration to joining nodes.
    neurons.push(LocalNeuron {
        peer_id: PeerIdStr::parse(&ids["liar"]).unwrap(),
        stake: 40 * RAO_PER_TAO,
        validator_permit: true,
    });
    // The miners are registered (no stake): only the metagraph's miners get stages.
    neurons.extend(miners.iter().map(|m| LocalNeuron {
        peer_id: PeerIdStr::parse(&ids[m]).unwrap(),
        stake: 0,
        validator_permit: false,
    }));
    let metagraph = Metagraph::for_local_run(neurons).unwrap();
    let metagraph_path = dir.join("metagraph.json");
    std::fs::write(&metagraph_path, metagraph.to_json()).unwrap();
    let run = RunConfig {
        epoch_timeout_secs: 2,
        ..RunConfig::default()
    };
    let run_path = dir.join("run.toml");
    std::fs::write(&run_path, run.to_toml_string().unwrap()).unwrap();
    let common = [
        "--metagraph",
        metagraph_path.to_str().unwrap(),
        "--run",
        run_path.to_str().unwrap(),
    ];

    let v100 = start_node(&dir, "v100", &[&common[..], &["--validator"]].concat())
        .await
        .unwrap();
    let boot = v100.listen_addr();
    let with_boot = |extra: &[&str]| -> Vec<String> {
        let mut args: Vec<String> = common.iter().map(|s| s.to_string()).collect();
        args.extend(["--bootstrap".to_string(), boot.clone()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    };
    let mut others = Vec::new();
    for (name, extra) in [
        ("v50", vec!["--validator"]),
        ("v10", vec!["--validator"]),
        ("rich-no-permit", vec!["--validator"]),
        ("unlisted", vec!["--validator"]),
    ] {
        let args = with_boot(&extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        others.push(start_node(&dir, name, &args).await.unwrap());
    }
    for name in &miners {
        let args = with_boot(&[]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        others.push(start_node(&dir, name, &args).await.unwrap());
    }
    // A stranger outside the metagraph forges plans naming itself orchestrator: its plans
    // are dropped and counted, it gets no stage, and peer scoring cuts it off.
    let forger_args = with_boot(&["--fault", "forge-plans"]);
    let forger_args: Vec<&str> = forger_args.iter().map(String::as_str).collect();
    let forger = start_node(&dir, "forger", &forger_args).await.unwrap();

    let everyone: Vec<&NodeProcess> = std::iter::once(&v100).chain(others.iter()).collect();
    let first_epoch = wait_for_agreement(
        "all nodes follow the stake-100 validator with stages 2/2/2",
        &everyone,
        &ids["v100"],
        None,
        Duration::from_secs(15),
    )
    .await;
    // Every miner holds a stage, and the forged plans went nowhere.
    let mut rejected_forgeries = 0.0;
    for node in &others {
        let status = node.status().await.unwrap();
        if node.name.starts_with("miner") {
            assert!(
                status["stage"].as_u64().is_some(),
                "{} holds a stage",
                node.name
            );
        }
        assert!(
            status["epoch"].as_u64().unwrap() < 1_000_000,
            "no forged epoch accepted"
        );
        let metrics = node.metrics().await.unwrap();
        // A forged plan is refused for naming a miner outside the metagraph (checked
        // first) or for its author, who is not the orchestrator.
        for reason in ["not_orchestrator", "plan_unregistered_miners"] {
            rejected_forgeries += metric(
                &metrics,
                "iota_gossip_rejected_total",
                &[&format!("reason=\"{reason}\"")],
            );
        }
    }
    assert!(
        rejected_forgeries > 0.0,
        "forged plans were dropped and counted"
    );
    let forger_status = forger.status().await.unwrap();
    assert!(
        forger_status["stage"].is_null(),
        "the forger holds no stage: {forger_status}"
    );
    let orchestrator_metric = v100.metrics().await.unwrap();
    assert!(orchestrator_metric.contains("iota_is_orchestrator 1"));

    // A lying validator advertises (in its heartbeats) and serves another run configuration.
    // A node started with `--bootstrap` pointing at the liar, and no run or metagraph file,
    // adopts the run that the validators with 160 of the 200 stake follow, never the liar's,
    // and follows the run's orchestrator.
    let liar = start_node(
        &dir,
        "liar",
        &with_boot(&["--validator", "--fault", "lie-join"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    )
    .await
    .unwrap();
    let lie = RunConfig {
        seed: run.seed.wrapping_add(1),
        ..run.clone()
    }
    .hash()
    .to_hex();
    let newcomer = start_node(&dir, "newcomer", &["--bootstrap", &liar.listen_addr()])
        .await
        .unwrap();
    let honest = run.hash().to_hex();
    let run_line = || {
        newcomer
            .stdout_lines()
            .iter()
            .find_map(|l| l.strip_prefix("RUN ").map(str::to_string))
    };
    wait_for(
        "the newcomer adopts a run",
        Duration::from_secs(30),
        POLL,
        || {
            let adopted = run_line();
            async move { Ok((adopted.is_some(), "no RUN line yet".to_string())) }
        },
    )
    .await
    .unwrap();
    assert_eq!(
        run_line().unwrap(),
        honest,
        "the majority's run, not the liar's {lie}"
    );
    let log = std::fs::read_to_string(newcomer.log_path()).unwrap();
    assert!(
        log.contains(&format!("a peer's run peer={}", ids["liar"])) && log.contains(&lie),
        "the newcomer heard the liar's summary first-hand: {log}"
    );
    assert!(
        log.contains("stake_percent=\"80.0\""),
        "adopted with the 160 of 200 stake behind it: {log}"
    );
    let status = newcomer.status().await.unwrap();
    assert_eq!(
        status["run_hash"].as_str(),
        Some(honest.as_str()),
        "{status}"
    );
    assert_eq!(
        status["metagraph_hash"].as_str().map(str::to_string),
        Some(hex::encode(metagraph.hash())),
        "{status}"
    );
    liar.kill().await.unwrap();
    others.push(newcomer);

    // Kill the orchestrator: the stake-50 validator (not the richer one without a permit,
    // not the one outside the metagraph) takes over and epochs keep increasing.
    v100.kill().await.unwrap();
    let rest: Vec<&NodeProcess> = others.iter().collect();
    let after = wait_for_agreement(
        "all remaining nodes follow the stake-50 validator",
        &rest,
        &ids["v50"],
        Some(first_epoch),
        Duration::from_secs(10),
    )
    .await;
    assert!(after > first_epoch);
    wait_for_agreement(
        "epochs keep increasing under the stake-50 validator",
        &rest,
        &ids["v50"],
        Some(after),
        Duration::from_secs(10),
    )
    .await;

    // A node with another run configuration is refused, and the run carries on.
    let other_run = RunConfig {
        seed: 99,
        ..run.clone()
    };
    let other_path = dir.join("other-run.toml");
    std::fs::write(&other_path, other_run.to_toml_string().unwrap()).unwrap();
    let v50_addr = others[0].listen_addr();
    let mut stranger = start_node(
        &dir,
        "stranger",
        &[
            "--metagraph",
            metagraph_path.to_str().unwrap(),
            "--run",
            other_path.to_str().unwrap(),
            "--bootstrap",
            &v50_addr,
        ],
    )
    .await
    .unwrap();
    let exit = wait_for(
        "the stranger refuses to join",
        Duration::from_secs(20),
        POLL,
        || {
            let exited = stranger.try_exit_status();
            async move {
                match exited? {
                    Some(status) => Ok((true, status.to_string())),
                    None => Ok((false, "still running".to_string())),
                }
            }
        },
    )
    .await;
    assert!(exit.is_ok(), "{exit:?}");
    let status = stranger.try_exit_status().unwrap().unwrap();
    assert!(!status.success(), "refusal is an error exit");
    let log = std::fs::read_to_string(stranger.log_path()).unwrap();
    assert!(
        log.contains("refusing to join"),
        "the reason is logged: {log}"
    );
    wait_for_agreement(
        "the run is unaffected",
        &rest,
        &ids["v50"],
        Some(after + 1),
        Duration::from_secs(10),
    )
    .await;

    forger.kill().await.unwrap();
    for node in others {
        let name = node.name.clone();
        let status = node.stop(Duration::from_secs(10)).await.unwrap();
        assert!(status.success(), "{name}: {status}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
