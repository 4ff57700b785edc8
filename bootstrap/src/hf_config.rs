//! Reading a model shape out of a Hugging Face Llama `config.json` (`--model-config`).
//!
//! [`model_shape_from_hf_config`] takes the keys a [`ModelShape`] needs and ignores the many
//! others such a file carries (token ids, dtype, library versions). It refuses what would
//! quietly give the user another model than the file describes: a `model_type` other than
//! `llama`, RoPE frequency scaling (`rope_scaling`, not implemented), biases in attention or
//! MLP, an activation other than SiLU, or a `head_dim` other than `hidden_size /
//! num_attention_heads`. `tie_word_embeddings` is read (false when absent, as in
//! `transformers`). `vocab_size` is not read: the vocabulary is the run's, its tokenizer's
//! (256 byte tokens without one).
//!
//! The shape is not checked here beyond its types: the run it goes into validates it
//! ([`RunConfig::validate`](crate::RunConfig::validate)) naming `model.<key>`.

use serde_json::{Map, Value};

use crate::ModelShape;

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
    if obj.get("rope_scaling").is_some_and(|v| !v.is_null()) {
        return unsupported(
            "rope_scaling",
            "RoPE frequency scaling is not supported; remove it (or set it to null) to train \
             plain RoPE with rope_theta",
        );
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
