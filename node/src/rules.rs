//! Who may say what, and when: every authorisation rule the router applies before a service
//! sees a message, in one place, pure and unit-tested (no IO, no clock: time comes in as an
//! argument).
//!
//! A message that breaks a rule never reaches a service. Gossip gets a [`Verdict`] that goes
//! back to gossipsub (`Reject` penalises the sender through peer scoring and stops the relay;
//! `Ignore` drops quietly what may be honest but cannot be used, such as a message of an
//! epoch this node has no plan for); a request gets a [`Refusal`] answered at once with an
//! error response. Each carries a short reason, the label of
//! `iota_gossip_rejected_total{reason}` or `iota_requests_rejected_total{reason}`.
//!
//! The rules, by message:
//! * **Epoch window.** Pipeline gossip must name the current epoch or the one before it
//!   (loss records and merges of the epoch that just closed arrive after the next plan).
//!   The next epoch is ignored until its plan is known (the router keeps a few such
//!   messages and checks them again when the plan arrives); anything further is ignored.
//! * **`Losses`** only from a tail miner of that epoch's plan, with the run's tokens per
//!   sample, each record's pathway one plan member per stage ending at the author, a finite
//!   loss, a sample that the pathway's head really draws in that epoch, and each sample
//!   counted once (a message of samples all claimed before is ignored, not punished: another
//!   tail may have claimed them falsely).
//! * **`ValLoss`** only from the evaluating head (the first head, in peer-id order), once
//!   per epoch, finite and non-negative.
//! * **`HeadDone`** only from a head, once per head and epoch, with counts within the plan.
//! * **`Merged`** only from a member of that stage in that epoch's plan, once (on a node
//!   that joined without the previous plan, from a member of that stage in the current one).
//! * **Pipeline requests.** A forward comes from the previous stage's miner in the plan of
//!   its epoch (current or the one before), which is the pathway's last hop, and every
//!   pathway entry holds its stage in that plan; an evaluation from a previous-stage miner
//!   of the current plan; a weights request from a replica of the requested stage; a spot
//!   check from a permitted validator.
//! * **Frames.** An activation or gradient frame must have exactly the shape
//!   `[batch, seq, width]` the run configuration implies, the run's id and the expected
//!   sample, checked on the header alone, before anything is decompressed or allocated.
//! * **Load.** Inbound requests are bounded per peer and in total ([`RequestBudget`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use bootstrap::{EpochPlan, PeerIdStr, RunConfig};
use training::wire::{self, DecodeLimits, FrameKind};

use crate::run_spec::sample_id;
use crate::services::merge::api::Readers;
use crate::wire::messages::{ForwardHeader, LossRecord, PipelineGossip};

/// Plans kept for checking messages of recent epochs.
const KEEP_PLANS: usize = 4;

/// Largest table of (sample → head) draws built per epoch; beyond it the draw check is
/// skipped (a run that large has `heads × epoch_samples` above a million samples an epoch).
const MAX_DRAWS: u64 = 1 << 20;

/// Inbound requests one peer may have in progress at once. A previous-stage miner keeps at
/// most its own in-flight bound (16) of samples here, plus evaluations and merge fetches.
pub(crate) const MAX_REQUESTS_PER_PEER: usize = 48;

/// Inbound requests all peers together may have in progress at once.
pub(crate) const MAX_REQUESTS_TOTAL: usize = 256;

/// How far a heartbeat's send time may lie from this node's clock, in milliseconds. Nodes
/// keep their clocks within well under a second of each other (NTP); the bound is what a
/// replayed heartbeat can buy: a dead peer stays live at most this long after its last
/// real heartbeat plus the heartbeat timeout.
pub(crate) const MAX_HEARTBEAT_SKEW_MS: u64 = 15_000;

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
    ) -> Result<(), &'static str> {
        if sent_at_ms.abs_diff(now_ms) > MAX_HEARTBEAT_SKEW_MS {
            return Err("stale_heartbeat");
        }
        if self
            .last
            .get(author)
            .is_some_and(|&last| (sent_at_ms, counter) <= last)
        {
            return Err("replayed_heartbeat");
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

/// What gossipsub is told about a message, with the reason for anything but `Accept`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Valid: hand it to the service and relay it.
    Accept,
    /// Not usable here, but not proof of malice: drop it quietly.
    Ignore(&'static str),
    /// Forbidden: drop it and penalise the sender.
    Reject(&'static str),
}

impl Verdict {
    /// The metric label of a refused message.
    pub(crate) fn reason(self) -> Option<&'static str> {
        match self {
            Verdict::Accept => None,
            Verdict::Ignore(reason) | Verdict::Reject(reason) => Some(reason),
        }
    }
}

/// Why a request is refused; [`Refusal::reason`] is its metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// This node has no plan for the request's epoch, or the epoch is too old.
    WrongEpoch,
    /// This node holds no stage in that epoch, or not the one the request is for.
    WrongStage,
    /// A forward not sent by the previous stage's miner in the plan.
    NotPreviousHop,
    /// A pathway entry does not hold its stage in the plan, or the sender is not its end.
    BadPathway,
    /// An evaluation not sent by a previous-stage miner of the plan.
    NotPreviousStage,
    /// A weights request from a peer that does not hold that stage.
    NotAReplica,
    /// The frame is not the run's, or not for this sample, stage and direction.
    FrameMismatch,
    /// The frame's shape is not the one the run configuration implies.
    FrameShape,
    /// The frame's header does not decode.
    FrameMalformed,
    /// The peer, or all peers together, have too many requests in progress.
    TooManyRequests,
    /// A request only a permitted validator may make (a spot check).
    NotValidator,
    /// A request for a service this node does not run (a merge confirmation asked of a
    /// node that is not a validator).
    NotServed,
}

impl Refusal {
    /// The metric label.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            Refusal::WrongEpoch => "wrong_epoch",
            Refusal::WrongStage => "wrong_stage",
            Refusal::NotPreviousHop => "not_previous_hop",
            Refusal::BadPathway => "bad_pathway",
            Refusal::NotPreviousStage => "not_previous_stage",
            Refusal::NotAReplica => "not_a_replica",
            Refusal::FrameMismatch => "frame_mismatch",
            Refusal::FrameShape => "frame_shape",
            Refusal::FrameMalformed => "frame_malformed",
            Refusal::TooManyRequests => "too_many_requests",
            Refusal::NotValidator => "not_validator",
            Refusal::NotServed => "not_served",
        }
    }
}

/// The plans of the last few epochs, by epoch.
#[derive(Debug, Clone, Default)]
pub(crate) struct PlanBook {
    plans: BTreeMap<u64, EpochPlan>,
}

impl PlanBook {
    /// Records an accepted plan, forgetting the oldest beyond [`KEEP_PLANS`].
    pub(crate) fn insert(&mut self, plan: EpochPlan) {
        self.plans.insert(plan.epoch, plan);
        while self.plans.len() > KEEP_PLANS {
            self.plans.pop_first();
        }
    }

    /// The newest plan.
    pub(crate) fn current(&self) -> Option<&EpochPlan> {
        self.plans.values().next_back()
    }

    /// The epochs whose plans are kept.
    pub(crate) fn epochs(&self) -> Vec<u64> {
        self.plans.keys().copied().collect()
    }

    /// The kept plan of `epoch`.
    pub(crate) fn get(&self, epoch: u64) -> Option<&EpochPlan> {
        self.plans.get(&epoch)
    }

    /// The plan of `epoch`, if it is the current or the previous one and known.
    pub(crate) fn recent(&self, epoch: u64) -> Option<&EpochPlan> {
        let current = self.current()?.epoch;
        (epoch == current || epoch.checked_add(1) == Some(current))
            .then(|| self.plans.get(&epoch))
            .flatten()
    }
}

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
    epochs: BTreeMap<u64, Seen>,
    /// Peer ids of the metagraph's validators with a permit (who may publish weights).
    validators: BTreeSet<String>,
    /// (epoch, validator) of the weights accepted within the window.
    weights_seen: BTreeSet<(u64, String)>,
}

impl PipelineRules {
    /// Rules for `run`.
    pub(crate) fn new(run: &RunConfig) -> Self {
        PipelineRules {
            tokens_per_sample: u64::from(run.batch_size) * u64::from(run.seq_len),
            epochs: BTreeMap::new(),
            validators: BTreeSet::new(),
            weights_seen: BTreeSet::new(),
        }
    }

    /// Who may publish weights: the metagraph's validators with a permit.
    pub(crate) fn set_validators(&mut self, validators: BTreeSet<String>) {
        self.validators = validators;
    }

    /// Judges `message` signed by `author`; remembers what it accepts.
    pub(crate) fn check(
        &mut self,
        book: &PlanBook,
        author: &str,
        message: &PipelineGossip,
    ) -> Verdict {
        let epoch = epoch_of(message);
        let Some(current) = book.current().map(|p| p.epoch) else {
            return Verdict::Ignore("no_plan_yet");
        };
        if let PipelineGossip::Weights { weights, .. } = message {
            return self.check_weights(current, epoch, author, weights);
        }
        if current.checked_add(1) == Some(epoch) {
            return Verdict::Ignore("no_plan_for_epoch");
        }
        // A node catching up (restarted with an old plan) keeps the merge hashes of epochs
        // ahead of it until their plans arrive: it needs them to load its stage.
        if matches!(message, PipelineGossip::Merged { .. }) && epoch > current {
            return Verdict::Ignore("no_plan_for_epoch");
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
            return Verdict::Ignore("epoch_out_of_window");
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
                self.tokens_per_sample,
                author,
                *tokens_per_sample,
                records,
            ),
            PipelineGossip::ValLoss { loss, .. } => {
                if plan.miners_of(0).next().map(PeerIdStr::as_str) != Some(author) {
                    Verdict::Reject("val_loss_not_evaluator")
                } else if !(loss.is_finite() && *loss >= 0.0) {
                    Verdict::Reject("val_loss_bad_value")
                } else if seen.val_loss {
                    Verdict::Reject("val_loss_duplicate")
                } else {
                    seen.val_loss = true;
                    Verdict::Accept
                }
            }
            PipelineGossip::HeadDone {
                samples, dropped, ..
            } => {
                if !plan.miners_of(0).any(|h| h.as_str() == author) {
                    Verdict::Reject("head_done_not_head")
                } else if samples
                    .checked_add(*dropped)
                    .is_none_or(|n| n > plan.epoch_samples)
                {
                    Verdict::Reject("head_done_bad_counts")
                } else if !seen.heads_done.insert(author.to_string()) {
                    Verdict::Reject("head_done_duplicate")
                } else {
                    Verdict::Accept
                }
            }
            // Judged above, before the plan window.
            PipelineGossip::Weights { .. } => Verdict::Ignore("weights_elsewhere"),
            PipelineGossip::Merged { stage, .. } => {
                if !plan.miners_of(*stage).any(|m| m.as_str() == author) {
                    Verdict::Reject("merged_not_member")
                } else if !seen.merged.insert((*stage, author.to_string())) {
                    Verdict::Reject("merged_duplicate")
                } else {
                    Verdict::Accept
                }
            }
        }
    }
}

impl PipelineRules {
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
    ) -> Verdict {
        let uids: BTreeSet<u16> = weights.iter().map(|(uid, _)| *uid).collect();
        if !self.validators.contains(author) {
            return Verdict::Reject("weights_not_validator");
        }
        if epoch > current || current - epoch > WEIGHTS_WINDOW {
            return Verdict::Ignore("epoch_out_of_window");
        }
        if weights.len() > bootstrap::MAX_PLAN_MINERS {
            return Verdict::Reject("weights_too_many");
        }
        if uids.len() != weights.len() {
            return Verdict::Reject("weights_duplicate_uid");
        }
        self.weights_seen
            .retain(|(e, _)| current - WEIGHTS_WINDOW.min(current) <= *e);
        if !self.weights_seen.insert((epoch, author.to_string())) {
            return Verdict::Reject("weights_duplicate");
        }
        Verdict::Accept
    }
}

/// How many closed epochs back a validator's weights are still taken.
const WEIGHTS_WINDOW: u64 = 8;

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

/// Loss records: all of them valid, or the message is refused whole.
fn check_losses(
    plan: &EpochPlan,
    seen: &mut Seen,
    run_tokens: u64,
    author: &str,
    tokens: u64,
    records: &[LossRecord],
) -> Verdict {
    let tail = plan.stages.saturating_sub(1);
    if !plan.miners_of(tail).any(|m| m.as_str() == author) {
        return Verdict::Reject("losses_not_tail");
    }
    if tokens != run_tokens {
        return Verdict::Reject("losses_bad_tokens");
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
            return Verdict::Reject("losses_bad_record");
        }
        if !draws.is_empty() {
            let drawn_by = draws.get(&record.sample).and_then(|&i| heads.get(i));
            if drawn_by.map(|h| h.as_str()) != record.pathway.first().map(String::as_str) {
                return Verdict::Reject("losses_not_drawn");
            }
        }
        // A sample already claimed is skipped, not held against the author: another tail
        // may have claimed it first, falsely (validators catch that tail: it cannot show
        // the sample). The validator's ledger keeps the first record of each sample.
        if !seen.samples.contains(&record.sample) {
            fresh.insert(record.sample);
        }
    }
    if fresh.is_empty() {
        return Verdict::Ignore("losses_duplicate");
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

/// Checks a forward request from `sender` against the plan of its epoch; returns this
/// node's stage (the pathway's length) when it may be served.
pub(crate) fn check_forward(
    book: &PlanBook,
    me: &str,
    sender: &str,
    header: &ForwardHeader,
) -> Result<u32, Refusal> {
    let plan = book.recent(header.epoch).ok_or(Refusal::WrongEpoch)?;
    let stage = stage_in(plan, me).ok_or(Refusal::WrongStage)?;
    if stage == 0 || header.pathway.len() != stage as usize {
        return Err(Refusal::WrongStage);
    }
    if stage_in(plan, sender) != Some(stage - 1) {
        return Err(Refusal::NotPreviousHop);
    }
    let pathway_ok = header.pathway.last().map(String::as_str) == Some(sender)
        && header
            .pathway
            .iter()
            .enumerate()
            .all(|(s, peer)| stage_in(plan, peer) == Some(s as u32));
    if !pathway_ok {
        return Err(Refusal::BadPathway);
    }
    Ok(stage)
}

/// Checks an evaluation request from `sender`: it must hold the stage before this node's in
/// the current (or previous) plan. Returns this node's stage.
pub(crate) fn check_eval(book: &PlanBook, me: &str, sender: &str) -> Result<u32, Refusal> {
    let current = book.current().ok_or(Refusal::WrongEpoch)?;
    let stage = stage_in(current, me)
        .filter(|&s| s > 0)
        .ok_or(Refusal::WrongStage)?;
    let allowed = [Some(current), book.recent(current.epoch.wrapping_sub(1))]
        .into_iter()
        .flatten()
        .any(|plan| stage_in(plan, sender) == Some(stage - 1));
    if allowed {
        Ok(stage)
    } else {
        Err(Refusal::NotPreviousStage)
    }
}

/// Checks a weights request for `stage` from `sender`: only a replica of that stage in the
/// current plan (a miner that joins or changes stage) is served.
pub(crate) fn check_weights(book: &PlanBook, sender: &str, stage: u32) -> Result<(), Refusal> {
    let current = book.current().ok_or(Refusal::WrongEpoch)?;
    if stage_in(current, sender) == Some(stage) {
        Ok(())
    } else {
        Err(Refusal::NotAReplica)
    }
}

/// Checks that `sender` may spot-check this miner: a permitted validator of the metagraph.
/// The evidence (inputs, outputs and the whole stage's weights) is costly to assemble and
/// large, so no one else gets it.
pub(crate) fn check_spot_check(validators: &BTreeSet<String>, sender: &str) -> Result<(), Refusal> {
    if validators.contains(sender) {
        Ok(())
    } else {
        Err(Refusal::NotValidator)
    }
}

/// Checks that `author` may speak in the butterfly merge of `stage` closing `epoch`: a
/// member of that stage in the epoch's plan (commitments, slice hashes, reports) or a
/// validator (audit reports). A merge this node holds no plan for is not judged: its
/// gossip is ignored, neither delivered nor relayed.
pub(crate) fn check_butterfly_author(
    readers: &Readers,
    author: &PeerIdStr,
    epoch: u64,
    stage: u32,
) -> Verdict {
    if readers.validators.contains(author) {
        return Verdict::Accept;
    }
    match readers.members.get(&(epoch, stage)) {
        Some(members) if members.contains(author) => Verdict::Accept,
        Some(_) => Verdict::Reject("butterfly_not_member"),
        None => Verdict::Ignore("butterfly_unknown_merge"),
    }
}

fn stage_in(plan: &EpochPlan, peer: &str) -> Option<u32> {
    PeerIdStr::parse(peer).ok().and_then(|p| plan.stage_of(&p))
}

/// The exact shape of every frame of a run, from its configuration.
#[derive(Debug, Clone)]
pub(crate) struct FrameRules {
    run: u64,
    batch: usize,
    seq: usize,
    /// Width of the tensor crossing boundary `b` (from stage `b` to `b + 1`).
    widths: Vec<usize>,
    limits: DecodeLimits,
}

/// What a frame is expected to be.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Expect {
    /// The sample it belongs to (`None`: any, as for held-out batches).
    pub(crate) sample: Option<u64>,
    /// The boundary it crosses: an activation produced by stage `b`, or the gradient for it.
    pub(crate) boundary: u32,
    /// Activation (forward) or gradient (backward).
    pub(crate) kind: FrameKind,
}

impl FrameRules {
    /// The frame shapes of `run`, whose frames carry `run_id`.
    pub(crate) fn new(run: &RunConfig, run_id: u64) -> anyhow::Result<Self> {
        let preset = crate::run_spec::preset(run.preset);
        let model = preset.config();
        let mut widths = Vec::new();
        for stage in 0..run.stages.saturating_sub(1) {
            let layout = training::StageLayout::new(
                &model,
                run.stages as usize,
                stage as usize,
                crate::run_spec::bottleneck(run),
            )?;
            widths.push(layout.out_width.unwrap_or(model.d_model));
        }
        let batch = run.batch_size as usize;
        let seq = run.seq_len as usize;
        let largest = widths.iter().copied().max().unwrap_or(0);
        // Room for the largest frame of the run in f32; nothing larger is ever decoded.
        let max_raw_bytes = batch
            .saturating_mul(seq)
            .saturating_mul(largest)
            .saturating_mul(4)
            .max(1);
        Ok(FrameRules {
            run: run_id,
            batch,
            seq,
            widths,
            limits: DecodeLimits { max_raw_bytes },
        })
    }

    /// The decoder limits every frame of the run fits in.
    pub(crate) fn limits(&self) -> DecodeLimits {
        self.limits
    }

    /// Checks `frame`'s header against `expect` without decompressing anything.
    pub(crate) fn check(&self, frame: &[u8], expect: Expect) -> Result<(), Refusal> {
        let header = wire::decode_header(frame, &self.limits).map_err(|error| match error {
            wire::DecodeError::TooLarge { .. } => Refusal::FrameShape,
            _ => Refusal::FrameMalformed,
        })?;
        let meta = header.meta;
        if meta.run != self.run
            || meta.kind != expect.kind
            || expect.sample.is_some_and(|s| s != meta.sample)
            || (expect.kind == FrameKind::Activation && meta.stage != expect.boundary)
        {
            return Err(Refusal::FrameMismatch);
        }
        let width = self
            .widths
            .get(expect.boundary as usize)
            .ok_or(Refusal::FrameMismatch)?;
        if header.shape != [self.batch, self.seq, *width] {
            return Err(Refusal::FrameShape);
        }
        Ok(())
    }
}

/// Counts inbound requests in progress, per peer and in total.
#[derive(Debug, Clone, Default)]
pub(crate) struct RequestBudget {
    inner: Arc<Mutex<BudgetState>>,
}

#[derive(Debug, Default)]
struct BudgetState {
    per_peer: HashMap<String, usize>,
    total: usize,
}

/// One request in progress; dropping it gives the slot back.
#[derive(Debug)]
pub(crate) struct BudgetSlot {
    inner: Arc<Mutex<BudgetState>>,
    peer: String,
}

impl RequestBudget {
    /// Takes a slot for a request of `peer`, or refuses when it or everyone is at the bound.
    pub(crate) fn acquire(&self, peer: &str) -> Result<BudgetSlot, Refusal> {
        let mut state = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mine = state.per_peer.get(peer).copied().unwrap_or(0);
        if mine >= MAX_REQUESTS_PER_PEER || state.total >= MAX_REQUESTS_TOTAL {
            return Err(Refusal::TooManyRequests);
        }
        state.per_peer.insert(peer.to_string(), mine + 1);
        state.total += 1;
        Ok(BudgetSlot {
            inner: self.inner.clone(),
            peer: peer.to_string(),
        })
    }
}

impl Drop for BudgetSlot {
    fn drop(&mut self) {
        let mut state = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        state.total = state.total.saturating_sub(1);
        if let Some(n) = state.per_peer.get_mut(&self.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                state.per_peer.remove(&self.peer);
            }
        }
    }
}

#[cfg(test)]
mod tests;
