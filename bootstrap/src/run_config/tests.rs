use std::collections::BTreeSet;

use super::*;

const EVERY_FIELD: &str = r#"
run_name = "sn9-pretrain.v2"
preset = "base"
stages = 5
bottleneck = 0
bottleneck_kind = "resbm"
wire_format = "int8"
gradient_format = "bf16"
epoch_samples = 1000
epoch_timeout_secs = 600
inner_steps = 16
lr = 0.0006
batch_size = 8
seq_len = 1024
seed = 1234
min_validator_stake = 1000000000000
heartbeat_timeout_ms = 3000
butterfly_partitions = 32
audit_rate = 0.25
open_registration = 3
lr_decay_epochs = 40
outer_lr = 0.5
outer_momentum = 0.8
outer_momentum_start = 0.4
outer_warmup_epochs = 10
dataset = "1111111111111111111111111111111111111111111111111111111111111111"
tokenizer = "2222222222222222222222222222222222222222222222222222222222222222"
vocab = 4096
"#;

fn every_field() -> RunConfig {
    RunConfig {
        run_name: "sn9-pretrain.v2".to_owned(),
        preset: ModelPreset::Base,
        stages: 5,
        bottleneck: 0,
        bottleneck_kind: BottleneckKind::Resbm,
        wire_format: WireFormat::Int8,
        gradient_format: Some(WireFormat::Bf16),
        epoch_samples: 1000,
        epoch_timeout_secs: 600,
        inner_steps: 16,
        lr: 0.0006,
        lr_decay_epochs: 40,
        batch_size: 8,
        seq_len: 1024,
        seed: 1234,
        min_validator_stake: 1_000 * crate::RAO_PER_TAO,
        heartbeat_timeout_ms: 3000,
        butterfly_partitions: 32,
        audit_rate: 0.25,
        open_registration: 3,
        outer_lr: 0.5,
        outer_momentum: 0.8,
        outer_momentum_start: 0.4,
        outer_warmup_epochs: 10,
        dataset: Some("1".repeat(64)),
        tokenizer: Some("2".repeat(64)),
        vocab: Some(4096),
        model: None,
    }
}

#[test]
fn defaults_are_valid_and_have_three_stages_and_a_five_second_heartbeat() {
    let config = RunConfig::default();
    config.validate().unwrap();
    assert_eq!(config.stages, 3);
    assert_eq!(config.heartbeat_timeout(), Duration::from_secs(5));
    assert_eq!(RunConfig::from_toml_str("").unwrap(), config);
}

#[test]
fn every_field_is_read_from_toml() {
    let parsed = RunConfig::from_toml_str(EVERY_FIELD).unwrap();
    assert_eq!(parsed, every_field());
    // Each value differs from its default, so a field the parser skipped would show above.
    let defaults = RunConfig::default();
    let toml_default: toml::Table = defaults.to_toml_string().unwrap().parse().unwrap();
    let toml_every: toml::Table = EVERY_FIELD.parse().unwrap();
    for (key, value) in &toml_every {
        assert_ne!(
            toml_default.get(key),
            Some(value),
            "{key} equals its default"
        );
    }
    // A default config leaves `gradient_format` out: gradients then follow `wire_format`.
    assert!(!toml_default.contains_key("gradient_format"));
    assert_eq!(
        toml_default.len() + 4,
        toml_every.len(),
        "the sample sets every field"
    );
}

#[test]
fn fields_left_out_keep_their_default() {
    let parsed = RunConfig::from_toml_str("stages = 4\nlr = 1e-3\n").unwrap();
    let expected = RunConfig {
        stages: 4,
        lr: 1e-3,
        ..RunConfig::default()
    };
    assert_eq!(parsed, expected);
}

#[test]
fn configs_round_trip_through_toml() {
    for config in [RunConfig::default(), every_field()] {
        let text = config.to_toml_string().unwrap();
        assert_eq!(RunConfig::from_toml_str(&text).unwrap(), config, "{text}");
    }
}

#[test]
fn unknown_fields_are_rejected_by_name() {
    for (text, field) in [
        ("stage = 3", "stage"),
        ("learning_rate = 0.1", "learning_rate"),
        ("[training]\nlr = 0.1", "training"),
    ] {
        match RunConfig::from_toml_str(text) {
            Err(RunConfigError::UnknownField { field: got }) => assert_eq!(got, field),
            other => panic!("{text}: {other:?}"),
        }
    }
}

#[test]
fn wrong_types_name_the_field() {
    for (text, field) in [
        ("stages = \"three\"", "stages"),
        ("stages = -1", "stages"),
        ("stages = 5000000000", "stages"),
        ("preset = \"huge\"", "preset"),
        ("wire_format = \"fp8\"", "wire_format"),
        ("bottleneck_kind = \"resnet\"", "bottleneck_kind"),
        ("gradient_format = \"fp8\"", "gradient_format"),
        ("lr = \"fast\"", "lr"),
        ("run_name = 7", "run_name"),
        ("seed = -3", "seed"),
        ("audit_rate = true", "audit_rate"),
    ] {
        match RunConfig::from_toml_str(text) {
            Err(RunConfigError::FieldType { field: got, .. }) => assert_eq!(got, field, "{text}"),
            other => panic!("{text}: {other:?}"),
        }
    }
}

#[test]
fn out_of_range_values_name_the_field() {
    for (text, field) in [
        ("run_name = \"\"", "run_name"),
        ("run_name = \"has space\"", "run_name"),
        (&format!("run_name = \"{}\"", "a".repeat(65)), "run_name"),
        ("stages = 0", "stages"),
        ("stages = 257", "stages"),
        ("epoch_samples = 0", "epoch_samples"),
        ("epoch_timeout_secs = 0", "epoch_timeout_secs"),
        ("inner_steps = 0", "inner_steps"),
        ("batch_size = 0", "batch_size"),
        ("seq_len = 0", "seq_len"),
        ("heartbeat_timeout_ms = 0", "heartbeat_timeout_ms"),
        ("butterfly_partitions = 0", "butterfly_partitions"),
        ("lr = 0.0", "lr"),
        ("lr = -0.1", "lr"),
        ("lr = nan", "lr"),
        ("lr = inf", "lr"),
        ("audit_rate = 1.5", "audit_rate"),
        ("audit_rate = -0.1", "audit_rate"),
        ("open_registration = 257", "open_registration"),
        ("outer_lr = 0.0", "outer_lr"),
        ("outer_lr = 10.5", "outer_lr"),
        ("outer_lr = nan", "outer_lr"),
        ("outer_momentum = 1.0", "outer_momentum"),
        ("outer_momentum = -0.1", "outer_momentum"),
        ("outer_momentum_start = 1.0", "outer_momentum_start"),
    ] {
        match RunConfig::from_toml_str(text) {
            Err(RunConfigError::Invalid { field: got, .. }) => assert_eq!(got, field, "{text}"),
            other => panic!("{text}: {other:?}"),
        }
    }
}

#[test]
fn integers_past_toml_range_are_invalid_so_every_valid_config_can_be_written() {
    let config = RunConfig {
        seed: u64::MAX,
        ..RunConfig::default()
    };
    assert!(matches!(
        config.to_toml_string(),
        Err(RunConfigError::Invalid { field: "seed", .. })
    ));
}

#[test]
fn bad_text_is_refused() {
    assert!(matches!(
        RunConfig::from_toml_str("stages = = 3"),
        Err(RunConfigError::Syntax(_))
    ));
    let big = format!("# {}\n", "x".repeat(MAX_RUN_CONFIG_BYTES));
    assert!(matches!(
        RunConfig::from_toml_str(&big),
        Err(RunConfigError::TooLarge { .. })
    ));
}

#[test]
fn hash_does_not_depend_on_toml_layout() {
    let reordered = r#"
        # same run, written differently
        vocab = 4_096
        tokenizer = "2222222222222222222222222222222222222222222222222222222222222222"
        dataset = "1111111111111111111111111111111111111111111111111111111111111111"
        outer_warmup_epochs = 10
        outer_momentum_start = 0.40
        outer_momentum = 0.8
        outer_lr = 5e-1
        open_registration = 3
        lr_decay_epochs = 40
        audit_rate = 0.250
        butterfly_partitions = 32
        heartbeat_timeout_ms = 3_000
        min_validator_stake = 1_000_000_000_000
        seed = 1234
        seq_len = 1024
        batch_size = 8
        lr = 6e-4
        inner_steps = 16
        epoch_timeout_secs = 600
        epoch_samples = 1000
        gradient_format = "bf16"
        wire_format = "int8"
        bottleneck_kind = "resbm"
        bottleneck = 0
        stages = 5
        preset = "base"
        run_name = "sn9-pretrain.v2"
    "#;
    let a = RunConfig::from_toml_str(EVERY_FIELD).unwrap();
    let b = RunConfig::from_toml_str(reordered).unwrap();
    assert_eq!(a.hash(), b.hash());
}

#[test]
fn hash_changes_with_every_field() {
    let changes: [fn(&mut RunConfig); 24] = [
        |c| c.run_name.push('x'),
        |c| c.preset = ModelPreset::Small,
        |c| c.stages += 1,
        |c| c.bottleneck += 1,
        |c| c.bottleneck_kind = BottleneckKind::Subspace,
        |c| c.wire_format = WireFormat::F32,
        |c| c.gradient_format = Some(WireFormat::Int4),
        |c| c.epoch_samples += 1,
        |c| c.epoch_timeout_secs += 1,
        |c| c.inner_steps += 1,
        |c| c.lr *= 2.0,
        |c| c.lr_decay_epochs += 1,
        |c| c.batch_size += 1,
        |c| c.seq_len += 1,
        |c| c.seed += 1,
        |c| c.min_validator_stake += 1,
        |c| c.heartbeat_timeout_ms += 1,
        |c| c.butterfly_partitions += 1,
        |c| c.audit_rate /= 2.0,
        |c| c.open_registration += 1,
        |c| c.outer_lr /= 2.0,
        |c| c.outer_momentum += 0.25,
        |c| c.outer_momentum_start += 0.25,
        |c| c.outer_warmup_epochs += 1,
    ];
    let base = RunConfig::default();
    let mut hashes = BTreeSet::from([base.hash()]);
    for (i, change) in changes.iter().enumerate() {
        let mut config = base.clone();
        change(&mut config);
        assert!(
            hashes.insert(config.hash()),
            "change #{i} did not change the hash"
        );
    }
}

#[test]
fn a_dataset_changes_the_hash_and_is_named_with_its_tokenizer_and_vocabulary() {
    let base = every_field();
    let changes: [fn(&mut RunConfig); 3] = [
        |c| c.dataset = Some("3".repeat(64)),
        |c| c.tokenizer = Some("3".repeat(64)),
        |c| c.vocab = Some(50_257),
    ];
    let mut hashes = BTreeSet::from([
        base.hash(),
        RunConfig {
            dataset: None,
            tokenizer: None,
            vocab: None,
            ..base.clone()
        }
        .hash(),
    ]);
    for change in changes {
        let mut c = base.clone();
        change(&mut c);
        assert!(hashes.insert(c.hash()));
    }
    assert_eq!(base.dataset_hash(), Some([0x11; 32]));
    assert_eq!(base.vocab_size(), 4096);
    assert_eq!(RunConfig::default().vocab_size(), 256);
    for (toml, field) in [
        (
            "dataset = \"abc\"\ntokenizer = \"abc\"\nvocab = 5",
            "dataset",
        ),
        (&format!("dataset = \"{}\"", "1".repeat(64)), "dataset"),
        (
            &format!(
                "dataset = \"{0}\"\ntokenizer = \"{0}\"\nvocab = 0",
                "1".repeat(64)
            ),
            "vocab",
        ),
    ] {
        match RunConfig::from_toml_str(toml) {
            Err(RunConfigError::Invalid { field: f, .. }) => assert_eq!(f, field, "{toml}"),
            other => panic!("{toml}: {other:?}"),
        }
    }
}

#[test]
fn negative_zero_hashes_like_zero() {
    let zero = RunConfig {
        audit_rate: 0.0,
        ..RunConfig::default()
    };
    let negative = RunConfig {
        audit_rate: -0.0,
        ..RunConfig::default()
    };
    assert_eq!(zero.hash(), negative.hash());
}

#[test]
fn run_hash_prints_and_parses_as_lower_case_hex() {
    let hash = RunConfig::default().hash();
    let hex = hash.to_string();
    assert_eq!(hex.len(), 64);
    assert!(hex
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
    assert_eq!(hex.parse::<RunHash>().unwrap(), hash);
    assert_eq!(
        serde_json::from_str::<RunHash>(&serde_json::to_string(&hash).unwrap()).unwrap(),
        hash
    );
    assert!(hex.to_uppercase().parse::<RunHash>().is_err());
    assert!(hex[..63].parse::<RunHash>().is_err());
}

#[test]
fn learning_rate_decays_along_a_cosine_when_asked() {
    let constant = RunConfig::default();
    assert_eq!(constant.lr_at(0), constant.lr);
    assert_eq!(constant.lr_at(1000), constant.lr);
    let decaying = RunConfig {
        lr_decay_epochs: 10,
        ..RunConfig::default()
    };
    assert_eq!(decaying.lr_at(0), decaying.lr);
    assert!((decaying.lr_at(5) - decaying.lr * 0.55).abs() < 1e-12);
    assert!((decaying.lr_at(10) - decaying.lr / 10.0).abs() < 1e-12);
    assert_eq!(decaying.lr_at(50), decaying.lr_at(10));
    assert!(decaying.lr_at(3) > decaying.lr_at(4));
}

#[test]
fn the_outer_momentum_warms_up_linearly_and_plain_means_no_step() {
    let config = RunConfig {
        outer_lr: 0.7,
        outer_momentum: 0.9,
        outer_momentum_start: 0.5,
        outer_warmup_epochs: 20,
        ..RunConfig::default()
    };
    assert_eq!(config.outer_at(0), (0.7, 0.5));
    let (_, mid) = config.outer_at(10);
    assert!((mid - 0.7).abs() < 1e-12, "{mid}");
    assert_eq!(config.outer_at(20).1, 0.9);
    assert_eq!(config.outer_at(500).1, 0.9);
    let flat = RunConfig {
        outer_warmup_epochs: 0,
        ..config.clone()
    };
    assert_eq!(flat.outer_at(0), (0.7, 0.9));
    assert!(!config.outer_is_plain());
    let plain = RunConfig {
        outer_lr: 1.0,
        outer_momentum: 0.0,
        outer_momentum_start: 0.0,
        ..config
    };
    assert!(plain.outer_is_plain());
}

#[test]
fn toml_over_another_config_keeps_its_fields_and_checks_the_new_ones() {
    let base = RunConfig {
        run_name: "local-swarm".to_owned(),
        epoch_samples: 7,
        ..RunConfig::default()
    };
    let over = base.with_toml_str("outer_lr = 1.5").unwrap();
    assert_eq!(over.outer_lr, 1.5);
    assert_eq!(over.epoch_samples, 7);
    assert_eq!(over.run_name, "local-swarm");
    assert!(matches!(
        base.with_toml_str("outer_lr = 0.0"),
        Err(RunConfigError::Invalid {
            field: "outer_lr",
            ..
        })
    ));
    assert!(matches!(
        base.with_toml_str("bogus = 1"),
        Err(RunConfigError::UnknownField { .. })
    ));
}

#[test]
fn the_hashes_of_runs_without_a_model_table_stay_as_they_were() {
    // Pinned before runs could spell out a model shape: a run that does not keeps its hash.
    assert_eq!(
        RunConfig::default().hash().to_hex(),
        "302b215a262040e454618c99f4c52707e0cd4b313f11b54b55160ee1e0fd5a11"
    );
    assert_eq!(
        every_field().hash().to_hex(),
        "4a8551b843acb5b8d17a708ca19d36e74ede741927d6806a5ab3741dc911a269"
    );
}

/// A small grouped-query shape, as a `[model]` table.
const MODEL_TABLE: &str = r#"
[model]
hidden_size = 256
num_hidden_layers = 4
num_attention_heads = 8
num_key_value_heads = 2
intermediate_size = 688
rope_theta = 500000.0
max_position_embeddings = 1024
rms_norm_eps = 1e-6
"#;

fn model_table() -> ModelShape {
    ModelShape {
        hidden_size: 256,
        num_hidden_layers: 4,
        num_attention_heads: 8,
        num_key_value_heads: 2,
        intermediate_size: 688,
        rope_theta: 500_000.0,
        max_position_embeddings: 1024,
        rms_norm_eps: 1e-6,
        rope_scaling: None,
        tie_word_embeddings: false,
    }
}

#[test]
fn a_model_table_is_read_round_trips_and_changes_the_hash_with_each_key() {
    let run = RunConfig::from_toml_str(&format!("stages = 2\n{MODEL_TABLE}")).unwrap();
    assert_eq!(run.model, Some(model_table()));
    let text = run.to_toml_string().unwrap();
    assert!(text.contains("[model]"), "{text}");
    assert_eq!(RunConfig::from_toml_str(&text).unwrap(), run, "{text}");
    // The keys' order and number spelling do not matter.
    let reordered = r#"
        stages = 2
        [model]
        rms_norm_eps = 0.000001
        max_position_embeddings = 1_024
        rope_theta = 5e5
        intermediate_size = 688
        num_key_value_heads = 2
        num_attention_heads = 8
        num_hidden_layers = 4
        hidden_size = 256
    "#;
    assert_eq!(
        RunConfig::from_toml_str(reordered).unwrap().hash(),
        run.hash()
    );
    let changes: [fn(&mut ModelShape); 8] = [
        |m| m.hidden_size *= 2,
        |m| m.num_hidden_layers += 1,
        |m| m.num_attention_heads /= 2,
        |m| m.num_key_value_heads = 1,
        |m| m.intermediate_size += 1,
        |m| m.rope_theta = 10_000.0,
        |m| m.max_position_embeddings += 1,
        |m| m.rms_norm_eps = 1e-5,
    ];
    let without = RunConfig {
        model: None,
        ..run.clone()
    };
    let mut hashes = BTreeSet::from([run.hash(), without.hash()]);
    for (i, change) in changes.iter().enumerate() {
        let mut changed = run.clone();
        change(changed.model.as_mut().unwrap());
        changed.validate().unwrap();
        assert!(hashes.insert(changed.hash()), "change #{i}");
    }
    // Tying the embeddings is another model.
    let mut tied = run.clone();
    let untied_hash = tied.hash();
    tied.model.as_mut().unwrap().tie_word_embeddings = true;
    tied.validate().unwrap();
    assert_ne!(tied.hash(), untied_hash);
    let text = tied.to_toml_string().unwrap();
    assert!(text.contains("tie_word_embeddings = true"), "{text}");
    assert_eq!(RunConfig::from_toml_str(&text).unwrap(), tied);
    assert!(
        !run.to_toml_string().unwrap().contains("tie_word"),
        "left out when false"
    );
    // A key the table does not have, or one left out, is refused naming the table.
    for text in [
        format!("{MODEL_TABLE}num_local_experts = 8\n"),
        MODEL_TABLE.replace("rope_theta = 500000.0\n", ""),
    ] {
        match RunConfig::from_toml_str(&text) {
            Err(RunConfigError::FieldType { field: "model", .. }) => {}
            other => panic!("{text}: {other:?}"),
        }
    }
}

#[test]
fn a_model_table_no_model_can_have_is_refused_naming_the_key() {
    let cases: [(&str, &str, &str); 14] = [
        ("hidden_size = 256", "hidden_size = 0", "model.hidden_size"),
        (
            "hidden_size = 256",
            "hidden_size = 131072",
            "model.hidden_size",
        ),
        (
            "num_hidden_layers = 4",
            "num_hidden_layers = 0",
            "model.num_hidden_layers",
        ),
        (
            "num_attention_heads = 8",
            "num_attention_heads = 0",
            "model.num_attention_heads",
        ),
        // 256 / 12 is not whole, 256 / 256 is an odd head width of 1.
        (
            "num_attention_heads = 8",
            "num_attention_heads = 12",
            "model.num_attention_heads",
        ),
        (
            "num_attention_heads = 8",
            "num_attention_heads = 256",
            "model.num_attention_heads",
        ),
        (
            "num_key_value_heads = 2",
            "num_key_value_heads = 3",
            "model.num_key_value_heads",
        ),
        (
            "num_key_value_heads = 2",
            "num_key_value_heads = 16",
            "model.num_key_value_heads",
        ),
        (
            "num_key_value_heads = 2",
            "num_key_value_heads = 0",
            "model.num_key_value_heads",
        ),
        (
            "intermediate_size = 688",
            "intermediate_size = 0",
            "model.intermediate_size",
        ),
        (
            "rope_theta = 500000.0",
            "rope_theta = nan",
            "model.rope_theta",
        ),
        (
            "rms_norm_eps = 1e-6",
            "rms_norm_eps = 0.0",
            "model.rms_norm_eps",
        ),
        // The run's own settings must fit the shape.
        ("num_hidden_layers = 4", "num_hidden_layers = 2", "stages"),
        (
            "max_position_embeddings = 1024",
            "max_position_embeddings = 32",
            "seq_len",
        ),
    ];
    for (good, bad, field) in cases {
        let text = MODEL_TABLE.replace(good, bad);
        assert_ne!(text, MODEL_TABLE, "{bad}");
        match RunConfig::from_toml_str(&text) {
            Err(RunConfigError::Invalid { field: got, reason }) => {
                assert_eq!(got, field, "{bad}: {reason}")
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
    let wide = format!("bottleneck = 512\n{MODEL_TABLE}");
    assert!(matches!(
        RunConfig::from_toml_str(&wide),
        Err(RunConfigError::Invalid {
            field: "bottleneck",
            ..
        })
    ));
    let err = RunConfig::from_toml_str(
        &MODEL_TABLE.replace("num_key_value_heads = 2", "num_key_value_heads = 3"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("model.num_key_value_heads") && err.contains("divide num_attention_heads 8"),
        "{err}"
    );
}

#[test]
fn the_llama_3_2_presets_are_named_in_toml() {
    let mut hashes = vec![RunConfig::default().hash()];
    for (name, preset) in [
        ("llama-3.2-1b", ModelPreset::Llama32_1b),
        ("llama-3.2-3b", ModelPreset::Llama32_3b),
    ] {
        let run = RunConfig::from_toml_str(&format!("preset = \"{name}\"")).unwrap();
        assert_eq!(run.preset, preset);
        assert_eq!(run.preset.name(), name);
        assert!(!hashes.contains(&run.hash()), "{name}");
        hashes.push(run.hash());
        assert_eq!(
            RunConfig::from_toml_str(&run.to_toml_string().unwrap()).unwrap(),
            run
        );
    }
}

#[test]
fn a_rope_scaling_table_is_read_hashed_and_checked_naming_its_key() {
    let scaling = "\n[model.rope_scaling]\nrope_type = \"llama3\"\nfactor = 32.0\n\
                   low_freq_factor = 1.0\nhigh_freq_factor = 4.0\n\
                   original_max_position_embeddings = 8192\n";
    let plain = RunConfig::from_toml_str(&format!("stages = 2\n{MODEL_TABLE}")).unwrap();
    let run = RunConfig::from_toml_str(&format!("stages = 2\n{MODEL_TABLE}{scaling}")).unwrap();
    let expected = RopeScalingShape {
        rope_type: RopeType::Llama3,
        factor: 32.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8192,
    };
    assert_eq!(run.model.as_ref().unwrap().rope_scaling, Some(expected));
    assert_ne!(run.hash(), plain.hash());
    let text = run.to_toml_string().unwrap();
    assert_eq!(RunConfig::from_toml_str(&text).unwrap(), run);
    assert!(!plain.to_toml_string().unwrap().contains("rope_scaling"));
    type Edit = fn(&mut RopeScalingShape);
    let edited = |change: Edit| {
        let mut changed = run.clone();
        change(
            changed
                .model
                .as_mut()
                .unwrap()
                .rope_scaling
                .as_mut()
                .unwrap(),
        );
        changed
    };
    let changes: [Edit; 4] = [
        |r| r.factor = 8.0,
        |r| r.low_freq_factor = 2.0,
        |r| r.high_freq_factor = 8.0,
        |r| r.original_max_position_embeddings = 4096,
    ];
    let mut hashes = BTreeSet::from([run.hash(), plain.hash()]);
    for (i, change) in changes.iter().enumerate() {
        let changed = edited(*change);
        changed.validate().unwrap();
        assert!(hashes.insert(changed.hash()), "change #{i}");
    }
    // Numbers out of range are refused naming the key; another kind does not parse.
    let bad: [(Edit, &str); 4] = [
        (|r| r.factor = 0.5, "model.rope_scaling.factor"),
        (
            |r| r.low_freq_factor = 0.0,
            "model.rope_scaling.low_freq_factor",
        ),
        (
            |r| r.high_freq_factor = 1.0,
            "model.rope_scaling.high_freq_factor",
        ),
        (
            |r| r.original_max_position_embeddings = 0,
            "model.rope_scaling.original_max_position_embeddings",
        ),
    ];
    for (change, key) in bad {
        let changed = edited(change);
        match changed.validate() {
            Err(RunConfigError::Invalid { field, .. }) => assert_eq!(field, key),
            other => panic!("{key}: {other:?}"),
        }
    }
    let linear = format!("{MODEL_TABLE}{}", scaling.replace("llama3", "linear"));
    assert!(RunConfig::from_toml_str(&linear).is_err());
}
