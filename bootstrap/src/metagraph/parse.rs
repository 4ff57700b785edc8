//! Reading the metagraph JSON field by field, so every error names the entry and the field.
//!
//! The size is checked before parsing; numbers are range-checked into their Rust types rather
//! than trusted.

use serde_json::{Map, Value};

use super::{FieldProblem, Hotkey, Metagraph, MetagraphError, Neuron, MAX_METAGRAPH_BYTES};
use crate::peer_id::PeerIdStr;

pub(super) fn from_json_slice(bytes: &[u8]) -> Result<Metagraph, MetagraphError> {
    if bytes.len() > MAX_METAGRAPH_BYTES {
        return Err(MetagraphError::TooLarge {
            len: bytes.len(),
            max: MAX_METAGRAPH_BYTES,
        });
    }
    let value: Value = serde_json::from_slice(bytes).map_err(MetagraphError::Json)?;
    let top = value.as_object().ok_or(MetagraphError::NotAnObject)?;
    let top_field = |field: &'static str| move |problem| MetagraphError::Field { field, problem };
    let netuid = uint(top.get("netuid"), "u16").map_err(top_field("netuid"))?;
    let block = uint(top.get("block"), "u64").map_err(top_field("block"))?;
    let entries = match top.get("neurons") {
        None | Some(Value::Null) => Err(FieldProblem::Missing),
        Some(Value::Array(entries)) => Ok(entries),
        Some(_) => Err(FieldProblem::WrongType {
            expected: "an array",
        }),
    }
    .map_err(top_field("neurons"))?;
    let neurons = entries
        .iter()
        .enumerate()
        .map(|(index, entry)| neuron(index, entry))
        .collect::<Result<Vec<_>, _>>()?;
    Metagraph::new(netuid, block, neurons)
}

fn neuron(index: usize, entry: &Value) -> Result<Neuron, MetagraphError> {
    let fields = entry
        .as_object()
        .ok_or(MetagraphError::NeuronNotAnObject { index })?;
    let uid: u16 = uint(fields.get("uid"), "u16").map_err(|problem| MetagraphError::Neuron {
        index,
        uid: None,
        field: "uid",
        problem,
    })?;
    let at = |field: &'static str| {
        move |problem| MetagraphError::Neuron {
            index,
            uid: Some(uid),
            field,
            problem,
        }
    };
    let hotkey = text(fields, "hotkey")
        .and_then(|t| Hotkey::parse(t).map_err(FieldProblem::from))
        .map_err(at("hotkey"))?;
    let peer_id = text(fields, "peer_id")
        .and_then(|t| PeerIdStr::parse(t).map_err(FieldProblem::from))
        .map_err(at("peer_id"))?;
    let stake = uint(fields.get("stake"), "u64").map_err(at("stake"))?;
    let validator_permit = match fields.get("validator_permit") {
        None | Some(Value::Null) => Err(FieldProblem::Missing),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(FieldProblem::WrongType {
            expected: "a boolean",
        }),
    }
    .map_err(at("validator_permit"))?;
    Ok(Neuron {
        uid,
        hotkey,
        peer_id,
        stake,
        validator_permit,
    })
}

/// An unsigned integer that fits `T` (`expected` names `T` in errors).
fn uint<T: TryFrom<u64>>(value: Option<&Value>, expected: &'static str) -> Result<T, FieldProblem> {
    match value {
        None | Some(Value::Null) => Err(FieldProblem::Missing),
        Some(Value::Number(n)) => {
            let out_of_range = || FieldProblem::OutOfRange {
                expected,
                value: n.to_string(),
            };
            match n.as_u64() {
                Some(x) => T::try_from(x).map_err(|_| out_of_range()),
                // Negative integers, and floats without a fraction (serde_json reads integers
                // past u64::MAX as floats), are integers out of range; anything else is not an
                // integer at all.
                None if n.is_i64() => Err(out_of_range()),
                None if n.as_f64().is_some_and(|f| f.fract() == 0.0) => Err(out_of_range()),
                None => Err(FieldProblem::WrongType { expected }),
            }
        }
        Some(_) => Err(FieldProblem::WrongType { expected }),
    }
}

fn text<'a>(fields: &'a Map<String, Value>, field: &str) -> Result<&'a str, FieldProblem> {
    match fields.get(field) {
        None | Some(Value::Null) => Err(FieldProblem::Missing),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(FieldProblem::WrongType {
            expected: "a string",
        }),
    }
}
