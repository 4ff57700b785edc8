//! What the rest of the node uses of the chain service: the stake reader and a validator's
//! weight submitter (each started as a task), the check of a chain URL the CLI runs, and the
//! `metagraph` command.

pub(crate) use super::jsonrpc::{check_url, RpcLimits};
pub(crate) use super::show::{metagraph_command, Query as MetagraphQuery};
pub(crate) use super::stake::{run as read_stake, StakeSource};
pub(crate) use super::weights::{run as submit_weights, Policy, Submitter};

use crate::services::consensus::api::ChainStake;

/// One read of the subnet's neurons at the finalized head (a joining node's, before the
/// stake reader starts); the error says why, for the log.
pub(crate) async fn read_stake_once(source: &StakeSource) -> Result<ChainStake, String> {
    let rpc = super::jsonrpc::ChainRpc::connect(&source.url, source.limits)
        .await
        .map_err(|e| e.to_string())?;
    super::stake::read(&rpc, source.netuid)
        .await
        .map_err(|e| e.to_string())
}
