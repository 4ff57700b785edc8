//! What `/status` reports: a JSON snapshot of the node, built on demand.
//!
//! Peer counts come from the network event loop at the moment of the request; the rest from
//! watch values: the node's view, which its loop keeps up to date, and the miner's status,
//! which the miner service publishes. This is the observe service: it reads what the others
//! publish and changes nothing.

use tokio::sync::watch;

use serde::Serialize;

pub(crate) use crate::services::consensus::api::EpochStats;
use crate::services::data::api::DataHandle;

/// The parts of the status that the node loop publishes and the HTTP handler reads.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct NodeView {
    /// Addresses the node listens on, each ending in `/p2p/<peer id>`.
    pub(crate) listen_addrs: Vec<String>,
    /// The hash of the run configuration the node follows (hex), what a joining node pins
    /// with `--run-hash`.
    pub(crate) run_hash: String,
    /// The hash of the stake snapshot the node follows (hex; none with stake from the
    /// chain), what a joining node pins with `--metagraph-hash`.
    pub(crate) metagraph_hash: Option<String>,
    /// `public` (it listens on a global address, was given `--external-address` or
    /// bootstraps through a global address: it keeps and dials only its peers' global
    /// addresses) or `local` (it keeps them all).
    pub(crate) reachability: &'static str,
    /// The addresses it was told others reach it at (`--external-address`), the only ones it
    /// advertises when there are any.
    pub(crate) external_addrs: Vec<String>,
    /// Peers whose heartbeats are fresh, sorted.
    pub(crate) live_peers: Vec<bootstrap::PeerIdStr>,
    /// The same peers, each as the run knows it: a validator with a permit, a miner of the
    /// plan in force, or unverified (whatever its heartbeat claims).
    pub(crate) peers: Vec<crate::services::observe::peers::LivePeer>,
    /// The HTTP servers (`http://<ip>:<port>`) that live validators with a permit and miners
    /// of the plan in force announce in their heartbeats: the dashboard reads their `/status`
    /// too. An unverified peer's URL is never offered.
    pub(crate) peer_dashboards: std::collections::BTreeMap<String, String>,
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
    /// The miners of each stage in the plan in force (peer ids, sorted).
    pub(crate) stage_map: Vec<Vec<String>>,
    /// Samples each head draws in the epoch in force.
    pub(crate) epoch_samples: Option<u64>,
    /// The miner's counters (defaults on a validator).
    #[serde(flatten)]
    pub(crate) miner: crate::services::miner::api::MinerStatus,
    /// On a validator: its weights after the latest scored epoch (per miner: uid, peer id,
    /// stage, samples, CLASP effect, flagged, chain weight).
    pub(crate) validator_weights: Option<crate::services::validator::api::EpochWeights>,
    /// The validators' weights for the latest epoch weighed, combined by Yuma consensus
    /// (per miner: uid, hotkey, peer id, weight, incentive; per validator: stake, trust).
    pub(crate) weights: Option<crate::services::consensus::api::ConsensusWeights>,
    /// The epoch of `weights`.
    pub(crate) consensus_epoch: Option<u64>,
    /// What the run did, epoch by epoch, as heard over gossip.
    pub(crate) epochs: Vec<EpochStats>,
    /// With stake from the chain: every hotkey binding this node verified, hotkey (SS58) →
    /// peer id (`iota-p2p metagraph --node` shows them next to the chain's neurons).
    pub(crate) bindings: std::collections::BTreeMap<String, String>,
    /// Uid of each peer in the metagraph in force.
    pub(crate) uids: std::collections::BTreeMap<String, u16>,
    /// Changes whenever the metagraph or the bindings change.
    #[serde(skip)]
    pub(crate) metagraph_generation: u64,
}

/// JSON body of `GET /status`: identity and peer counts, then the node's view flattened in.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Status {
    pub(crate) peer_id: bootstrap::PeerIdStr,
    pub(crate) role: &'static str,
    pub(crate) connected_peers: usize,
    pub(crate) routing_table_peers: usize,
    pub(crate) routing_table: Vec<String>,
    /// The process's peak resident memory so far, in bytes (Linux `VmHWM`; `null` where
    /// unknown). Host memory only: on CUDA the device's is not counted.
    pub(crate) peak_memory_bytes: Option<u64>,
    /// How the node is reached and reaches its peers, from the network loop.
    pub(crate) nat: NatStatus,
    #[serde(flatten)]
    pub(crate) view: NodeView,
}

/// `/status` `nat`: what AutoNAT found, the addresses the node advertises, the relays that
/// hold a reservation for it, and how each connected peer is reached.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct NatStatus {
    /// `unknown`, `public` (a peer dialled it back) or `private` (it listens through relays).
    pub(crate) reachability: &'static str,
    /// Addresses it advertises: confirmed by AutoNAT, given by the operator, relay circuits.
    pub(crate) external_addrs: Vec<String>,
    /// Relays holding a reservation for it.
    pub(crate) relays: Vec<String>,
    /// Every connected peer: `direct` or `relayed`.
    pub(crate) peer_paths: std::collections::BTreeMap<String, &'static str>,
    /// Hole punches that gave a direct connection, and those that failed.
    pub(crate) hole_punches_succeeded: u64,
    pub(crate) hole_punches_failed: u64,
    /// Whether it runs a relay server, and what that holds now.
    pub(crate) relay_server: bool,
    pub(crate) relay_reservations: usize,
    pub(crate) relay_circuits: usize,
}

impl From<p2p::Connectivity> for NatStatus {
    fn from(c: p2p::Connectivity) -> Self {
        NatStatus {
            reachability: c.reachability.as_str(),
            external_addrs: c.external_addrs.iter().map(ToString::to_string).collect(),
            relays: c.relays.iter().map(ToString::to_string).collect(),
            peer_paths: c
                .peers
                .iter()
                .map(|(p, path)| (p.to_string(), path.as_str()))
                .collect(),
            hole_punches_succeeded: c.hole_punches_succeeded,
            hole_punches_failed: c.hole_punches_failed,
            relay_server: c.relay_server,
            relay_reservations: c.relay_reservations,
            relay_circuits: c.relay_circuits,
        }
    }
}

/// Builds [`Status`] snapshots from the network client and the shared [`NodeView`].
#[derive(Clone)]
pub(crate) struct StatusSource {
    pub(crate) client: p2p::Client,
    pub(crate) role: &'static str,
    pub(crate) view: watch::Receiver<NodeView>,
    /// The miner's status, on a miner.
    pub(crate) miner: Option<watch::Receiver<crate::services::miner::api::MinerStatus>>,
    /// The latest epoch's weights, on a validator.
    pub(crate) validator:
        Option<watch::Receiver<Option<crate::services::validator::api::EpochWeights>>>,
    /// The run's data: its bytes per token turn held-out losses into bits per byte.
    pub(crate) data: DataHandle,
}

impl StatusSource {
    /// Asks the network loop for its peers and combines them with the node's view.
    pub(crate) async fn snapshot(&self) -> Result<Status, p2p::ClientError> {
        let connected = self.client.connected_peers().await?;
        let nat = NatStatus::from(self.client.connectivity().await?);
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
        if let (Some(own), Some(consensus)) = (&view.validator_weights, &mut view.weights) {
            annotate(consensus, own);
        }
        held_out_bits_per_byte(&mut view.epochs, self.data.bytes_per_token());
        Ok(Status {
            peer_id: crate::wire::peer::of(&self.client.local_peer_id()),
            role: self.role,
            connected_peers: connected.len(),
            routing_table_peers: routing.len(),
            routing_table: routing,
            peak_memory_bytes: training::memory::peak_rss_bytes(),
            nat,
            view,
        })
    }
}

/// Gives each epoch's held-out loss in bits per byte too, the held-out text holding
/// `bytes_per_token` bytes per token (`None`: the dataset's manifest is not here yet, and
/// no figure is given rather than a wrong one).
fn held_out_bits_per_byte(epochs: &mut [EpochStats], bytes_per_token: Option<f64>) {
    for e in epochs {
        e.val_bits_per_byte = match (e.val_loss, bytes_per_token) {
            (Some(nats), Some(bytes)) => {
                Some(training::dataset::bits_per_byte(f64::from(nats), bytes))
            }
            _ => None,
        };
    }
}

/// Adds a validator's own reasons to the consensus of the same epoch.
fn annotate(
    consensus: &mut crate::services::consensus::api::ConsensusWeights,
    own: &crate::services::validator::api::EpochWeights,
) {
    if consensus.epoch != own.epoch {
        return;
    }
    for miner in &mut consensus.miners {
        if let Some(reason) = own
            .miners
            .iter()
            .find(|m| m.uid == miner.uid)
            .and_then(|m| m.reason.clone())
        {
            miner.flagged = true;
            miner.reason = Some(reason);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::consensus::api::{ConsensusWeights, MinerConsensus};
    use crate::services::validator::api::{EpochWeights, MinerWeight};

    #[test]
    fn status_gives_the_peak_memory_and_a_miners_stage_estimate() {
        let mut view = NodeView::default();
        view.miner.stage_memory_estimate_bytes = Some(49_000_000);
        view.miner.host_memory_estimate_bytes = Some(98_000_000);
        let status = Status {
            peer_id: bootstrap::PeerIdStr::parse(
                "12D3KooWDpJ7As7BWAwRMfu1VU2WCqNjvq387JEYKDBj4kx6nXTN",
            )
            .unwrap(),
            role: "miner",
            connected_peers: 0,
            routing_table_peers: 0,
            routing_table: Vec::new(),
            peak_memory_bytes: Some(470_000_000),
            nat: NatStatus::default(),
            view,
        };
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["peak_memory_bytes"], 470_000_000);
        assert_eq!(json["stage_memory_estimate_bytes"], 49_000_000);
        assert_eq!(json["host_memory_estimate_bytes"], 98_000_000);
    }

    fn consensus(epoch: u64) -> ConsensusWeights {
        let miner = |uid: u16, weight: f64| MinerConsensus {
            uid,
            hotkey: String::new(),
            peer_id: format!("p{uid}"),
            weight,
            incentive: weight,
            flagged: weight == 0.0,
            reason: (weight == 0.0).then(|| "weighed 0 by consensus".into()),
        };
        ConsensusWeights {
            epoch,
            miners: vec![miner(1, 0.5), miner(2, 0.5), miner(3, 0.0)],
            validators: Vec::new(),
        }
    }

    fn own(epoch: u64) -> EpochWeights {
        let miner = |uid: u16, reason: Option<&str>| MinerWeight {
            uid,
            peer_id: format!("p{uid}"),
            stage: 0,
            samples: 10,
            effect: None,
            standard_error: None,
            flagged: reason.is_some(),
            reason: reason.map(str::to_string),
            weight: 0,
        };
        EpochWeights {
            epoch,
            records: 30,
            fit_error: None,
            miners: vec![
                miner(1, None),
                miner(2, Some("spot_check: output_not_reproduced")),
            ],
            spot_checks: Default::default(),
        }
    }

    #[test]
    fn status_gives_each_held_out_loss_in_bits_per_byte_once_the_data_is_known() {
        let ln2 = std::f64::consts::LN_2;
        let epoch = |epoch: u64, val_loss: Option<f32>| {
            let mut e = EpochStats::default();
            (e.epoch, e.val_loss) = (epoch, val_loss);
            e
        };
        let mut view = NodeView {
            epochs: vec![epoch(0, Some(3.0)), epoch(1, None)],
            ..NodeView::default()
        };
        let bpb = |view: &NodeView| -> Vec<serde_json::Value> {
            let json = serde_json::to_value(view).unwrap();
            json["epochs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| e["val_bits_per_byte"].clone())
                .collect()
        };
        // Byte tokens: nats per token over ln 2.
        held_out_bits_per_byte(&mut view.epochs, Some(1.0));
        let got = bpb(&view);
        assert!(
            (got[0].as_f64().unwrap() - 3.0 / ln2).abs() < 1e-6,
            "{got:?}"
        );
        assert!(got[1].is_null(), "no held-out loss, no figure: {got:?}");
        // Three bytes of text per token divide by three.
        held_out_bits_per_byte(&mut view.epochs, Some(3.0));
        assert!((bpb(&view)[0].as_f64().unwrap() - 1.0 / ln2).abs() < 1e-6);
        // Before the manifest: the field is there, and null.
        held_out_bits_per_byte(&mut view.epochs, None);
        assert!(bpb(&view)[0].is_null());
        // What `local-swarm` reads back from `/status` keeps the figure.
        held_out_bits_per_byte(&mut view.epochs, Some(1.0));
        let json = serde_json::to_value(&view).unwrap();
        let rows: Vec<EpochStats> = serde_json::from_value(json["epochs"].clone()).unwrap();
        assert_eq!(rows[0].val_bits_per_byte, view.epochs[0].val_bits_per_byte);
    }

    #[test]
    fn a_validators_own_reasons_annotate_the_consensus_of_the_same_epoch_only() {
        let mut weights = consensus(4);
        annotate(&mut weights, &own(4));
        let reasons: Vec<(bool, Option<&str>)> = weights
            .miners
            .iter()
            .map(|m| (m.flagged, m.reason.as_deref()))
            .collect();
        assert_eq!(
            reasons,
            vec![
                (false, None),
                (true, Some("spot_check: output_not_reproduced")),
                (true, Some("weighed 0 by consensus")),
            ]
        );
        let mut other = consensus(5);
        annotate(&mut other, &own(4));
        assert!(!other.miners[1].flagged);
    }
}
