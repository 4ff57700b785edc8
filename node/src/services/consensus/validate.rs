//! The rules of the messages consensus owns — heartbeats, epoch plans and the pipeline
//! gossip — pure and unit-tested (no IO, no clock: time comes in as an argument). Every
//! verdict carries a typed reason whose label is the metric label.
//!
//! The rules, by message:
//! * **Heartbeats** must be fresh ([`HeartbeatGate`]); a late heartbeat can be honest (a slow
//!   mesh), and so can a miner waiting for its registration or a binding about to be renewed:
//!   those are ignored, never relayed, but their senders are not punished
//!   ([`heartbeat_verdict`]).
//! * **Who may publish a plan** ([`plan_verdict`]): the orchestrator this node elected. A
//!   plan of a permitted validator that is not (yet) the orchestrator here is ignored and
//!   kept to be checked again (the election may be changing hands); one of anybody else is
//!   rejected. Plans of an orchestrator already replaced, or judged without a metagraph, are
//!   not proof of malice and are ignored.
//! * **Epoch window.** Pipeline gossip must name the current epoch or the one before it
//!   (loss records and merges of the epoch that just closed arrive after the next plan).
//!   The next epoch is ignored until its plan is known (the router keeps a few such
//!   messages and checks them again when the plan arrives); anything further is ignored.
//! * **`Losses`** only from a tail miner of that epoch's plan, with the run's tokens per
//!   sample, each record's pathway one plan member per stage ending at the author, a finite
//!   loss, a sample that the pathway's head really draws in that epoch, a chain of hop
//!   receipts that proves the pathway ([`crate::wire::receipt`]: one per hop, each signed by
//!   that hop's peer for this run, epoch, sample and stage and naming the next hop, each
//!   link following the one before), and each sample counted once (a message of samples
//!   all claimed before is ignored, not punished: another tail may have served them too,
//!   on a retry). A refusal for receipts proves the author claimed work it cannot show
//!   ([`PipelineReason::forges_credit`]): validators hold it against it.
//! * **`ValLoss`** only from the evaluating head (the first head, in peer-id order), once
//!   per epoch, finite and non-negative.
//! * **`HeadDone`** only from a head, once per head and epoch, with counts within the plan.
//! * **`Merged`** only from a member of that stage in that epoch's plan, once (on a node
//!   that joined without the previous plan, from a member of that stage in the current one).
//! * **`Weights`** only from a permitted validator, once per epoch, within
//!   [`WEIGHTS_WINDOW`] closed epochs, one weight per uid. Weights for the epoch in force wait
//!   (like gossip of the next epoch) until it closes: a validator scores an epoch when the
//!   next plan reaches it, which may be before it reaches this node.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use bootstrap::{EpochPlan, PeerIdStr, RunConfig};

use super::plan_book::{stage_in, PlanBook};
use crate::rules::{Reason, Verdict};
use crate::run_spec::sample_id;
use crate::services::consensus::api::HeartbeatRejected;
use crate::wire::messages::{LossRecord, PipelineGossip};
use crate::wire::receipt::{self, ChainError};

/// Largest table of (sample → head) draws built per epoch; beyond it the draw check is
/// skipped (a run that large has `heads × epoch_samples` above a million samples an epoch).
const MAX_DRAWS: u64 = 1 << 20;

/// How far a heartbeat's send time may lie from this node's clock, in milliseconds. Nodes
/// keep their clocks within well under a second of each other (NTP); the bound is what a
/// replayed heartbeat can buy: a dead peer stays live at most this long after its last
/// real heartbeat plus the heartbeat timeout.
pub(crate) const MAX_HEARTBEAT_SKEW_MS: u64 = 15_000;

/// How many closed epochs back a validator's weights are still taken.
const WEIGHTS_WINDOW: u64 = 8;

/// Why a heartbeat is not fresh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Freshness {
    /// Sent too long ago, or in the future, by this node's clock.
    Stale,
    /// Not newer than the last one taken from its sender.
    Replayed,
}

impl Reason for Freshness {
    fn label(&self) -> &'static str {
        match self {
            Freshness::Stale => "stale_heartbeat",
            Freshness::Replayed => "replayed_heartbeat",
        }
    }
}

/// Freshness of heartbeats: each must be recent and newer than the last one taken from its
/// sender, ordered by (send time, counter), so a restarted sender (counter back at 1, a
/// later send time) is heard again while a recorded one cannot be replayed.
#[derive(Debug, Default)]
pub(crate) struct HeartbeatGate {
    last: HashMap<String, (u64, u64)>,
}

impl HeartbeatGate {
    /// Takes a heartbeat of `author` sent at `sent_at_ms` with `counter`, at `now_ms`.
    pub(crate) fn check(
        &mut self,
        author: &str,
        sent_at_ms: u64,
        counter: u64,
        now_ms: u64,
    ) -> Result<(), Freshness> {
        if sent_at_ms.abs_diff(now_ms) > MAX_HEARTBEAT_SKEW_MS {
            return Err(Freshness::Stale);
        }
        if self
            .last
            .get(author)
            .is_some_and(|&last| (sent_at_ms, counter) <= last)
        {
            return Err(Freshness::Replayed);
        }
        self.last.insert(author.to_string(), (sent_at_ms, counter));
        Ok(())
    }

    /// Forgets senders silent for longer than any acceptable heartbeat could be old.
    pub(crate) fn prune(&mut self, now_ms: u64) {
        self.last
            .retain(|_, (sent, _)| now_ms.saturating_sub(*sent) <= 2 * MAX_HEARTBEAT_SKEW_MS);
    }

    /// Senders remembered.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.last.len()
    }
}

/// The verdict on a heartbeat consensus judged.
pub(crate) fn heartbeat_verdict(
    judged: &Result<(), HeartbeatRejected>,
) -> Verdict<HeartbeatRejected> {
    match judged {
        Ok(()) => Verdict::Accept,
        // Another run's node is not malicious: it is on the wrong mesh.
        Err(rejected @ HeartbeatRejected::WrongRun { .. }) => Verdict::Ignore(rejected.clone()),
        // A late heartbeat can be honest (a slow mesh), and so can a miner waiting for its
        // registration: never relay them, but do not punish their senders.
        Err(
            rejected @ (HeartbeatRejected::NotFresh(_)
            | HeartbeatRejected::NotRegistered
            | HeartbeatRejected::StaleBinding),
        ) => Verdict::Ignore(rejected.clone()),
        Err(rejected) => Verdict::Reject(rejected.clone()),
    }
}

/// Why a plan received over gossip was not adopted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PlanRejected {
    /// It does not decode.
    Malformed,
    /// It does not follow the run configuration.
    MismatchesRun,
    /// Its merge start is not near this node's clock.
    MergeStart,
    /// It places more miners outside the metagraph than the run's open places.
    UnregisteredMiners,
    /// Its epoch is not after the plan in force, or the last one the election accepted.
    StaleEpoch,
    /// This node has no metagraph, so nobody is elected.
    NoMetagraph,
    /// Its author is not the orchestrator this node elected.
    NotOrchestrator,
    /// Refused by the election for another reason (another run, a wrong seed, an epoch
    /// jump): the label is the election's own.
    Election(&'static str),
}

impl Reason for PlanRejected {
    fn label(&self) -> &'static str {
        match self {
            PlanRejected::Malformed => "malformed_plan",
            PlanRejected::MismatchesRun => "plan_mismatches_run",
            PlanRejected::MergeStart => "plan_merge_start",
            PlanRejected::UnregisteredMiners => "plan_unregistered_miners",
            PlanRejected::StaleEpoch => "stale_epoch",
            PlanRejected::NoMetagraph => "no_metagraph",
            PlanRejected::NotOrchestrator => "not_orchestrator",
            PlanRejected::Election(label) => label,
        }
    }
}

impl From<&bootstrap::PlanRejected> for PlanRejected {
    fn from(rejected: &bootstrap::PlanRejected) -> Self {
        match rejected {
            bootstrap::PlanRejected::NotOrchestrator { .. } => PlanRejected::NotOrchestrator,
            bootstrap::PlanRejected::StaleEpoch { .. } => PlanRejected::StaleEpoch,
            other => PlanRejected::Election(other.reason()),
        }
    }
}

/// What happened to a plan received over gossip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PlanOutcome {
    /// Accepted: it is now the current plan.
    Accepted,
    /// Dropped, and why.
    Rejected(PlanRejected),
}

/// Who may publish a plan: the verdict on a plan whose `outcome` consensus decided, from an
/// author that is (`author_permitted`) or is not a permitted validator of the metagraph.
pub(crate) fn plan_verdict(outcome: PlanOutcome, author_permitted: bool) -> Verdict<PlanRejected> {
    match outcome {
        PlanOutcome::Accepted => Verdict::Accept,
        // Plans of an orchestrator this node has not heard yet, or already replaced, are
        // not proof of malice; forgeries by the wrong author are.
        PlanOutcome::Rejected(reason @ (PlanRejected::StaleEpoch | PlanRejected::NoMetagraph)) => {
            Verdict::Ignore(reason)
        }
        PlanOutcome::Rejected(reason @ PlanRejected::NotOrchestrator) => {
            if author_permitted {
                Verdict::Ignore(reason)
            } else {
                Verdict::Reject(reason)
            }
        }
        PlanOutcome::Rejected(reason) => Verdict::Reject(reason),
    }
}

/// Whether a plan with this verdict waits for the election: a permitted validator's plan
/// this node does not yet see as the orchestrator's (it just started, or the election is
/// changing hands), kept to be checked again rather than losing the epoch to its timeout.
pub(crate) fn waits_for_election(verdict: &Verdict<PlanRejected>) -> bool {
    *verdict == Verdict::Ignore(PlanRejected::NotOrchestrator)
}

/// Whether a plan with this verdict may yet be its orchestrator's, once this node's
/// metagraph has filled in: its author is no permitted validator here, or it names miners
/// the metagraph does not hold, or there is no metagraph yet. A node that just started
/// cannot tell these from a forgery until it hears the peers' heartbeats (and, with stake
/// from the chain, verifies their hotkey bindings). The verdict stands; the router keeps
/// such a plan apart for a while (see `reprocess`).
pub(crate) fn waits_for_metagraph(verdict: &Verdict<PlanRejected>) -> bool {
    matches!(
        verdict,
        Verdict::Reject(PlanRejected::NotOrchestrator | PlanRejected::UnregisteredMiners)
            | Verdict::Ignore(PlanRejected::NoMetagraph)
    )
}

/// Why pipeline gossip was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PipelineReason {
    /// It does not decode.
    Malformed,
    /// This node has no plan at all yet.
    NoPlanYet,
    /// It is of the next epoch, whose plan is not known yet.
    NoPlanForEpoch,
    /// Its epoch is outside the window.
    EpochOutOfWindow,
    /// Loss records not from a tail of the plan.
    LossesNotTail,
    /// Loss records with other tokens per sample than the run's.
    LossesBadTokens,
    /// A record with a wrong pathway or a bad loss.
    LossesBadRecord,
    /// A record of a sample its head does not draw.
    LossesNotDrawn,
    /// Every sample was claimed before.
    LossesDuplicate,
    /// A record without one receipt per hop of its pathway.
    LossesNoReceipts,
    /// A record whose receipts are not signed by its pathway's peers for that sample (a
    /// forged chain, another sample's or another pathway's).
    LossesBadReceipt,
    /// A record whose receipts do not follow one another.
    LossesBrokenChain,
    /// A held-out loss not from the evaluating head.
    ValLossNotEvaluator,
    /// A held-out loss that is not finite and non-negative.
    ValLossBadValue,
    /// A second held-out loss for the epoch.
    ValLossDuplicate,
    /// A head-done report not from a head.
    HeadDoneNotHead,
    /// Counts beyond the plan's.
    HeadDoneBadCounts,
    /// A second report of the head for the epoch.
    HeadDoneDuplicate,
    /// A merged hash not from a member of that stage.
    MergedNotMember,
    /// A second merged hash of the member for the stage.
    MergedDuplicate,
    /// Weights judged elsewhere (never given: weights are judged before the plan window).
    WeightsElsewhere,
    /// Weights not from a permitted validator.
    WeightsNotValidator,
    /// More weights than a plan has miners.
    WeightsTooMany,
    /// A uid weighed twice.
    WeightsDuplicateUid,
    /// A second vector of the validator for the epoch.
    WeightsDuplicate,
}

impl Reason for PipelineReason {
    fn label(&self) -> &'static str {
        match self {
            PipelineReason::Malformed => "malformed_pipeline",
            PipelineReason::NoPlanYet => "no_plan_yet",
            PipelineReason::NoPlanForEpoch => "no_plan_for_epoch",
            PipelineReason::EpochOutOfWindow => "epoch_out_of_window",
            PipelineReason::LossesNotTail => "losses_not_tail",
            PipelineReason::LossesBadTokens => "losses_bad_tokens",
            PipelineReason::LossesBadRecord => "losses_bad_record",
            PipelineReason::LossesNotDrawn => "losses_not_drawn",
            PipelineReason::LossesDuplicate => "losses_duplicate",
            PipelineReason::LossesNoReceipts => "losses_no_receipts",
            PipelineReason::LossesBadReceipt => "losses_bad_receipt",
            PipelineReason::LossesBrokenChain => "losses_broken_chain",
            PipelineReason::ValLossNotEvaluator => "val_loss_not_evaluator",
            PipelineReason::ValLossBadValue => "val_loss_bad_value",
            PipelineReason::ValLossDuplicate => "val_loss_duplicate",
            PipelineReason::HeadDoneNotHead => "head_done_not_head",
            PipelineReason::HeadDoneBadCounts => "head_done_bad_counts",
            PipelineReason::HeadDoneDuplicate => "head_done_duplicate",
            PipelineReason::MergedNotMember => "merged_not_member",
            PipelineReason::MergedDuplicate => "merged_duplicate",
            PipelineReason::WeightsElsewhere => "weights_elsewhere",
            PipelineReason::WeightsNotValidator => "weights_not_validator",
            PipelineReason::WeightsTooMany => "weights_too_many",
            PipelineReason::WeightsDuplicateUid => "weights_duplicate_uid",
            PipelineReason::WeightsDuplicate => "weights_duplicate",
        }
    }
}

impl PipelineReason {
    /// Whether the refusal proves its sender claimed credit for work it cannot show: loss
    /// records whose receipts do not prove their pathway. An honest tail checks the chain it
    /// receives before serving and signs its own, so it never sends one.
    pub(crate) fn forges_credit(&self) -> bool {
        matches!(
            self,
            PipelineReason::LossesNoReceipts
                | PipelineReason::LossesBadReceipt
                | PipelineReason::LossesBrokenChain
        )
    }
}

/// Whether pipeline gossip with this verdict waits for the next epoch's plan.
pub(crate) fn waits_for_plan(verdict: &Verdict<PipelineReason>) -> bool {
    *verdict == Verdict::Ignore(PipelineReason::NoPlanForEpoch)
}

type Pipeline = Verdict<PipelineReason>;

/// What was already accepted in one epoch.
#[derive(Debug, Default)]
struct Seen {
    samples: HashSet<u64>,
    val_loss: bool,
    heads_done: BTreeSet<String>,
    merged: BTreeSet<(u32, String)>,
    /// Sample id → index of the head that draws it; `None` until built, or when too large.
    draws: Option<HashMap<u64, usize>>,
}

/// The rules of the pipeline topic, with what each epoch has already accepted.
#[derive(Debug)]
pub(crate) struct PipelineRules {
    tokens_per_sample: u64,
    /// The run's id, which hop receipts are signed for.
    run_id: u64,
    epochs: BTreeMap<u64, Seen>,
    /// Peer ids of the metagraph's validators with a permit (who may publish weights).
    validators: BTreeSet<PeerIdStr>,
    /// (epoch, validator) of the weights accepted within the window.
    weights_seen: BTreeSet<(u64, String)>,
}

impl PipelineRules {
    /// Rules for `run`.
    pub(crate) fn new(run: &RunConfig) -> Self {
        PipelineRules {
            tokens_per_sample: u64::from(run.batch_size) * u64::from(run.seq_len),
            run_id: crate::run_spec::run_id(run),
            epochs: BTreeMap::new(),
            validators: BTreeSet::new(),
            weights_seen: BTreeSet::new(),
        }
    }

    /// Who may publish weights: the metagraph's validators with a permit.
    pub(crate) fn set_validators(&mut self, validators: BTreeSet<PeerIdStr>) {
        self.validators = validators;
    }

    /// Judges `message` signed by `author`; remembers what it accepts.
    pub(crate) fn check(
        &mut self,
        book: &PlanBook,
        author: &str,
        message: &PipelineGossip,
    ) -> Pipeline {
        let epoch = epoch_of(message);
        let Some(current) = book.current().map(|p| p.epoch) else {
            return Verdict::Ignore(PipelineReason::NoPlanYet);
        };
        if let PipelineGossip::Weights { weights, .. } = message {
            return self.check_weights(current, epoch, author, weights);
        }
        if current.checked_add(1) == Some(epoch) {
            return Verdict::Ignore(PipelineReason::NoPlanForEpoch);
        }
        // A node catching up (restarted with an old plan) keeps the merge hashes of epochs
        // ahead of it until their plans arrive: it needs them to load its stage.
        if matches!(message, PipelineGossip::Merged { .. }) && epoch > current {
            return Verdict::Ignore(PipelineReason::NoPlanForEpoch);
        }
        // A node that joined with the current plan never had the previous one, but needs
        // the hashes of the merges closing it to load a stage: it takes them from the
        // members of that stage in the plan in force (it then loads only a snapshot that
        // hashes to them, and none when members disagree).
        let joined_late_merge = matches!(message, PipelineGossip::Merged { .. })
            && epoch.checked_add(1) == Some(current)
            && book.recent(epoch).is_none();
        let Some(plan) = book
            .recent(epoch)
            .or_else(|| joined_late_merge.then(|| book.current()).flatten())
        else {
            return Verdict::Ignore(PipelineReason::EpochOutOfWindow);
        };
        // Forget epochs that left the window.
        while self
            .epochs
            .first_key_value()
            .is_some_and(|(&e, _)| e.saturating_add(1) < current)
        {
            self.epochs.pop_first();
        }
        let seen = self.epochs.entry(epoch).or_default();
        match message {
            PipelineGossip::Losses {
                tokens_per_sample,
                records,
                ..
            } => check_losses(
                plan,
                seen,
                (self.run_id, self.tokens_per_sample),
                author,
                *tokens_per_sample,
                records,
            ),
            PipelineGossip::ValLoss { loss, .. } => check_val_loss(plan, seen, author, *loss),
            PipelineGossip::HeadDone {
                samples, dropped, ..
            } => check_head_done(plan, seen, author, *samples, *dropped),
            // Judged above, before the plan window.
            PipelineGossip::Weights { .. } => Verdict::Ignore(PipelineReason::WeightsElsewhere),
            PipelineGossip::Merged { stage, .. } => {
                if !plan.miners_of(*stage).any(|m| m.as_str() == author) {
                    Verdict::Reject(PipelineReason::MergedNotMember)
                } else if !seen.merged.insert((*stage, author.to_string())) {
                    Verdict::Reject(PipelineReason::MergedDuplicate)
                } else {
                    Verdict::Accept
                }
            }
        }
    }

    /// A validator's weights for a closed `epoch`: a validator scores an epoch a few seconds
    /// after it closes, when short epochs may have moved on by more than one, so the window
    /// is [`WEIGHTS_WINDOW`] closed epochs rather than the plan's; no plan is needed to judge
    /// them, only who sent them.
    fn check_weights(
        &mut self,
        current: u64,
        epoch: u64,
        author: &str,
        weights: &[(u16, u16)],
    ) -> Pipeline {
        let uids: BTreeSet<u16> = weights.iter().map(|(uid, _)| *uid).collect();
        if !self.validators.contains(author) {
            return Verdict::Reject(PipelineReason::WeightsNotValidator);
        }
        if epoch == current {
            return Verdict::Ignore(PipelineReason::NoPlanForEpoch);
        }
        if epoch > current || current - epoch > WEIGHTS_WINDOW {
            return Verdict::Ignore(PipelineReason::EpochOutOfWindow);
        }
        if weights.len() > bootstrap::MAX_PLAN_MINERS {
            return Verdict::Reject(PipelineReason::WeightsTooMany);
        }
        if uids.len() != weights.len() {
            return Verdict::Reject(PipelineReason::WeightsDuplicateUid);
        }
        self.weights_seen
            .retain(|(e, _)| current - WEIGHTS_WINDOW.min(current) <= *e);
        if !self.weights_seen.insert((epoch, author.to_string())) {
            return Verdict::Reject(PipelineReason::WeightsDuplicate);
        }
        Verdict::Accept
    }
}

/// The epoch a pipeline message is about.
pub(crate) fn epoch_of(message: &PipelineGossip) -> u64 {
    match message {
        PipelineGossip::Losses { epoch, .. }
        | PipelineGossip::ValLoss { epoch, .. }
        | PipelineGossip::HeadDone { epoch, .. }
        | PipelineGossip::Weights { epoch, .. }
        | PipelineGossip::Merged { epoch, .. } => *epoch,
    }
}

/// A held-out loss: from the evaluating head, finite and non-negative, once.
fn check_val_loss(plan: &EpochPlan, seen: &mut Seen, author: &str, loss: f32) -> Pipeline {
    if plan.miners_of(0).next().map(PeerIdStr::as_str) != Some(author) {
        Verdict::Reject(PipelineReason::ValLossNotEvaluator)
    } else if !(loss.is_finite() && loss >= 0.0) {
        Verdict::Reject(PipelineReason::ValLossBadValue)
    } else if seen.val_loss {
        Verdict::Reject(PipelineReason::ValLossDuplicate)
    } else {
        seen.val_loss = true;
        Verdict::Accept
    }
}

/// A head's report that its samples are done: from a head, within the plan, once.
fn check_head_done(
    plan: &EpochPlan,
    seen: &mut Seen,
    author: &str,
    samples: u64,
    dropped: u64,
) -> Pipeline {
    if !plan.miners_of(0).any(|h| h.as_str() == author) {
        Verdict::Reject(PipelineReason::HeadDoneNotHead)
    } else if samples
        .checked_add(dropped)
        .is_none_or(|n| n > plan.epoch_samples)
    {
        Verdict::Reject(PipelineReason::HeadDoneBadCounts)
    } else if !seen.heads_done.insert(author.to_string()) {
        Verdict::Reject(PipelineReason::HeadDoneDuplicate)
    } else {
        Verdict::Accept
    }
}

/// Loss records: all of them valid, or the message is refused whole. Each record's
/// receipts are checked after every record's shape (the signatures cost the most): at most
/// one signature per stage per record, and the message is bounded before it is parsed.
fn check_losses(
    plan: &EpochPlan,
    seen: &mut Seen,
    (run_id, run_tokens): (u64, u64),
    author: &str,
    tokens: u64,
    records: &[LossRecord],
) -> Pipeline {
    let tail = plan.stages.saturating_sub(1);
    if !plan.miners_of(tail).any(|m| m.as_str() == author) {
        return Verdict::Reject(PipelineReason::LossesNotTail);
    }
    if tokens != run_tokens {
        return Verdict::Reject(PipelineReason::LossesBadTokens);
    }
    let draws = seen.draws.get_or_insert_with(|| draws_of(plan));
    let heads: Vec<&PeerIdStr> = plan.miners_of(0).collect();
    let mut fresh = HashSet::with_capacity(records.len());
    for record in records {
        let pathway_ok = record.pathway.len() == plan.stages as usize
            && record.pathway.last().map(String::as_str) == Some(author)
            && record
                .pathway
                .iter()
                .enumerate()
                .all(|(stage, peer)| stage_in(plan, peer) == Some(stage as u32));
        if !pathway_ok || !record.loss.is_finite() || record.loss < 0.0 {
            return Verdict::Reject(PipelineReason::LossesBadRecord);
        }
        if !draws.is_empty() {
            let drawn_by = draws.get(&record.sample).and_then(|&i| heads.get(i));
            if drawn_by.map(|h| h.as_str()) != record.pathway.first().map(String::as_str) {
                return Verdict::Reject(PipelineReason::LossesNotDrawn);
            }
        }
        // A sample already claimed is skipped, not held against the author: another tail
        // may have claimed it first, falsely (validators catch that tail: it cannot show
        // the sample). The validator's ledger keeps the first record of each sample.
        if !seen.samples.contains(&record.sample) {
            fresh.insert(record.sample);
        }
    }
    // Receipts: the proof that each sample travelled its pathway to the author. A record
    // of a sample claimed before is checked too: a forgery is one whoever came first.
    for record in records {
        let sample = receipt::Sample {
            run: run_id,
            epoch: plan.epoch,
            sample: record.sample,
            pathway: &record.pathway,
        };
        if let Err(error) = receipt::verify_chain(&sample, &record.receipts, None) {
            return Verdict::Reject(match error {
                ChainError::Missing { .. } => PipelineReason::LossesNoReceipts,
                ChainError::UnknownKey { .. } | ChainError::BadSignature { .. } => {
                    PipelineReason::LossesBadReceipt
                }
                ChainError::Broken { .. } => PipelineReason::LossesBrokenChain,
            });
        }
    }
    if fresh.is_empty() {
        return Verdict::Ignore(PipelineReason::LossesDuplicate);
    }
    seen.samples.extend(fresh);
    Verdict::Accept
}

/// Every sample the heads of `plan` draw, with the drawing head's index; empty when the
/// table would pass [`MAX_DRAWS`].
fn draws_of(plan: &EpochPlan) -> HashMap<u64, usize> {
    let heads = plan.miners_of(0).count() as u64;
    if heads.saturating_mul(plan.epoch_samples) > MAX_DRAWS {
        return HashMap::new();
    }
    let mut draws = HashMap::new();
    for index in 0..heads {
        for counter in 0..plan.epoch_samples {
            draws.insert(sample_id(plan.seed, index, counter), index as usize);
        }
    }
    draws
}

#[cfg(test)]
mod tests;
