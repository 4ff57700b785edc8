//! A validator's weights on chain: `SubtensorModule.set_weights`, every few scored epochs.
//!
//! The validator service publishes each epoch's weights (by uid, in chain form) as a watch
//! value; this task takes every `every_epochs`-th of them and, when the chain's rate limit
//! allows ([`Policy::min_blocks`] since the last submission), submits them signed by the
//! validator's hotkey. What it reads from the chain for each submission: the best head (its
//! number and hash are the mortal era's birth), the runtime version (to rebuild the call from
//! fresh metadata V15 after a runtime upgrade), the genesis hash (with the metadata) and the
//! hotkey's next nonce. The signature commits to the runtime's metadata hash where the runtime
//! checks one (`CheckMetadataHash` mode 1, see `extrinsic::metadata_hash`), and nothing is
//! signed for an endpoint whose genesis is not the one the operator pinned
//! (`--chain-genesis`). A failed submission is logged with its reason, counted, and retried with the next
//! epoch's weights; nothing else waits on it.

use bootstrap::identity::HotkeyPair;
use tokio::sync::watch;

use super::extrinsic::{ChainState, SetWeights};
use super::jsonrpc::{ChainRpc, RpcError, RpcLimits};
use crate::metrics::ChainMetrics;
use crate::services::validator::api::EpochWeights;

/// When to submit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Policy {
    /// Submit every this many scored epochs.
    pub(crate) every_epochs: u64,
    /// Never within this many blocks of the last submission.
    pub(crate) min_blocks: u64,
}

/// What the policy remembers: the last epoch taken and the block of the last submission.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Pacing {
    epochs_since: u64,
    last_block: Option<u64>,
}

/// Why an epoch's weights were not submitted (or the submission failed).
#[derive(Debug, thiserror::Error)]
pub(crate) enum SubmitError {
    /// The chain node did not answer, or refused.
    #[error(transparent)]
    Rpc(#[from] RpcError),
    /// What the chain answered is not of the expected shape.
    #[error("{0}")]
    Chain(String),
    /// The chain's metadata is not one the call can be built from.
    #[error(transparent)]
    Metadata(#[from] super::extrinsic::ChainStateError),
    /// The extrinsic could not be built or signed.
    #[error(transparent)]
    Sign(#[from] super::extrinsic::SignError),
}

impl SubmitError {
    /// Metric label.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            SubmitError::Rpc(RpcError::Remote { .. }) => "refused",
            SubmitError::Rpc(RpcError::Timeout { .. }) => "timeout",
            SubmitError::Rpc(_) => "transport",
            SubmitError::Chain(_) => "bad_answer",
            SubmitError::Metadata(super::extrinsic::ChainStateError::WrongChain { .. }) => {
                "wrong_chain"
            }
            SubmitError::Metadata(_) => "metadata",
            SubmitError::Sign(_) => "extrinsic",
        }
    }
}

impl Pacing {
    /// Whether the epoch just scored is one to submit, the chain being at `head`.
    /// Counting epochs and blocks, pure.
    pub(crate) fn due(&mut self, policy: Policy, head: u64) -> bool {
        self.epochs_since += 1;
        if self.epochs_since < policy.every_epochs {
            return false;
        }
        self.last_block
            .is_none_or(|last| head >= last.saturating_add(policy.min_blocks))
    }

    /// Records a submission at block `head`.
    pub(crate) fn submitted(&mut self, head: u64) {
        self.epochs_since = 0;
        self.last_block = Some(head);
    }
}

/// The chain form of an epoch's weights: uids with a non-zero weight, in uid order.
pub(crate) fn call_of(weights: &EpochWeights, netuid: u16, version_key: u64) -> SetWeights {
    let mut pairs: Vec<(u16, u16)> = weights
        .miners
        .iter()
        .filter(|m| m.weight > 0)
        .map(|m| (m.uid, m.weight))
        .collect();
    pairs.sort_unstable();
    pairs.dedup_by_key(|(uid, _)| *uid);
    SetWeights {
        netuid,
        uids: pairs.iter().map(|(uid, _)| *uid).collect(),
        weights: pairs.iter().map(|(_, w)| *w).collect(),
        version_key,
    }
}

/// Where the weights go and how.
pub(crate) struct Submitter {
    /// The chain node.
    pub(crate) url: String,
    /// The subnet.
    pub(crate) netuid: u16,
    /// `version_key` of the calls.
    pub(crate) version_key: u64,
    /// When.
    pub(crate) policy: Policy,
    /// The validator's hotkey.
    pub(crate) hotkey: HotkeyPair,
    /// Bounds of each call.
    pub(crate) limits: RpcLimits,
    /// The chain's genesis hash, when the operator pinned it (`--chain-genesis`).
    pub(crate) genesis: Option<[u8; 32]>,
}

/// Submits the validator's weights as they come, until the validator service is gone.
pub(crate) async fn run(
    submitter: Submitter,
    mut weights: watch::Receiver<Option<EpochWeights>>,
    metrics: ChainMetrics,
) {
    let mut rpc: Option<ChainRpc> = None;
    // Read from the chain once, and again when the runtime changes.
    let mut cached: Option<ChainState> = None;
    let mut pacing = Pacing::default();
    while weights.changed().await.is_ok() {
        let Some(epoch_weights) = weights.borrow_and_update().clone() else {
            continue;
        };
        let call = call_of(&epoch_weights, submitter.netuid, submitter.version_key);
        if call.uids.is_empty() {
            tracing::info!(
                epoch = epoch_weights.epoch,
                "no miner earned weight this epoch; nothing submitted"
            );
            continue;
        }
        if rpc.is_none() {
            match ChainRpc::connect(&submitter.url, submitter.limits).await {
                Ok(connected) => rpc = Some(connected),
                Err(error) => {
                    metrics.weights_failed("transport");
                    tracing::warn!(%error, epoch = epoch_weights.epoch, "weights not submitted");
                    continue;
                }
            }
        }
        let Some(client) = &rpc else { continue };
        match submit(client, &submitter, &mut cached, &mut pacing, &call).await {
            Ok(Some((block, tx))) => {
                metrics.weights_submitted.inc();
                tracing::info!(
                    epoch = epoch_weights.epoch,
                    block,
                    netuid = call.netuid,
                    uids = ?call.uids,
                    weights = ?call.weights,
                    tx = %tx,
                    "weights submitted to the chain"
                );
            }
            Ok(None) => {}
            Err(error) => {
                metrics.weights_failed(error.reason());
                tracing::warn!(%error, epoch = epoch_weights.epoch, "weights not submitted");
            }
        }
    }
}

/// One submission, if one is due: returns the head block and the transaction hash.
async fn submit(
    rpc: &ChainRpc,
    submitter: &Submitter,
    cached: &mut Option<ChainState>,
    pacing: &mut Pacing,
    call: &SetWeights,
) -> Result<Option<(u64, String)>, SubmitError> {
    let head_hash = rpc.chain_get_head().await?;
    let header = rpc.chain_get_header(&head_hash).await?;
    let head = super::stake::block_number(&header, &head_hash)
        .map_err(|e| SubmitError::Chain(e.to_string()))?;
    if !pacing.due(submitter.policy, head) {
        return Ok(None);
    }
    let version = rpc.state_get_runtime_version(Some(&head_hash)).await?;
    let version_field = |name: &str| {
        version[name]
            .as_u64()
            .and_then(|v| u32::try_from(v).ok())
            .ok_or_else(|| SubmitError::Chain(format!("runtime version has no u32 {name}")))
    };
    let spec_version = version_field("specVersion")?;
    let transaction_version = version_field("transactionVersion")?;
    // The metadata is read again only when the runtime changed.
    let state = match cached.take() {
        Some(state) if state.spec_version() == spec_version => state,
        _ => {
            let genesis = hash_bytes(&rpc.chain_get_block_hash(0).await?)?;
            let metadata = rpc.metadata_v15(Some(&head_hash)).await?;
            ChainState::from_metadata_bytes(&metadata, genesis, spec_version, transaction_version)?
                .pinned(submitter.genesis)?
        }
    };
    let state = cached.insert(state);
    let nonce = rpc
        .system_account_next_index(submitter.hotkey.hotkey().as_str())
        .await?;
    let extrinsic = super::extrinsic::signed_set_weights(
        state,
        &submitter.hotkey.seed(),
        call,
        nonce,
        (head, hash_bytes(&head_hash)?),
    )?;
    let tx = rpc.author_submit_extrinsic(&extrinsic).await?;
    pacing.submitted(head);
    Ok(Some((head, tx)))
}

/// `0x` and 64 hex digits as 32 bytes.
fn hash_bytes(hash: &str) -> Result<[u8; 32], SubmitError> {
    let digits = hash.strip_prefix("0x").unwrap_or(hash);
    let mut out = [0u8; 32];
    hex::decode_to_slice(digits, &mut out)
        .map_err(|_| SubmitError::Chain(format!("{hash:?} is not a block hash")))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::validator::api::MinerWeight;

    fn miner(uid: u16, weight: u16) -> MinerWeight {
        MinerWeight {
            uid,
            peer_id: format!("peer-{uid}"),
            stage: 0,
            samples: 1,
            effect: None,
            standard_error: None,
            flagged: weight == 0,
            reason: None,
            weight,
        }
    }

    #[test]
    fn the_call_holds_the_paid_miners_in_uid_order() {
        let weights = EpochWeights {
            epoch: 3,
            records: 10,
            fit_error: None,
            miners: vec![miner(7, 100), miner(2, 65_535), miner(4, 0)],
            spot_checks: Default::default(),
        };
        let call = call_of(&weights, 9, 42);
        assert_eq!(call.uids, [2, 7]);
        assert_eq!(call.weights, [65_535, 100]);
        assert_eq!((call.netuid, call.version_key), (9, 42));
    }

    #[test]
    fn submissions_wait_for_their_epoch_and_the_rate_limit() {
        let policy = Policy {
            every_epochs: 2,
            min_blocks: 100,
        };
        let mut pacing = Pacing::default();
        assert!(!pacing.due(policy, 1_000), "the first epoch of two");
        assert!(pacing.due(policy, 1_010));
        pacing.submitted(1_010);
        assert!(!pacing.due(policy, 1_020));
        assert!(!pacing.due(policy, 1_050), "two epochs, but 40 blocks");
        assert!(pacing.due(policy, 1_110), "100 blocks on");
        pacing.submitted(1_110);
        let every = Policy {
            every_epochs: 1,
            min_blocks: 0,
        };
        assert!(pacing.due(every, 1_110));
    }
}
