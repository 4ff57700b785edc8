//! `iota-p2p export`: the model a run holds, taken out of the nodes' checkpoint stores.
//!
//! A run's model lives split by stage in the miners' sled stores, one merged checkpoint per
//! epoch and stage (`crate::services::miner` saves the merge's result). Export reads the stores of
//! the data dirs it is given (a `local-swarm` output holds one per node), picks the newest
//! epoch that every stage has a checkpoint of, checks each checkpoint against its blob hash
//! and every replica of a stage against the others (the merged weights hash the same on
//! every replica), and writes one model with `training::export`, with the run's tokenizer
//! (`--tokenizer`, else the byte-level one), whose size is the model's vocabulary.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use anyhow::Context;
use bootstrap::RunConfig;
use training::checkpoint::Manifest;
use training::CheckpointStore;

use crate::cli::ExportArgs;

/// The run's tokenizer: `--tokenizer` (which must be the one the run names), else the one a
/// node cached with the run's dataset (`<data dir>/datasets/<dataset>/tokenizer.json`), else
/// the byte-level one of a run on the embedded corpus.
fn run_tokenizer(
    given: Option<&std::path::Path>,
    run: &RunConfig,
    dirs: &[PathBuf],
) -> anyhow::Result<training::Tokenizer> {
    let want = run.tokenizer.as_deref().map(str::to_ascii_lowercase);
    let check = |t: training::Tokenizer, from: &std::path::Path| match &want {
        Some(w) if t.hash().to_hex().as_str() != w => anyhow::bail!(
            "{}: tokenizer {} is not the run's {w}",
            from.display(),
            t.hash().to_hex()
        ),
        None if t.vocab_size() != training::VOCAB => anyhow::bail!(
            "{}: the run trains byte tokens on the embedded corpus; this tokenizer has {} tokens",
            from.display(),
            t.vocab_size()
        ),
        _ => Ok(t),
    };
    if let Some(path) = given {
        let t = training::Tokenizer::from_file(path)
            .with_context(|| format!("--tokenizer {}", path.display()))?;
        return check(t, path);
    }
    let (Some(dataset), Some(_)) = (&run.dataset, &want) else {
        return Ok(training::Tokenizer::byte_level()?);
    };
    for dir in dirs {
        let path = dir
            .join("datasets")
            .join(dataset.to_ascii_lowercase())
            .join(training::dataset::TOKENIZER_FILE);
        if let Ok(t) = training::Tokenizer::from_file(&path) {
            if let Ok(t) = check(t, &path) {
                return Ok(t);
            }
        }
    }
    anyhow::bail!(
        "the run's tokenizer {} is in none of the data dirs' datasets/{dataset}/: pass it \
         with --tokenizer (prepare-data's output holds it)",
        want.unwrap_or_default()
    )
}

/// One stage's merged weights at the exported epoch.
struct StageWeights {
    hash: String,
    params: Vec<f32>,
    /// The data dirs whose checkpoints agreed.
    replicas: Vec<PathBuf>,
}

/// Runs `export`.
pub(crate) fn run(args: &ExportArgs) -> anyhow::Result<()> {
    let dirs = data_dirs(&args.from)?;
    let run = run_config(args)?;
    let tokenizer = run_tokenizer(args.tokenizer.as_deref(), &run, &dirs)?;
    let model = crate::run_spec::model(&run).with_vocab(tokenizer.vocab_size());
    let run_id = crate::run_spec::run_id(&run);
    let stages = run.stages;
    let stores = open_stores(&dirs)?;
    let held = held_checkpoints(&stores, run_id, stages)?;
    let epoch = match args.epoch {
        Some(epoch) => epoch,
        None => latest_complete(&held, stages).with_context(|| {
            format!(
                "no epoch has a checkpoint of every one of the run's {stages} stages in {} \
                 (run hash {}; pass the run's --run file if it is not the built-in one)",
                args.from
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                run.hash()
            )
        })?,
    };
    let mut weights = Vec::new();
    for stage in 0..stages {
        let found = held.get(&(stage, epoch)).cloned().unwrap_or_default();
        weights.push(
            stage_weights(&stores, &dirs, &found)
                .with_context(|| format!("stage {stage} at epoch {epoch}"))?,
        );
    }
    let flats: Vec<&[f32]> = weights.iter().map(|w| w.params.as_slice()).collect();
    let bottleneck = crate::run_spec::bottleneck(&run);
    let tensors = training::export::assemble_with(&model, bottleneck, run.seed, &flats)
        .with_context(|| {
            format!(
                "assembling a model with a vocabulary of {} tokens, the tokenizer's (is \
                 --tokenizer the one the run trained with?)",
                model.vocab
            )
        })?;
    let mut config = training::export::config_json_with(&model, stages as usize, bottleneck);
    config["iota_epoch"] = epoch.into();
    config["iota_run_hash"] = run.hash().to_string().into();
    config["iota_stage_hashes"] = weights
        .iter()
        .map(|w| w.hash.clone())
        .collect::<Vec<_>>()
        .into();
    let metadata = HashMap::from([
        ("format".to_string(), "pt".to_string()),
        ("iota_epoch".to_string(), epoch.to_string()),
        ("iota_run_hash".to_string(), run.hash().to_string()),
    ]);
    training::export::write(&args.out, &tensors, &config, tokenizer.json(), metadata)?;
    print_stages(&weights, epoch);
    let params: usize = tensors.iter().map(|t| t.values.len()).sum();
    println!(
        "RESULT export epoch={epoch} stages={stages} params={params} vocab={} tokenizer={} \
         out={}",
        model.vocab,
        tokenizer.hash(),
        args.out.display()
    );
    Ok(())
}

/// The checkpoint store of every data dir.
fn open_stores(dirs: &[PathBuf]) -> anyhow::Result<Vec<CheckpointStore>> {
    dirs.iter()
        .map(|d| {
            CheckpointStore::open(&d.join("checkpoints")).with_context(|| {
                format!(
                    "opening the checkpoints of {} (is its node still running?)",
                    d.display()
                )
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()
}

/// Which checkpoints the stores hold: (stage, epoch) -> the stores holding one of it (by
/// index), with its manifest.
fn held_checkpoints(stores: &[CheckpointStore], run_id: u64, stages: u32) -> anyhow::Result<Held> {
    // (stage, epoch) -> the stores holding a checkpoint of it, newest step first.
    let mut held: Held = BTreeMap::new();
    for (i, store) in stores.iter().enumerate() {
        for stage in 0..stages {
            for m in store.list(run_id, stage)? {
                held.entry((stage, m.epoch)).or_default().push((i, m));
            }
        }
    }
    Ok(held)
}

/// The checkpoints held, by (stage, epoch): the stores holding one (by index), newest step
/// first.
type Held = BTreeMap<(u32, u64), Vec<(usize, Manifest)>>;

/// One line per stage: whose merged weights were exported, and which replicas agreed.
fn print_stages(weights: &[StageWeights], epoch: u64) {
    for (stage, w) in weights.iter().enumerate() {
        println!(
            "stage {stage}: merged weights of epoch {epoch}, hash {}, agreed by {} replica(s): {}",
            w.hash,
            w.replicas.len(),
            w.replicas
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

/// The data dirs `from` names: each one holding `checkpoints/`, or each child of it that does
/// (a `local-swarm` output directory).
fn data_dirs(from: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut dirs = Vec::new();
    for path in from {
        if path.join("checkpoints").is_dir() {
            dirs.push(path.clone());
            continue;
        }
        let entries = std::fs::read_dir(path)
            .with_context(|| format!("--from {}: not a readable directory", path.display()))?;
        let mut children: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join("checkpoints").is_dir())
            .collect();
        if children.is_empty() {
            anyhow::bail!(
                "--from {}: no checkpoints in it or its subdirectories: pass a local-swarm \
                 output directory or node data directories",
                path.display()
            );
        }
        children.sort();
        dirs.extend(children);
    }
    Ok(dirs)
}

/// `--run`, else the `run.toml` a local-swarm output holds, else the built-in defaults.
fn run_config(args: &ExportArgs) -> anyhow::Result<RunConfig> {
    let path = args.run.clone().or_else(|| {
        args.from
            .iter()
            .map(|p| p.join("run.toml"))
            .find(|p| p.is_file())
    });
    let Some(path) = path else {
        return Ok(RunConfig::default());
    };
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    RunConfig::from_toml_str(&text).with_context(|| format!("run configuration {}", path.display()))
}

/// The newest epoch of which every stage `0..stages` has a checkpoint.
fn latest_complete(
    held: &BTreeMap<(u32, u64), Vec<(usize, Manifest)>>,
    stages: u32,
) -> Option<u64> {
    let epochs_of = |stage: u32| {
        held.keys()
            .filter(move |(s, _)| *s == stage)
            .map(|(_, e)| *e)
    };
    epochs_of(0)
        .filter(|e| (1..stages).all(|s| epochs_of(s).any(|x| x == *e)))
        .max()
}

/// The stage's weights from the checkpoints `found` (store index, manifest): each one read
/// and checked against its blob hash (a corrupt one is skipped, said on stderr), and all that
/// read must hold the same weights.
fn stage_weights(
    stores: &[CheckpointStore],
    dirs: &[PathBuf],
    found: &[(usize, Manifest)],
) -> anyhow::Result<StageWeights> {
    let mut by_hash: BTreeMap<String, (Vec<f32>, Vec<PathBuf>)> = BTreeMap::new();
    for (i, manifest) in found {
        let dir = &dirs[*i];
        match stores[*i].load(manifest) {
            Ok(state) => {
                let hash = hex::encode(training::stage::hash_f32(&state.params));
                let entry = by_hash
                    .entry(hash)
                    .or_insert_with(|| (state.params, Vec::new()));
                if !entry.1.contains(dir) {
                    entry.1.push(dir.clone());
                }
            }
            Err(error) => eprintln!(
                "skipping the checkpoint of stage {} epoch {} in {}: {error}",
                manifest.stage,
                manifest.epoch,
                dir.display()
            ),
        }
    }
    match by_hash.len() {
        0 => anyhow::bail!("no readable checkpoint"),
        1 => {
            let (hash, (params, replicas)) = by_hash.into_iter().next().context("one hash")?;
            Ok(StageWeights {
                hash,
                params,
                replicas,
            })
        }
        _ => anyhow::bail!(
            "the replicas disagree on the merged weights: {}",
            by_hash
                .iter()
                .map(|(h, (_, dirs))| format!(
                    "{h} in {}",
                    dirs.iter()
                        .map(|d| d.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
                .collect::<Vec<_>>()
                .join("; ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(stage: u32, epoch: u64) -> Manifest {
        Manifest {
            run: 1,
            stage,
            epoch,
            step: 0,
            blake3: String::new(),
            bytes: 0,
        }
    }

    #[test]
    fn the_latest_epoch_is_the_newest_every_stage_has() {
        let mut held = BTreeMap::new();
        for (stage, epoch) in [(0, 3), (0, 4), (1, 3), (1, 4), (2, 3)] {
            held.entry((stage, epoch))
                .or_insert_with(Vec::new)
                .push((0, manifest(stage, epoch)));
        }
        assert_eq!(latest_complete(&held, 3), Some(3));
        assert_eq!(latest_complete(&held, 2), Some(4));
        held.retain(|(s, _), _| *s != 2);
        assert_eq!(latest_complete(&held, 3), None);
    }

    #[test]
    fn a_directory_without_checkpoints_is_refused_with_what_to_pass() {
        let dir = std::env::temp_dir().join(format!("iota-export-empty-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let err = data_dirs(std::slice::from_ref(&dir))
            .unwrap_err()
            .to_string();
        assert!(err.contains("no checkpoints"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
