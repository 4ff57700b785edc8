//! A swarm started together gives every miner a stage at once: the first plan waits until
//! the metagraph's miners are heard, so none of them sits out the first epoch.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use bootstrap::{LocalNeuron, Metagraph, PeerIdStr, RunConfig, RAO_PER_TAO};
use iota_tests::{keygen, scratch_dir, start_node, NodeProcess};
use tokio::time::Instant;

const POLL: Duration = Duration::from_millis(100);

/// How long after all nodes agree on the orchestrator every miner must hold a stage.
const STAGES_WITHIN: Duration = Duration::from_secs(3);

/// The miners that hold no stage yet.
async fn without_stage(miners: &[NodeProcess]) -> Vec<String> {
    let mut missing = Vec::new();
    for node in miners {
        match node.status().await {
            Ok(status) if status["stage"].as_u64().is_some() => {}
            _ => missing.push(node.name.clone()),
        }
    }
    missing
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_validators_and_six_miners_started_together_all_hold_stages_at_once() {
    let dir = scratch_dir("startup");
    let validators = ["v0", "v1", "v2"];
    let miner_names: Vec<String> = (0..6).map(|i| format!("miner-{i}")).collect();
    let mut neurons: Vec<LocalNeuron> = validators
        .iter()
        .zip([30u64, 20, 10])
        .map(|(v, tao)| LocalNeuron {
            peer_id: PeerIdStr::parse(&keygen(&dir, v)).unwrap(),
            stake: tao * RAO_PER_TAO,
            validator_permit: true,
        })
        .collect();
    neurons.extend(miner_names.iter().map(|m| LocalNeuron {
        peer_id: PeerIdStr::parse(&keygen(&dir, m)).unwrap(),
        stake: 0,
        validator_permit: false,
    }));
    let metagraph_path = dir.join("metagraph.json");
    std::fs::write(
        &metagraph_path,
        Metagraph::for_local_run(neurons).unwrap().to_json(),
    )
    .unwrap();
    let run_path = dir.join("run.toml");
    std::fs::write(&run_path, RunConfig::default().to_toml_string().unwrap()).unwrap();
    let common = [
        "--metagraph".to_string(),
        metagraph_path.display().to_string(),
        "--run".to_string(),
        run_path.display().to_string(),
    ];
    let args_of = |extra: &[String]| -> Vec<String> { [&common[..], extra].concat() };

    // The bootstrap node first (the others need its address), then all the rest at once.
    let v0 = start_node(&dir, "v0", &as_strs(&args_of(&["--validator".into()])))
        .await
        .unwrap();
    let boot = vec!["--bootstrap".to_string(), v0.listen_addr()];
    let mut starting = tokio::task::JoinSet::new();
    for (name, validator) in validators[1..]
        .iter()
        .map(|v| (v.to_string(), true))
        .chain(miner_names.iter().map(|m| (m.clone(), false)))
    {
        let mut args = args_of(&boot);
        if validator {
            args.push("--validator".into());
        }
        let dir = dir.clone();
        starting.spawn(async move { start_node(&dir, &name, &as_strs(&args)).await });
    }
    let mut nodes = vec![v0];
    while let Some(started) = starting.join_next().await {
        nodes.push(started.unwrap().unwrap());
    }
    let miners: Vec<NodeProcess> = {
        let (miners, rest): (Vec<_>, Vec<_>) =
            nodes.into_iter().partition(|n| n.name.starts_with("miner"));
        nodes = rest;
        miners
    };
    let everyone: Vec<&NodeProcess> = nodes.iter().chain(miners.iter()).collect();
    assert_eq!(everyone.len(), 9);

    // All nine agree on the orchestrator…
    let deadline = Instant::now() + Duration::from_secs(30);
    let agreed = loop {
        if let Some(o) = agreed_orchestrator_of(&everyone).await {
            break (o, Instant::now());
        }
        assert!(
            Instant::now() < deadline,
            "the nodes never agreed on an orchestrator within 30 s"
        );
        tokio::time::sleep(POLL).await;
    };
    // …and within three seconds of that every miner holds a stage.
    let (orchestrator, at) = agreed;
    loop {
        let missing = without_stage(&miners).await;
        if missing.is_empty() {
            break;
        }
        assert!(
            at.elapsed() <= STAGES_WITHIN,
            "{:.1} s after all nodes agreed on {orchestrator}, miners without a stage: {missing:?}",
            at.elapsed().as_secs_f64()
        );
        tokio::time::sleep(POLL).await;
    }
    for node in nodes.into_iter().chain(miners) {
        node.kill().await.unwrap();
    }
}

/// The orchestrator every one of `nodes` reports, when they all report the same one.
async fn agreed_orchestrator_of(nodes: &[&NodeProcess]) -> Option<String> {
    let mut seen = None;
    for node in nodes {
        let status = node.status().await.ok()?;
        let orchestrator = status["orchestrator"].as_str()?.to_string();
        match &seen {
            None => seen = Some(orchestrator),
            Some(o) if *o == orchestrator => {}
            Some(_) => return None,
        }
    }
    seen
}

fn as_strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}
