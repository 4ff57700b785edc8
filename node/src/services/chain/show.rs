//! `iota-p2p metagraph`: a subnet's neurons as subtensor lists them, printed as a table or JSON.
//!
//! One run reads the neurons at the finalized head (the same read a node does every refresh,
//! [`super::stake::read`]) and, with `--node`, the hotkey → peer-id bindings a running node has
//! verified, from the `bindings` object of its `GET /status` (absent: no peer ids). The stake
//! printed is the sum of each neuron's stake list: on dynamic-TAO runtimes that is the
//! subnet's **alpha** (α), not TAO (see `bootstrap::chain`); it is shown in units of
//! [`RAO_PER_TAO`] rao with nine decimals, and in rao.
//!
//! [`table`] and [`json`] are pure; [`metagraph_command`] only fetches and prints.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Read as _;
use std::time::Duration;

use anyhow::Context as _;
use bootstrap::RAO_PER_TAO;
use serde_json::{json as json_value, Value};

use super::jsonrpc::ChainRpc;
use super::stake;
use crate::services::consensus::api::ChainStake;

/// Largest `/status` body read from `--node`.
const MAX_STATUS_BYTES: u64 = 8 << 20;
/// How long the `/status` request may take.
const STATUS_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the bindings could not be read from a node's `/status`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BindingsError {
    /// The request failed (connection, timeout, a non-2xx status).
    #[error("GET {url}: {detail}")]
    Http {
        /// The `/status` URL.
        url: String,
        /// What failed ([`describe`]).
        detail: String,
    },
    /// Reading the body failed.
    #[error("GET {url}: reading the body: {source}")]
    Body {
        /// The `/status` URL.
        url: String,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// The body is longer than [`MAX_STATUS_BYTES`].
    #[error("GET {url}: the body is longer than {max} bytes")]
    TooLarge {
        /// The `/status` URL.
        url: String,
        /// The bound.
        max: u64,
    },
    /// The body is not JSON, or `bindings` is not an object of strings.
    #[error("GET {url}: {problem}")]
    Malformed {
        /// The `/status` URL.
        url: String,
        /// What is wrong.
        problem: String,
    },
}

/// What `iota-p2p metagraph` asks.
#[derive(Debug, Clone)]
pub(crate) struct Query {
    /// The chain node's URL.
    pub(crate) subtensor: String,
    /// The subnet.
    pub(crate) netuid: u16,
    /// JSON instead of a table.
    pub(crate) json: bool,
    /// A running node's HTTP server, for the bindings it verified.
    pub(crate) node: Option<String>,
}

/// Runs `iota-p2p metagraph`: reads the neurons of `--netuid` from `--subtensor` and prints
/// them, with the peer ids `--node` has verified.
pub(crate) async fn metagraph_command(args: &Query) -> anyhow::Result<()> {
    let rpc = ChainRpc::connect(&args.subtensor, Default::default())
        .await
        .with_context(|| format!("connecting to subtensor at {}", args.subtensor))?;
    let stake = stake::read(&rpc, args.netuid).await.with_context(|| {
        format!(
            "reading the neurons of netuid {} from {}",
            args.netuid, args.subtensor
        )
    })?;
    let peers = match &args.node {
        Some(node) => {
            let url = status_url(node);
            tokio::task::spawn_blocking(move || fetch_bindings(&url))
                .await
                .context("the /status request's thread failed")??
        }
        None => BTreeMap::new(),
    };
    if args.json {
        let text = serde_json::to_string_pretty(&json(&stake, &peers))?;
        println!("{text}");
    } else {
        print!("{}", table(&stake, &peers));
    }
    Ok(())
}

/// `<node>/status`, whether or not `node` ends in a slash.
fn status_url(node: &str) -> String {
    format!("{}/status", node.trim_end_matches('/'))
}

/// `GET url` (blocking, within [`STATUS_TIMEOUT`], at most [`MAX_STATUS_BYTES`]) and the
/// bindings of its body.
fn fetch_bindings(url: &str) -> Result<BTreeMap<String, String>, BindingsError> {
    let response = ureq::get(url)
        .timeout(STATUS_TIMEOUT)
        .call()
        .map_err(|error| BindingsError::Http {
            url: url.to_string(),
            detail: describe(&error),
        })?;
    let mut body = Vec::new();
    response
        .into_reader()
        .take(MAX_STATUS_BYTES + 1)
        .read_to_end(&mut body)
        .map_err(|source| BindingsError::Body {
            url: url.to_string(),
            source,
        })?;
    if body.len() as u64 > MAX_STATUS_BYTES {
        return Err(BindingsError::TooLarge {
            url: url.to_string(),
            max: MAX_STATUS_BYTES,
        });
    }
    bindings_of(url, &body)
}

/// What a failed request met, without the URL (which ureq's own message repeats at every
/// level of its chain): the HTTP status, or the transport failure and its cause.
fn describe(error: &ureq::Error) -> String {
    match error {
        ureq::Error::Status(code, response) => {
            format!("HTTP status {code} {}", response.status_text())
        }
        ureq::Error::Transport(transport) => {
            let mut text = transport.kind().to_string();
            if let Some(message) = transport.message() {
                text.push_str(": ");
                text.push_str(message);
            }
            if let Some(cause) = std::error::Error::source(transport) {
                text.push_str(": ");
                text.push_str(&cause.to_string());
            }
            text
        }
    }
}

/// The `bindings` object (hotkey SS58 → peer id) of a `/status` body; empty when the field is
/// absent or null.
fn bindings_of(url: &str, body: &[u8]) -> Result<BTreeMap<String, String>, BindingsError> {
    let malformed = |problem: String| BindingsError::Malformed {
        url: url.to_string(),
        problem,
    };
    let status: Value =
        serde_json::from_slice(body).map_err(|e| malformed(format!("not JSON: {e}")))?;
    match status.get("bindings") {
        None | Some(Value::Null) => Ok(BTreeMap::new()),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(hotkey, peer)| match peer.as_str() {
                Some(peer) => Ok((hotkey.clone(), peer.to_string())),
                None => Err(malformed(format!(
                    "bindings[{hotkey:?}] is {}, not a peer id string",
                    kind(peer)
                ))),
            })
            .collect(),
        Some(other) => Err(malformed(format!(
            "bindings is {}, not an object",
            kind(other)
        ))),
    }
}

/// The JSON type of `value`, for messages.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a bool",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `rao` in units of [`RAO_PER_TAO`] with nine decimals: `1234567890123` → `1234.567890123`.
fn units(rao: u128) -> String {
    let per = u128::from(RAO_PER_TAO);
    format!("{}.{:09}", rao / per, rao % per)
}

/// `yes` or `-`.
fn yes(flag: bool) -> &'static str {
    if flag {
        "yes"
    } else {
        "-"
    }
}

/// The neurons as text: a header line (netuid, block, hash, neurons, validator permits, total
/// stake) and one aligned row per neuron, uid order, with the peer id `peers` binds to its
/// hotkey (`-` when none).
pub(crate) fn table(stake: &ChainStake, peers: &BTreeMap<String, String>) -> String {
    let permits = stake.neurons.iter().filter(|n| n.validator_permit).count();
    let total: u128 = stake.neurons.iter().map(|n| u128::from(n.stake)).sum();
    let mut out = format!(
        "netuid {}  block {}  hash {}  neurons {}  validator permits {}  total stake {} α\n",
        stake.netuid,
        stake.block,
        stake.block_hash,
        stake.neurons.len(),
        permits,
        units(total),
    );
    /// Whether a column's cells are right-aligned (numbers) or left-aligned (text).
    const RIGHT: [bool; 7] = [true, false, true, true, false, false, false];
    let mut rows: Vec<[String; 7]> = vec![[
        "uid".into(),
        "hotkey".into(),
        "stake (α)".into(),
        "stake (rao)".into(),
        "permit".into(),
        "active".into(),
        "peer id".into(),
    ]];
    rows.extend(stake.neurons.iter().map(|n| {
        [
            n.uid.to_string(),
            n.hotkey.to_string(),
            units(u128::from(n.stake)),
            n.stake.to_string(),
            yes(n.validator_permit).into(),
            yes(n.active).into(),
            peers
                .get(n.hotkey.as_str())
                .map_or_else(|| "-".to_string(), Clone::clone),
        ]
    }));
    let mut widths = [0usize; 7];
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    for row in &rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let pad = widths[i].saturating_sub(cell.chars().count());
            if RIGHT[i] {
                line.extend(std::iter::repeat_n(' ', pad));
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
    out
}

/// The neurons as JSON: `{"netuid", "block", "block_hash", "wrapped", "neurons": [{"uid",
/// "hotkey", "coldkey", "stake_rao", "stake", "validator_permit", "active", "last_update",
/// "peer_id"}]}`. `stake_rao` is exact; `stake` is the same in units of [`RAO_PER_TAO`] (α on
/// dynamic-TAO runtimes) as a JSON number, so rounded to a double; `peer_id` is null when
/// `peers` binds none to the hotkey.
pub(crate) fn json(stake: &ChainStake, peers: &BTreeMap<String, String>) -> Value {
    let neurons: Vec<Value> = stake
        .neurons
        .iter()
        .map(|n| {
            json_value!({
                "uid": n.uid,
                "hotkey": n.hotkey.as_str(),
                "coldkey": n.coldkey.as_str(),
                "stake_rao": n.stake,
                "stake": n.stake as f64 / RAO_PER_TAO as f64,
                "validator_permit": n.validator_permit,
                "active": n.active,
                "last_update": n.last_update,
                "peer_id": peers.get(n.hotkey.as_str()),
            })
        })
        .collect();
    json_value!({
        "netuid": stake.netuid,
        "block": stake.block,
        "block_hash": stake.block_hash,
        "wrapped": stake.wrapped,
        "neurons": neurons,
    })
}

#[cfg(test)]
mod tests {
    use bootstrap::chain::{decode_neurons_lite, encode_neurons_lite, NeuronSpec};
    use bootstrap::Hotkey;

    use super::*;

    /// Three neurons of netuid 9 at block 123: uid 0 a permitted validator with
    /// 1234.567890123 α, uid 1 an inactive miner with none, uid 2 a miner with 0.5 α.
    fn stake() -> ChainStake {
        let spec = |uid: u16, stake: u64, permit: bool, active: bool| NeuronSpec {
            uid,
            netuid: 9,
            hotkey: [uid as u8 + 1; 32],
            coldkey: [100; 32],
            active,
            stake,
            validator_permit: permit,
            last_update: 100 + u64::from(uid),
        };
        let bytes = encode_neurons_lite(
            &[
                spec(0, 1_234_567_890_123, true, true),
                spec(1, 0, false, false),
                spec(2, 500_000_000, false, true),
            ],
            false,
        );
        let lite = decode_neurons_lite(&bytes).expect("decodes");
        ChainStake {
            netuid: 9,
            block: 123,
            block_hash: "0xabcd".into(),
            neurons: lite.neurons,
            wrapped: lite.wrapped,
        }
    }

    fn hotkey(uid: u8) -> String {
        Hotkey::from_public_key(&[uid + 1; 32]).to_string()
    }

    fn peers() -> BTreeMap<String, String> {
        BTreeMap::from([(hotkey(0), "12D3KooWPeerZero".to_string())])
    }

    #[test]
    fn units_have_nine_decimals() {
        assert_eq!(units(0), "0.000000000");
        assert_eq!(units(1), "0.000000001");
        assert_eq!(units(1_234_567_890_123), "1234.567890123");
        assert_eq!(units(u128::from(u64::MAX)), "18446744073.709551615");
    }

    #[test]
    fn table_has_a_header_and_aligned_rows() {
        let text = table(&stake(), &peers());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "netuid 9  block 123  hash 0xabcd  neurons 3  validator permits 1  \
             total stake 1235.067890123 α"
        );
        assert_eq!(lines.len(), 5);
        let h0 = hotkey(0);
        let pad = " ".repeat(h0.len() - "hotkey".len());
        assert_eq!(
            lines[1],
            format!("uid  hotkey{pad}       stake (α)    stake (rao)  permit  active  peer id")
        );
        assert_eq!(
            lines[2],
            format!("  0  {h0}  1234.567890123  1234567890123  yes     yes     12D3KooWPeerZero")
        );
        assert_eq!(
            lines[3],
            format!(
                "  1  {}     0.000000000              0  -       -       -",
                hotkey(1)
            )
        );
        assert_eq!(
            lines[4],
            format!(
                "  2  {}     0.500000000      500000000  -       yes     -",
                hotkey(2)
            )
        );
        // Every column starts at the same character in every row.
        let at = |line: &str, needle: &str| {
            line.chars().count() - line[line.find(needle).expect("present")..].chars().count()
        };
        assert_eq!(at(lines[1], "permit"), at(lines[2], "yes"));
        assert_eq!(at(lines[1], "peer id"), at(lines[2], "12D3"));
    }

    #[test]
    fn an_empty_subnet_is_a_header_and_column_names() {
        let empty = ChainStake {
            neurons: Vec::new(),
            ..stake()
        };
        let text = table(&empty, &BTreeMap::new());
        assert!(text.starts_with("netuid 9  block 123  hash 0xabcd  neurons 0  validator permits 0  total stake 0.000000000 α\n"));
        assert_eq!(text.lines().count(), 2);
    }

    #[test]
    fn json_lists_every_neuron_with_its_peer_id_or_null() {
        let value = json(&stake(), &peers());
        assert_eq!(value["netuid"], 9);
        assert_eq!(value["block"], 123);
        assert_eq!(value["block_hash"], "0xabcd");
        assert_eq!(value["wrapped"], false);
        let neurons = value["neurons"].as_array().expect("an array");
        assert_eq!(neurons.len(), 3);
        assert_eq!(
            neurons[0],
            json_value!({
                "uid": 0,
                "hotkey": hotkey(0),
                "coldkey": Hotkey::from_public_key(&[100; 32]).to_string(),
                "stake_rao": 1_234_567_890_123u64,
                "stake": 1234.567890123,
                "validator_permit": true,
                "active": true,
                "last_update": 100,
                "peer_id": "12D3KooWPeerZero",
            })
        );
        assert_eq!(neurons[1]["peer_id"], Value::Null);
        assert_eq!(neurons[1]["stake_rao"], 0);
        assert_eq!(neurons[1]["active"], false);
        assert_eq!(neurons[2]["stake"], 0.5);
    }

    #[test]
    fn bindings_are_optional_but_must_be_strings() {
        let url = "http://127.0.0.1:9/status";
        assert_eq!(
            bindings_of(url, br#"{"peer_id":"x"}"#).expect("absent is fine"),
            BTreeMap::new()
        );
        assert_eq!(
            bindings_of(url, br#"{"bindings":null}"#).expect("null is fine"),
            BTreeMap::new()
        );
        assert_eq!(
            bindings_of(url, br#"{"bindings":{"5Hot":"12D3Peer"}}"#).expect("an object"),
            BTreeMap::from([("5Hot".to_string(), "12D3Peer".to_string())])
        );
        for bad in [
            &br#"{"bindings":[]}"#[..],
            br#"{"bindings":{"5Hot":7}}"#,
            b"not json",
        ] {
            let error = bindings_of(url, bad).expect_err("malformed");
            assert!(matches!(error, BindingsError::Malformed { .. }), "{error}");
            assert!(error.to_string().contains(url), "{error}");
        }
    }

    #[test]
    fn status_urls_take_or_leave_a_trailing_slash() {
        assert_eq!(
            status_url("http://1.2.3.4:9090"),
            "http://1.2.3.4:9090/status"
        );
        assert_eq!(
            status_url("http://1.2.3.4:9090/"),
            "http://1.2.3.4:9090/status"
        );
    }

    #[test]
    fn an_unreachable_node_is_an_error_naming_its_url() {
        // A port just released: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let url = format!("http://127.0.0.1:{port}/status");
        let error = fetch_bindings(&url).expect_err("refused");
        assert!(matches!(error, BindingsError::Http { .. }), "{error}");
        assert!(error.to_string().contains(&url), "{error}");
    }

    #[test]
    fn an_oversized_status_is_refused() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!(
            "http://{}/status",
            listener.local_addr().expect("an address")
        );
        let server = std::thread::spawn(move || {
            use std::io::Write as _;
            let (mut conn, _) = listener.accept().expect("a connection");
            let mut request = [0u8; 1024];
            let _ = conn.read(&mut request);
            let len = MAX_STATUS_BYTES + 1;
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nContent-Type: application/json\r\n\r\n"
            );
            let chunk = vec![b' '; 1 << 16];
            let mut left = len;
            while left > 0 {
                let n = left.min(chunk.len() as u64) as usize;
                if conn.write_all(&chunk[..n]).is_err() {
                    break;
                }
                left -= n as u64;
            }
        });
        let error = fetch_bindings(&url).expect_err("too large");
        assert!(matches!(error, BindingsError::TooLarge { .. }), "{error}");
        let _ = server.join();
    }
}
