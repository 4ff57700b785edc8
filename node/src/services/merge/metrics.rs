//! Prometheus metrics of the butterfly merges of one node.
//!
//! One [`Metrics`] per node, created with [`Metrics::new`] (registered) or
//! [`Metrics::unregistered`] (tests, benches) and shared by cloning. Byte counters count at
//! this node's butterfly boundary, whether a merge is running or not: tagged request and
//! response frames (tag byte included, the p2p layer's length prefix not) and gossip
//! payloads (the butterfly message, without the p2p envelope). Mismatches and published
//! reports come from each merge's and audit's report when it ends; received reports are
//! counted as they arrive. Labels are bounded: two directions times the known kinds.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use training::butterfly::{AuditReport, MergeReport, MisbehaviourKind};

/// Whether a misbehaviour report was ours or someone else's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Published by this node (a merge or an audit it ran).
    Published,
    /// Received over gossip from another node.
    Received,
}

impl Direction {
    fn as_str(self) -> &'static str {
        match self {
            Direction::Published => "published",
            Direction::Received => "received",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReportLabels {
    direction: &'static str,
    kind: &'static str,
}

fn kind_label(kind: MisbehaviourKind) -> &'static str {
    match kind {
        MisbehaviourKind::WrongAverage => "wrong_average",
        MisbehaviourKind::Equivocation => "equivocation",
        MisbehaviourKind::NonFinite => "non_finite",
        MisbehaviourKind::Outlier => "outlier",
        _ => "other",
    }
}

/// Counters of the butterfly merges of one node. Clone freely (shared atomics).
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// `iota_butterfly_bytes_sent_total`: gossip payloads published, request frames sent and
    /// response frames served, when each left this node.
    bytes_sent: Counter,
    /// `iota_butterfly_bytes_received_total`: gossip payloads delivered on a butterfly
    /// topic, response frames received and request frames served, when each arrived.
    bytes_received: Counter,
    /// `iota_butterfly_mismatches_total`: failed hash checks, added from each merge's report
    /// when the merge ends.
    mismatches: Counter,
    /// `iota_butterfly_weights_capped_total`: members whose merge weight (their claimed
    /// samples) was cut to the most the epoch's plan can feed, counted when the merge ends.
    weights_capped: Counter,
    /// `iota_misbehaviour_reports_total{direction,kind}`: misbehaviour reports this node
    /// published (counted when its merge or audit ends) or received over gossip (counted on
    /// arrival).
    reports: Family<ReportLabels, Counter>,
}

impl Metrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn new(registry: &mut Registry) -> Self {
        let m = Self::default();
        // prometheus-client appends `_total` to counter names.
        registry.register(
            "iota_butterfly_bytes_sent",
            "Butterfly merge bytes sent: gossip payloads, request and response frames",
            m.bytes_sent.clone(),
        );
        registry.register(
            "iota_butterfly_bytes_received",
            "Butterfly merge bytes received: gossip payloads, request and response frames",
            m.bytes_received.clone(),
        );
        registry.register(
            "iota_butterfly_mismatches",
            "Butterfly hash checks that failed (inputs, averages, disagreeing holders)",
            m.mismatches.clone(),
        );
        registry.register(
            "iota_butterfly_weights_capped",
            "Butterfly merge members whose claimed samples were cut to the plan's maximum",
            m.weights_capped.clone(),
        );
        registry.register(
            "iota_misbehaviour_reports",
            "Misbehaviour reports published by this node or received from others",
            m.reports.clone(),
        );
        m
    }

    /// Metrics registered nowhere (tests and benchmarks with many nodes in one process).
    pub fn unregistered() -> Self {
        Self::default()
    }

    pub(crate) fn sent(&self, bytes: usize) {
        self.bytes_sent.inc_by(bytes as u64);
    }

    pub(crate) fn received(&self, bytes: usize) {
        self.bytes_received.inc_by(bytes as u64);
    }

    fn report(&self, direction: Direction, kind: MisbehaviourKind) {
        self.reports
            .get_or_create(&ReportLabels {
                direction: direction.as_str(),
                kind: kind_label(kind),
            })
            .inc();
    }

    pub(crate) fn report_received(&self, kind: MisbehaviourKind) {
        self.report(Direction::Received, kind);
    }

    /// Adds what a finished merge found: its mismatches and the reports it published.
    pub fn record_merge(&self, report: &MergeReport) {
        self.mismatches.inc_by(report.mismatches);
        self.weights_capped
            .inc_by(report.weights_capped.len() as u64);
        for m in &report.misbehaviour {
            self.report(Direction::Published, m.kind);
        }
    }

    /// Adds the reports a finished audit published.
    pub fn record_audit(&self, report: &AuditReport) {
        for m in &report.misbehaviour {
            self.report(Direction::Published, m.kind);
        }
    }

    /// Bytes sent so far.
    pub fn bytes_sent(&self) -> u64 {
        self.bytes_sent.get()
    }

    /// Bytes received so far.
    pub fn bytes_received(&self) -> u64 {
        self.bytes_received.get()
    }

    /// Mismatches so far.
    pub fn mismatches(&self) -> u64 {
        self.mismatches.get()
    }

    /// Reports so far in `direction` of `kind`.
    pub fn misbehaviour_reports(&self, direction: Direction, kind: MisbehaviourKind) -> u64 {
        self.reports
            .get_or_create(&ReportLabels {
                direction: direction.as_str(),
                kind: kind_label(kind),
            })
            .get()
    }
}
