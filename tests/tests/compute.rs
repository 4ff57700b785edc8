//! A miner whose compute thread dies exits with a clear error instead of lingering: a miner
//! that heartbeats while every sample it is given fails would hold a stage for nothing.
//!
//! A validator and three miners (one per stage) start a run; one miner runs with the hidden
//! `--fault compute-dies` (its stage's compute thread panics once the first epoch trains).
//! That process must exit non-zero, saying why, while the other nodes stay up.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::time::Duration;

use bootstrap::RunConfig;
use iota_tests::{keygen, run_files, scratch_dir, start_node, wait_for};

const POLL: Duration = Duration::from_millis(250);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_miner_whose_compute_thread_dies_exits_saying_why() {
    let dir = scratch_dir("compute-dies");
    let run = RunConfig {
        run_name: "compute-dies".into(),
        epoch_samples: 8,
        ..RunConfig::default()
    };
    let names = ["validator", "miner-0", "miner-1", "miner-2"];
    let neurons: Vec<(String, u64, bool)> = names
        .iter()
        .map(|n| {
            let v = *n == "validator";
            (keygen(&dir, n), if v { 100 } else { 0 }, v)
        })
        .collect();
    let common = run_files(&dir, &neurons, &run);
    let args = |extra: &[&str]| -> Vec<String> {
        let mut v = common.clone();
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let validator_args = args(&["--validator"]);
    let validator_refs: Vec<&str> = validator_args.iter().map(String::as_str).collect();
    let validator = start_node(&dir, "validator", &validator_refs)
        .await
        .unwrap();
    let boot = validator.listen_addr();
    let mut miners = Vec::new();
    for (i, name) in names[1..].iter().enumerate() {
        let mut extra = vec!["--bootstrap", boot.as_str()];
        if i == 0 {
            extra.extend(["--fault", "compute-dies"]);
        }
        let miner_args = args(&extra);
        let miner_refs: Vec<&str> = miner_args.iter().map(String::as_str).collect();
        miners.push(start_node(&dir, name, &miner_refs).await.unwrap());
    }

    // The faulty miner gets a stage with the first plan, crashes its compute thread as soon
    // as it trains, and exits with an error.
    let mut faulty = miners.remove(0);
    let exited = wait_for(
        "the miner with a dead compute thread exits",
        Duration::from_secs(90),
        POLL,
        || {
            let status = faulty.try_exit_status();
            async move {
                let status = status?;
                Ok((status.is_some(), format!("{status:?}")))
            }
        },
    )
    .await;
    exited.unwrap();
    let status = faulty.try_exit_status().unwrap().unwrap();
    assert!(
        !status.success(),
        "a node whose compute thread died exits with failure: {status}"
    );
    let log = std::fs::read_to_string(faulty.log_path()).unwrap_or_default();
    assert!(
        log.contains("compute thread stopped"),
        "the log says why the node stopped; it ends with:\n{}",
        log.lines().rev().take(10).collect::<Vec<_>>().join("\n")
    );

    // Everyone else is still up, and stops cleanly.
    for node in std::iter::once(validator).chain(miners) {
        let name = node.name.clone();
        let status = node.stop(Duration::from_secs(15)).await.unwrap();
        assert!(status.success(), "{name}: {status}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
