//! The main job end to end: miners train one model over the network, replicas merge to the
//! same weights, the run survives a miner dying and coming back, and a miner that joins late
//! starts from the latest merge.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bootstrap::RunConfig;
use iota_tests::{keygen, run_files, scratch_dir, start_node, wait_for, NodeProcess};

const POLL: Duration = Duration::from_millis(500);

/// The run the test trains: tiny model, short epochs.
fn test_run() -> RunConfig {
    RunConfig {
        run_name: "training-test".into(),
        epoch_samples: 12,
        epoch_timeout_secs: 60,
        // Room for one miner that is not in the metagraph: the late joiner.
        open_registration: 1,
        // An outer step with momentum, so that joining and restarting must carry it.
        outer_lr: 1.0,
        outer_momentum: 0.5,
        outer_momentum_start: 0.5,
        ..RunConfig::default()
    }
}

/// Borrowed views of owned flags.
fn as_str(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// The validator's epoch table.
async fn epochs(validator: &NodeProcess) -> anyhow::Result<Vec<serde_json::Value>> {
    Ok(validator.status().await?["epochs"]
        .as_array()
        .cloned()
        .unwrap_or_default())
}

/// Waits until the validator knows the held-out loss at the start of epoch `epoch`.
async fn wait_for_epoch(validator: &NodeProcess, epoch: u64, timeout: Duration) -> Duration {
    wait_for(
        &format!("held-out loss at the start of epoch {epoch}"),
        timeout,
        POLL,
        || async {
            let rows = epochs(validator).await?;
            let reached = rows
                .iter()
                .any(|r| r["epoch"] == epoch && r["val_loss"].is_number());
            let last = rows.last().map(|r| r["epoch"].clone());
            Ok((reached, format!("latest epoch {last:?}")))
        },
    )
    .await
    .unwrap()
}

/// The last weights hash a log says was saved to, or loaded from, a checkpoint.
fn logged_hash(log: &str, what: &str) -> Option<String> {
    log.lines()
        .filter(|l| l.contains(what))
        .filter_map(|l| l.split("weights_hash=").nth(1))
        .map(|h| {
            h.split_whitespace()
                .next()
                .unwrap_or_default()
                .trim_matches('\u{1b}')
                .to_string()
        })
        .next_back()
}

/// Waits until `miner` (restarted or new) trains, then checks from its log that it started
/// from the replicas' merged snapshot, whose hash is the one the stage's members gossiped for
/// that merge and the validator (`validator_id`) confirmed after its audit, and neither from
/// the run seed nor from a stale checkpoint (`saved`: the last hash its previous life
/// checkpointed). Returns whether the validator confirmed it.
async fn starts_from_the_latest_merge(
    miner: &NodeProcess,
    validator: &NodeProcess,
    validator_id: &str,
    saved: Option<&str>,
) -> bool {
    wait_for(
        &format!("{} trains", miner.name),
        Duration::from_secs(120),
        POLL,
        || async {
            let status = miner.status().await?;
            let n = status["samples_processed"].as_u64().unwrap_or(0);
            Ok((n > 0, format!("{n} samples")))
        },
    )
    .await
    .unwrap();
    let log = std::fs::read_to_string(miner.log_path()).unwrap();
    assert!(
        !log.contains("resumed from checkpoint") && !log.contains("initialised from the run seed"),
        "{}: neither its stale checkpoint nor the seed: {log}",
        miner.name
    );
    let line = log
        .lines()
        .rfind(|l| l.contains("weights fetched from a replica"))
        .unwrap_or_else(|| panic!("{} loaded the replicas' snapshot: {log}", miner.name));
    let field = |name: &str| -> String {
        let clean: String = line.chars().filter(|c| !c.is_control()).collect();
        let clean = clean
            .replace("[0m", "")
            .replace("[3m", "")
            .replace("[2m", "");
        clean
            .split(&format!("{name}="))
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("no {name} in {line}"))
            .to_string()
    };
    let loaded = field("weights_hash");
    let stage = field("stage");
    let merged_epoch: u64 = field("epoch")
        .trim_start_matches("Some(")
        .trim_end_matches(')')
        .parse()
        .unwrap_or_else(|_| panic!("a merged epoch in {line}"));
    if let Some(saved) = saved {
        assert_ne!(loaded, saved, "the stale checkpoint is not what it loaded");
    }
    // The miner may fetch the snapshot before the merge's gossip reached the validator: wait
    // (bounded) until the validator heard the hash of the stage's merge.
    let merged_members = || async {
        let rows = epochs(validator).await?;
        Ok::<_, anyhow::Error>(
            rows.iter()
                .find(|r| r["epoch"] == merged_epoch)
                .and_then(|r| r["merged"][stage.as_str()].as_object().cloned())
                .unwrap_or_default(),
        )
    };
    let heard = wait_for(
        &format!("the validator hears the merge of epoch {merged_epoch}, stage {stage}"),
        Duration::from_secs(15),
        POLL,
        || async {
            let members = merged_members().await?;
            Ok((!members.is_empty(), format!("{members:?}")))
        },
    )
    .await;
    let members = merged_members().await.unwrap();
    let merged: BTreeSet<String> = members
        .values()
        .filter_map(|h| h.as_str().map(str::to_string))
        .collect();
    assert_eq!(
        merged,
        BTreeSet::from([loaded.clone()]),
        "{}: loaded {loaded}: the merge of epoch {merged_epoch}, stage {stage} gossiped {merged:?} ({heard:?})",
        miner.name
    );
    // A merge of two replicas or more was audited, and the validator confirmed its hash; one
    // replica alone merges with nobody, and there is nothing to audit.
    let expected = if members.len() >= 2 {
        validator_id
    } else {
        "none"
    };
    assert_eq!(
        field("confirmed_by"),
        expected,
        "{}: the validator's word on what it loaded, from a merge of {} replicas",
        miner.name,
        members.len()
    );
    members.len() >= 2
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn six_miners_train_merge_and_survive_a_crash() {
    let dir = scratch_dir("training");
    let names: Vec<String> = std::iter::once("validator".to_string())
        .chain((0..6).map(|i| format!("miner-{i}")))
        .collect();
    let ids: BTreeMap<String, String> =
        names.iter().map(|n| (n.clone(), keygen(&dir, n))).collect();
    let run = test_run();
    let neurons: Vec<(String, u64, bool)> = names
        .iter()
        .map(|n| {
            (
                ids[n].clone(),
                if n == "validator" { 100 } else { 0 },
                n == "validator",
            )
        })
        .collect();
    let common = run_files(&dir, &neurons, &run);
    let args = |extra: &[&str]| -> Vec<String> {
        common
            .iter()
            .cloned()
            .chain(extra.iter().map(|s| s.to_string()))
            .collect()
    };

    let validator_args = args(&["--validator"]);
    let validator = start_node(&dir, "validator", &as_str(&validator_args))
        .await
        .unwrap();
    let boot = validator.listen_addr();
    let miner_args = args(&["--bootstrap", &boot]);
    let mut miners = Vec::new();
    for name in &names[1..] {
        miners.push(start_node(&dir, name, &as_str(&miner_args)).await.unwrap());
    }

    // Three epochs of training: held-out loss falls, every miner works, and the replicas of
    // each stage hold the same weights after every merge.
    wait_for_epoch(&validator, 3, Duration::from_secs(240)).await;
    let rows = epochs(&validator).await.unwrap();
    let val = |e: u64| -> f64 {
        rows.iter()
            .find(|r| r["epoch"] == e)
            .and_then(|r| r["val_loss"].as_f64())
            .unwrap()
    };
    assert!(
        val(3) < val(0) - 0.5,
        "held-out loss falls: {} -> {}",
        val(0),
        val(3)
    );
    for e in 0..3u64 {
        let row = rows.iter().find(|r| r["epoch"] == e).unwrap();
        let merged = row["merged"].as_object().cloned().unwrap_or_default();
        assert_eq!(merged.len(), 3, "epoch {e}: every stage merged: {row}");
        for (stage, replicas) in merged {
            let hashes: BTreeSet<&str> = replicas
                .as_object()
                .unwrap()
                .values()
                .filter_map(|h| h.as_str())
                .collect();
            assert_eq!(
                replicas.as_object().unwrap().len(),
                2,
                "epoch {e} stage {stage}"
            );
            assert_eq!(
                hashes.len(),
                1,
                "epoch {e} stage {stage}: identical replicas"
            );
        }
    }
    let mut stage_of = BTreeMap::new();
    for miner in &miners {
        let status = miner.status().await.unwrap();
        assert!(
            status["samples_processed"].as_u64().unwrap() > 0,
            "{} processed samples",
            miner.name
        );
        stage_of.insert(miner.name.clone(), status["stage"].as_u64().unwrap());
    }

    // Kill a miner of the middle stage mid-epoch: its replica carries the stage, the epoch
    // completes, and the run does not stall.
    let victim_name = stage_of
        .iter()
        .find(|(_, s)| **s == 1)
        .map(|(n, _)| n.clone())
        .unwrap();
    let position = miners.iter().position(|m| m.name == victim_name).unwrap();
    let victim = miners.remove(position);
    let before = epochs(&validator).await.unwrap().last().unwrap()["epoch"]
        .as_u64()
        .unwrap();
    victim.kill().await.unwrap();
    wait_for_epoch(&validator, before + 2, Duration::from_secs(90)).await;
    let rows = epochs(&validator).await.unwrap();
    let row = rows.iter().find(|r| r["epoch"] == before).unwrap();
    assert!(
        row["samples"].as_u64().unwrap() > 0,
        "the epoch went on: {row}"
    );
    // No stall: consecutive loss records never more than 30 s apart.
    for pair in rows.windows(2) {
        if let (Some(a), Some(b)) = (
            pair[0]["last_record_s"].as_f64(),
            pair[1]["first_record_s"].as_f64(),
        ) {
            assert!(b - a < 30.0, "stall between epochs: {} s", b - a);
        }
    }

    // Restart it with its data dir after the run moved on: its own checkpoint is older
    // than the latest merge, so it loads the replicas' merged snapshot, whose hash is the
    // one the stage's members gossiped for the merge before its first epoch back.
    let saved = logged_hash(
        &std::fs::read_to_string(dir.join(format!("{victim_name}.log"))).unwrap(),
        "checkpoint saved",
    )
    .expect("the victim saved a checkpoint before it died");
    let restarted = start_node(&dir, &victim_name, &as_str(&miner_args))
        .await
        .unwrap();
    let mut confirmed =
        starts_from_the_latest_merge(&restarted, &validator, &ids["validator"], Some(&saved)).await;

    // A miner that was never part of the run joins late: it too loads the replicas' merged
    // snapshot of its stage, never the run seed's weights.
    // It starts with `--bootstrap` and `--data-dir` alone: no run or metagraph file, which it
    // fetches from the validator by the hashes the validator's heartbeats advertise.
    keygen(&dir, "joiner");
    let joiner = start_node(&dir, "joiner", &["--bootstrap", &boot])
        .await
        .unwrap();
    wait_for(
        "the joiner prints the run it adopted",
        Duration::from_secs(30),
        POLL,
        || {
            let lines = joiner.stdout_lines();
            let want = format!("RUN {}", run.hash().to_hex());
            async move { Ok((lines.contains(&want), format!("{lines:?}"))) }
        },
    )
    .await
    .unwrap();
    confirmed |= starts_from_the_latest_merge(&joiner, &validator, &ids["validator"], None).await;
    assert!(
        confirmed,
        "a validator confirmed at least one of the snapshots loaded"
    );

    // A miner of another run is refused, and the run goes on.
    let other = RunConfig {
        seed: 1,
        ..test_run()
    };
    let other_args = run_files(&dir, &neurons, &other);
    let mut stranger_args = other_args.clone();
    stranger_args.extend(["--bootstrap".to_string(), boot.clone()]);
    let mut stranger = start_node(&dir, "stranger", &as_str(&stranger_args))
        .await
        .unwrap();
    wait_for(
        "the stranger is refused",
        Duration::from_secs(30),
        POLL,
        || {
            let exited = stranger.try_exit_status();
            async move { Ok((exited?.is_some(), String::new())) }
        },
    )
    .await
    .unwrap();
    assert!(!stranger.try_exit_status().unwrap().unwrap().success());
    let latest = epochs(&validator).await.unwrap().last().unwrap()["epoch"]
        .as_u64()
        .unwrap();
    wait_for_epoch(&validator, latest + 1, Duration::from_secs(90)).await;

    // Every merge took the outer step from one basis: the restarted miner and the joiner
    // loaded the outer momentum with the weights (a member on another basis makes the whole
    // stage fall back to the plain average, and says so).
    for node in miners.iter().chain([&restarted, &joiner]) {
        let log = std::fs::read_to_string(node.log_path()).unwrap();
        assert!(
            !log.contains("hold different outer bases"),
            "{}: a merge fell back to the plain average: {log}",
            node.name
        );
    }

    let reported = epochs(&validator).await.unwrap();
    for node in miners.into_iter().chain([restarted, joiner, validator]) {
        let name = node.name.clone();
        let status = node.stop(Duration::from_secs(15)).await.unwrap();
        assert!(status.success(), "{name}: {status}");
    }
    reported_losses_are_those_of_the_merged_checkpoints(&dir, &run, &reported);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The held-out losses the run reported are those of the model it holds: the merged weights
/// the miners checkpointed, evaluated here in one process (the reference trainer's pipeline,
/// activations through the same wire codec) on the same held-out batches, give the loss the
/// swarm reported at the start of the next epoch. Checked for every epoch whose merged
/// checkpoints of all stages are still kept.
fn reported_losses_are_those_of_the_merged_checkpoints(
    dir: &std::path::Path,
    run: &RunConfig,
    reported: &[serde_json::Value],
) {
    let run_id = u64::from_le_bytes(run.hash().as_bytes()[..8].try_into().unwrap());
    let mut merged: BTreeMap<(u32, u64), Vec<f32>> = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let store_dir = entry.unwrap().path().join("checkpoints");
        if !store_dir.is_dir() {
            continue;
        }
        let store = training::CheckpointStore::open(&store_dir).unwrap();
        for stage in 0..run.stages {
            for manifest in store.list(run_id, stage).unwrap() {
                let state = store.load(&manifest).unwrap();
                merged.insert((stage, manifest.epoch), state.params);
            }
        }
    }
    let preset: training::Preset = run.preset.name().parse().unwrap();
    let wire: training::WireDtype = run.wire_format.name().parse().unwrap();
    let base = training::StageConfig::new(
        preset,
        run.stages as usize,
        0,
        run.bottleneck as usize,
        run.seed,
    );
    let corpus = training::Corpus::shakespeare().unwrap();
    // The miners' held-out set (`pipeline::VAL_BATCHES` batches of the run's shape).
    let val = corpus
        .val_batches(run.batch_size as usize, run.seq_len as usize, 16)
        .unwrap();
    tch::set_num_threads(1);
    let mut checked = Vec::new();
    for row in reported {
        let (Some(epoch), Some(loss)) = (row["epoch"].as_u64(), row["val_loss"].as_f64()) else {
            continue;
        };
        let Some(before) = epoch.checked_sub(1) else {
            continue;
        };
        let weights: Option<Vec<&Vec<f32>>> = (0..run.stages)
            .map(|stage| merged.get(&(stage, before)))
            .collect();
        let Some(weights) = weights else {
            continue;
        };
        let mut pipe = training::local::Pipeline::new(
            &base,
            run.stages as usize,
            training::wire::Codec::new(wire),
            run_id,
        )
        .unwrap();
        for (stage, w) in pipe.stages.iter_mut().zip(weights) {
            stage.set_flat_params(w).unwrap();
        }
        let total: f64 = val
            .iter()
            .map(|b| {
                f64::from(
                    pipe.eval_loss(&b.inputs_tensor(), &b.targets_tensor())
                        .unwrap(),
                )
            })
            .sum();
        let here = total / val.len() as f64;
        assert!(
            (here - loss).abs() < 1e-4,
            "epoch {epoch}: the swarm reported {loss}, its merged checkpoints of epoch {before} score {here}"
        );
        checked.push(epoch);
    }
    assert!(
        !checked.is_empty(),
        "no reported epoch had every stage's merged checkpoint kept: {:?}",
        merged.keys().collect::<Vec<_>>()
    );
    eprintln!("reported held-out losses match the merged checkpoints at epochs {checked:?}");
}
