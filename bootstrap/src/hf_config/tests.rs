#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

use super::*;
use crate::RunConfig;

/// The values of meta-llama/Llama-3.2-1B's `config.json` on the Hugging Face Hub (keys as
/// published, layout ours): it ties its embeddings and scales its RoPE frequencies.
const LLAMA_3_2_1B: &str = r#"{
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
}"#;

/// The published config with `edit` applied to its JSON object.
fn edited(edit: impl FnOnce(&mut Map<String, Value>)) -> String {
    let mut v: Value = serde_json::from_str(LLAMA_3_2_1B).unwrap();
    edit(v.as_object_mut().unwrap());
    v.to_string()
}

/// The published config without what is not supported: untied, no RoPE scaling.
fn supported() -> String {
    edited(|o| {
        o.insert("tie_word_embeddings".into(), false.into());
        o.remove("rope_scaling");
    })
}

/// The keys a config must have.
const REQUIRED: [&str; 9] = [
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "intermediate_size",
    "rope_theta",
    "max_position_embeddings",
    "rms_norm_eps",
];

#[test]
fn the_published_llama_3_2_1b_config_gives_its_scaled_tied_shape() {
    let shape = model_shape_from_hf_config(LLAMA_3_2_1B).unwrap();
    assert!(shape.tie_word_embeddings);
    assert_eq!(
        shape.rope_scaling,
        Some(RopeScalingShape {
            rope_type: RopeType::Llama3,
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        })
    );
    // A null `rope_scaling` is what transformers writes for none.
    let null_scaling = edited(|o| {
        o.insert("rope_scaling".into(), Value::Null);
    });
    assert_eq!(
        model_shape_from_hf_config(&null_scaling)
            .unwrap()
            .rope_scaling,
        None
    );
    // Another kind of scaling is refused; so is a Llama 3 one missing a number.
    let linear = edited(|o| {
        o.insert(
            "rope_scaling".into(),
            serde_json::json!({"rope_type": "linear", "factor": 2.0}),
        );
    });
    let err = model_shape_from_hf_config(&linear).unwrap_err().to_string();
    assert!(
        err.contains("rope_scaling") && err.contains("linear"),
        "{err}"
    );
    let partial = edited(|o| {
        o["rope_scaling"]
            .as_object_mut()
            .unwrap()
            .remove("high_freq_factor");
    });
    let err = model_shape_from_hf_config(&partial).unwrap_err();
    assert!(
        matches!(
            err,
            HfConfigError::Missing {
                key: "rope_scaling.high_freq_factor"
            }
        ),
        "{err}"
    );
    // A run configuration takes it (train-local trains it; the node says it cannot yet).
    RunConfig {
        model: Some(shape),
        ..RunConfig::default()
    }
    .validate()
    .unwrap();
}

#[test]
fn an_untied_unscaled_llama_config_gives_its_shape_and_a_run_accepts_it() {
    let shape = model_shape_from_hf_config(&supported()).unwrap();
    assert_eq!(
        shape,
        ModelShape {
            hidden_size: 2048,
            num_hidden_layers: 16,
            num_attention_heads: 32,
            num_key_value_heads: 8,
            intermediate_size: 8192,
            rope_theta: 500_000.0,
            max_position_embeddings: 131_072,
            rms_norm_eps: 1e-5,
            rope_scaling: None,
            tie_word_embeddings: false,
        }
    );
    let run = RunConfig {
        model: Some(shape),
        ..RunConfig::default()
    };
    run.validate().unwrap();
    // Unknown keys are ignored; so are absent optional ones.
    let minimal = edited(|o| {
        o.retain(|k, _| REQUIRED.contains(&k.as_str()));
        o.insert("something_new".into(), Value::from(7));
    });
    assert_eq!(
        model_shape_from_hf_config(&minimal).unwrap(),
        run.model.unwrap()
    );
}

#[test]
fn a_missing_or_ill_typed_key_is_refused_naming_it() {
    for key in REQUIRED {
        let text = supported();
        let missing = edited(|o| {
            *o = serde_json::from_str::<Map<String, Value>>(&text).unwrap();
            o.remove(key);
        });
        let err = model_shape_from_hf_config(&missing).unwrap_err();
        assert!(
            matches!(err, HfConfigError::Missing { key: k } if k == key),
            "{key}: {err}"
        );
        assert!(err.to_string().contains(key), "{err}");
        let wrong = edited(|o| {
            *o = serde_json::from_str::<Map<String, Value>>(&text).unwrap();
            o.insert(key.into(), Value::from(vec![1]));
        });
        let err = model_shape_from_hf_config(&wrong).unwrap_err();
        assert!(
            matches!(err, HfConfigError::Type { key: k, .. } if k == key),
            "{key}: {err}"
        );
    }
    for (key, value) in [
        ("hidden_size", Value::from(-1)),
        ("hidden_size", Value::from(2048.5)),
        ("num_hidden_layers", Value::from(1u64 << 32)),
        ("rope_theta", Value::from("500000")),
        ("tie_word_embeddings", Value::from("no")),
    ] {
        let text = supported();
        let bad = edited(|o| {
            *o = serde_json::from_str::<Map<String, Value>>(&text).unwrap();
            o.insert(key.into(), value.clone());
        });
        let err = model_shape_from_hf_config(&bad).unwrap_err();
        assert!(
            matches!(err, HfConfigError::Type { key: k, .. } if k == key),
            "{key}: {err}"
        );
    }
}

#[test]
fn another_architecture_or_a_feature_the_model_lacks_is_refused_naming_the_key() {
    let text = supported();
    let with = |key: &str, value: Value| {
        let mut o: Map<String, Value> = serde_json::from_str(&text).unwrap();
        o.insert(key.into(), value);
        model_shape_from_hf_config(&Value::Object(o).to_string()).unwrap_err()
    };
    for (key, value) in [
        ("model_type", Value::from("mistral")),
        ("attention_bias", Value::from(true)),
        ("mlp_bias", Value::from(true)),
        ("hidden_act", Value::from("gelu")),
        ("head_dim", Value::from(128)),
    ] {
        let err = with(key, value);
        assert!(
            matches!(err, HfConfigError::Unsupported { key: k, .. } if k == key),
            "{key}: {err}"
        );
    }
    assert!(with("model_type", "mistral".into())
        .to_string()
        .contains("\"mistral\""));
    assert!(matches!(
        model_shape_from_hf_config("[1, 2]"),
        Err(HfConfigError::NotAnObject)
    ));
    assert!(matches!(
        model_shape_from_hf_config("{"),
        Err(HfConfigError::Syntax(_))
    ));
    let huge = " ".repeat(MAX_HF_CONFIG_BYTES + 1);
    assert!(matches!(
        model_shape_from_hf_config(&huge),
        Err(HfConfigError::TooLarge { .. })
    ));
}
