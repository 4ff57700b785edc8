//! The JSON-RPC 2.0 envelope and the shapes of results, pure: a response checked against its
//! request's id, a notification told from an answer, hashes and hex checked, hostile text cut
//! before it goes into an error.

use serde_json::Value;

use super::error::RpcError;
use super::limits::MAX_METHOD_LEN;

/// Cuts `s` to at most `max` characters (for error messages built from hostile text).
pub(super) fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// Whether `method` is a name this client sends: 1 to [`MAX_METHOD_LEN`] letters, digits or
/// `_`.
pub(super) fn is_method_name(method: &str) -> bool {
    !method.is_empty()
        && method.len() <= MAX_METHOD_LEN
        && method
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Whether `text` is a JSON-RPC notification (a `method` and no `id`), cheaply: only objects
/// that parse are looked into.
pub(super) fn is_notification(text: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct Probe {
        #[serde(default)]
        id: Option<serde::de::IgnoredAny>,
        #[serde(default)]
        method: Option<serde::de::IgnoredAny>,
    }
    serde_json::from_str::<Probe>(text).is_ok_and(|p| p.id.is_none() && p.method.is_some())
}

/// Checks one response: a JSON-RPC 2.0 object with the request's id and a `result` or an
/// `error`.
pub(super) fn parse_response(method: &str, text: &str, id: u64) -> Result<Value, RpcError> {
    let malformed = |reason: String| RpcError::Malformed {
        method: method.to_string(),
        reason,
    };
    let value: Value =
        serde_json::from_str(text).map_err(|e| malformed(format!("not JSON: {e}")))?;
    let Value::Object(mut object) = value else {
        return Err(malformed("not a JSON object".into()));
    };
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(malformed("no \"jsonrpc\": \"2.0\"".into()));
    }
    let got = object.get("id").cloned().unwrap_or(Value::Null);
    let error = object.remove("error");
    // An error about the request itself may come with a null id (JSON-RPC 2.0, 5.1).
    let id_ok = got.as_u64() == Some(id) || (got.is_null() && error.is_some());
    if !id_ok {
        return Err(RpcError::IdMismatch {
            method: method.to_string(),
            expected: id,
            got: cut(&got.to_string(), 100),
        });
    }
    if let Some(error) = error {
        let code = error.get("code").and_then(Value::as_i64);
        let message = error.get("message").and_then(Value::as_str);
        let (Some(code), Some(message)) = (code, message) else {
            return Err(malformed(
                "an error object without an integer code and a message".into(),
            ));
        };
        let message = match error.get("data") {
            Some(Value::String(data)) => format!("{message}: {data}"),
            Some(Value::Null) | None => message.to_string(),
            Some(data) => format!("{message}: {data}"),
        };
        return Err(RpcError::Remote {
            code,
            message: cut(&message, 1000),
        });
    }
    object
        .remove("result")
        .ok_or_else(|| malformed("neither a result nor an error".into()))
}

/// A block hash argument: `0x` and 64 hex digits.
pub(super) fn check_hash_arg(hash: &str) -> Result<&str, RpcError> {
    if is_hash(hash) {
        Ok(hash)
    } else {
        Err(RpcError::BadRequest(format!(
            "{:?} is not a block hash (0x and 64 hex digits)",
            cut(hash, 100)
        )))
    }
}

/// Whether `s` is a block hash: `0x` and 64 hex digits.
fn is_hash(s: &str) -> bool {
    s.len() == 66 && s.starts_with("0x") && s[2..].bytes().all(|b| b.is_ascii_hexdigit())
}

/// A hash result, checked.
pub(super) fn hash_result(method: &str, result: &Value) -> Result<String, RpcError> {
    match result {
        Value::Null => Err(RpcError::Missing {
            method: method.to_string(),
        }),
        Value::String(s) if is_hash(s) => Ok(s.clone()),
        _ => Err(RpcError::BadResult {
            method: method.to_string(),
            reason: "not a hash (0x and 64 hex digits)".into(),
        }),
    }
}

/// A `0x…` hex result, decoded (its size is already bounded by the response limit).
pub(super) fn hex_result(method: &str, result: &Value) -> Result<Vec<u8>, RpcError> {
    let bad = |reason: &str| RpcError::BadResult {
        method: method.to_string(),
        reason: reason.to_string(),
    };
    match result {
        Value::Null => Err(RpcError::Missing {
            method: method.to_string(),
        }),
        Value::String(s) => {
            let digits = s.strip_prefix("0x").ok_or_else(|| bad("hex without 0x"))?;
            hex::decode(digits).map_err(|_| bad("not an even number of hex digits"))
        }
        _ => Err(bad("not a hex string")),
    }
}
