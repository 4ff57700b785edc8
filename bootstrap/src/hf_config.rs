//! Reading a model shape out of a Hugging Face Llama `config.json` (`--model-config`).
//!
//! [`model_shape_from_hf_config`] takes the keys a [`ModelShape`] needs and ignores the many
//! others such a file carries (token ids, dtype, library versions). It refuses what would
//! quietly give the user another model than the file describes: a `model_type` other than
//! `llama`, RoPE frequency scaling other than Llama 3's (`rope_scaling` with another
//! `rope_type`), biases in attention or MLP, an activation other than SiLU, or a `head_dim` other than `hidden_size /
//! num_attention_heads`. `tie_word_embeddings` is read (false when absent, as in
//! `transformers`). `vocab_size` is not read: the vocabulary is the run's, its tokenizer's
//! (256 byte tokens without one).
//!
//! The shape is not checked here beyond its types: the run it goes into validates it
//! ([`RunConfig::validate`](crate::RunConfig::validate)) naming `model.<key>`.

use serde_json::{Map, Value};

use crate::{ModelShape, RopeScalingShape, RopeType};

/// Largest `config.json` read, in bytes (a Llama one is about 1 kB).
pub const MAX_HF_CONFIG_BYTES: usize = 64 << 10;

/// Why a `config.json` gave no [`ModelShape`]; each names the key at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HfConfigError {
    /// The text is larger than [`MAX_HF_CONFIG_BYTES`]; it was not parsed.
    #[error("config.json is {len} bytes; at most {max} are accepted")]
    TooLarge {
        /// Size of the text.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The text is not JSON.
    #[error("config.json is not valid JSON: {0}")]
    Syntax(#[source] serde_json::Error),
    /// The JSON is not an object.
    #[error("config.json is not a JSON object")]
    NotAnObject,
    /// A key the shape needs is absent.
    #[error("config.json has no `{key}`")]
    Missing {
        /// The key.
        key: &'static str,
    },
    /// A key whose value has the wrong type.
    #[error("config.json `{key}` must be {expected}")]
    Type {
        /// The key.
        key: &'static str,
        /// What it must be, in words.
        expected: &'static str,
    },
    /// A key whose value names a model this project does not train.
    #[error("config.json `{key}`: {reason}")]
    Unsupported {
        /// The key.
        key: &'static str,
        /// Why, in words.
        reason: String,
    },
}

/// The model shape of the Hugging Face Llama `config.json` `text`.
pub fn model_shape_from_hf_config(text: &str) -> Result<ModelShape, HfConfigError> {
    if text.len() > MAX_HF_CONFIG_BYTES {
        return Err(HfConfigError::TooLarge {
            len: text.len(),
            max: MAX_HF_CONFIG_BYTES,
        });
    }
    let value: Value = serde_json::from_str(text).map_err(HfConfigError::Syntax)?;
    let obj = value.as_object().ok_or(HfConfigError::NotAnObject)?;
    let unsupported = |key, reason: &str| {
        Err(HfConfigError::Unsupported {
            key,
            reason: reason.to_owned(),
        })
    };
    let model_type = string(obj, "model_type")?;
    if model_type != "llama" {
        return Err(HfConfigError::Unsupported {
            key: "model_type",
            reason: format!("is {model_type:?}; only \"llama\" is supported"),
        });
    }
    for key in ["attention_bias", "mlp_bias"] {
        if optional_bool(obj, key)? == Some(true) {
            return unsupported(key, "biases are not supported");
        }
    }
    if let Some(act) = obj.get("hidden_act") {
        if act.as_str() != Some("silu") {
            return unsupported("hidden_act", "only \"silu\" (SwiGLU) is supported");
        }
    }
    let shape = ModelShape {
        hidden_size: whole(obj, "hidden_size")?,
        num_hidden_layers: whole(obj, "num_hidden_layers")?,
        num_attention_heads: whole(obj, "num_attention_heads")?,
        num_key_value_heads: whole(obj, "num_key_value_heads")?,
        intermediate_size: whole(obj, "intermediate_size")?,
        rope_theta: number(obj, "rope_theta")?,
        max_position_embeddings: whole(obj, "max_position_embeddings")?,
        rms_norm_eps: number(obj, "rms_norm_eps")?,
        rope_scaling: rope_scaling(obj)?,
        // transformers' LlamaConfig default.
        tie_word_embeddings: optional_bool(obj, "tie_word_embeddings")?.unwrap_or(false),
    };
    if let Some(head_dim) = obj.get("head_dim").filter(|v| !v.is_null()) {
        let implied =
            (shape.num_attention_heads != 0).then(|| shape.hidden_size / shape.num_attention_heads);
        if head_dim.as_u64() != implied.map(u64::from) {
            return unsupported(
                "head_dim",
                "only hidden_size / num_attention_heads is supported",
            );
        }
    }
    Ok(shape)
}

/// `rope_scaling`: absent or `null` for none, else Llama 3's (`rope_type`, or the older
/// `type`, `"llama3"`) with its four numbers.
fn rope_scaling(obj: &Map<String, Value>) -> Result<Option<RopeScalingShape>, HfConfigError> {
    const KEY: &str = "rope_scaling";
    let Some(value) = obj.get(KEY).filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let table = value.as_object().ok_or(HfConfigError::Type {
        key: KEY,
        expected: "an object or null",
    })?;
    let kind = table
        .get("rope_type")
        .or_else(|| table.get("type"))
        .and_then(Value::as_str);
    if kind != Some("llama3") {
        return Err(HfConfigError::Unsupported {
            key: KEY,
            reason: format!(
                "rope_type {kind:?}: only \"llama3\" scaling is supported (remove it, or set it \
                 to null, to train plain RoPE with rope_theta)"
            ),
        });
    }
    // Looked up by its own name, reported under `rope_scaling.<name>`.
    let field = |name: &str, reported: &'static str| {
        table
            .get(name)
            .ok_or(HfConfigError::Missing { key: reported })
    };
    let num = |name: &str, reported: &'static str| {
        field(name, reported)?.as_f64().ok_or(HfConfigError::Type {
            key: reported,
            expected: "a number",
        })
    };
    let original = field(
        "original_max_position_embeddings",
        "rope_scaling.original_max_position_embeddings",
    )?
    .as_u64()
    .and_then(|v| u32::try_from(v).ok())
    .ok_or(HfConfigError::Type {
        key: "rope_scaling.original_max_position_embeddings",
        expected: "a whole number from 0 to 4294967295",
    })?;
    Ok(Some(RopeScalingShape {
        rope_type: RopeType::Llama3,
        factor: num("factor", "rope_scaling.factor")?,
        low_freq_factor: num("low_freq_factor", "rope_scaling.low_freq_factor")?,
        high_freq_factor: num("high_freq_factor", "rope_scaling.high_freq_factor")?,
        original_max_position_embeddings: original,
    }))
}

fn get<'a>(obj: &'a Map<String, Value>, key: &'static str) -> Result<&'a Value, HfConfigError> {
    obj.get(key).ok_or(HfConfigError::Missing { key })
}

fn whole(obj: &Map<String, Value>, key: &'static str) -> Result<u32, HfConfigError> {
    get(obj, key)?
        .as_u64()
        .and_then(|v| u32::try_from(v).ok())
        .ok_or(HfConfigError::Type {
            key,
            expected: "a whole number from 0 to 4294967295",
        })
}

fn number(obj: &Map<String, Value>, key: &'static str) -> Result<f64, HfConfigError> {
    get(obj, key)?.as_f64().ok_or(HfConfigError::Type {
        key,
        expected: "a number",
    })
}

fn string<'a>(obj: &'a Map<String, Value>, key: &'static str) -> Result<&'a str, HfConfigError> {
    get(obj, key)?.as_str().ok_or(HfConfigError::Type {
        key,
        expected: "a string",
    })
}

fn optional_bool(
    obj: &Map<String, Value>,
    key: &'static str,
) -> Result<Option<bool>, HfConfigError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_bool().map(Some).ok_or(HfConfigError::Type {
            key,
            expected: "true or false",
        }),
    }
}

#[cfg(test)]
mod tests;
