//! What other parts of the node may use of the validator service: its inbox messages, handle
//! and the weights it publishes.

#![allow(unused_imports)]
use std::collections::{BTreeMap, BTreeSet};

use bootstrap::{EpochPlan, PeerIdStr};
use p2p::{Heartbeat, PeerId};
use tokio::sync::{mpsc, oneshot, watch};

use crate::services::inbox::{ask, send, ServiceGone};
use crate::services::merge::api::{AuditFinding, AuditVerdict};
use crate::wire::messages::{PipelineGossip, Service};
// Validator: checks the miners' work.

/// One miner's line in a validator's weights of an epoch.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct MinerWeight {
    /// The miner's uid in the metagraph.
    pub(crate) uid: u16,
    /// Its peer id.
    pub(crate) peer_id: String,
    /// The stage it served in the epoch.
    pub(crate) stage: u32,
    /// Samples it served to completion (authenticated loss records naming it).
    pub(crate) samples: u64,
    /// Its CLASP effect on the loss (nats; positive is harm), when the fit ran.
    pub(crate) effect: Option<f64>,
    /// The effect's standard error.
    pub(crate) standard_error: Option<f64>,
    /// Quality 0 for the epoch: CLASP flagged it, a spot check or a merge audit caught it.
    pub(crate) flagged: bool,
    /// Why it was flagged (`clasp`, `spot_check: …`, `merge_audit: …`).
    pub(crate) reason: Option<String>,
    /// Its weight in chain form (the largest is 65 535), from the smoothed scores.
    pub(crate) weight: u16,
}

/// A validator's weights after an epoch.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct EpochWeights {
    /// The epoch scored.
    pub(crate) epoch: u64,
    /// Authenticated loss records it was scored from.
    pub(crate) records: u64,
    /// Why the CLASP fit did not run, if it did not (the work is still counted).
    pub(crate) fit_error: Option<String>,
    /// Per miner, by uid.
    pub(crate) miners: Vec<MinerWeight>,
    /// Spot checks that ended while this epoch was scored: passed, failed, inconclusive.
    #[serde(default)]
    pub(crate) spot_checks: SpotCheckCounts,
}

/// Spot checks by outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct SpotCheckCounts {
    /// Recomputed and reproduced.
    pub(crate) passed: u64,
    /// Recomputed and not reproduced (the miner is caught).
    pub(crate) failed: u64,
    /// Not concluded (no answer, evidence superseded by a merge, …).
    pub(crate) inconclusive: u64,
}

/// The validator service's inbox.
pub(crate) enum ValidatorMsg {
    /// Consensus moved from `closed` to `next`: the merges closing `closed` run now.
    EpochClosed {
        closed: Box<EpochPlan>,
        next: Box<EpochPlan>,
    },
    /// Loss records the router accepted (from the plan's tails, each sample once).
    Losses {
        epoch: u64,
        records: Vec<crate::wire::messages::LossRecord>,
    },
    /// Score `epoch` now: its last loss records have had time to arrive.
    Score(Box<EpochPlan>),
    /// A stage's replicas gossiped the hash of their merged weights (the weights every
    /// replica starts the next epoch from).
    Merged {
        epoch: u64,
        stage: u32,
        hash: String,
    },
    /// A merge audit named a miner.
    AuditFinding(AuditFinding),
    /// The audit of the merge of `stage` closing `epoch` ended.
    Audited {
        epoch: u64,
        stage: u32,
        verdict: AuditVerdict,
    },
    /// A joining replica asks which merge hash the audit confirmed.
    Confirmation {
        request: crate::wire::messages::ConfirmationRequest,
        reply: oneshot::Sender<crate::wire::messages::ConfirmationReply>,
    },
    /// Time for the next spot check (the service's own timer).
    SpotTick,
    /// A spot check ended.
    Checked(Box<SpotCheckDone>),
}

/// A finished spot check, as the validator service records it.
#[derive(Debug, Clone)]
pub(crate) struct SpotCheckDone {
    /// Epoch of the sample checked.
    pub(crate) epoch: u64,
    /// The miner checked.
    pub(crate) peer: String,
    /// Its stage.
    pub(crate) stage: u32,
    /// The sample.
    pub(crate) sample: u64,
    /// `None` when passed; the failure's reason; or an inconclusive check's reason.
    pub(crate) failed: Option<&'static str>,
    /// Why nothing could be concluded, when nothing could.
    pub(crate) inconclusive: Option<&'static str>,
}

/// The validator service, as the router sees it.
#[derive(Clone)]
pub(crate) struct ValidatorHandle {
    pub(crate) tx: mpsc::Sender<ValidatorMsg>,
    /// The latest epoch's weights.
    pub(crate) weights: watch::Receiver<Option<EpochWeights>>,
}

impl ValidatorHandle {
    /// Hands the validator accepted loss records.
    pub(crate) async fn losses(
        &self,
        epoch: u64,
        records: Vec<crate::wire::messages::LossRecord>,
    ) -> Result<(), ServiceGone> {
        send(
            &self.tx,
            "validator",
            ValidatorMsg::Losses { epoch, records },
        )
        .await
    }

    /// Hands the validator a stage's accepted merge hash.
    pub(crate) async fn merged(
        &self,
        epoch: u64,
        stage: u32,
        hash: String,
    ) -> Result<(), ServiceGone> {
        send(
            &self.tx,
            "validator",
            ValidatorMsg::Merged { epoch, stage, hash },
        )
        .await
    }

    /// The validator's word on the merge a request asks about.
    pub(crate) async fn confirmation(
        &self,
        request: crate::wire::messages::ConfirmationRequest,
    ) -> Result<crate::wire::messages::ConfirmationReply, ServiceGone> {
        ask(&self.tx, "validator", |reply| ValidatorMsg::Confirmation {
            request,
            reply,
        })
        .await
    }

    /// Tells the validator an epoch closed.
    pub(crate) async fn epoch_closed(
        &self,
        closed: EpochPlan,
        next: EpochPlan,
    ) -> Result<(), ServiceGone> {
        send(
            &self.tx,
            "validator",
            ValidatorMsg::EpochClosed {
                closed: Box::new(closed),
                next: Box::new(next),
            },
        )
        .await
    }
}

/// What a joiner makes of the validators' word on a merge.
pub(crate) use super::confirmation::{decide, Decision};
/// The spot-check reply parser, for the fuzzer.
pub(crate) use super::spot::{parse_reply, Target};
/// The rules of spot-check and confirmation requests.
pub(crate) use super::validate::{confirmation_request, spot_check_request};
/// Starting the service.
pub(crate) use super::{spawn, ValidatorParts};
