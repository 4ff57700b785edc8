//! What other parts of the node may use of the merge service: its inbox messages and handle
//! (the butterfly all-reduce and its audits).

use std::collections::{BTreeMap, BTreeSet};

use bootstrap::{EpochPlan, PeerIdStr};
use p2p::PeerId;
use tokio::sync::{mpsc, oneshot};

use crate::services::inbox::{ask, send, ServiceGone};

/// What the miner asks the merge service to merge.
#[derive(Debug, Clone)]
pub(crate) struct MergeRequest {
    /// Epoch the merge closes.
    pub(crate) epoch: u64,
    /// Stage merged.
    pub(crate) stage: u32,
    /// The epoch's seed (it draws the butterfly partners).
    pub(crate) seed: u64,
    /// The stage's replicas in the epoch's plan, sorted.
    pub(crate) members: Vec<PeerIdStr>,
    /// This replica's weights.
    pub(crate) weights: Vec<f32>,
    /// Samples this replica processed in the epoch (its weight in the average).
    pub(crate) samples: u64,
    /// Wall-clock start of the merge (the same on every member).
    pub(crate) start: std::time::SystemTime,
    /// Cap on every member's sample count: the most samples the epoch's plan can feed.
    pub(crate) max_samples: u64,
}

/// The peers a merge's partitions are served to: the members of that stage in the plans of
/// recent epochs, and the validators (who audit merges).
#[derive(Debug, Default, Clone)]
pub(crate) struct Readers {
    /// (epoch, stage) → members.
    pub(crate) members: BTreeMap<(u64, u32), BTreeSet<PeerIdStr>>,
    /// Validators with a permit.
    pub(crate) validators: BTreeSet<PeerIdStr>,
}

/// What the merge service made of a gossip message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MergeGossip {
    /// Butterfly gossip, delivered to its merge or audit.
    Delivered,
    /// Butterfly gossip refused, with the metric label.
    Refused(&'static str),
    /// Butterfly gossip of a merge this node cannot judge: neither delivered nor relayed.
    Ignored(&'static str),
    /// Not butterfly gossip.
    NotButterfly,
}

/// What the merge service answers a request with.
pub(crate) enum MergeAnswer {
    /// The answer to send.
    Reply(Vec<u8>),
    /// The requester may not ask this (the metric label).
    Refused(&'static str),
    /// The request is not for the merge service.
    NotMine,
}

/// The merge service's inbox.
pub(crate) enum MergeMsg {
    /// Gossip on a topic of no other service.
    Gossip {
        author: PeerId,
        topic: String,
        data: Vec<u8>,
        reply: oneshot::Sender<MergeGossip>,
    },
    /// A request with no pipeline tag.
    Request {
        peer: PeerId,
        data: Vec<u8>,
        reply: oneshot::Sender<MergeAnswer>,
    },
    /// Who may fetch partitions from now on.
    Readers(Readers),
    /// Merge this replica's weights with the stage's other replicas.
    Merge {
        request: Box<MergeRequest>,
        reply: oneshot::Sender<anyhow::Result<Vec<f32>>>,
    },
    /// Audit the merges closing `closed`, which start as `next` says; every miner found
    /// misbehaving is sent on `findings`.
    Audit {
        closed: Box<EpochPlan>,
        next: Box<EpochPlan>,
        findings: mpsc::Sender<AuditEvent>,
    },
}

/// The merge service, as the router, the miner and the validator see it.
#[derive(Clone)]
pub(crate) struct MergeHandle {
    pub(crate) tx: mpsc::Sender<MergeMsg>,
}

impl MergeHandle {
    /// Routes gossip to the merge service.
    pub(crate) async fn gossip(
        &self,
        author: PeerId,
        topic: &str,
        data: Vec<u8>,
    ) -> Result<MergeGossip, ServiceGone> {
        ask(&self.tx, "merge", |reply| MergeMsg::Gossip {
            author,
            topic: topic.to_string(),
            data,
            reply,
        })
        .await
    }

    /// Has the merge service answer a request.
    pub(crate) async fn request(
        &self,
        peer: PeerId,
        data: Vec<u8>,
    ) -> Result<MergeAnswer, ServiceGone> {
        ask(&self.tx, "merge", |reply| MergeMsg::Request {
            peer,
            data,
            reply,
        })
        .await
    }

    /// Sets who may fetch partitions.
    pub(crate) async fn set_readers(&self, readers: Readers) -> Result<(), ServiceGone> {
        send(&self.tx, "merge", MergeMsg::Readers(readers)).await
    }

    /// Merges a replica's weights; returns the merged weights.
    pub(crate) async fn merge(&self, request: MergeRequest) -> anyhow::Result<Vec<f32>> {
        ask(&self.tx, "merge", |reply| MergeMsg::Merge {
            request: Box::new(request),
            reply,
        })
        .await?
    }

    /// Starts the audit of the merges closing `closed`.
    pub(crate) async fn audit(
        &self,
        closed: EpochPlan,
        next: EpochPlan,
        findings: mpsc::Sender<AuditEvent>,
    ) -> Result<(), ServiceGone> {
        send(
            &self.tx,
            "merge",
            MergeMsg::Audit {
                closed: Box::new(closed),
                next: Box::new(next),
                findings,
            },
        )
        .await
    }
}

/// What an audit sends back while and when it ends.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum AuditEvent {
    /// A member named.
    Finding(AuditFinding),
    /// The audit of one stage's merge ended.
    Done {
        epoch: u64,
        stage: u32,
        verdict: AuditVerdict,
    },
}

/// How the audit of one stage's merge ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AuditVerdict {
    /// Every sampled partition had a claim, and every claim reproduced.
    Clean,
    /// It named a member.
    Caught,
    /// It could not finish (a sampled partition without a claim, or no audit plan).
    Incomplete,
}

/// A miner a merge audit found misbehaving.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AuditFinding {
    /// Epoch of the merge.
    pub(crate) epoch: u64,
    /// The accused member's peer id.
    pub(crate) accused: PeerIdStr,
    /// What it did.
    pub(crate) kind: FindingKind,
}

/// What a merge audit found a member doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FindingKind {
    /// A report of the butterfly protocol (a wrong average, an equivocation, …).
    Misbehaviour(training::butterfly::MisbehaviourKind),
    /// It claimed more samples than the epoch's plan can feed (its weight was capped).
    InflatedSamples,
}

impl std::fmt::Display for FindingKind {
    /// The kind as a miner's reason shows it after `merge_audit: ` (the butterfly's own
    /// variant name, e.g. `WrongAverage`, or `InflatedSamples`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FindingKind::Misbehaviour(kind) => write!(f, "{kind:?}"),
            FindingKind::InflatedSamples => f.write_str("InflatedSamples"),
        }
    }
}

/// Starting the service.
pub(crate) use super::task::spawn;

/// The merge plan of a stage, as every member computes it (`iota-p2p simulate` derives a
/// merge's traffic from it).
pub(crate) use super::plan_of;
