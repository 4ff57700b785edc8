//! What `/status` reports: a JSON snapshot of the node, built on demand.
//!
//! Peer counts come from the network event loop at the moment of the request; the rest from
//! watch values: the node's view, which its loop keeps up to date, and the miner's status,
//! which the miner service publishes. This is the observe service: it reads what the others
//! publish and changes nothing.

use tokio::sync::watch;

use serde::Serialize;

mod stats;
pub(crate) use stats::{EpochStats, RunStats};

/// The parts of the status that the node loop publishes and the HTTP handler reads.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct NodeView {
    /// Addresses the node listens on, each ending in `/p2p/<peer id>`.
    pub(crate) listen_addrs: Vec<String>,
    /// Peers whose heartbeats are fresh, sorted.
    pub(crate) live_peers: Vec<String>,
    /// Heartbeats this node has published.
    pub(crate) heartbeats_sent: u64,
    /// The elected orchestrator.
    pub(crate) orchestrator: Option<String>,
    /// Whether this node is the orchestrator.
    pub(crate) is_orchestrator: bool,
    /// Epoch of the plan in force.
    pub(crate) epoch: Option<u64>,
    /// This node's stage in the plan in force.
    pub(crate) stage: Option<u32>,
    /// Miners per stage in the plan in force.
    pub(crate) stage_sizes: Vec<usize>,
    /// The miner's counters (defaults on a validator).
    #[serde(flatten)]
    pub(crate) miner: crate::handles::MinerStatus,
    /// On a validator: its weights after the latest scored epoch (per miner: uid, peer id,
    /// stage, samples, CLASP effect, flagged, chain weight).
    pub(crate) validator_weights: Option<crate::handles::EpochWeights>,
    /// The validators' weights for the latest epoch weighed, combined by Yuma consensus
    /// (per miner: uid, hotkey, peer id, weight, incentive; per validator: stake, trust).
    pub(crate) weights: Option<crate::handles::ConsensusWeights>,
    /// The epoch of `weights`.
    pub(crate) consensus_epoch: Option<u64>,
    /// What the run did, epoch by epoch, as heard over gossip.
    pub(crate) epochs: Vec<EpochStats>,
}

/// JSON body of `GET /status`: identity and peer counts, then the node's view flattened in.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Status {
    pub(crate) peer_id: String,
    pub(crate) role: &'static str,
    pub(crate) connected_peers: usize,
    pub(crate) routing_table_peers: usize,
    pub(crate) routing_table: Vec<String>,
    #[serde(flatten)]
    pub(crate) view: NodeView,
}

/// Builds [`Status`] snapshots from the network client and the shared [`NodeView`].
#[derive(Clone)]
pub(crate) struct StatusSource {
    pub(crate) client: p2p::Client,
    pub(crate) role: &'static str,
    pub(crate) view: watch::Receiver<NodeView>,
    /// The miner's status, on a miner.
    pub(crate) miner: Option<watch::Receiver<crate::handles::MinerStatus>>,
    /// The latest epoch's weights, on a validator.
    pub(crate) validator: Option<watch::Receiver<Option<crate::handles::EpochWeights>>>,
}

impl StatusSource {
    /// Asks the network loop for its peers and combines them with the node's view.
    pub(crate) async fn snapshot(&self) -> Result<Status, p2p::ClientError> {
        let connected = self.client.connected_peers().await?;
        let mut routing: Vec<String> = self
            .client
            .routing_table_peers()
            .await?
            .iter()
            .map(ToString::to_string)
            .collect();
        routing.sort();
        let mut view = self.view.borrow().clone();
        if let Some(miner) = &self.miner {
            view.miner = miner.borrow().clone();
        }
        if let Some(validator) = &self.validator {
            view.validator_weights = validator.borrow().clone();
        }
        Ok(Status {
            peer_id: self.client.local_peer_id().to_string(),
            role: self.role,
            connected_peers: connected.len(),
            routing_table_peers: routing.len(),
            routing_table: routing,
            view,
        })
    }
}
