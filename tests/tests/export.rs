//! `iota-p2p export`: a run's checkpoints become one model that Hugging Face `transformers`
//! loads as a `LlamaForCausalLM` and that computes the same logits as the stages did, and that
//! `iota-p2p generate` samples from; its tokenizer (byte-level, or the run's BPE) loads with
//! `AutoTokenizer` and gives the ids ours gives; an export with IOTA bottlenecks computes those
//! logits in a plain PyTorch forward written from the README's layout; replicas that disagree,
//! or no complete epoch, make it fail saying why.
//!
//! The checkpoints are written here as the miners write them (one sled store per data dir,
//! the merged weights of each stage at an epoch), from weights made non-trivial by a
//! deterministic perturbation of the seed's (every norm away from 1).
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use std::path::{Path, PathBuf};
use std::process::Command;

use bootstrap::RunConfig;
use iota_tests::{binary, scratch_dir};
use training::checkpoint::CheckpointKey;
use training::{CheckpointStore, Stage, StageConfig};

const STAGES: usize = 3;
const EPOCH: u64 = 4;

fn run_config(bottleneck: u32) -> RunConfig {
    RunConfig {
        stages: STAGES as u32,
        bottleneck,
        seed: 7,
        ..RunConfig::default()
    }
}

fn run_id(run: &RunConfig) -> u64 {
    // The node's run id: the first 8 bytes of the run hash (private to the node crate).
    u64::from_le_bytes(run.hash().as_bytes()[..8].try_into().unwrap())
}

/// The three stages with perturbed weights.
fn stages(run: &RunConfig) -> Vec<Stage> {
    stages_with_vocab(run, training::VOCAB)
}

/// The model `run` trains (the preset's shape, or its `[model]` table's), with the byte
/// vocabulary.
fn shape(run: &RunConfig) -> training::ModelConfig {
    let preset: training::Preset = run.preset.name().parse().unwrap();
    match &run.model {
        None => preset.config(),
        Some(m) => training::ModelConfig {
            d_model: m.hidden_size as usize,
            n_layers: m.num_hidden_layers as usize,
            n_heads: m.num_attention_heads as usize,
            n_kv_heads: m.num_key_value_heads as usize,
            ffn_hidden: m.intermediate_size as usize,
            max_seq: m.max_position_embeddings as usize,
            vocab: training::VOCAB,
            rope_theta: m.rope_theta,
            norm_eps: m.rms_norm_eps,
            rope_scaling: m.rope_scaling.map(|r| training::RopeScaling {
                factor: r.factor,
                low_freq_factor: r.low_freq_factor,
                high_freq_factor: r.high_freq_factor,
                original_max_position_embeddings: r.original_max_position_embeddings as usize,
            }),
            tie_embeddings: m.tie_word_embeddings,
        },
    }
}

/// [`stages`] of a model with a vocabulary of `vocab` tokens.
fn stages_with_vocab(run: &RunConfig, vocab: usize) -> Vec<Stage> {
    let preset: training::Preset = run.preset.name().parse().unwrap();
    (0..STAGES)
        .map(|i| {
            let kind: training::BottleneckKind = run.bottleneck_kind.name().parse().unwrap();
            let b = training::Bottleneck::new(kind, run.bottleneck as usize);
            let cfg = StageConfig::new(preset, STAGES, i, b, run.seed)
                .with_shape(shape(run).with_vocab(vocab));
            let mut stage = Stage::new(&cfg).unwrap();
            let perturbed: Vec<f32> = stage
                .flat_params()
                .iter()
                .enumerate()
                .map(|(j, v)| v + 0.05 * ((j as f32 * 0.7 + i as f32).sin()))
                .collect();
            stage.set_flat_params(&perturbed).unwrap();
            stage
        })
        .collect()
}

/// Saves `params` as `stage`'s merged checkpoint of `epoch` in `data_dir`.
fn save(data_dir: &Path, run: &RunConfig, stage: &Stage, index: u32, params: Vec<f32>) {
    let store = CheckpointStore::open(&data_dir.join("checkpoints")).unwrap();
    let mut state = stage.export_state();
    state.params = params;
    let key = CheckpointKey {
        run: run_id(run),
        stage: index,
        epoch: EPOCH,
        step: 10,
    };
    store.save(&key, &state).unwrap();
}

fn export(from: &Path, out: &Path, extra: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(binary())
        .args(["export", "--from"])
        .arg(from)
        .arg("--out")
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

/// The 4096-token BPE tokenizer of data/tokenizers.
fn bpe_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../data/tokenizers/shakespeare-bpe-4096.json")
}

fn venv_python() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .join(".venv/bin/python")
}

/// A fixed batch of two 32-byte windows.
fn tokens() -> Vec<Vec<i64>> {
    (0..2)
        .map(|b| {
            b"ROMEO: But soft, what light through yonder window"
                .iter()
                .skip(b * 3)
                .take(32)
                .map(|&c| i64::from(c))
                .collect()
        })
        .collect()
}

/// The stages' own logits on `tokens`, flattened.
fn stage_logits(stages: &[Stage], tokens: &[Vec<i64>]) -> Vec<f32> {
    let flat: Vec<i64> = tokens.iter().flatten().copied().collect();
    let ids = tch::Tensor::from_slice(&flat).reshape([tokens.len() as i64, -1]);
    let mut h = ids.shallow_clone();
    for stage in &stages[..stages.len() - 1] {
        h = stage.eval_forward_with_tokens(&h, Some(&ids)).unwrap();
    }
    let h = stages[stages.len() - 1]
        .eval_logits_with_tokens(&h, Some(&ids))
        .unwrap();
    Vec::<f32>::try_from(h.flatten(0, -1)).unwrap()
}

/// The logits `script` (in scripts/) computes for the model in `model` on `tokens`, flattened.
fn python_logits(script: &str, model: &Path, tokens: &[Vec<i64>], scratch: &Path) -> Vec<f32> {
    let python = venv_python();
    assert!(
        python.exists(),
        "{} is missing: run ./scripts/setup.sh",
        python.display()
    );
    let tokens_path = scratch.join("tokens.json");
    std::fs::write(&tokens_path, serde_json::to_string(tokens).unwrap()).unwrap();
    let logits_path = scratch.join(format!("{script}.json"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scripts")
        .join(script);
    let ran = Command::new(&python)
        .arg(&script)
        .arg(model)
        .arg(&tokens_path)
        .arg(&logits_path)
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(
        ran.status.success(),
        "{} on the export: {}",
        script.display(),
        String::from_utf8_lossy(&ran.stderr)
    );
    let nested: Vec<Vec<Vec<f32>>> =
        serde_json::from_str(&std::fs::read_to_string(&logits_path).unwrap()).unwrap();
    nested.into_iter().flatten().flatten().collect()
}

/// What `transformers` makes of an export and a text (see scripts/hf_tokenizer.py).
struct HfRun {
    class: String,
    is_fast: bool,
    eos_token: Option<String>,
    eos_token_id: Option<u64>,
    ids: Vec<u32>,
    /// `[position][vocab]`, flattened.
    logits: Vec<f32>,
    generated: Vec<u32>,
    decoded: String,
}

/// Runs scripts/hf_tokenizer.py on the export in `model` and `text`.
fn transformers_run(model: &Path, text: &str, scratch: &Path) -> HfRun {
    let text_path = scratch.join("text.json");
    std::fs::write(&text_path, serde_json::to_string(text).unwrap()).unwrap();
    let out_path = scratch.join("hf_tokenizer.json");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/hf_tokenizer.py");
    let ran = Command::new(venv_python())
        .arg(&script)
        .arg(model)
        .arg(&text_path)
        .arg(&out_path)
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(
        ran.status.success(),
        "{} on the export: {}",
        script.display(),
        String::from_utf8_lossy(&ran.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out_path).unwrap()).unwrap();
    let ids = |key: &str| -> Vec<u32> {
        v[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|id| id.as_u64().unwrap() as u32)
            .collect()
    };
    HfRun {
        class: v["class"].as_str().unwrap().to_owned(),
        is_fast: v["is_fast"].as_bool().unwrap(),
        eos_token: v["eos_token"].as_str().map(str::to_owned),
        eos_token_id: v["eos_token_id"].as_u64(),
        ids: ids("ids"),
        logits: v["logits"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|row| row.as_array().unwrap().iter())
            .map(|x| x.as_f64().unwrap() as f32)
            .collect(),
        generated: ids("generated"),
        decoded: v["decoded"].as_str().unwrap().to_owned(),
    }
}

/// Largest absolute difference, after checking both are the same non-trivial size.
fn max_diff(ours: &[f32], theirs: &[f32]) -> f32 {
    assert_eq!(theirs.len(), ours.len(), "logits of one shape");
    let spread = ours.iter().map(|v| v.abs()).fold(0f32, f32::max);
    assert!(spread > 0.1, "the logits are not trivially zero");
    ours.iter()
        .zip(theirs)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max)
}

/// A run's own shape: 8 query heads sharing 2 key-value heads, Llama 3's RoPE base, another
/// norm epsilon (a `[model]` table, open for more keys).
const GQA_TABLE: &str = "[model]\nhidden_size = 128\nnum_hidden_layers = 3\n\
     num_attention_heads = 8\nnum_key_value_heads = 2\nintermediate_size = 352\n\
     rope_theta = 500000.0\nmax_position_embeddings = 256\nrms_norm_eps = 1e-6\n";

/// Asserts that `transformers` and the documented plain-PyTorch forward compute the stages'
/// logits for the export in `out` (`what` names it in the output).
fn assert_transformers_and_plain_agree(what: &str, stages: &[Stage], out: &Path, scratch: &Path) {
    let tokens = tokens();
    let ours = stage_logits(stages, &tokens);
    let theirs = python_logits("hf_logits.py", out, &tokens, scratch);
    let diff = max_diff(&ours, &theirs);
    println!("{what}: max |logit difference| {diff:e}");
    assert!(
        diff <= 1e-4,
        "{what}: transformers' logits differ from the stages' by {diff}"
    );
    let plain = python_logits("iota_forward.py", out, &tokens, scratch);
    assert!(max_diff(&ours, &plain) <= 1e-4, "{what}: the plain forward");
}

/// Writes the stages' checkpoints as a swarm output in `swarm` (two replicas of the middle
/// stage) and exports it to `out` (with the `extra` arguments), returning export's stdout.
fn checkpoint_and_export(
    swarm: &Path,
    out: &Path,
    run: &RunConfig,
    stages: &[Stage],
    extra: &[&std::ffi::OsStr],
) -> String {
    std::fs::create_dir_all(swarm).unwrap();
    std::fs::write(swarm.join("run.toml"), run.to_toml_string().unwrap()).unwrap();
    for (node, index) in [
        ("miner-0", 0),
        ("miner-1", 1),
        ("miner-2", 1),
        ("miner-3", 2),
    ] {
        let stage = &stages[index];
        save(
            &swarm.join(node),
            run,
            stage,
            index as u32,
            stage.flat_params(),
        );
    }
    let done = export(swarm, out, extra);
    let stdout = String::from_utf8_lossy(&done.stdout).to_string();
    assert!(
        done.status.success(),
        "export: {stdout}{}",
        String::from_utf8_lossy(&done.stderr)
    );
    stdout
}

#[test]
fn a_bottleneck_export_matches_a_plain_pytorch_forward_of_the_documented_layout() {
    tch::set_num_threads(1);
    let dir = scratch_dir("export-bottleneck");
    let run = run_config(16);
    let stages = stages(&run);
    let out = dir.join("model");
    checkpoint_and_export(&dir.join("swarm"), &out, &run, &stages, &[]);
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["model_type"], "iota_bottleneck_llama");
    let tokens = tokens();
    let ours = stage_logits(&stages, &tokens);
    let theirs = python_logits("iota_forward.py", &out, &tokens, &dir);
    let diff = max_diff(&ours, &theirs);
    println!("bottleneck export: max |logit difference| {diff:e}");
    assert!(
        diff <= 1e-4,
        "the documented layout's logits differ by {diff}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_export_loads_in_transformers_with_the_logits_of_the_stages() {
    tch::set_num_threads(1);
    let dir = scratch_dir("export");
    let run = run_config(0);
    let stages = stages(&run);
    let out = dir.join("model");
    let stdout = checkpoint_and_export(&dir.join("swarm"), &out, &run, &stages, &[]);
    assert!(
        stdout.contains(&format!("RESULT export epoch={EPOCH} stages={STAGES}")),
        "{stdout}"
    );
    assert!(stdout.contains("agreed by 2 replica(s)"), "{stdout}");
    // transformers loads the byte-level tokenizer as a fast one with no special token, whose
    // ids are the text's bytes; the model's logits on them are the stages'.
    let text = "ROMEO: But soft, what light — héllo\n\tthrough yonder window";
    let hf = transformers_run(&out, text, &dir);
    assert!(hf.is_fast, "{} is not a fast tokenizer", hf.class);
    assert_eq!((hf.eos_token, hf.eos_token_id), (None, None));
    let bytes: Vec<u32> = text.bytes().map(u32::from).collect();
    assert_eq!(hf.ids, bytes, "transformers' ids are the bytes");
    let ids: Vec<i64> = bytes.iter().map(|&b| i64::from(b)).collect();
    let diff = max_diff(&stage_logits(&stages, &[ids]), &hf.logits);
    println!("export: max |logit difference| {diff:e}");
    assert!(
        diff <= 1e-4,
        "transformers' logits differ from the stages' by {diff}"
    );
    assert_eq!(hf.generated.len(), 8, "no end-of-document token to stop at");
    assert_eq!(
        hf.decoded,
        String::from_utf8_lossy(&hf.generated.iter().map(|&b| b as u8).collect::<Vec<u8>>())
    );
    // The documented plain-PyTorch forward agrees on this export too.
    let tokens = tokens();
    let ours = stage_logits(&stages, &tokens);
    let plain = python_logits("iota_forward.py", &out, &tokens, &dir);
    assert!(max_diff(&ours, &plain) <= 1e-4);

    // `generate` samples from the export: the prompt and 50 bytes, the same for one seed.
    let generate = |seed: &str| {
        let output = Command::new(binary())
            .args([
                "generate", "--prompt", "ROMEO:", "--tokens", "50", "--seed", seed, "--model",
            ])
            .arg(&out)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "generate: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        output.stdout
    };
    let text = generate("3");
    assert!(
        text.starts_with(b"ROMEO:"),
        "{}",
        String::from_utf8_lossy(&text)
    );
    assert_eq!(text, generate("3"), "one seed, one text");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_grouped_query_export_loads_in_transformers_with_the_logits_of_the_stages() {
    tch::set_num_threads(1);
    let dir = scratch_dir("export-gqa");
    let run = run_config(0).with_toml_str(GQA_TABLE).unwrap();
    let stages = stages(&run);
    let out = dir.join("model");
    checkpoint_and_export(&dir.join("swarm"), &out, &run, &stages, &[]);
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["model_type"], "llama");
    assert_eq!(config["num_attention_heads"], 8);
    assert_eq!(config["num_key_value_heads"], 2);
    assert_eq!(config["head_dim"], 16);
    assert_eq!(config["rope_theta"], 500_000.0);
    assert_eq!(config["rms_norm_eps"], 1e-6);
    assert_eq!(config["max_position_embeddings"], 256);
    assert_transformers_and_plain_agree("grouped-query export", &stages, &out, &dir);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_tied_rope_scaled_export_loads_in_transformers_with_the_logits_of_the_stage() {
    tch::set_num_threads(1);
    let dir = scratch_dir("export-tied");
    // Llama 3.2's way: the LM head is the embedding, and RoPE's low frequencies are scaled
    // (past a context of 16, so that it shows within these tokens). A tied run is one stage
    // (a pipeline of several cannot keep the head's and the tail's copies equal across the
    // network yet).
    let table = format!(
        "{GQA_TABLE}tie_word_embeddings = true\n\n[model.rope_scaling]\nrope_type = \"llama3\"\n\
         factor = 8.0\nlow_freq_factor = 1.0\nhigh_freq_factor = 4.0\n\
         original_max_position_embeddings = 16\n"
    );
    let run = RunConfig {
        stages: 1,
        ..run_config(0)
    }
    .with_toml_str(&table)
    .unwrap();
    let model = shape(&run);
    assert!(model.tie_embeddings);
    let cfg = StageConfig::new(training::Preset::Tiny, 1, 0, 0, run.seed).with_shape(model.clone());
    let mut stage = Stage::new(&cfg).unwrap();
    let perturbed: Vec<f32> = stage
        .flat_params()
        .iter()
        .enumerate()
        .map(|(j, v)| v + 0.05 * (j as f32 * 0.7).sin())
        .collect();
    stage.set_flat_params(&perturbed).unwrap();
    assert_eq!(stage.num_params(), model.num_params());
    let swarm = dir.join("swarm");
    std::fs::create_dir_all(&swarm).unwrap();
    std::fs::write(swarm.join("run.toml"), run.to_toml_string().unwrap()).unwrap();
    save(&swarm.join("miner-0"), &run, &stage, 0, stage.flat_params());
    let out = dir.join("model");
    let done = export(&swarm, &out, &[]);
    assert!(
        done.status.success(),
        "export: {}",
        String::from_utf8_lossy(&done.stderr)
    );
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["tie_word_embeddings"], true);
    assert_eq!(config["rope_scaling"]["factor"], 8.0);
    assert_eq!(config["num_key_value_heads"], 2);
    assert_transformers_and_plain_agree("tied export", std::slice::from_ref(&stage), &out, &dir);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bpe_export_loads_in_transformers_with_our_token_ids_logits_and_greedy_text() {
    tch::set_num_threads(1);
    let dir = scratch_dir("export-bpe");
    let tokenizer = training::Tokenizer::from_file(&bpe_path()).unwrap();
    // A run on a prepared dataset names its tokenizer and vocabulary (the dataset's hash is
    // only a name here: export reads checkpoints, not shards).
    let run = RunConfig {
        dataset: Some("ab".repeat(32)),
        tokenizer: Some(tokenizer.hash().to_hex().to_string()),
        vocab: Some(4096),
        ..run_config(0)
    };
    assert_eq!(tokenizer.vocab_size(), 4096);
    let stages = stages_with_vocab(&run, 4096);
    let out = dir.join("model");
    let bpe = bpe_path();
    let flag = [std::ffi::OsStr::new("--tokenizer"), bpe.as_os_str()];
    let stdout = checkpoint_and_export(&dir.join("swarm"), &out, &run, &stages, &flag);
    assert!(
        stdout.contains(&format!("vocab=4096 tokenizer={}", tokenizer.hash())),
        "{stdout}"
    );
    assert_eq!(
        std::fs::read(out.join("tokenizer.json")).unwrap(),
        tokenizer.json(),
        "the run's tokenizer, byte for byte"
    );
    let text = "ROMEO: But soft, what light through yonder window breaks?\n\
                It is the east, and Juliet is the sun — héllo!<|endoftext|>JULIET:\n  Ay me!";
    let hf = transformers_run(&out, text, &dir);
    // The same tokenizer: a fast one, its end-of-document token as eos, our ids.
    assert!(hf.is_fast, "{} is not a fast tokenizer", hf.class);
    assert_eq!(hf.eos_token.as_deref(), Some("<|endoftext|>"));
    assert_eq!(hf.eos_token_id, Some(0));
    let ids = tokenizer.encode(text).unwrap();
    assert_eq!(hf.ids, ids, "transformers' ids against ours");
    assert!(ids.contains(&0) && ids.len() * 2 < text.len(), "{ids:?}");
    // The same logits, over all 4096 tokens.
    let ours = stage_logits(&stages, &[ids.iter().map(|&id| i64::from(id)).collect()]);
    assert_eq!(ours.len(), ids.len() * 4096);
    let diff = max_diff(&ours, &hf.logits);
    println!("bpe export: max |logit difference| {diff:e}");
    assert!(
        diff <= 1e-4,
        "transformers' logits differ from the stages' by {diff}"
    );
    // Greedy generation in transformers draws what ours draws (it may stop early, at the
    // end-of-document token), and both decode it alike.
    assert!(!hf.generated.is_empty());
    let model = training::generate::Model::load(&out).unwrap();
    let greedy = training::generate::Sampling {
        tokens: 8,
        temperature: 0.0,
        top_k: 0,
        seed: 0,
    };
    let mine = model.generate_ids(&ids, &greedy).unwrap();
    assert_eq!(hf.generated, mine[..hf.generated.len()], "greedy ids");
    assert_eq!(hf.decoded, tokenizer.decode(&hf.generated).unwrap());
    // `iota-p2p generate` samples from it through the tokenizer.
    let output = Command::new(binary())
        .args([
            "generate", "--prompt", "ROMEO:", "--tokens", "20", "--model",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "generate: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed = String::from_utf8(output.stdout).unwrap();
    assert!(printed.starts_with("ROMEO:"), "{printed}");
    // Without --tokenizer, export looks for the run's in the nodes' dataset caches: none
    // holds it yet, so it fails saying where it looked; once a node cached it, it is found.
    let failed = export(&dir.join("swarm"), &dir.join("model-cached"), &[]);
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(!failed.status.success(), "{stderr}");
    assert!(stderr.contains("is in none of the data dirs"), "{stderr}");
    let cache = dir
        .join("swarm/miner-3/datasets")
        .join(run.dataset.as_deref().unwrap());
    std::fs::create_dir_all(&cache).unwrap();
    std::fs::write(cache.join("tokenizer.json"), tokenizer.json()).unwrap();
    let found = export(&dir.join("swarm"), &dir.join("model-cached"), &[]);
    assert!(
        found.status.success(),
        "{}",
        String::from_utf8_lossy(&found.stderr)
    );
    assert_eq!(
        std::fs::read(dir.join("model-cached/tokenizer.json")).unwrap(),
        tokenizer.json()
    );
    // A tokenizer other than the run's is refused.
    let bytes_json = dir.join("bytes.json");
    std::fs::write(
        &bytes_json,
        training::Tokenizer::byte_level().unwrap().json(),
    )
    .unwrap();
    let flag = [std::ffi::OsStr::new("--tokenizer"), bytes_json.as_os_str()];
    let wrong = export(&dir.join("swarm"), &dir.join("model-wrong"), &flag);
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert!(!wrong.status.success(), "{stderr}");
    assert!(stderr.contains("is not the run's"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_subspace_export_is_a_plain_llama_with_the_logits_of_the_stages() {
    tch::set_num_threads(1);
    let dir = scratch_dir("export-subspace");
    let run = RunConfig {
        bottleneck_kind: bootstrap::BottleneckKind::Subspace,
        ..run_config(16)
    };
    let stages = stages(&run);
    assert!(stages[1].needs_tokens());
    let out = dir.join("model");
    checkpoint_and_export(&dir.join("swarm"), &out, &run, &stages, &[]);
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["model_type"], "llama");
    assert_eq!(config["iota_subspace"], 16);
    let tokens = tokens();
    let ours = stage_logits(&stages, &tokens);
    let theirs = python_logits("hf_logits.py", &out, &tokens, &dir);
    let diff = max_diff(&ours, &theirs);
    println!("subspace export: max |logit difference| {diff:e}");
    assert!(
        diff <= 1e-4,
        "transformers' logits differ from the stages' by {diff}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn replicas_that_disagree_or_a_missing_stage_make_the_export_fail_saying_why() {
    tch::set_num_threads(1);
    let dir = scratch_dir("export-refused");
    let run = run_config(0);
    let stages = stages(&run);
    let swarm = dir.join("swarm");
    std::fs::create_dir_all(&swarm).unwrap();
    std::fs::write(swarm.join("run.toml"), run.to_toml_string().unwrap()).unwrap();

    // Stage 2 has no checkpoint: no epoch is complete.
    save(
        &swarm.join("miner-0"),
        &run,
        &stages[0],
        0,
        stages[0].flat_params(),
    );
    save(
        &swarm.join("miner-1"),
        &run,
        &stages[1],
        1,
        stages[1].flat_params(),
    );
    let failed = export(&swarm, &dir.join("model"), &[]);
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(!failed.status.success());
    assert!(
        stderr.contains("no epoch has a checkpoint of every one"),
        "{stderr}"
    );

    // Two replicas of stage 1 hold different weights.
    save(
        &swarm.join("miner-3"),
        &run,
        &stages[2],
        2,
        stages[2].flat_params(),
    );
    let mut other = stages[1].flat_params();
    other[0] += 1.0;
    save(&swarm.join("miner-2"), &run, &stages[1], 1, other);
    let failed = export(&swarm, &dir.join("model"), &[]);
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(!failed.status.success());
    assert!(stderr.contains("replicas disagree"), "{stderr}");
    assert!(!dir.join("model/model.safetensors").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_model_whose_boundaries_export_cannot_write_is_refused_saying_so() {
    tch::set_num_threads(1);
    let dir = scratch_dir("export-resbm");
    let run = RunConfig {
        bottleneck_kind: bootstrap::BottleneckKind::Resbm,
        ..run_config(16)
    };
    let stages = stages(&run);
    let swarm = dir.join("swarm");
    std::fs::create_dir_all(&swarm).unwrap();
    std::fs::write(swarm.join("run.toml"), run.to_toml_string().unwrap()).unwrap();
    for (index, stage) in stages.iter().enumerate() {
        save(
            &swarm.join(format!("miner-{index}")),
            &run,
            stage,
            index as u32,
            stage.flat_params(),
        );
    }
    let failed = export(&swarm, &dir.join("model"), &[]);
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(!failed.status.success(), "{stderr}");
    assert!(
        stderr.contains("resbm bottlenecks have no exported layout"),
        "{stderr}"
    );
    assert!(!dir.join("model/model.safetensors").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
