//! [`ChainRpc`]: one subtensor node's client. A call is checked, sent on the transport the
//! URL names within its deadline, and its answer checked against the request; the typed
//! wrappers check the shape of what each method returns.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{json, Value};

use super::endpoint::{Endpoint, Scheme};
use super::error::RpcError;
use super::frames::{check_hash_arg, cut, hash_result, hex_result, is_method_name, parse_response};
use super::limits::{RpcLimits, MAX_METHOD_LEN};
use super::ws::Ws;

/// A JSON-RPC 2.0 client for one subtensor node.
pub struct ChainRpc {
    /// The node's URL, parsed.
    pub(super) endpoint: Endpoint,
    /// The bounds every call works within.
    pub(super) limits: RpcLimits,
    /// The id of the next request (answers are matched against it).
    pub(super) next_id: AtomicU64,
    /// The open WebSocket (`ws://` only); `None` until reconnected after a failure.
    pub(super) ws: tokio::sync::Mutex<Option<Ws>>,
    /// Serialises HTTP calls too, so that both transports behave alike.
    pub(super) http: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for ChainRpc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChainRpc")
            .field("url", &self.endpoint.url)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl ChainRpc {
    /// A client for the node at `url` (`http://host:port/path` or `ws://host:port/path`).
    ///
    /// For `ws://` the WebSocket is opened now (within [`RpcLimits::connect_timeout`]), so a
    /// wrong address fails here; for `http://` nothing is sent until the first call.
    pub async fn connect(url: &str, limits: RpcLimits) -> Result<ChainRpc, RpcError> {
        let endpoint = Endpoint::parse(url)?;
        if limits.max_response_bytes == 0 {
            return Err(RpcError::BadRequest(
                "max_response_bytes must be at least 1".into(),
            ));
        }
        let rpc = ChainRpc {
            endpoint,
            limits,
            next_id: AtomicU64::new(1),
            ws: tokio::sync::Mutex::new(None),
            http: tokio::sync::Mutex::new(()),
        };
        if rpc.endpoint.scheme == Scheme::Ws {
            let ws = tokio::time::timeout(limits.connect_timeout, rpc.open_ws())
                .await
                .map_err(|_| RpcError::Timeout {
                    method: "connect".into(),
                    after: limits.connect_timeout,
                })??;
            *rpc.ws.lock().await = Some(ws);
        }
        Ok(rpc)
    }

    /// The node's URL.
    pub fn url(&self) -> &str {
        &self.endpoint.url
    }

    /// The limits this client works within.
    pub fn limits(&self) -> RpcLimits {
        self.limits
    }

    /// Calls `method` with `params` (a JSON array, as subtensor takes them) and returns its
    /// `result` (which may be `null`).
    pub async fn call(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        if !is_method_name(method) {
            return Err(RpcError::BadRequest(format!(
                "method name {:?} is not 1 to {MAX_METHOD_LEN} letters, digits or _",
                cut(method, 200)
            )));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let body = request.to_string();
        let exchange = async {
            match self.endpoint.scheme {
                Scheme::Http => self.http_exchange(method, body).await,
                Scheme::Ws => self.ws_exchange(method, body).await,
            }
        };
        let text = tokio::time::timeout(self.limits.call_timeout, exchange)
            .await
            .map_err(|_| RpcError::Timeout {
                method: method.to_string(),
                after: self.limits.call_timeout,
            })??;
        parse_response(method, &text, id)
    }

    /// `state_call(method, data[, at])`: runs runtime API `method` on SCALE-encoded `hex_params`
    /// (hex, with or without `0x`, sent as given) at block `at` (the best block if `None`) and
    /// returns the SCALE bytes of its answer.
    pub async fn state_call(
        &self,
        method: &str,
        hex_params: &str,
        at: Option<&str>,
    ) -> Result<Vec<u8>, RpcError> {
        if !is_method_name(method) {
            return Err(RpcError::BadRequest(format!(
                "runtime API {:?} is not 1 to {MAX_METHOD_LEN} letters, digits or _",
                cut(method, 200)
            )));
        }
        let digits = hex_params.strip_prefix("0x").unwrap_or(hex_params);
        if digits.len() % 2 != 0 || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(RpcError::BadRequest(format!(
                "state_call parameters {:?} are not hex bytes",
                cut(hex_params, 200)
            )));
        }
        let mut params = vec![json!(method), json!(hex_params)];
        if let Some(at) = at {
            params.push(json!(check_hash_arg(at)?));
        }
        let result = self.call("state_call", Value::Array(params)).await?;
        hex_result("state_call", &result)
    }

    /// `chain_getHead`: the hash of the best block (`0x` and 64 hex digits).
    pub async fn chain_get_head(&self) -> Result<String, RpcError> {
        let result = self.call("chain_getHead", json!([])).await?;
        hash_result("chain_getHead", &result)
    }

    /// `chain_getFinalizedHead`: the hash of the last finalized block.
    pub async fn chain_get_finalized_head(&self) -> Result<String, RpcError> {
        let result = self.call("chain_getFinalizedHead", json!([])).await?;
        hash_result("chain_getFinalizedHead", &result)
    }

    /// `chain_getHeader(hash)`: the block header as the node's JSON (an object with `number`,
    /// `parentHash`, `stateRoot`, `extrinsicsRoot`, `digest`).
    pub async fn chain_get_header(&self, hash: &str) -> Result<Value, RpcError> {
        let result = self
            .call("chain_getHeader", json!([check_hash_arg(hash)?]))
            .await?;
        match result {
            Value::Null => Err(RpcError::Missing {
                method: "chain_getHeader".into(),
            }),
            Value::Object(_) => Ok(result),
            _ => Err(RpcError::BadResult {
                method: "chain_getHeader".into(),
                reason: "not an object".into(),
            }),
        }
    }

    /// `state_getRuntimeVersion([at])`: the runtime version as the node's JSON (an object with
    /// `specVersion`, `transactionVersion`, `apis`, ...).
    pub async fn state_get_runtime_version(&self, at: Option<&str>) -> Result<Value, RpcError> {
        let params = match at {
            Some(at) => json!([check_hash_arg(at)?]),
            None => json!([]),
        };
        let result = self.call("state_getRuntimeVersion", params).await?;
        match result {
            Value::Object(ref o) if o.get("specVersion").is_some_and(Value::is_u64) => Ok(result),
            _ => Err(RpcError::BadResult {
                method: "state_getRuntimeVersion".into(),
                reason: "not an object with a numeric specVersion".into(),
            }),
        }
    }

    /// `state_getMetadata([at])`: the SCALE bytes of the runtime metadata (`meta` magic first).
    pub async fn state_get_metadata(&self, at: Option<&str>) -> Result<Vec<u8>, RpcError> {
        let params = match at {
            Some(at) => json!([check_hash_arg(at)?]),
            None => json!([]),
        };
        let result = self.call("state_getMetadata", params).await?;
        hex_result("state_getMetadata", &result)
    }

    /// `state_call Metadata_metadata_at_version(15)` at `at`: the SCALE bytes of the runtime's
    /// metadata V15 (`meta` magic first), the runtime API's `Option<OpaqueMetadata>` opened
    /// ([`RpcError::Missing`] when the runtime has no V15).
    pub async fn metadata_v15(&self, at: Option<&str>) -> Result<Vec<u8>, RpcError> {
        use subxt_core::ext::codec::Decode;
        const METHOD: &str = "Metadata_metadata_at_version";
        let answer = self.state_call(METHOD, "0x0f000000", at).await?;
        let bad = |reason: &str| RpcError::BadResult {
            method: METHOD.into(),
            reason: reason.into(),
        };
        let mut rest = answer.as_slice();
        let metadata = Option::<Vec<u8>>::decode(&mut rest)
            .map_err(|_| bad("not an Option<Vec<u8>>"))?
            .ok_or_else(|| RpcError::Missing {
                method: METHOD.into(),
            })?;
        if !rest.is_empty() {
            return Err(bad("bytes left over"));
        }
        Ok(metadata)
    }

    /// `chain_getBlockHash(n)`: the hash of block number `n` ([`RpcError::Missing`] if the node
    /// has no such block).
    pub async fn chain_get_block_hash(&self, n: u64) -> Result<String, RpcError> {
        let result = self.call("chain_getBlockHash", json!([n])).await?;
        hash_result("chain_getBlockHash", &result)
    }

    /// `system_accountNextIndex(ss58)`: the next nonce of an account, counting the transactions
    /// of it in the node's pool.
    pub async fn system_account_next_index(&self, ss58: &str) -> Result<u64, RpcError> {
        const BASE58: &[u8] = b"123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz";
        if ss58.is_empty() || ss58.len() > 64 || !ss58.bytes().all(|b| BASE58.contains(&b)) {
            return Err(RpcError::BadRequest(format!(
                "{:?} is not an SS58 address",
                cut(ss58, 100)
            )));
        }
        let result = self.call("system_accountNextIndex", json!([ss58])).await?;
        result.as_u64().ok_or_else(|| RpcError::BadResult {
            method: "system_accountNextIndex".into(),
            reason: "not a non-negative integer".into(),
        })
    }

    /// `author_submitExtrinsic(bytes)`: hands a signed extrinsic to the node's pool and returns
    /// its hash.
    pub async fn author_submit_extrinsic(&self, extrinsic: &[u8]) -> Result<String, RpcError> {
        let hex = format!("0x{}", hex::encode(extrinsic));
        let result = self.call("author_submitExtrinsic", json!([hex])).await?;
        hash_result("author_submitExtrinsic", &result)
    }
}
