//! Prometheus metrics of the node itself (the p2p layer registers its own).
//!
//! One struct, registered once and passed around; no globals.

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Metrics of the node's orchestration state.
#[derive(Clone, Debug, Default)]
pub(crate) struct NodeMetrics {
    /// `iota_epoch`: the epoch of the plan in force; -1 before the first plan.
    pub(crate) epoch: Gauge,
    /// `iota_is_orchestrator`: 1 while this node holds the orchestrator duty, else 0.
    pub(crate) is_orchestrator: Gauge,
    /// `iota_requests_rejected_total{reason}`: inbound requests the router refused before
    /// any service saw them, by the rule that refused them (labels: [`crate::rules::Refusal`]).
    requests_rejected: Family<ReasonLabels, Counter>,
    /// `iota_pending_gossip`: messages of the next epoch held until its plan arrives.
    pub(crate) pending_gossip: Gauge,
    /// `iota_miner_weight{peer}`: each miner's consensus weight (the validators'
    /// stake-weighted median) for the latest epoch weighed.
    miner_weight: Family<PeerLabels, Gauge<f64, AtomicU64>>,
    /// `iota_validator_trust{peer}`: the share of each validator's weight that survived
    /// clipping to consensus.
    validator_trust: Family<PeerLabels, Gauge<f64, AtomicU64>>,
}

/// Labels of a per-peer gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct PeerLabels {
    peer: String,
}

/// Labels of a refusal counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

impl NodeMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub(crate) fn new(registry: &mut Registry) -> Self {
        let m = NodeMetrics::default();
        m.epoch.set(-1);
        registry.register(
            "iota_epoch",
            "Epoch of the plan in force (-1: none yet)",
            m.epoch.clone(),
        );
        registry.register(
            "iota_is_orchestrator",
            "1 while this node holds the orchestrator duty",
            m.is_orchestrator.clone(),
        );
        registry.register(
            "iota_requests_rejected",
            "Inbound requests refused by the router, by rule",
            m.requests_rejected.clone(),
        );
        registry.register(
            "iota_pending_gossip",
            "Gossip of the next epoch held until its plan arrives",
            m.pending_gossip.clone(),
        );
        registry.register(
            "iota_miner_weight",
            "Consensus weight of each miner for the latest epoch weighed",
            m.miner_weight.clone(),
        );
        registry.register(
            "iota_validator_trust",
            "Share of each validator's weight that survived clipping to consensus",
            m.validator_trust.clone(),
        );
        m
    }

    /// Shows the consensus of the latest epoch weighed: each miner's weight and each
    /// validator's trust, by peer id (peers no longer in it are dropped).
    pub(crate) fn set_weights(
        &self,
        miners: impl IntoIterator<Item = (String, f64)>,
        validators: impl IntoIterator<Item = (String, f64)>,
    ) {
        self.miner_weight.clear();
        for (peer, weight) in miners {
            self.miner_weight
                .get_or_create(&PeerLabels { peer })
                .set(weight);
        }
        self.validator_trust.clear();
        for (peer, trust) in validators {
            self.validator_trust
                .get_or_create(&PeerLabels { peer })
                .set(trust);
        }
    }

    /// Counts a refused request.
    pub(crate) fn request_rejected(&self, reason: &'static str) {
        self.requests_rejected
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }
}

/// Labels of `iota_wire_bytes_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct WireLabels {
    direction: &'static str,
    kind: &'static str,
}

/// Metrics of the training pipeline.
#[derive(Clone, Debug, Default)]
pub(crate) struct PipelineMetrics {
    /// `iota_samples_forward_total`: forward passes this miner ran on training samples.
    pub(crate) samples_forward: Counter,
    /// `iota_samples_backward_total`: backward passes this miner completed.
    pub(crate) samples_backward: Counter,
    /// `iota_samples_dropped_total`: samples this miner gave up after every retry failed.
    pub(crate) samples_dropped: Counter,
    /// `iota_train_loss`: the latest training loss this miner saw.
    pub(crate) train_loss: Gauge<f64, AtomicU64>,
    /// `iota_val_loss`: the latest held-out loss this node saw, in nats per token.
    pub(crate) val_loss: Gauge<f64, AtomicU64>,
    /// `iota_val_bits_per_byte`: the same loss in bits per byte of held-out text (set when
    /// the node knows the dataset's bytes per token), which compares runs whose tokenizers
    /// differ.
    val_bits_per_byte: Gauge<f64, AtomicU64>,
    /// `iota_wire_bytes_total{direction,kind}`: pipeline bytes on the wire; direction is
    /// `sent` or `received`, kind `activation` or `gradient`.
    wire_bytes: Family<WireLabels, Counter>,
    /// `iota_responses_rejected_total{reason}`: replies of the next stage this miner refused
    /// before using them (a gradient of the wrong shape or sample, a malformed result).
    responses_rejected: Family<ReasonLabels, Counter>,
}

impl PipelineMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub(crate) fn new(registry: &mut Registry) -> Self {
        let m = PipelineMetrics::default();
        registry.register(
            "iota_samples_forward",
            "Forward passes on training samples",
            m.samples_forward.clone(),
        );
        registry.register(
            "iota_samples_backward",
            "Backward passes completed",
            m.samples_backward.clone(),
        );
        registry.register(
            "iota_samples_dropped",
            "Samples dropped after every retry failed",
            m.samples_dropped.clone(),
        );
        registry.register(
            "iota_train_loss",
            "Latest training loss seen (nats per token)",
            m.train_loss.clone(),
        );
        registry.register(
            "iota_val_loss",
            "Latest held-out loss seen (nats per token)",
            m.val_loss.clone(),
        );
        registry.register(
            "iota_val_bits_per_byte",
            "Latest held-out loss seen, in bits per byte of held-out text",
            m.val_bits_per_byte.clone(),
        );
        registry.register(
            "iota_wire_bytes",
            "Pipeline bytes on the wire",
            m.wire_bytes.clone(),
        );
        registry.register(
            "iota_responses_rejected",
            "Replies of the next stage refused before use, by reason",
            m.responses_rejected.clone(),
        );
        m
    }

    /// A held-out loss of `nats` per token, and the same in bits per byte when the node knows
    /// it (the bits-per-byte gauge keeps its last value otherwise).
    pub(crate) fn set_val_loss(&self, nats: f64, bits_per_byte: Option<f64>) {
        self.val_loss.set(nats);
        if let Some(bpb) = bits_per_byte {
            self.val_bits_per_byte.set(bpb);
        }
    }

    /// Counts a refused reply of the next stage.
    pub(crate) fn response_rejected(&self, reason: &'static str) {
        self.responses_rejected
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Counts `bytes` of `kind` sent.
    pub(crate) fn wire_sent(&self, kind: &'static str, bytes: usize) {
        self.wire_bytes
            .get_or_create(&WireLabels {
                direction: "sent",
                kind,
            })
            .inc_by(bytes as u64);
    }

    /// Counts `bytes` received of `kind`.
    pub(crate) fn wire_received(&self, kind: &'static str, bytes: usize) {
        self.wire_bytes
            .get_or_create(&WireLabels {
                direction: "received",
                kind,
            })
            .inc_by(bytes as u64);
    }

    /// Activation bytes sent so far.
    pub(crate) fn wire_bytes_sent(&self) -> u64 {
        self.wire_bytes
            .get_or_create(&WireLabels {
                direction: "sent",
                kind: "activation",
            })
            .get()
    }
}

/// Metrics of the chain (subtensor) as a stake source and a weight sink.
#[derive(Clone, Debug, Default)]
pub(crate) struct ChainMetrics {
    /// `iota_chain_stake_age_seconds`: seconds since the stake snapshot in force was read
    /// from the chain (-1: none read yet). It grows while reads fail: the staleness alarm.
    pub(crate) stake_age_seconds: Gauge<f64, AtomicU64>,
    /// `iota_chain_stake_block`: the block the stake snapshot in force was read at.
    pub(crate) stake_block: Gauge,
    /// `iota_chain_neurons`: neurons in the snapshot in force.
    pub(crate) neurons: Gauge,
    /// `iota_chain_bound_hotkeys`: the snapshot's hotkeys with a verified binding to a peer.
    pub(crate) bound_hotkeys: Gauge,
    /// `iota_chain_reads_failed_total{reason}`: reads of the neurons that failed (the last
    /// good snapshot stays in force).
    reads_failed: Family<ReasonLabels, Counter>,
    /// `iota_chain_weights_submitted_total`: `set_weights` extrinsics the chain accepted
    /// into its pool.
    pub(crate) weights_submitted: Counter,
    /// `iota_chain_weights_failed_total{reason}`: weight submissions that failed.
    weights_failed: Family<ReasonLabels, Counter>,
}

impl ChainMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub(crate) fn new(registry: &mut Registry) -> Self {
        let m = ChainMetrics::default();
        m.stake_age_seconds.set(-1.0);
        registry.register(
            "iota_chain_stake_age_seconds",
            "Seconds since the stake snapshot in force was read from the chain (-1: none yet)",
            m.stake_age_seconds.clone(),
        );
        registry.register(
            "iota_chain_stake_block",
            "Block the stake snapshot in force was read at",
            m.stake_block.clone(),
        );
        registry.register(
            "iota_chain_neurons",
            "Neurons in the stake snapshot in force",
            m.neurons.clone(),
        );
        registry.register(
            "iota_chain_bound_hotkeys",
            "Hotkeys of the snapshot with a verified binding to a peer id",
            m.bound_hotkeys.clone(),
        );
        registry.register(
            "iota_chain_reads_failed",
            "Failed reads of the subnet's neurons, by reason",
            m.reads_failed.clone(),
        );
        registry.register(
            "iota_chain_weights_submitted",
            "set_weights extrinsics accepted into the chain's pool",
            m.weights_submitted.clone(),
        );
        registry.register(
            "iota_chain_weights_failed",
            "Weight submissions that failed, by reason",
            m.weights_failed.clone(),
        );
        m
    }

    /// Counts a failed read of the neurons.
    pub(crate) fn read_failed(&self, reason: &'static str) {
        self.reads_failed
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Counts a failed weight submission.
    pub(crate) fn weights_failed(&self, reason: &'static str) {
        self.weights_failed
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the unlabelled metric `name` in the text exposition of `registry`.
    fn value(registry: &Registry, name: &str) -> Option<f64> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .map(|v| v.trim().parse().unwrap())
    }

    #[test]
    fn a_held_out_loss_is_exported_in_nats_per_token_and_bits_per_byte() {
        let mut registry = Registry::default();
        let m = PipelineMetrics::new(&mut registry);
        let nats = 2.0;
        m.set_val_loss(nats, Some(nats / std::f64::consts::LN_2));
        assert_eq!(value(&registry, "iota_val_loss"), Some(2.0));
        let bpb = value(&registry, "iota_val_bits_per_byte").unwrap();
        assert!((bpb - 2.0 / std::f64::consts::LN_2).abs() < 1e-9, "{bpb}");
        // Without the data's bytes per token, the loss moves and bits per byte keep their
        // last known value.
        m.set_val_loss(1.5, None);
        assert_eq!(value(&registry, "iota_val_loss"), Some(1.5));
        assert_eq!(value(&registry, "iota_val_bits_per_byte"), Some(bpb));
    }
}
