//! Spot checks: a validator recomputes one recent sample of one miner and compares.
//!
//! **When and whom.** At random moments (intervals uniform in ½–1½ × [`MEAN_INTERVAL`]) the
//! validator checks the next miner of a random order of the epoch's miners (one that joins
//! during a round next), on one of that miner's [`RECENT_RECORDS`] newest samples in the
//! authenticated ledger; a miner whose weights had not stepped when it had served too few
//! samples to owe a step ([`laziness_undecided`]) is checked again soon. The randomness is
//! seeded from the validator's own secret key ([`Schedule::new`]), so a miner can predict
//! neither the moment nor the sample.
//!
//! **The evidence.** The miner returns the sample payload it received (token ids and
//! activation; none at the head, which draws the ids its sample id names), what it sent on
//! (the sample payload with its activation, or at the tail the gradient it sent back), its current weights, and at a middle stage the gradient it
//! received from the next stage and the one it sent back upstream
//! (`crate::services::miner`'s evidence store), frozen for the check and fetched in chunks
//! that fit any frame limit ([`transfer`]). The input and output frames must hash to what
//! the miner's receipt in the loss record says it received and sent
//! (`crate::wire::receipt`): a miner cannot send one frame and show another.
//!
//! **The token ids.** Only heads read data: a sample's ids travel beside its activations
//! (`crate::wire::messages::pack_sample`), and the receipts hash them with the frames. The
//! validator holds the data, so at the head it checks that the ids sent are those the
//! sample id names; after the head, that the ids sent on are those received (the tail sends
//! none on). Either mismatch fails the miner ([`SpotFailure::WrongTokens`]). A stage is
//! recomputed with the ids it received, so an honest stage fed wrong ids by the stage before
//! it is not blamed: the receipts name who sent them.
//!
//! **Which weights are reproducible.** The only weights every node agrees on by hash are
//! the merged weights an epoch starts from, but a miner's outputs come from weights that an
//! epoch of optimizer steps moved away from them. So the forward is recomputed with the
//! weights the miner holds when it answers, a few optimizer steps after the sample (its
//! newest samples are asked for; a merge since the sample leaves the miner nothing to show,
//! and it answers `Superseded` naming that merge); the hash-agreed weights serve to catch a miner that never steps: weights
//! whose hash is the epoch's starting hash (the run seed's, or a merge hash its stage
//! gossiped for the epoch before) after [`lazy_threshold`] samples served in the epoch fail,
//! and so do weights that moved from those starting weights by less than [`MOVED_MIN`]
//! learning rates (root mean square per weight, [`moved`]): the optimizer steps such a
//! miner owes move an honest replica's weights by a good fraction of a learning rate each,
//! while changing a few weights by an ulp, to dodge the hash, moves them by nothing.
//!
//! **A middle stage's backward pass.** The gradient a middle stage sends upstream is
//! recomputed too: forward and backward on the miner's weights, from its input and the
//! gradient it received from the next stage, and compared with what it sent (cosine ≥
//! [`GRADIENT_COSINE_MIN`], the norm ratio as for a tail's gradient). A middle stage that shows no
//! gradients for a sample dodged the check ([`SpotInconclusive::GradientsNotHeld`]).
//!
//! **Tolerances** (measured on honest miners in local swarms, docs/BENCHMARKS.md): the
//! recomputed activation and the miner's must have cosine ≥ [`COSINE_MIN`] and norm ratio
//! within [`NORM_RATIO_MIN`]–1/[`NORM_RATIO_MIN`]; at the tail the loss in the ledger must be
//! within [`LOSS_TOLERANCE`] (relative) of the recomputed loss, or lie between it and the loss
//! with the epoch's starting weights ([`loss_reproduced`]), and the gradient it sent back
//! must have cosine ≥ [`GRADIENT_COSINE_MIN`] and norm ratio within
//! [`GRADIENT_NORM_RATIO_MIN`]–1/[`GRADIENT_NORM_RATIO_MIN`]. A tail that cannot
//! show a sample it claimed fails. In the run's first epoch only the exact test is judged
//! (see [`judge`]).
//!
//! **No evidence is evidence too.** A check the miner ends without evidence (`Superseded`,
//! `NotHeld`, an error, no answer, a chunk of its evidence not served) concludes nothing about the sample, but it is a dodge,
//! counted against the miner, which is checked again soon; a miner that dodges far more
//! than honest miners do fails, and a `Superseded` naming a merge its stage's replicas did
//! not announce is false (`super::dodges`).
//!
//! **Layout.** Everything here decides and is pure: the [`Schedule`], [`parse_reply`],
//! the chunks' bookkeeping ([`transfer`]), [`judge`] and [`compare`]; [`Checker`]
//! (`checker.rs`) does the IO around them, asking the miner and recomputing on a scratch
//! stage.

mod checker;
pub(crate) mod transfer;

use std::collections::BTreeMap;
use std::time::Duration;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::wire::messages::{self, LossRecord, Service, SpotCheckReply};
use crate::wire::receipt::Digest;

pub(crate) use checker::Checker;

/// Mean time between two checks.
pub(crate) const MEAN_INTERVAL: Duration = Duration::from_millis(1000);

/// A check is made on one of the miner's this many newest records.
pub(crate) const RECENT_RECORDS: usize = 4;

/// Least cosine between the recomputed activation and the miner's. Honest heads and
/// middle stages measured 0.96–1.000 after the first epoch; `noise` miners about 0.0.
pub(crate) const COSINE_MIN: f64 = 0.9;

/// Least cosine between the recomputed gradient a tail (or a middle stage) sent back and
/// the miner's: a gradient moves more with the weights than an activation does, and a tail
/// steps once per sample, so the weights it answers with are up to a few steps past the
/// sample. Honest tails measured 0.798–1.000 after the first epoch (439 checks, 1 % below
/// 0.89); `noise` tails at most 0.006. Honest middle stages measured 0.987–1.000 after the
/// first epoch (0.896 and more in it, where it is not judged); `noise-grad` middle stages
/// −0.013–0.008 (0.87–0.92 on samples whose gradient a `noise` tail had sent it).
pub(crate) const GRADIENT_COSINE_MIN: f64 = 0.5;

/// Least ratio of the miner's output norm to the recomputed one (and at most its inverse).
/// Honest miners measured 0.905–1.155 after the first epoch.
pub(crate) const NORM_RATIO_MIN: f64 = 0.75;

/// [`NORM_RATIO_MIN`] for a gradient (a tail's, or the one a middle stage sends upstream):
/// its norm moves with the weights more than an activation's does. Honest tails that
/// carried their stage alone, or on a loaded machine, measured 1.347 and 1.62 (cosine 0.980
/// and 0.836), a few to ten learning rates of steps after their sample; `noise` gradients
/// keep the norm (they are caught by the cosine).
pub(crate) const GRADIENT_NORM_RATIO_MIN: f64 = 0.5;

/// Least root-mean-square change per weight since the epoch's starting weights, in
/// learning rates of the epoch (`RunConfig::lr_at`), of a miner that owes optimizer steps
/// ([`lazy_threshold`]). Each AdamW step moves most weights by about its learning rate, and
/// the two steps owed at least take 1/30 and 2/30 of it in the warm-up, so the bound stays
/// below the smallest move owed. Honest miners measured 0.96–17.7 once they owed steps
/// (1.02 and more after the first epoch); a `lazy-ulp` miner (one weight changed by one
/// ulp) 2.7e-10–2.3e-9.
pub(crate) const MOVED_MIN: f64 = 0.01;

/// Largest relative difference between the ledger's loss and the recomputed loss. Honest
/// tails measured within 4.1 % after the first epoch (the largest right after a merge);
/// `lie-loss` tails 16.7–20.3 % below. At Llama-3.2-1B's width with 64-token samples an
/// honest tail's own step lowered the sample's loss by 10–30 % before the check, so a claim
/// above the recomputed loss is also measured against the epoch's starting weights
/// ([`loss_reproduced`]).
pub(crate) const LOSS_TOLERANCE: f64 = 0.1;

/// Samples a miner must have served in an epoch before weights still equal to the epoch's
/// starting weights mean it never stepped: its in-flight bound, plus two optimizer steps.
pub(crate) fn lazy_threshold(inner_steps: u32) -> u64 {
    16 + 2 * u64::from(inner_steps.max(1))
}

/// One check to make.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Target {
    /// Epoch of the sample.
    pub(crate) epoch: u64,
    /// The miner.
    pub(crate) peer: String,
    /// Its stage on the sample's pathway.
    pub(crate) stage: u32,
    /// Whether that stage is the tail.
    pub(crate) tail: bool,
    /// The sample.
    pub(crate) sample: u64,
    /// The loss the ledger holds for it.
    pub(crate) claimed_loss: f32,
    /// Samples the miner served in the epoch so far (ledger records naming it).
    pub(crate) served: u64,
    /// The miner's records in the epoch's ledger newer than the sample's, when the check
    /// was chosen.
    pub(crate) later: u64,
    /// The hashes its receipt in the record says it received and sent: the evidence it
    /// shows must be those frames.
    pub(crate) receipt: Option<(Digest, Digest)>,
    /// The miners that served the stage in the epoch (the ledger's pathways), the target
    /// among them: whom to ask for the stage's starting weights.
    pub(crate) replicas: Vec<String>,
}

/// What recomputing the evidence measured.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Measured {
    /// Cosine between the miner's output and the recomputed one.
    pub(crate) cosine: Option<f64>,
    /// The miner's output norm over the recomputed one.
    pub(crate) norm_ratio: Option<f64>,
    /// The ledger's loss over the recomputed loss (the tail).
    pub(crate) loss_ratio: Option<f64>,
    /// The ledger's loss over the sample's loss recomputed with the weights the epoch
    /// started from (the tail; `None` when those weights could not be had).
    pub(crate) start_loss_ratio: Option<f64>,
    /// The output compared is a tail's gradient (else an activation).
    pub(crate) gradient: bool,
    /// The weights are the epoch's starting weights.
    pub(crate) unchanged_weights: bool,
    /// Root-mean-square change per weight since the epoch's starting weights, in learning
    /// rates ([`moved`]); `None` when the starting weights could not be had.
    pub(crate) moved: Option<f64>,
    /// Cosine between the gradient a middle stage sent upstream and the recomputed one.
    pub(crate) grad_cosine: Option<f64>,
    /// Norm of the gradient a middle stage sent upstream over the recomputed one's.
    pub(crate) grad_norm_ratio: Option<f64>,
    /// A middle stage showed no gradients for the sample.
    pub(crate) gradients_missing: bool,
    /// Samples served in the epoch when the check was chosen.
    pub(crate) served: u64,
    /// Milliseconds from the check's first request to its answer.
    pub(crate) answered_ms: u64,
    /// What the miner's `Superseded` answer claimed, if it answered so (the check's outcome
    /// waits for the claim to be checked).
    pub(crate) claim: Option<Claim>,
}

/// Why a spot check caught a miner: its work was not reproduced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SpotFailure {
    /// Its weights are still the epoch's starting weights (or as good as: they moved less
    /// than [`MOVED_MIN`]) after enough samples to owe a step.
    WeightsNeverStepped,
    /// The output it sent on points elsewhere than the recomputed one.
    OutputNotReproduced,
    /// The output it sent on has the wrong norm.
    OutputScaleWrong,
    /// The loss in the ledger is not the recomputed loss.
    LossNotReproduced,
    /// The gradient a middle stage sent upstream points elsewhere than the recomputed one.
    GradientNotReproduced,
    /// The gradient a middle stage sent upstream has the wrong norm.
    GradientScaleWrong,
    /// The evidence does not parse, or does not fit the run's shapes.
    EvidenceMalformed,
    /// A tail cannot show a sample it claimed a loss for.
    ClaimedSampleNotHeld,
    /// The frames it shows are not the ones its receipt says it received and sent.
    EvidenceNotReceipted,
    /// It answered `Superseded` naming a merge of its stage whose replicas announced other
    /// hashes only (see [`super::dodges::judge_claim`]).
    SupersededFalse,
    /// It answered far more of its checks without evidence than honest miners do (see
    /// [`super::dodges`]).
    DodgedChecks,
    /// The token ids it sent on are not its sample's: a head's are not those its sample id
    /// names in the run's data, a later stage's not those it received.
    WrongTokens,
}

impl SpotFailure {
    /// Its label, as logged and shown after `spot_check: ` in a miner's reason.
    pub(crate) fn label(self) -> &'static str {
        match self {
            SpotFailure::WeightsNeverStepped => "weights_never_stepped",
            SpotFailure::OutputNotReproduced => "output_not_reproduced",
            SpotFailure::OutputScaleWrong => "output_scale_wrong",
            SpotFailure::LossNotReproduced => "loss_not_reproduced",
            SpotFailure::GradientNotReproduced => "gradient_not_reproduced",
            SpotFailure::GradientScaleWrong => "gradient_scale_wrong",
            SpotFailure::EvidenceMalformed => "evidence_malformed",
            SpotFailure::ClaimedSampleNotHeld => "claimed_sample_not_held",
            SpotFailure::EvidenceNotReceipted => "evidence_not_receipted",
            SpotFailure::SupersededFalse => "superseded_false",
            SpotFailure::DodgedChecks => "dodged_checks",
            SpotFailure::WrongTokens => "wrong_tokens",
        }
    }
}

impl std::fmt::Display for SpotFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// Why a spot check concluded nothing about the work. The miner's own answers (see
/// [`SpotInconclusive::against_miner`]) are dodges, counted against it by
/// [`super::dodges::DodgeBook`]; the validator's own failures count against no one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SpotInconclusive {
    /// The miner answered with an error (busy, …).
    Refused,
    /// A stage before the tail no longer holds the sample.
    NotHeld,
    /// A merge since the sample replaced the weights it was computed with, and the merge it
    /// named is one the stage's replicas announced.
    Superseded,
    /// The miner answered `Superseded` naming a merge that cannot be checked: the run seed,
    /// a merge older than the sample's epoch, or one nobody announced in time.
    SupersededUnverified,
    /// A middle stage showed no gradients for the sample (its backward pass did not end in
    /// time, or it keeps none).
    GradientsNotHeld,
    /// The miner's peer id does not parse.
    BadPeer,
    /// The request could not be encoded.
    RequestNotEncoded,
    /// No answer in time.
    NoAnswer,
    /// The miner answered the check's first chunk of evidence but not a later one.
    ChunkNotServed,
    /// The validator could not build the stage to recompute with.
    NoScratchStage,
    /// The validator could not draw the sample's batch.
    NoSample,
    /// The validator's own recomputation did not decode.
    RecomputeFailed,
}

impl SpotInconclusive {
    /// Its label, as logged.
    pub(crate) fn label(self) -> &'static str {
        match self {
            SpotInconclusive::Refused => "refused",
            SpotInconclusive::NotHeld => "not_held",
            SpotInconclusive::Superseded => "superseded",
            SpotInconclusive::SupersededUnverified => "superseded_unverified",
            SpotInconclusive::GradientsNotHeld => "gradients_not_held",
            SpotInconclusive::BadPeer => "bad_peer",
            SpotInconclusive::RequestNotEncoded => "request_not_encoded",
            SpotInconclusive::NoAnswer => "no_answer",
            SpotInconclusive::ChunkNotServed => "chunk_not_served",
            SpotInconclusive::NoScratchStage => "no_scratch_stage",
            SpotInconclusive::NoSample => "no_sample",
            SpotInconclusive::RecomputeFailed => "recompute_failed",
        }
    }

    /// Whether the miner's answer (or its silence) ended the check, rather than the
    /// validator's own failure: a dodge, which counts against the miner.
    pub(crate) fn against_miner(self) -> bool {
        match self {
            SpotInconclusive::Refused
            | SpotInconclusive::NotHeld
            | SpotInconclusive::Superseded
            | SpotInconclusive::SupersededUnverified
            | SpotInconclusive::GradientsNotHeld
            | SpotInconclusive::NoAnswer
            | SpotInconclusive::ChunkNotServed => true,
            SpotInconclusive::BadPeer
            | SpotInconclusive::RequestNotEncoded
            | SpotInconclusive::NoScratchStage
            | SpotInconclusive::NoSample
            | SpotInconclusive::RecomputeFailed => false,
        }
    }
}

/// A check's verdict: exactly one of passed, failed (why) or inconclusive (why).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Reproduced.
    Pass,
    /// Not reproduced: the miner is caught.
    Fail(SpotFailure),
    /// Nothing could be concluded.
    Inconclusive(SpotInconclusive),
}

/// Written with the reasons' labels (`Fail("output_not_reproduced")`): the spot check's
/// log line reads as it always has.
impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Pass => f.write_str("Pass"),
            Outcome::Fail(why) => f.debug_tuple("Fail").field(&why.label()).finish(),
            Outcome::Inconclusive(why) => {
                f.debug_tuple("Inconclusive").field(&why.label()).finish()
            }
        }
    }
}

/// Whether the weights a miner showed have not stepped: its epoch's starting weights, or
/// moved from them by less than [`MOVED_MIN`] learning rates.
fn looks_unstepped(m: &Measured) -> bool {
    m.unchanged_weights || m.moved.is_some_and(|x| x.is_nan() || x < MOVED_MIN)
}

/// Whether a check came too early in the miner's epoch to tell whether it steps: its weights
/// have not stepped, but it had served fewer than `lazy_threshold` samples, so [`judge`]
/// passes it. Such a miner is checked again soon, when it has served more: otherwise a lazy
/// miner whose checks all fall early in its epochs goes unflagged (measured: a lazy head
/// checked at 5, 5 and 16 samples served in its first two epochs, threshold 18).
pub(crate) fn laziness_undecided(m: &Measured, lazy_threshold: u64) -> bool {
    looks_unstepped(m) && m.served < lazy_threshold
}

/// Judges measured evidence (pure). In the run's first epoch (`first_epoch`) only the
/// tests of the weights' steps are judged: the warm-up moves the weights too fast for
/// weights taken a moment after a sample to reproduce it (honest miners measured cosine down
/// to 0.57 and losses 6.9 % off there).
pub(crate) fn judge(m: &Measured, lazy_threshold: u64, first_epoch: bool) -> Outcome {
    if looks_unstepped(m) && m.served >= lazy_threshold {
        return Outcome::Fail(SpotFailure::WeightsNeverStepped);
    }
    if first_epoch {
        return Outcome::Pass;
    }
    let least = if m.gradient {
        GRADIENT_COSINE_MIN
    } else {
        COSINE_MIN
    };
    if m.cosine.is_some_and(|c| c.is_nan() || c < least) {
        return Outcome::Fail(SpotFailure::OutputNotReproduced);
    }
    let band = if m.gradient {
        GRADIENT_NORM_RATIO_MIN
    } else {
        NORM_RATIO_MIN
    };
    if m.norm_ratio
        .is_some_and(|r| !(band..=1.0 / band).contains(&r))
    {
        return Outcome::Fail(SpotFailure::OutputScaleWrong);
    }
    if m.loss_ratio
        .is_some_and(|r| !loss_reproduced(r, m.start_loss_ratio))
    {
        return Outcome::Fail(SpotFailure::LossNotReproduced);
    }
    if m.grad_cosine
        .is_some_and(|c| c.is_nan() || c < GRADIENT_COSINE_MIN)
    {
        return Outcome::Fail(SpotFailure::GradientNotReproduced);
    }
    if m.grad_norm_ratio
        .is_some_and(|r| !(GRADIENT_NORM_RATIO_MIN..=1.0 / GRADIENT_NORM_RATIO_MIN).contains(&r))
    {
        return Outcome::Fail(SpotFailure::GradientScaleWrong);
    }
    if m.gradients_missing {
        return Outcome::Inconclusive(SpotInconclusive::GradientsNotHeld);
    }
    Outcome::Pass
}

/// Whether a tail's claimed loss is one its weights took on the sample: `now` is the claim
/// over the loss recomputed with the weights it answered with, `start` the claim over the
/// loss with the weights the epoch started from. The claim was computed between the two (the
/// optimizer steps on the sample itself and on later ones lower it, those before the
/// sample lower it from the start's), so it may lie anywhere from `now`'s loss to the
/// larger of the two, each widened by [`LOSS_TOLERANCE`]; without `start` it is held to
/// `now`'s loss within the tolerance.
pub(crate) fn loss_reproduced(now: f64, start: Option<f64>) -> bool {
    let within = |r: f64| (1.0 - LOSS_TOLERANCE..=1.0 + LOSS_TOLERANCE).contains(&r);
    if within(now) {
        return true;
    }
    now > 1.0 && start.is_some_and(|r| r <= 1.0 + LOSS_TOLERANCE)
}

/// Root-mean-square difference per value between `weights` and `start`, in units of `lr`:
/// how far the optimizer steps since `start` moved the weights. `None` for different
/// lengths, no values or a learning rate that is not positive.
pub(crate) fn moved(weights: &[f32], start: &[f32], lr: f64) -> Option<f64> {
    if weights.len() != start.len() || weights.is_empty() || lr.is_nan() || lr <= 0.0 {
        return None;
    }
    let sum: f64 = weights
        .iter()
        .zip(start)
        .map(|(w, s)| (f64::from(*w) - f64::from(*s)).powi(2))
        .sum();
    Some((sum / weights.len() as f64).sqrt() / lr)
}

/// Cosine and norm ratio (`a` over `b`) of two vectors; `None` for different lengths or a
/// zero vector.
pub(crate) fn compare(a: &[f32], b: &[f32]) -> Option<(f64, f64)> {
    if a.len() != b.len() || a.is_empty() {
        return None;
    }
    let (mut dot, mut na, mut nb) = (0.0f64, 0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (f64::from(*x), f64::from(*y));
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    if na == 0.0 && nb == 0.0 {
        return Some((1.0, 1.0));
    }
    if na == 0.0 || nb == 0.0 {
        return Some((0.0, 0.0));
    }
    Some((dot / (na.sqrt() * nb.sqrt()), (na / nb).sqrt()))
}

/// The secret-seeded schedule: when the next check happens, and whom it checks.
pub(crate) struct Schedule {
    rng: rand_chacha::ChaCha20Rng,
    /// Miners still to check in this round, in random order.
    queue: Vec<String>,
    /// Every miner a round has held: one not among them joined after its round began.
    known: std::collections::BTreeSet<String>,
    /// A miner to check again outside the round, and whether the one pick of the round
    /// that goes first has been made.
    again: Option<(String, bool)>,
}

impl Schedule {
    /// A schedule drawn from `secret` (derived from the validator's private key).
    pub(crate) fn new(secret: [u8; 32]) -> Schedule {
        Schedule {
            rng: rand_chacha::ChaCha20Rng::from_seed(secret),
            queue: Vec::new(),
            known: std::collections::BTreeSet::new(),
            again: None,
        }
    }

    /// Checks `peer` again soon, after one pick of the round: a miner that dodged a check
    /// is asked again without waiting for the round to come back to it (it cannot tell a
    /// recheck from a round's check), and the round goes on in between.
    pub(crate) fn recheck(&mut self, peer: &str) {
        self.again = Some((peer.to_string(), false));
    }

    /// Time until the next check.
    pub(crate) fn next_delay(&mut self) -> Duration {
        MEAN_INTERVAL.mul_f64(self.rng.gen_range(0.5..1.5))
    }

    /// The next check on `records` (one epoch's ledger), if any miner is in it.
    pub(crate) fn pick(&mut self, epoch: u64, records: &[LossRecord]) -> Option<Target> {
        let mut served: BTreeMap<&str, u64> = BTreeMap::new();
        for record in records {
            for peer in &record.pathway {
                *served.entry(peer.as_str()).or_default() += 1;
            }
        }
        let peer = match self.again.take() {
            Some((peer, true)) if served.contains_key(peer.as_str()) => peer,
            Some((peer, false)) => {
                self.again = Some((peer, true));
                self.next_in_round(&served)?
            }
            _ => self.next_in_round(&served)?,
        };
        let recent: Vec<(usize, &LossRecord)> = records
            .iter()
            .rev()
            .filter_map(|r| Some((r.pathway.iter().position(|p| *p == peer)?, r)))
            .take(RECENT_RECORDS)
            .collect();
        let pick = self.rng.gen_range(0..recent.len().max(1));
        let &(stage, record) = recent.get(pick)?;
        let replicas: std::collections::BTreeSet<&str> = records
            .iter()
            .filter_map(|r| r.pathway.get(stage))
            .map(String::as_str)
            .collect();
        Some(Target {
            epoch,
            stage: stage as u32,
            tail: stage + 1 == record.pathway.len(),
            sample: record.sample,
            claimed_loss: record.loss,
            served: served.get(peer.as_str()).copied().unwrap_or(0),
            later: pick as u64,
            receipt: record.receipts.get(stage).map(|r| (r.received, r.sent)),
            replicas: replicas.into_iter().map(str::to_string).collect(),
            peer,
        })
    }

    /// The next miner of the round among those that `served` the epoch (a new round, in a
    /// new random order, once the last is done).
    fn next_in_round(&mut self, served: &BTreeMap<&str, u64>) -> Option<String> {
        self.queue.retain(|p| served.contains_key(p.as_str()));
        if self.queue.is_empty() {
            self.queue = served.keys().map(|p| p.to_string()).collect();
            self.queue.shuffle(&mut self.rng);
            self.known.extend(self.queue.iter().cloned());
        } else {
            // A miner that joined after the round began goes first: waiting for the next
            // round could leave its first epoch unchecked.
            let mut new: Vec<String> = served
                .keys()
                .filter(|p| !self.known.contains(**p))
                .map(|p| p.to_string())
                .collect();
            new.shuffle(&mut self.rng);
            self.known.extend(new.iter().cloned());
            self.queue.extend(new);
        }
        self.queue.pop()
    }
}

/// A spot check's evidence, whole and split ([`transfer::Assembly::finish`]).
#[derive(Debug, PartialEq)]
pub(crate) struct Evidence<'a> {
    /// The stage the miner says it served the sample at.
    pub(crate) stage: u32,
    /// The sample payload received (empty at the head).
    pub(crate) input: &'a [u8],
    /// What it sent on: a sample payload, or the tail's gradient frame.
    pub(crate) output: &'a [u8],
    /// Its weights, little-endian f32.
    pub(crate) weights: &'a [u8],
    /// A middle stage's gradient frame received from the next stage (else empty).
    pub(crate) received: &'a [u8],
    /// A middle stage's gradient frame sent back upstream (else empty).
    pub(crate) sent_back: &'a [u8],
}

/// What a miner's `Superseded` answer claims replaced the weights a sample was served with:
/// the merge of its stage closing `epoch` (none: the run seed), whose weights hash to `hash`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Claim {
    /// The epoch the merge closed.
    pub(crate) epoch: Option<u64>,
    /// blake3 of the merged weights.
    pub(crate) hash: [u8; 32],
}

/// A spot check's reply that is not its outcome yet.
#[derive(Debug, PartialEq)]
pub(crate) enum Reply<'a> {
    /// A chunk of the evidence, to gather ([`transfer::Assembly`]) and recompute.
    Evidence(transfer::Chunk<'a>),
    /// No evidence, and a claim of what replaced the weights, to check against the merges
    /// heard ([`super::dodges::judge_claim`]).
    Superseded(Claim),
}

/// 32 bytes from 64 hex digits.
fn parse_hash(text: &str) -> Option<[u8; 32]> {
    let digits = text.as_bytes();
    if digits.len() != 64 {
        return None;
    }
    let mut hash = [0u8; 32];
    for (byte, pair) in hash.iter_mut().zip(digits.chunks_exact(2)) {
        *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(hash)
}

/// Reads a spot check's reply to `target`: a chunk of evidence (its sizes are checked
/// against the run's by [`transfer::Assembly`] before anything is held), or a checkable
/// `Superseded` claim; any other reply is the check's outcome, and a `Superseded` naming no
/// hash is malformed.
pub(crate) fn parse_reply<'a>(reply: &'a [u8], target: &Target) -> Result<Reply<'a>, Outcome> {
    let malformed = Outcome::Fail(SpotFailure::EvidenceMalformed);
    if reply.first() == Some(&crate::wire::rpc::ERROR) {
        return Err(Outcome::Inconclusive(SpotInconclusive::Refused));
    }
    let (header, payload) =
        messages::decode::<SpotCheckReply>(Service::SpotCheck, reply).map_err(|_| malformed)?;
    match header {
        SpotCheckReply::Evidence {
            stage,
            input_len,
            output_len,
            weights_len,
            received_len,
            sent_back_len,
            total,
            hash,
            offset,
            ..
        } => {
            if stage != target.stage {
                return Err(malformed);
            }
            Ok(Reply::Evidence(transfer::Chunk {
                layout: transfer::Layout {
                    stage,
                    input_len,
                    output_len,
                    weights_len,
                    received_len,
                    sent_back_len,
                },
                total,
                hash: parse_hash(&hash).ok_or(malformed)?,
                offset,
                bytes: payload,
            }))
        }
        // Only the tail's own claims are its to prove; an earlier stage may have lost a
        // sample a tail claimed falsely.
        SpotCheckReply::NotHeld if target.tail => {
            Err(Outcome::Fail(SpotFailure::ClaimedSampleNotHeld))
        }
        SpotCheckReply::NotHeld => Err(Outcome::Inconclusive(SpotInconclusive::NotHeld)),
        SpotCheckReply::Superseded { epoch, hash } => {
            let hash = parse_hash(&hash).ok_or(malformed)?;
            Ok(Reply::Superseded(Claim { epoch, hash }))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn record(sample: u64, pathway: &[&str], loss: f32) -> LossRecord {
        LossRecord {
            sample,
            pathway: pathway.iter().map(|p| p.to_string()).collect(),
            loss,
            receipts: Vec::new(),
        }
    }

    #[test]
    fn judging_fails_each_kind_of_wrong_evidence_and_passes_honest_drift() {
        let honest = Measured {
            cosine: Some(0.999),
            norm_ratio: Some(1.01),
            loss_ratio: Some(0.995),
            start_loss_ratio: None,
            gradient: false,
            unchanged_weights: false,
            moved: Some(0.5),
            grad_cosine: None,
            grad_norm_ratio: None,
            gradients_missing: false,
            served: 100,
            answered_ms: 0,
            claim: None,
        };
        let lazy = lazy_threshold(1);
        assert_eq!(judge(&honest, lazy, false), Outcome::Pass);
        let noise = Measured {
            cosine: Some(0.5),
            ..honest
        };
        assert_eq!(
            judge(&noise, lazy, false),
            Outcome::Fail(SpotFailure::OutputNotReproduced)
        );
        let nan = Measured {
            cosine: Some(f64::NAN),
            ..honest
        };
        assert_eq!(
            judge(&nan, lazy, false),
            Outcome::Fail(SpotFailure::OutputNotReproduced)
        );
        // A tail's gradient drifts more: 0.85 passes there, not for an activation.
        let drifted = Measured {
            cosine: Some(0.85),
            ..honest
        };
        assert_eq!(
            judge(&drifted, lazy, false),
            Outcome::Fail(SpotFailure::OutputNotReproduced)
        );
        let drifted_gradient = Measured {
            gradient: true,
            ..drifted
        };
        assert_eq!(judge(&drifted_gradient, lazy, false), Outcome::Pass);
        // The least honest tail gradient measured (a clean-clone run of the adversary
        // tests, one step per sample) passes.
        let worst_honest_gradient = Measured {
            cosine: Some(0.79),
            ..drifted_gradient
        };
        assert_eq!(judge(&worst_honest_gradient, lazy, false), Outcome::Pass);
        let noise_gradient = Measured {
            cosine: Some(0.01),
            gradient: true,
            ..honest
        };
        assert_eq!(
            judge(&noise_gradient, lazy, false),
            Outcome::Fail(SpotFailure::OutputNotReproduced)
        );
        let scaled = Measured {
            norm_ratio: Some(2.0),
            ..honest
        };
        assert_eq!(
            judge(&scaled, lazy, false),
            Outcome::Fail(SpotFailure::OutputScaleWrong)
        );
        let lie = Measured {
            loss_ratio: Some(0.8),
            ..honest
        };
        assert_eq!(
            judge(&lie, lazy, false),
            Outcome::Fail(SpotFailure::LossNotReproduced)
        );
        let stale = Measured {
            unchanged_weights: true,
            ..honest
        };
        assert_eq!(
            judge(&stale, lazy, false),
            Outcome::Fail(SpotFailure::WeightsNeverStepped)
        );
        // Too early in the epoch for a step to be owed.
        let early = Measured {
            unchanged_weights: true,
            served: lazy - 1,
            ..honest
        };
        assert_eq!(judge(&early, lazy, false), Outcome::Pass);
        // The first epoch judges only the tests of the weights' steps.
        assert_eq!(judge(&noise, lazy, true), Outcome::Pass);
        assert_eq!(
            judge(&stale, lazy, true),
            Outcome::Fail(SpotFailure::WeightsNeverStepped)
        );
    }

    #[test]
    fn weights_changed_by_an_ulp_have_not_stepped() {
        let honest = Measured {
            moved: Some(0.5),
            served: 100,
            ..Measured::default()
        };
        let lazy = lazy_threshold(1);
        assert_eq!(judge(&honest, lazy, false), Outcome::Pass);
        let start = vec![0.25f32; 1000];
        let mut nudged = start.clone();
        nudged[0] = f32::from_bits(nudged[0].to_bits() ^ 1);
        let ulp = Measured {
            moved: moved(&nudged, &start, 3e-3),
            ..honest
        };
        assert!(ulp.moved.unwrap() < 1e-6, "{ulp:?}");
        for first_epoch in [false, true] {
            assert_eq!(
                judge(&ulp, lazy, first_epoch),
                Outcome::Fail(SpotFailure::WeightsNeverStepped)
            );
        }
        // Too early in the epoch for a step to be owed; unknown starting weights judge
        // nothing.
        let early = Measured {
            served: lazy - 1,
            ..ulp
        };
        assert_eq!(judge(&early, lazy, false), Outcome::Pass);
        // ... but that is undecided, not cleared: the miner is checked again. An honest
        // miner as early in its epoch has stepped, and one judged lazy is decided.
        assert!(laziness_undecided(&early, lazy));
        let honest_early = Measured {
            served: lazy - 1,
            ..honest
        };
        assert!(!laziness_undecided(&honest_early, lazy));
        assert!(!laziness_undecided(&ulp, lazy));
        let unknown = Measured {
            moved: None,
            ..honest
        };
        assert_eq!(judge(&unknown, lazy, false), Outcome::Pass);
        assert!(!laziness_undecided(&unknown, lazy));
        let nan = Measured {
            moved: Some(f64::NAN),
            ..honest
        };
        assert_eq!(
            judge(&nan, lazy, false),
            Outcome::Fail(SpotFailure::WeightsNeverStepped)
        );
        // Every weight moved by an AdamW step of a tenth of the learning rate: enough.
        let stepped: Vec<f32> = start.iter().map(|w| w + 3e-4).collect();
        let moved_by = moved(&stepped, &start, 3e-3).unwrap();
        assert!((moved_by - 0.1).abs() < 1e-3, "{moved_by}");
        assert!(moved(&start, &start[1..], 3e-3).is_none());
        assert!(moved(&start, &start, 0.0).is_none());
        assert!(moved(&[], &[], 3e-3).is_none());
    }

    #[test]
    fn a_tails_loss_may_lie_between_its_weights_now_and_at_the_epochs_start() {
        // Live, at Llama-3.2-1B's width with 64-token samples, an honest tail's own step on
        // the sample lowered its loss by 10-30 % before the check recomputed it: the ledger's
        // loss was 1.11-1.28 times the one recomputed with the weights it answered with.
        let honest = Measured {
            cosine: Some(0.95),
            norm_ratio: Some(1.0),
            loss_ratio: Some(1.28),
            start_loss_ratio: Some(0.93),
            gradient: true,
            served: 100,
            ..Measured::default()
        };
        let lazy = lazy_threshold(1);
        assert_eq!(judge(&honest, lazy, false), Outcome::Pass);
        // Without the epoch's starting loss to bound it, the claim is held to the weights
        // it answered with.
        let unbounded = Measured {
            start_loss_ratio: None,
            ..honest
        };
        assert_eq!(
            judge(&unbounded, lazy, false),
            Outcome::Fail(SpotFailure::LossNotReproduced)
        );
        // Claimed above what the sample cost even before the epoch's steps (inflated), or
        // below what it costs with the weights after its steps (a lie, whatever the start
        // says).
        for (now, start) in [
            (1.5, 1.2),
            (1.5, f64::NAN),
            (0.85, 0.7),
            (0.85, 1.0),
            (0.85, f64::NAN),
        ] {
            let wrong = Measured {
                loss_ratio: Some(now),
                start_loss_ratio: Some(start),
                ..honest
            };
            assert_eq!(
                judge(&wrong, lazy, false),
                Outcome::Fail(SpotFailure::LossNotReproduced),
                "{now} {start}"
            );
        }
    }

    #[test]
    fn a_busy_honest_tails_gradient_norm_is_not_a_failure_but_a_scaled_one_is() {
        // Live, an honest tail that carried its stage alone answered a check with a gradient
        // of cosine 0.980 and norm ratio 1.347 (and 1.62 once before, on a loaded machine):
        // its weights had moved 10 learning rates since the epoch began.
        let busy = Measured {
            cosine: Some(0.980),
            norm_ratio: Some(1.347),
            loss_ratio: Some(1.012),
            gradient: true,
            served: 121,
            ..Measured::default()
        };
        let lazy = lazy_threshold(1);
        assert_eq!(judge(&busy, lazy, false), Outcome::Pass);
        for ratio in [1.62, 0.6] {
            let loaded = Measured {
                norm_ratio: Some(ratio),
                ..busy
            };
            assert_eq!(judge(&loaded, lazy, false), Outcome::Pass, "{ratio}");
        }
        for ratio in [2.5, 0.4, f64::NAN] {
            let scaled = Measured {
                norm_ratio: Some(ratio),
                ..busy
            };
            assert_eq!(
                judge(&scaled, lazy, false),
                Outcome::Fail(SpotFailure::OutputScaleWrong),
                "{ratio}"
            );
        }
        // An activation keeps the tighter band.
        let activation = Measured {
            gradient: false,
            loss_ratio: None,
            ..busy
        };
        assert_eq!(
            judge(&activation, lazy, false),
            Outcome::Fail(SpotFailure::OutputScaleWrong)
        );
    }

    #[test]
    fn a_middle_stages_gradient_upstream_is_judged_like_a_tails() {
        let honest = Measured {
            cosine: Some(0.99),
            norm_ratio: Some(1.0),
            grad_cosine: Some(0.95),
            grad_norm_ratio: Some(1.02),
            served: 100,
            ..Measured::default()
        };
        let lazy = lazy_threshold(1);
        assert_eq!(judge(&honest, lazy, false), Outcome::Pass);
        for (cosine, ratio, why) in [
            (0.01, 1.0, SpotFailure::GradientNotReproduced),
            (f64::NAN, 1.0, SpotFailure::GradientNotReproduced),
            (0.99, 2.5, SpotFailure::GradientScaleWrong),
            (0.99, 0.4, SpotFailure::GradientScaleWrong),
        ] {
            let wrong = Measured {
                grad_cosine: Some(cosine),
                grad_norm_ratio: Some(ratio),
                ..honest
            };
            assert_eq!(judge(&wrong, lazy, false), Outcome::Fail(why));
            // The warm-up's first epoch is not judged so.
            assert_eq!(judge(&wrong, lazy, true), Outcome::Pass);
        }
        // No gradients shown: a dodge, unless the activation already failed.
        let missing = Measured {
            grad_cosine: None,
            grad_norm_ratio: None,
            gradients_missing: true,
            ..honest
        };
        assert_eq!(
            judge(&missing, lazy, false),
            Outcome::Inconclusive(SpotInconclusive::GradientsNotHeld)
        );
        assert!(SpotInconclusive::GradientsNotHeld.against_miner());
        let missing_and_noise = Measured {
            cosine: Some(0.0),
            ..missing
        };
        assert_eq!(
            judge(&missing_and_noise, lazy, false),
            Outcome::Fail(SpotFailure::OutputNotReproduced)
        );
    }

    #[test]
    fn replies_are_read_as_chunks_of_the_stage_checked() {
        let target = Target {
            epoch: 2,
            peer: "p".into(),
            stage: 1,
            tail: false,
            sample: 9,
            claimed_loss: 2.0,
            served: 40,
            later: 0,
            receipt: None,
            replicas: vec!["p".into()],
        };
        let reply = |stage: u32, hash: &str, payload: &[u8]| {
            messages::encode(
                Service::SpotCheck,
                &SpotCheckReply::Evidence {
                    stage,
                    loss: None,
                    input_len: 3,
                    output_len: 2,
                    weights_len: 1,
                    received_len: 0,
                    sent_back_len: 0,
                    total: 9,
                    hash: hash.into(),
                    offset: 4,
                },
                payload,
            )
            .unwrap()
        };
        let payload = [5u8, 0, 0, 128, 63];
        let hash = "0f".repeat(32);
        let good = reply(1, &hash, &payload);
        assert_eq!(
            parse_reply(&good, &target).unwrap(),
            Reply::Evidence(transfer::Chunk {
                layout: transfer::Layout {
                    stage: 1,
                    input_len: 3,
                    output_len: 2,
                    weights_len: 1,
                    received_len: 0,
                    sent_back_len: 0,
                },
                total: 9,
                hash: [15; 32],
                offset: 4,
                bytes: &payload,
            })
        );
        let malformed = Err(Outcome::Fail(SpotFailure::EvidenceMalformed));
        for bad in [
            reply(0, &hash, &payload),
            reply(1, "0f", &payload),
            vec![crate::wire::rpc::SPOT_CHECK, 0, 0],
        ] {
            assert_eq!(parse_reply(&bad, &target), malformed);
        }
        let not_held = messages::encode(Service::SpotCheck, &SpotCheckReply::NotHeld, &[]).unwrap();
        assert_eq!(
            parse_reply(&not_held, &target),
            Err(Outcome::Inconclusive(SpotInconclusive::NotHeld))
        );
        let tail = Target {
            tail: true,
            stage: 2,
            ..target.clone()
        };
        assert_eq!(
            parse_reply(&not_held, &tail),
            Err(Outcome::Fail(SpotFailure::ClaimedSampleNotHeld))
        );
        assert_eq!(
            parse_reply(
                &crate::wire::rpc::error_response(crate::wire::rpc::ErrorCode::Busy),
                &target
            ),
            Err(Outcome::Inconclusive(SpotInconclusive::Refused))
        );
    }

    #[test]
    fn a_superseded_reply_must_name_a_merge_hash() {
        let target = Target {
            epoch: 2,
            peer: "p".into(),
            stage: 1,
            tail: true,
            sample: 9,
            claimed_loss: 2.0,
            served: 40,
            later: 0,
            receipt: None,
            replicas: vec!["p".into()],
        };
        let superseded = |epoch: Option<u64>, hash: &str| {
            let header = SpotCheckReply::Superseded {
                epoch,
                hash: hash.into(),
            };
            messages::encode(Service::SpotCheck, &header, &[]).unwrap()
        };
        let hash = "0f".repeat(32);
        assert_eq!(
            parse_reply(&superseded(Some(1), &hash), &target),
            Ok(Reply::Superseded(Claim {
                epoch: Some(1),
                hash: [15; 32]
            }))
        );
        assert_eq!(
            parse_reply(&superseded(None, &hash.to_uppercase()), &target),
            Ok(Reply::Superseded(Claim {
                epoch: None,
                hash: [15; 32]
            }))
        );
        // Naming nothing checkable is malformed, as is the bare answer older nodes sent.
        let malformed = Err(Outcome::Fail(SpotFailure::EvidenceMalformed));
        for bad in [
            "",
            "0f",
            &"0g".repeat(32),
            &"0f".repeat(33),
            &"é".repeat(32),
        ] {
            assert_eq!(parse_reply(&superseded(Some(1), bad), &target), malformed);
        }
        let bare = [
            &[crate::wire::rpc::SPOT_CHECK, 0, 0, 0, 12][..],
            b"\"Superseded\"",
        ]
        .concat();
        assert_eq!(parse_reply(&bare, &target), malformed);
    }

    #[test]
    fn a_miner_that_dodged_is_checked_again_after_one_other() {
        let records: Vec<LossRecord> = (0..40)
            .map(|i| record(i, &[["h0", "h1"][i as usize % 2], "m", "t"], 3.0))
            .collect();
        let mut schedule = Schedule::new([9; 32]);
        let first = schedule.pick(5, &records).unwrap().peer;
        schedule.recheck(&first);
        let other = schedule.pick(5, &records).unwrap().peer;
        assert_ne!(other, first);
        assert_eq!(schedule.pick(5, &records).unwrap().peer, first);
        // A miner that keeps dodging is checked every other time, and the rounds go on.
        let mut schedule = Schedule::new([9; 32]);
        let mut others = BTreeSet::new();
        for _ in 0..4 {
            schedule.recheck("t");
            others.insert(schedule.pick(5, &records).unwrap().peer);
            assert_eq!(schedule.pick(5, &records).unwrap().peer, "t");
        }
        assert!(others.len() >= 3, "{others:?}");
        // A miner with no record in the epoch is not checked again.
        schedule.recheck("gone");
        let picks: Vec<String> = (0..3)
            .map(|_| schedule.pick(5, &records).unwrap().peer)
            .collect();
        assert!(!picks.contains(&"gone".to_string()), "{picks:?}");
    }

    #[test]
    fn compare_measures_direction_and_scale() {
        let a = [1.0, 2.0, 3.0];
        let (c, r) = compare(&a, &a).unwrap();
        assert!((c - 1.0).abs() < 1e-12 && (r - 1.0).abs() < 1e-12);
        let doubled = [2.0, 4.0, 6.0];
        let (c, r) = compare(&doubled, &a).unwrap();
        assert!((c - 1.0).abs() < 1e-12 && (r - 2.0).abs() < 1e-12);
        let (c, _) = compare(&[1.0, 0.0], &[0.0, 1.0]).unwrap();
        assert!(c.abs() < 1e-12);
        assert!(compare(&a, &[1.0]).is_none());
        let (c, r) = compare(&[0.0, 0.0], &a[..2]).unwrap();
        assert_eq!((c, r), (0.0, 0.0));
    }

    #[test]
    fn a_miner_new_to_the_schedule_is_checked_before_the_round_goes_on() {
        // Live (the `dodge` adversary test): a tail that joined in epoch 1 waited for the
        // round begun before it came, was not checked in that epoch, and its understated
        // losses went into the epoch's fit unquestioned.
        let honest = ["a", "b", "c", "d", "e"];
        let records: Vec<LossRecord> = (0..20)
            .map(|i| record(i, &[honest[i as usize % 5]], 3.0))
            .collect();
        for secret in 0..8u8 {
            let mut schedule = Schedule::new([secret; 32]);
            let first = schedule.pick(1, &records).unwrap().peer;
            assert!(honest.contains(&first.as_str()));
            let mut joined = records.clone();
            joined.push(record(20, &["new"], 2.0));
            assert_eq!(
                schedule.pick(1, &joined).unwrap().peer,
                "new",
                "secret {secret}"
            );
            // Then the round goes on where it was: the other four, once each.
            let rest: BTreeSet<String> = (0..4)
                .map(|_| schedule.pick(1, &joined).unwrap().peer)
                .collect();
            assert_eq!(rest.len(), 4);
            assert!(!rest.contains(&first) && !rest.contains("new"));
        }
    }

    #[test]
    fn the_schedule_checks_every_miner_in_a_round_on_its_newest_records() {
        let records: Vec<LossRecord> = (0..40)
            .map(|i| {
                let head = if i % 2 == 0 { "h0" } else { "h1" };
                record(i, &[head, "m", "t"], 3.0)
            })
            .collect();
        let mut schedule = Schedule::new([7; 32]);
        let mut seen = BTreeSet::new();
        for _ in 0..4 {
            let target = schedule.pick(5, &records).unwrap();
            assert_eq!(target.epoch, 5);
            assert!(
                target.sample >= 40 - 2 * RECENT_RECORDS as u64,
                "{target:?}"
            );
            let expected_stage = match target.peer.as_str() {
                "h0" | "h1" => 0,
                "m" => 1,
                _ => 2,
            };
            assert_eq!(target.stage, expected_stage);
            assert_eq!(target.tail, expected_stage == 2);
            // How many of the miner's records are newer than the one picked.
            assert!(target.later < RECENT_RECORDS as u64, "{target:?}");
            if target.peer == "t" {
                assert_eq!(target.sample, 39 - target.later, "{target:?}");
            }
            assert_eq!(target.served, if expected_stage == 0 { 20 } else { 40 });
            let replicas: &[&str] = match expected_stage {
                0 => &["h0", "h1"],
                1 => &["m"],
                _ => &["t"],
            };
            assert_eq!(target.replicas, replicas);
            seen.insert(target.peer);
        }
        assert_eq!(seen.len(), 4, "one round checks each miner once");
        // Another secret, another order and other moments.
        let mut other = Schedule::new([8; 32]);
        let a: Vec<_> = (0..8).map(|_| schedule.next_delay()).collect();
        let b: Vec<_> = (0..8).map(|_| other.next_delay()).collect();
        assert_ne!(a, b);
        assert!(a
            .iter()
            .all(|d| *d >= MEAN_INTERVAL / 2 && *d <= MEAN_INTERVAL * 3 / 2));
        assert!(Schedule::new([1; 32]).pick(0, &[]).is_none());
    }

    #[test]
    fn outcomes_read_as_the_logs_and_reasons_always_showed_them() {
        let failures = [
            (SpotFailure::WeightsNeverStepped, "weights_never_stepped"),
            (SpotFailure::OutputNotReproduced, "output_not_reproduced"),
            (SpotFailure::OutputScaleWrong, "output_scale_wrong"),
            (SpotFailure::LossNotReproduced, "loss_not_reproduced"),
            (
                SpotFailure::GradientNotReproduced,
                "gradient_not_reproduced",
            ),
            (SpotFailure::GradientScaleWrong, "gradient_scale_wrong"),
            (SpotFailure::EvidenceMalformed, "evidence_malformed"),
            (SpotFailure::ClaimedSampleNotHeld, "claimed_sample_not_held"),
            (SpotFailure::SupersededFalse, "superseded_false"),
            (SpotFailure::DodgedChecks, "dodged_checks"),
            (SpotFailure::WrongTokens, "wrong_tokens"),
        ];
        for (failure, label) in failures {
            assert_eq!(failure.to_string(), label);
            assert_eq!(
                format!("{:?}", Outcome::Fail(failure)),
                format!("Fail({label:?})")
            );
        }
        let inconclusive = [
            (SpotInconclusive::Refused, "refused"),
            (SpotInconclusive::NotHeld, "not_held"),
            (SpotInconclusive::Superseded, "superseded"),
            (
                SpotInconclusive::SupersededUnverified,
                "superseded_unverified",
            ),
            (SpotInconclusive::GradientsNotHeld, "gradients_not_held"),
            (SpotInconclusive::BadPeer, "bad_peer"),
            (SpotInconclusive::RequestNotEncoded, "request_not_encoded"),
            (SpotInconclusive::NoAnswer, "no_answer"),
            (SpotInconclusive::ChunkNotServed, "chunk_not_served"),
            (SpotInconclusive::NoScratchStage, "no_scratch_stage"),
            (SpotInconclusive::NoSample, "no_sample"),
            (SpotInconclusive::RecomputeFailed, "recompute_failed"),
        ];
        for (why, label) in inconclusive {
            assert_eq!(
                format!("{:?}", Outcome::Inconclusive(why)),
                format!("Inconclusive({label:?})")
            );
        }
        assert_eq!(format!("{:?}", Outcome::Pass), "Pass");
    }
}
