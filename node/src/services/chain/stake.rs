//! Stake from subtensor: the subnet's neurons read every refresh and handed to consensus.
//!
//! One read is: the finalized head, its header (for the block number), and
//! `state_call("NeuronInfoRuntimeApi_get_neurons_lite", SCALE(netuid))` at that head, decoded
//! by `bootstrap::chain` and checked (every neuron of the subnet asked for, uids unique). A
//! failed read changes nothing: the last good snapshot stays in force, the failure is logged
//! with its reason and counted, `iota_chain_stake_age_seconds` keeps growing, and the next try
//! comes sooner than a refresh (backing off from [`RETRY_FIRST`] to [`RETRY_MAX`]).

use std::collections::BTreeSet;
use std::time::Duration;

use bootstrap::chain::{decode_neurons_lite, ChainDecodeError, ChainNeuron};
use tokio::time::Instant;

use super::jsonrpc::{ChainRpc, RpcError, RpcLimits};
use crate::metrics::ChainMetrics;
use crate::services::consensus::api::{ChainStake, ConsensusHandle};

/// The first retry after a failed read comes this soon.
pub(crate) const RETRY_FIRST: Duration = Duration::from_secs(2);
/// Retries back off (doubling) up to this.
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(60);
/// How often the staleness gauge is brought up to date between reads.
const GAUGE_EVERY: Duration = Duration::from_secs(1);

/// Why one read of the neurons failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    /// The chain node did not answer, or answered with an error.
    #[error(transparent)]
    Rpc(#[from] RpcError),
    /// The header has no block number of the usual shape.
    #[error("header of {hash} has no block number: {number}")]
    BlockNumber {
        /// The block.
        hash: String,
        /// What `number` held.
        number: String,
    },
    /// The answer is not SCALE of `Vec<NeuronInfoLite>`.
    #[error("neurons of netuid {netuid} at block {block}: {source}")]
    Decode {
        /// The subnet.
        netuid: u16,
        /// The block.
        block: u64,
        /// What is wrong.
        #[source]
        source: ChainDecodeError,
    },
    /// The answer decodes but is not the subnet asked for.
    #[error("neurons of netuid {netuid} at block {block}: {problem}")]
    Inconsistent {
        /// The subnet.
        netuid: u16,
        /// The block.
        block: u64,
        /// What is wrong.
        problem: String,
    },
}

impl ReadError {
    /// Metric label of the failure.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            ReadError::Rpc(RpcError::Timeout { .. }) => "timeout",
            ReadError::Rpc(RpcError::TooLarge { .. }) => "too_large",
            ReadError::Rpc(RpcError::Remote { .. }) => "rpc_error",
            ReadError::Rpc(
                RpcError::Malformed { .. } | RpcError::BadResult { .. } | RpcError::Missing { .. },
            ) => "bad_answer",
            ReadError::Rpc(_) => "transport",
            ReadError::BlockNumber { .. } => "bad_header",
            ReadError::Decode { .. } => "bad_scale",
            ReadError::Inconsistent { .. } => "inconsistent",
        }
    }
}

/// SCALE of a `u16` netuid, as `state_call` takes it (hex, little-endian).
pub(crate) fn netuid_param(netuid: u16) -> String {
    format!("0x{}", hex::encode(netuid.to_le_bytes()))
}

/// Parses a header's `number` (`"0x…"` hex, as Substrate nodes write it).
pub(crate) fn block_number(header: &serde_json::Value, hash: &str) -> Result<u64, ReadError> {
    let bad = || ReadError::BlockNumber {
        hash: hash.to_string(),
        number: header["number"].to_string().chars().take(80).collect(),
    };
    let text = header["number"].as_str().ok_or_else(bad)?;
    let digits = text.strip_prefix("0x").ok_or_else(bad)?;
    if digits.is_empty() || digits.len() > 16 {
        return Err(bad());
    }
    u64::from_str_radix(digits, 16).map_err(|_| bad())
}

/// The finalized head: its hash and number.
pub(crate) async fn finalized_head(rpc: &ChainRpc) -> Result<(String, u64), ReadError> {
    let hash = rpc.chain_get_finalized_head().await?;
    let header = rpc.chain_get_header(&hash).await?;
    let number = block_number(&header, &hash)?;
    Ok((hash, number))
}

/// Reads the neurons of `netuid` at the finalized head.
pub(crate) async fn read(rpc: &ChainRpc, netuid: u16) -> Result<ChainStake, ReadError> {
    let (block_hash, block) = finalized_head(rpc).await?;
    let bytes = rpc
        .state_call(
            "NeuronInfoRuntimeApi_get_neurons_lite",
            &netuid_param(netuid),
            Some(&block_hash),
        )
        .await?;
    let lite = decode_neurons_lite(&bytes).map_err(|source| ReadError::Decode {
        netuid,
        block,
        source,
    })?;
    check(netuid, block, &lite.neurons)?;
    let mut neurons = lite.neurons;
    neurons.sort_by_key(|n| n.uid);
    Ok(ChainStake {
        netuid,
        block,
        block_hash,
        neurons,
        wrapped: lite.wrapped,
    })
}

/// Every neuron is of `netuid`, uids and hotkeys are unique.
fn check(netuid: u16, block: u64, neurons: &[ChainNeuron]) -> Result<(), ReadError> {
    let inconsistent = |problem: String| ReadError::Inconsistent {
        netuid,
        block,
        problem,
    };
    let mut uids = BTreeSet::new();
    let mut hotkeys = BTreeSet::new();
    for n in neurons {
        if n.netuid != netuid {
            return Err(inconsistent(format!(
                "uid {} says it is of netuid {}",
                n.uid, n.netuid
            )));
        }
        if !uids.insert(n.uid) {
            return Err(inconsistent(format!("uid {} appears twice", n.uid)));
        }
        if !hotkeys.insert(&n.hotkey) {
            return Err(inconsistent(format!("hotkey {} appears twice", n.hotkey)));
        }
    }
    Ok(())
}

/// Where and how often the stake is read.
#[derive(Debug, Clone)]
pub(crate) struct StakeSource {
    /// The chain node.
    pub(crate) url: String,
    /// The subnet.
    pub(crate) netuid: u16,
    /// Time between good reads.
    pub(crate) refresh: Duration,
    /// Bounds of each call.
    pub(crate) limits: RpcLimits,
}

/// Reads the stake every refresh for as long as consensus runs, handing each good snapshot to
/// it. Returns when consensus is gone.
pub(crate) async fn run(source: StakeSource, consensus: ConsensusHandle, metrics: ChainMetrics) {
    let mut rpc: Option<ChainRpc> = None;
    let mut last_good: Option<Instant> = None;
    let mut retry = RETRY_FIRST;
    let mut next_read = Instant::now();
    let mut gauge = tokio::time::interval(GAUGE_EVERY);
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(next_read) => {}
            _ = gauge.tick() => {
                if let Some(at) = last_good {
                    metrics.stake_age_seconds.set(at.elapsed().as_secs_f64());
                }
                continue;
            }
        }
        let outcome = match &rpc {
            Some(rpc) => read(rpc, source.netuid).await,
            None => match ChainRpc::connect(&source.url, source.limits).await {
                Ok(connected) => {
                    let outcome = read(&connected, source.netuid).await;
                    rpc = Some(connected);
                    outcome
                }
                Err(error) => Err(ReadError::Rpc(error)),
            },
        };
        match outcome {
            Ok(stake) => {
                tracing::info!(
                    netuid = stake.netuid,
                    block = stake.block,
                    neurons = stake.neurons.len(),
                    wrapped = stake.wrapped,
                    "stake read from the chain"
                );
                metrics.stake_block.set(stake.block as i64);
                metrics.neurons.set(stake.neurons.len() as i64);
                metrics.stake_age_seconds.set(0.0);
                last_good = Some(Instant::now());
                retry = RETRY_FIRST;
                next_read = Instant::now() + source.refresh;
                if consensus.chain_stake(stake).await.is_err() {
                    return;
                }
            }
            Err(error) => {
                metrics.read_failed(error.reason());
                let stale = last_good.map(|at| at.elapsed().as_secs());
                match stale {
                    Some(secs) => tracing::warn!(
                        %error,
                        stale_secs = secs,
                        retry_secs = retry.as_secs_f64(),
                        "stake read from the chain failed; the last good snapshot stays in force"
                    ),
                    None => tracing::warn!(
                        %error,
                        retry_secs = retry.as_secs_f64(),
                        "stake read from the chain failed; no stake snapshot yet, so nobody is elected"
                    ),
                }
                next_read = Instant::now() + retry.min(source.refresh);
                retry = (retry * 2).min(RETRY_MAX);
            }
        }
        if consensus.tx.is_closed() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn netuids_go_as_little_endian_u16() {
        assert_eq!(netuid_param(1), "0x0100");
        assert_eq!(netuid_param(23), "0x1700");
        assert_eq!(netuid_param(0x1234), "0x3412");
    }

    #[test]
    fn block_numbers_are_hex_and_bounded() {
        let header = |n: serde_json::Value| serde_json::json!({ "number": n });
        assert_eq!(
            block_number(&header("0x689052".into()), "h").unwrap(),
            6_852_690
        );
        for bad in [
            serde_json::json!(6852690),
            "689052".into(),
            "0x".into(),
            "0xzz".into(),
            "0x11112222333344445".into(),
        ] {
            assert!(
                matches!(
                    block_number(&header(bad.clone()), "h"),
                    Err(ReadError::BlockNumber { .. })
                ),
                "{bad}"
            );
        }
    }
}
