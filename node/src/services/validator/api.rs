//! What other parts of the node may use of the validator service: its inbox messages, handle
//! and the weights it publishes, the confirmation a joiner makes of the validators' word,
//! and the spot-check reply parser (for the fuzzer).

use std::collections::BTreeMap;
use std::path::PathBuf;

use bootstrap::{EpochPlan, PeerIdStr, RunConfig};
use tokio::sync::{mpsc, oneshot, watch};

use super::dodges::Tally;
use crate::services::consensus::api::ConsensusHandle;
use crate::services::data::api::DataHandle;
use crate::services::inbox::{ask, send, ServiceGone};
use crate::services::merge::api::MergeHandle;
use crate::wire::messages::{ConfirmationReply, ConfirmationRequest, LossRecord};

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
    /// Why it was flagged: a [`super::scoring::CatchReason`] as text (`clasp`,
    /// `spot_check: …`, `merge_audit: …`, `probation after …`).
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
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct SpotCheckCounts {
    /// Recomputed and reproduced.
    pub(crate) passed: u64,
    /// Recomputed and not reproduced (the miner is caught).
    pub(crate) failed: u64,
    /// Not concluded (no answer, evidence superseded by a merge, …).
    pub(crate) inconclusive: u64,
    /// Of the inconclusive ones, those the miner ended without evidence (`Superseded`,
    /// `NotHeld`, an error, no answer): dodges, counted against it.
    #[serde(default)]
    pub(crate) dodged: u64,
    /// Per miner (its peer id), the checks of the scored epoch's samples so far and its
    /// dodges among them.
    #[serde(default)]
    pub(crate) miners: BTreeMap<String, Tally>,
}

/// The validator service's inbox: what other parts of the node tell or ask it. (Its own
/// timers and the results of its spot checks and audits are its task's, not messages.)
pub(crate) enum ValidatorMsg {
    /// Consensus moved from `closed` to `next`: the merges closing `closed` run now.
    EpochClosed {
        closed: Box<EpochPlan>,
        next: Box<EpochPlan>,
    },
    /// Loss records the router accepted (from the plan's tails, each sample once).
    Losses {
        epoch: u64,
        records: Vec<LossRecord>,
    },
    /// The router refused loss records of `epoch` from `peer` because their receipts do not
    /// prove their pathways (`why`: the refusal's label): credit claimed for work it cannot
    /// show, held against it.
    ForgedLosses {
        epoch: u64,
        peer: PeerIdStr,
        why: &'static str,
    },
    /// A stage's replicas gossiped the hash of their merged weights (the weights every
    /// replica starts the next epoch from).
    Merged {
        epoch: u64,
        stage: u32,
        hash: String,
    },
    /// A joining replica asks which merge hash the audit confirmed.
    Confirmation {
        request: ConfirmationRequest,
        reply: oneshot::Sender<ConfirmationReply>,
    },
}

/// What the service needs besides its inbox.
pub(crate) struct ValidatorParts {
    /// The merge service (audits).
    pub(crate) merge: MergeHandle,
    /// Where `weights/<epoch>.json` goes.
    pub(crate) data_dir: Option<PathBuf>,
    /// Consensus, which combines the validators' weights (this one's too).
    pub(crate) consensus: ConsensusHandle,
    /// The network, for publishing the weights.
    pub(crate) client: p2p::Client,
    /// The pipeline topic the weights go on.
    pub(crate) topic: String,
    /// This node's peer id.
    pub(crate) me: PeerIdStr,
    /// The run (spot checks recompute its stages).
    pub(crate) run: RunConfig,
    /// Where and in what precision spot checks compute.
    pub(crate) compute: crate::run_spec::Compute,
    /// The run's data: the ids a head sends are checked against it.
    pub(crate) data: DataHandle,
    /// Seeds the spot checks' schedule: derived from this node's private key.
    pub(crate) secret: [u8; 32],
    /// Misbehaviour on purpose: publish skewed weights (the hidden `skew-weights` fault).
    pub(crate) skew_weights: bool,
}

/// The validator service, as the router sees it.
#[derive(Clone)]
pub(crate) struct ValidatorHandle {
    tx: mpsc::Sender<ValidatorMsg>,
    /// The latest epoch's weights.
    pub(crate) weights: watch::Receiver<Option<EpochWeights>>,
}

impl ValidatorHandle {
    /// The handle of the task reading `tx`'s inbox and publishing `weights`.
    pub(super) fn new(
        tx: mpsc::Sender<ValidatorMsg>,
        weights: watch::Receiver<Option<EpochWeights>>,
    ) -> ValidatorHandle {
        ValidatorHandle { tx, weights }
    }

    /// Hands the validator accepted loss records.
    pub(crate) async fn losses(
        &self,
        epoch: u64,
        records: Vec<LossRecord>,
    ) -> Result<(), ServiceGone> {
        send(
            &self.tx,
            "validator",
            ValidatorMsg::Losses { epoch, records },
        )
        .await
    }

    /// Tells the validator that `peer` sent loss records of `epoch` with forged receipts.
    pub(crate) async fn forged_losses(
        &self,
        epoch: u64,
        peer: PeerIdStr,
        why: &'static str,
    ) -> Result<(), ServiceGone> {
        send(
            &self.tx,
            "validator",
            ValidatorMsg::ForgedLosses { epoch, peer, why },
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
        request: ConfirmationRequest,
    ) -> Result<ConfirmationReply, ServiceGone> {
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
/// The spot-check reply parser and the evidence's gathering, for the fuzzer.
pub(crate) use super::spot::{
    parse_reply,
    transfer::{Assembly, Bounds},
    Reply, Target,
};
/// What recomputes a spot check and what it concludes, for the end-to-end check test.
#[cfg(test)]
pub(crate) use super::spot::{Checker, Outcome, SpotFailure};
/// Starting the service.
pub(crate) use super::task::spawn;
/// The rules of spot-check and confirmation requests.
pub(crate) use super::validate::{confirmation_request, spot_check_request};

/// A validator's spot-check schedule: when checks start (`iota-p2p simulate` drives it).
pub(crate) use super::spot::Schedule as SpotSchedule;
