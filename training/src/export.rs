//! A trained model taken out of the swarm: the merged weights of every stage assembled into
//! one `model.safetensors` and a `config.json`, in the Hugging Face Llama layout.
//!
//! The model of [`crate::model`] is a Llama decoder (pre-norm RMSNorm, rotary embeddings
//! with the halves rotated, SwiGLU, no biases, the LM head tied to the embedding or not), so
//! with no bottleneck every tensor has a `LlamaForCausalLM` name and shape ([`hf_name`]) and
//! `config.json` carries the keys `transformers` reads (a tied model is written with its
//! embedding only and `tie_word_embeddings: true`; the tail's copy must equal the head's). With IOTA bottlenecks the extra projections are written
//! under `iota.boundary.<k>.{down,down_norm,up,up_norm}.weight` (boundary `k` sits after
//! stage `k`: `down` at the end of stage `k`, `up` at the start of stage `k + 1`), and the
//! config's `model_type` is `iota_bottleneck_llama`, so that Llama loaders refuse it rather
//! than silently drop the projections. A subspace model (the stream `T[token] + U·z`, see
//! [`crate::model`]) is a plain Llama once its fixed tensors are multiplied in: the embedding
//! becomes `T + E·Uᵀ`, every `wo` and `w2` becomes `U·W`, and it is written as a
//! `LlamaForCausalLM` ([`assemble_with`]). ResBM and plain bottlenecks have no exported
//! layout yet and are refused. Everything but [`write`] is pure.
//!
//! The vocabulary is the model's ([`ModelConfig::vocab`], a tokenizer's): `vocab_size` in
//! `config.json` is its padded size ([`ModelConfig::padded_vocab`], the rows of the embedding
//! and LM head; `transformers` accepts a model with more rows than its tokenizer has tokens).
//! Beside the weights [`write`] puts the run's `tokenizer.json` (byte for byte, so its blake3
//! is the run's tokenizer hash, recorded as `iota_tokenizer`), and the
//! `tokenizer_config.json` and `special_tokens_map.json` with which
//! `AutoTokenizer.from_pretrained` loads it as a fast tokenizer with its end-of-document token
//! as `eos_token`; `config.json`'s `eos_token_id` and `bos_token_id` follow that tokenizer
//! (`null` for the byte-level one, which has no special token).

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, TensorView};

use crate::model::{self, Bottleneck, BottleneckKind, LayoutError, StageLayout};
use crate::preset::ModelConfig;
use crate::tokenizer::{LoadError, Tokenizer};

/// Why a model cannot be assembled or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    /// The stages given do not split this model.
    #[error("stage layout: {0}")]
    Layout(#[from] LayoutError),
    /// A stage's weight vector is not that stage's length.
    #[error("stage {stage} has {got} values, its layout {expected}")]
    Length {
        /// The stage.
        stage: usize,
        /// Values its layout holds.
        expected: usize,
        /// Values given.
        got: usize,
    },
    /// The boundaries are of a kind this layout cannot express.
    #[error("{0} bottlenecks have no exported layout (export knows none, IOTA's and subspace)")]
    Unsupported(BottleneckKind),
    /// Multiplying a subspace model's fixed tensors in failed.
    #[error("materialising the subspace model: {0}")]
    Materialise(#[from] tch::TchError),
    /// The tokenizer given is not a tokenizer.json.
    #[error("the tokenizer: {0}")]
    Tokenizer(#[from] LoadError),
    /// The tokenizer has tokens the model has no row for.
    #[error("the tokenizer has {tokenizer} tokens, the model rows for {model}")]
    VocabMismatch {
        /// [`Tokenizer::vocab_size`].
        tokenizer: usize,
        /// The config's `vocab_size`.
        model: usize,
    },
    /// The head's and the tail's copies of a tied embedding differ: the stages were not
    /// trained as one tied model.
    #[error("the head's and the tail's copies of the tied embedding differ (largest difference {max_diff}); the stages do not hold one tied model")]
    TiedCopiesDiffer {
        /// The largest absolute difference of two values.
        max_diff: f32,
    },
    /// Writing the files failed.
    #[error("writing {path}: {message}")]
    Write {
        /// The file.
        path: String,
        /// What failed.
        message: String,
    },
}

/// One tensor of the assembled model.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedTensor<'a> {
    /// Its name in the exported file ([`hf_name`]).
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its values, row-major (borrowed from a stage's weights, or computed).
    pub values: Cow<'a, [f32]>,
}

/// The exported name of an internal parameter name (see the module documentation).
pub fn hf_name(name: &str) -> String {
    let parts: Vec<&str> = name.split('.').collect();
    match parts.as_slice() {
        ["embed"] => "model.embed_tokens.weight".into(),
        ["final_norm"] => "model.norm.weight".into(),
        ["lm_head"] => "lm_head.weight".into(),
        ["layers", l, w] => {
            let inner = match *w {
                "attn_norm" => "input_layernorm",
                "mlp_norm" => "post_attention_layernorm",
                "wq" => "self_attn.q_proj",
                "wk" => "self_attn.k_proj",
                "wv" => "self_attn.v_proj",
                "wo" => "self_attn.o_proj",
                "w1" => "mlp.gate_proj",
                "w3" => "mlp.up_proj",
                "w2" => "mlp.down_proj",
                other => other,
            };
            format!("model.layers.{l}.{inner}.weight")
        }
        ["boundary", k, w] => format!("iota.boundary.{k}.{w}.weight"),
        _ => format!("iota.{name}"),
    }
}

/// Splits each stage's flat weight vector (`stages[i]`: stage `i`'s, in
/// [`crate::Stage::flat_params`] order) into the model's named tensors, in model order, for
/// an IOTA bottleneck of width `bottleneck` (0: none).
pub fn assemble<'a>(
    model: &ModelConfig,
    bottleneck: usize,
    stages: &[&'a [f32]],
) -> Result<Vec<NamedTensor<'a>>, ExportError> {
    assemble_with(model, bottleneck.into(), 0, stages)
}

/// [`assemble`] for any bottleneck: a subspace model (run `seed`, which its fixed tensors
/// derive from) comes out as a plain Llama; ResBM and plain bottlenecks are refused.
pub fn assemble_with<'a>(
    model: &ModelConfig,
    bottleneck: Bottleneck,
    seed: u64,
    stages: &[&'a [f32]],
) -> Result<Vec<NamedTensor<'a>>, ExportError> {
    if bottleneck.width > 0
        && matches!(
            bottleneck.kind,
            BottleneckKind::Plain | BottleneckKind::Resbm
        )
    {
        return Err(ExportError::Unsupported(bottleneck.kind));
    }
    let fixed = bottleneck
        .is_subspace()
        .then(|| model::subspace_tensors(model, bottleneck.width, seed, tch::Device::Cpu));
    let mut out: Vec<NamedTensor<'a>> = Vec::new();
    for (index, flat) in stages.iter().enumerate() {
        let layout = StageLayout::new(model, stages.len(), index, bottleneck)?;
        let specs = model::param_specs(model, &layout);
        let expected: usize = specs.iter().map(|s| s.numel()).sum();
        if flat.len() != expected {
            return Err(ExportError::Length {
                stage: index,
                expected,
                got: flat.len(),
            });
        }
        let mut at = 0;
        for spec in specs {
            let n = spec.numel();
            let values = &flat[at..at + n];
            at += n;
            let mut tensor = NamedTensor {
                name: hf_name(&spec.name),
                shape: spec.shape.clone(),
                values: Cow::Borrowed(values),
            };
            if let Some((basis, table)) = &fixed {
                materialise(&spec.name, &mut tensor, basis, table, model.d_model)?;
            }
            if index > 0 && spec.name == "embed" {
                // The tail's copy of a tied embedding: written once, if it is the head's.
                tied_copy_matches(&out, &tensor)?;
                continue;
            }
            out.push(tensor);
        }
    }
    Ok(out)
}

/// Checks that `copy`, the tail's copy of a tied embedding, equals the head's in `assembled`.
fn tied_copy_matches(
    assembled: &[NamedTensor<'_>],
    copy: &NamedTensor<'_>,
) -> Result<(), ExportError> {
    let head = assembled.iter().find(|t| t.name == copy.name);
    let max_diff = match head {
        Some(h) if h.shape == copy.shape => h
            .values
            .iter()
            .zip(copy.values.iter())
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max),
        _ => f32::INFINITY,
    };
    if max_diff == 0.0 {
        Ok(())
    } else {
        Err(ExportError::TiedCopiesDiffer { max_diff })
    }
}

/// Multiplies a subspace model's fixed tensors into the tensors that live in the subspace:
/// the embedding (`T + E·Uᵀ`), and the stream writes `wo` and `w2` (`U·W`).
fn materialise(
    name: &str,
    tensor: &mut NamedTensor<'_>,
    basis: &tch::Tensor,
    table: &tch::Tensor,
    d: usize,
) -> Result<(), ExportError> {
    let writes = name.ends_with(".wo") || name.ends_with(".w2");
    if name != "embed" && !writes {
        return Ok(());
    }
    let (rows, cols) = (tensor.shape[0] as i64, tensor.shape[1] as i64);
    let w = tch::Tensor::f_from_slice(&tensor.values)?.f_reshape([rows, cols])?;
    let full = if writes {
        tensor.shape = vec![d, tensor.shape[1]];
        basis.f_matmul(&w)?
    } else {
        tensor.shape = vec![tensor.shape[0], d];
        w.f_matmul(&basis.f_transpose(0, 1)?)?.f_add(table)?
    };
    tensor.values = Cow::Owned(Vec::<f32>::try_from(full.f_flatten(0, -1)?)?);
    Ok(())
}

/// The `config.json` of the model split into `stages` stages with an IOTA bottleneck of width
/// `bottleneck` (0: none).
pub fn config_json(model: &ModelConfig, stages: usize, bottleneck: usize) -> serde_json::Value {
    config_json_with(model, stages, bottleneck.into())
}

/// [`config_json`] for any bottleneck [`assemble_with`] writes: a subspace model is a plain
/// Llama, with its width recorded as `iota_subspace`.
pub fn config_json_with(
    model: &ModelConfig,
    stages: usize,
    boundary: Bottleneck,
) -> serde_json::Value {
    let bottleneck = if boundary.is_subspace() {
        0
    } else {
        boundary.width
    };
    let mut config = iota_config(model, stages, bottleneck);
    config["iota_stage_layers"] = (0..stages)
        .filter_map(|i| StageLayout::new(model, stages, i, boundary).ok())
        .map(|l| [l.layers.start, l.layers.end])
        .collect::<Vec<_>>()
        .into();
    if boundary.is_subspace() {
        config["iota_subspace"] = boundary.width.into();
    }
    config
}

fn iota_config(model: &ModelConfig, stages: usize, bottleneck: usize) -> serde_json::Value {
    let model_type = if bottleneck == 0 {
        "llama"
    } else {
        "iota_bottleneck_llama"
    };
    serde_json::json!({
        "architectures": [if bottleneck == 0 { "LlamaForCausalLM" } else { "IotaBottleneckLlamaForCausalLM" }],
        "model_type": model_type,
        "vocab_size": model.padded_vocab(),
        "iota_vocab": model.vocab,
        "hidden_size": model.d_model,
        "intermediate_size": model.ffn_hidden,
        "num_hidden_layers": model.n_layers,
        "num_attention_heads": model.n_heads,
        "num_key_value_heads": model.n_kv_heads,
        "head_dim": model.head_dim(),
        "max_position_embeddings": model.max_seq,
        "rms_norm_eps": model.norm_eps,
        "rope_theta": model.rope_theta,
        "rope_scaling": model.rope_scaling.map(|s| serde_json::json!({
            "rope_type": "llama3",
            "factor": s.factor,
            "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position_embeddings,
        })),
        "hidden_act": "silu",
        "attention_bias": false,
        "mlp_bias": false,
        "tie_word_embeddings": model.tie_embeddings,
        "torch_dtype": "float32",
        "iota_stages": stages,
        "iota_bottleneck": bottleneck,
        "iota_stage_layers": (0..stages)
            .filter_map(|i| StageLayout::new(model, stages, i, bottleneck).ok())
            .map(|l| [l.layers.start, l.layers.end])
            .collect::<Vec<_>>(),
    })
}

/// Writes `tensors` to `dir/model.safetensors` (f32, with `metadata`), `config` to
/// `dir/config.json` with the special token ids of `tokenizer_json`, and that tokenizer
/// (a `tokenizer.json`'s bytes, e.g. [`crate::tokenizer::byte_level_json`]'s) with its
/// `transformers` files ([`tokenizer_files`]). The tokenizer is checked first: one that does
/// not load, or has more tokens than the model has rows, writes nothing.
pub fn write(
    dir: &Path,
    tensors: &[NamedTensor<'_>],
    config: &serde_json::Value,
    tokenizer_json: &[u8],
    metadata: HashMap<String, String>,
) -> Result<(), ExportError> {
    let failed = |path: &Path, message: String| ExportError::Write {
        path: path.display().to_string(),
        message,
    };
    let tokenizer = Tokenizer::from_bytes(tokenizer_json)?;
    let rows = config["vocab_size"].as_u64().unwrap_or(0) as usize;
    if tokenizer.vocab_size() > rows {
        return Err(ExportError::VocabMismatch {
            tokenizer: tokenizer.vocab_size(),
            model: rows,
        });
    }
    let mut config = config.clone();
    let id = |t: Option<&crate::tokenizer::SpecialToken>| t.map(|t| t.id);
    config["eos_token_id"] = id(tokenizer.end_of_document()).into();
    config["bos_token_id"] = id(tokenizer.begin_of_document()).into();
    config["iota_tokenizer"] = tokenizer.hash().to_hex().to_string().into();
    let max_len = config["max_position_embeddings"].as_u64().unwrap_or(0);
    let (tokenizer_config, special_tokens) = tokenizer_files(&tokenizer, max_len);
    std::fs::create_dir_all(dir).map_err(|e| failed(dir, e.to_string()))?;
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|t| t.values.iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect();
    let file = dir.join("model.safetensors");
    let views = tensors
        .iter()
        .zip(&bytes)
        .map(|(t, b)| {
            TensorView::new(Dtype::F32, t.shape.clone(), b)
                .map(|v| (t.name.clone(), v))
                .map_err(|e| failed(&file, format!("{e:?}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    safetensors::tensor::serialize_to_file(views, &Some(metadata), &file)
        .map_err(|e| failed(&file, format!("{e:?}")))?;
    let json = |name: &str, value: &serde_json::Value| {
        let path = dir.join(name);
        let text = serde_json::to_string_pretty(value).map_err(|e| failed(&path, e.to_string()))?;
        std::fs::write(&path, text + "\n").map_err(|e| failed(&path, e.to_string()))
    };
    json("config.json", &config)?;
    json("tokenizer_config.json", &tokenizer_config)?;
    json("special_tokens_map.json", &special_tokens)?;
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, tokenizer.json()).map_err(|e| failed(&path, e.to_string()))
}

/// The `tokenizer_config.json` and `special_tokens_map.json` that make `transformers` load
/// `tokenizer.json` as a fast tokenizer (`PreTrainedTokenizerFast`) for contexts of
/// `max_len` tokens, with the tokenizer's end-of-document token as `eos_token` and its
/// beginning-of-document token as `bos_token` (neither for a tokenizer without them).
/// Decoding does not touch spaces, so for a tokenizer without a post-processor (the
/// byte-level one, the test BPE) `transformers` gives the ids and text [`Tokenizer::encode`]
/// and [`Tokenizer::decode`] give; one whose post-processor adds a token around every text
/// (Llama 3's adds `<|begin_of_text|>`) adds it in `transformers` too, where
/// [`Tokenizer::encode`] does not.
pub fn tokenizer_files(
    tokenizer: &Tokenizer,
    max_len: u64,
) -> (serde_json::Value, serde_json::Value) {
    let mut special = serde_json::Map::new();
    if let Some(eos) = tokenizer.end_of_document() {
        special.insert("eos_token".into(), eos.content.clone().into());
    }
    if let Some(bos) = tokenizer.begin_of_document() {
        special.insert("bos_token".into(), bos.content.clone().into());
    }
    let mut config = serde_json::json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": max_len,
        "clean_up_tokenization_spaces": false,
        "add_bos_token": false,
        "add_eos_token": false,
    });
    for (key, value) in &special {
        config[key] = value.clone();
    }
    (config, special.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preset::Preset;

    #[test]
    fn every_internal_name_has_its_llama_name() {
        assert_eq!(hf_name("embed"), "model.embed_tokens.weight");
        assert_eq!(
            hf_name("layers.3.wq"),
            "model.layers.3.self_attn.q_proj.weight"
        );
        assert_eq!(
            hf_name("layers.0.w1"),
            "model.layers.0.mlp.gate_proj.weight"
        );
        assert_eq!(hf_name("layers.0.w3"), "model.layers.0.mlp.up_proj.weight");
        assert_eq!(
            hf_name("layers.0.w2"),
            "model.layers.0.mlp.down_proj.weight"
        );
        assert_eq!(
            hf_name("layers.1.mlp_norm"),
            "model.layers.1.post_attention_layernorm.weight"
        );
        assert_eq!(hf_name("final_norm"), "model.norm.weight");
        assert_eq!(hf_name("boundary.0.down"), "iota.boundary.0.down.weight");
    }

    #[test]
    fn stages_assemble_into_the_whole_model_once() {
        let model = Preset::Tiny.config();
        let lens: Vec<usize> = (0..3)
            .map(|i| {
                let layout = StageLayout::new(&model, 3, i, 0).unwrap();
                model::param_specs(&model, &layout)
                    .iter()
                    .map(|s| s.numel())
                    .sum()
            })
            .collect();
        let flats: Vec<Vec<f32>> = lens.iter().map(|&n| vec![0.5; n]).collect();
        let refs: Vec<&[f32]> = flats.iter().map(Vec::as_slice).collect();
        let tensors = assemble(&model, 0, &refs).unwrap();
        let total: usize = tensors.iter().map(|t| t.values.len()).sum();
        assert_eq!(total, model.num_params());
        let names: std::collections::BTreeSet<&str> =
            tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names.len(), tensors.len(), "no name twice");
        assert!(names.iter().all(|n| !n.starts_with("iota.")));
        // A stage of the wrong length is refused, naming it.
        let short = &flats[1][1..];
        let err = assemble(&model, 0, &[&flats[0], short, &flats[2]]).unwrap_err();
        assert!(matches!(err, ExportError::Length { stage: 1, .. }), "{err}");
    }

    #[test]
    fn a_bottleneck_export_names_its_projections_and_is_not_called_llama() {
        let model = Preset::Tiny.config();
        let flats: Vec<Vec<f32>> = (0..2)
            .map(|i| {
                let layout = StageLayout::new(&model, 2, i, 8).unwrap();
                let n = model::param_specs(&model, &layout)
                    .iter()
                    .map(|s| s.numel())
                    .sum();
                vec![0.0; n]
            })
            .collect();
        let refs: Vec<&[f32]> = flats.iter().map(Vec::as_slice).collect();
        let tensors = assemble(&model, 8, &refs).unwrap();
        let iota: Vec<&str> = tensors
            .iter()
            .map(|t| t.name.as_str())
            .filter(|n| n.starts_with("iota."))
            .collect();
        assert_eq!(
            iota,
            [
                "iota.boundary.0.down_norm.weight",
                "iota.boundary.0.down.weight",
                "iota.boundary.0.up_norm.weight",
                "iota.boundary.0.up.weight"
            ]
        );
        assert_eq!(
            config_json(&model, 2, 8)["model_type"],
            "iota_bottleneck_llama"
        );
        assert_eq!(config_json(&model, 2, 0)["model_type"], "llama");
    }
}
