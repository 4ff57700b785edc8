//! Prometheus metrics of the node itself (the p2p layer registers its own).
//!
//! One struct, registered once and passed around; no globals.

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Metrics of the node's orchestration state.
#[derive(Clone, Debug, Default)]
pub(crate) struct NodeMetrics {
    /// `iota_epoch`: the epoch of the plan in force; -1 before the first plan.
    pub(crate) epoch: Gauge,
    /// `iota_is_orchestrator`: 1 while this node holds the orchestrator duty, else 0.
    pub(crate) is_orchestrator: Gauge,
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
        m
    }
}
