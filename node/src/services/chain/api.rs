//! What the rest of the node uses of the chain service: the stake reader and a validator's
//! weight submitter (each started as a task), the check of a chain URL the CLI runs, and the
//! `metagraph` command.

pub(crate) use super::jsonrpc::{check_url, RpcLimits};
pub(crate) use super::show::{metagraph_command, Query as MetagraphQuery};
pub(crate) use super::stake::{run as read_stake, StakeSource};
pub(crate) use super::weights::{run as submit_weights, Policy, Submitter};
