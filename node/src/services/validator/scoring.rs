//! Scoring the miners of an epoch, and why a miner is paid nothing for it (pure: the task
//! feeds it and publishes what it returns).
//!
//! CLASP ([`attribution::clasp`]) gives each miner its effect on the loss and flags the
//! harmful ones; a miner's epoch score is the samples it served times its quality (0 when
//! flagged or caught), smoothed over epochs ([`attribution::score`]), and turned into chain
//! weights ([`attribution::weights`]).
//!
//! A miner is caught when a spot check or a merge audit proves it cheated, or when it sent
//! loss records whose hop receipts do not prove their pathways (credit it claimed for work
//! it cannot show: `crate::wire::receipt`) ([`Proof`]); it then stays at quality 0 for
//! [`PROBATION_EPOCHS`], and is listed in the epoch's weights even if none of its records
//! was taken. Spot checks it answered without
//! evidence are counted against it ([`super::dodges`]); too many of them catch it as a
//! failed check would (`spot_check: dodged_checks`). Why a miner weighs nothing is a
//! [`CatchReason`], whose text (`clasp`, `spot_check: …`, `merge_audit: …`,
//! `probation after …`) is what `/status`, the weights JSON and the report show.

use std::collections::{BTreeMap, BTreeSet};

use attribution::{clasp, EpochWork, Scores, Uid};
use bootstrap::{EpochPlan, PeerIdStr};

use super::api::{EpochWeights, MinerWeight, SpotCheckCounts};
use super::dodges::DodgeBook;
use super::ledger::Ledger;
use super::spot::{Outcome, SpotFailure};
use crate::services::merge::api::FindingKind;
use crate::wire::messages::LossRecord;

/// Epochs a miner caught by a spot check or a merge audit stays at quality 0 (the epoch it
/// was caught in included): cheating must cost more than the epochs a check might miss.
pub(crate) const PROBATION_EPOCHS: u64 = 10;

/// What proved that a miner cheated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Proof {
    /// A spot check did not reproduce its work.
    SpotCheck(SpotFailure),
    /// A merge audit named it.
    MergeAudit(FindingKind),
    /// It sent loss records whose receipts do not prove their pathways; the refusal's label
    /// (`losses_no_receipts`, `losses_bad_receipt`, `losses_broken_chain`).
    ForgedCredit(&'static str),
}

impl Proof {
    /// Whether it proves the miner lied about its work (a spot check, or forged loss
    /// records): its losses are not to be trusted.
    pub(crate) fn is_spot_check(self) -> bool {
        matches!(self, Proof::SpotCheck(_) | Proof::ForgedCredit(_))
    }
}

impl std::fmt::Display for Proof {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Proof::SpotCheck(why) => write!(f, "spot_check: {why}"),
            Proof::MergeAudit(kind) => write!(f, "merge_audit: {kind}"),
            Proof::ForgedCredit(label) => write!(f, "loss_records: {label}"),
        }
    }
}

/// Why a miner is flagged for an epoch (quality 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CatchReason {
    /// CLASP found its effect on the loss harmful.
    Clasp,
    /// Caught in the epoch (or an earlier one not scored yet).
    Caught(Proof),
    /// Still on probation after being caught.
    Probation {
        /// What caught it.
        after: Proof,
    },
}

impl CatchReason {
    /// The proof behind the reason, whether caught now or on probation after it.
    pub(crate) fn proof(self) -> Option<Proof> {
        match self {
            CatchReason::Clasp => None,
            CatchReason::Caught(proof) | CatchReason::Probation { after: proof } => Some(proof),
        }
    }
}

impl std::fmt::Display for CatchReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CatchReason::Clasp => f.write_str("clasp"),
            CatchReason::Caught(proof) => write!(f, "{proof}"),
            CatchReason::Probation { after } => write!(f, "probation after {after}"),
        }
    }
}

/// Miners on probation: the first epoch each is paid again, and why.
type Probation = BTreeMap<PeerIdStr, (u64, Proof)>;

/// What the validator knows of the miners between two scorings: the ledger, the smoothed
/// scores, who was caught and who is on probation, and the spot checks' tally.
#[derive(Default)]
pub(crate) struct Scoring {
    ledger: Ledger,
    scores: Scores,
    /// Miners caught by spot checks or merge audits, per epoch, until it is scored (the
    /// first proof of each miner kept).
    caught: BTreeMap<u64, BTreeMap<PeerIdStr, Proof>>,
    probation: Probation,
    /// Spot checks ended since the last scoring.
    checks: SpotCheckCounts,
    /// Spot checks per miner and epoch, and the dodges among them.
    dodges: DodgeBook,
}

impl Scoring {
    /// Adds loss records the router accepted for `epoch`.
    pub(crate) fn losses(&mut self, epoch: u64, records: Vec<LossRecord>) {
        self.ledger.add(epoch, records);
    }

    /// `epoch`'s records so far.
    pub(crate) fn records(&self, epoch: u64) -> Option<&[LossRecord]> {
        self.ledger.epoch(epoch)
    }

    /// Notes that `proof` caught `peer` in `epoch` (a miner's first proof in an epoch stays).
    pub(crate) fn caught(&mut self, epoch: u64, peer: PeerIdStr, proof: Proof) {
        self.caught
            .entry(epoch)
            .or_default()
            .entry(peer)
            .or_insert(proof);
    }

    /// Counts a finished spot check of `peer`'s sample of `epoch`, and catches it if failed
    /// or if it leaves the miner dodging far more checks than honest miners do; returns the
    /// failure that caught it, if any. `peer` is the text a loss record names it by.
    pub(crate) fn spot_checked(
        &mut self,
        epoch: u64,
        peer: &str,
        outcome: Outcome,
    ) -> Option<SpotFailure> {
        match outcome {
            Outcome::Pass => self.checks.passed += 1,
            Outcome::Fail(_) => self.checks.failed += 1,
            Outcome::Inconclusive(why) => {
                self.checks.inconclusive += 1;
                if why.against_miner() {
                    self.checks.dodged += 1;
                }
            }
        }
        // A check reaches the miner only if its id is one (a text that is not ends the
        // check inconclusive, on the validator's side, before it is asked).
        let peer = PeerIdStr::parse(peer).ok()?;
        let dodged = self.dodges.record(epoch, &peer, outcome);
        let why = match outcome {
            Outcome::Fail(why) => Some(why),
            _ => dodged,
        }?;
        self.caught(epoch, peer, Proof::SpotCheck(why));
        Some(why)
    }

    /// Scores `plan`'s epoch with the miners' `uids` in force now: its records, catches
    /// and probations, and the spot checks counted since the last scoring.
    pub(crate) fn score(&mut self, plan: &EpochPlan, uids: &BTreeMap<String, Uid>) -> EpochWeights {
        let records = self.ledger.take(plan.epoch);
        let (caught, mut liars) = self.take_catches(plan.epoch);
        // A miner that ended a check of this epoch without evidence showed nothing of its
        // work: its losses are not trusted in the fit either (honest miners measured no
        // dodge in over a thousand checks; its pay is still its work's, unless caught).
        liars.extend(
            self.dodges
                .epoch(plan.epoch)
                .into_iter()
                .filter(|(_, tally)| tally.dodged > 0)
                .filter_map(|(peer, _)| PeerIdStr::parse(&peer).ok()),
        );
        let caught = apply_probation(&mut self.probation, caught, plan.epoch);
        let mut weights =
            weigh_distrusting(plan, &records, uids, &caught, &liars, &mut self.scores);
        weights.spot_checks = std::mem::take(&mut self.checks);
        weights.spot_checks.miners = self.dodges.epoch(plan.epoch);
        weights
    }

    /// The catches of `epoch` and any earlier one not scored yet (a check that ended
    /// late), and the miners spot checks of later epochs already proved to lie.
    fn take_catches(&mut self, epoch: u64) -> (BTreeMap<PeerIdStr, Proof>, BTreeSet<PeerIdStr>) {
        let mut caught = BTreeMap::new();
        while let Some(entry) = self.caught.first_entry() {
            if *entry.key() > epoch {
                break;
            }
            for (peer, why) in entry.remove() {
                caught.entry(peer).or_insert(why);
            }
        }
        let liars = self
            .caught
            .values()
            .flat_map(|by_peer| by_peer.iter())
            .filter(|(_, why)| why.is_spot_check())
            .map(|(peer, _)| peer.clone())
            .collect();
        (caught, liars)
    }
}

/// A miner caught in `epoch` starts (or restarts) a probation of [`PROBATION_EPOCHS`]; one
/// still on probation is flagged too (a spot check may miss a cheater for an epoch; being
/// caught once costs the whole probation). Returns why each miner is flagged.
fn apply_probation(
    probation: &mut Probation,
    caught: BTreeMap<PeerIdStr, Proof>,
    epoch: u64,
) -> BTreeMap<PeerIdStr, CatchReason> {
    for (peer, why) in &caught {
        probation.insert(peer.clone(), (epoch + PROBATION_EPOCHS, *why));
    }
    probation.retain(|_, (until, _)| *until > epoch);
    let mut flagged: BTreeMap<PeerIdStr, CatchReason> = caught
        .into_iter()
        .map(|(peer, why)| (peer, CatchReason::Caught(why)))
        .collect();
    for (peer, (_, why)) in probation.iter() {
        flagged
            .entry(peer.clone())
            .or_insert(CatchReason::Probation { after: *why });
    }
    flagged
}

/// [`weigh_distrusting`] with no later catches: the unit tests' entry.
#[cfg(test)]
pub(crate) fn weigh(
    plan: &EpochPlan,
    records: &[LossRecord],
    uids: &BTreeMap<String, Uid>,
    caught: &BTreeMap<PeerIdStr, CatchReason>,
    scores: &mut Scores,
) -> EpochWeights {
    weigh_distrusting(plan, records, uids, caught, &BTreeSet::new(), scores)
}

/// A record whose every miner has a uid: (its order in the ledger, the uids, the record).
type Usable<'r> = (u64, Vec<Uid>, &'r LossRecord);

/// CLASP's estimate per miner, or why the fit could not run.
type Effects = (BTreeMap<Uid, clasp::MinerEffect>, Option<String>);

/// Scores the miners of `plan`'s epoch from its authenticated loss records and folds the
/// epoch into `scores`; returns the weights. Records naming a peer without a uid in the
/// metagraph (an open-registration miner) are left out: such a miner cannot be weighted
/// on chain. When the CLASP fit cannot run (too few records, a stage whose miners always
/// travel together) no one is flagged and the work alone is scored; the reason is kept.
///
/// The tails in `liars` have their losses kept out of the fit too: tails that ended a
/// check of this epoch without evidence, or that a spot check proved to lie in a later
/// epoch, before this one was scored (a lie is caught
/// an epoch after it starts more often than not, and in the epoch it joined in, a lying
/// tail's losses would shift the blame onto its honest sibling). Their pay for this epoch
/// is left as `caught` says.
pub(crate) fn weigh_distrusting(
    plan: &EpochPlan,
    records: &[LossRecord],
    uids: &BTreeMap<String, Uid>,
    caught: &BTreeMap<PeerIdStr, CatchReason>,
    liars: &BTreeSet<PeerIdStr>,
    scores: &mut Scores,
) -> EpochWeights {
    let usable = usable(records, uids);
    let mut served = served(&usable);
    // A miner caught (or on probation) in the plan is listed with the work it was credited,
    // none if all its records were refused, so that the weights say why it weighs nothing.
    for (peer, _) in caught.iter() {
        if let (Some(uid), Some(stage)) = (uids.get(peer.as_str()), plan.stage_of(peer)) {
            served.entry(*uid).or_insert((stage, 0));
        }
    }
    let (effects, fit_error) = fit(&usable, caught, liars);
    // The run's first epoch is not judged by CLASP: the loss falls from ~5.5 to ~3 in it,
    // far from the fit's quadratic trend, and an honest head was flagged there in a live
    // test (effects are still computed and shown).
    let judged = plan.epoch > 0;
    let peers: BTreeMap<Uid, &String> = uids.iter().map(|(peer, uid)| (*uid, peer)).collect();
    let caught_of = |uid: &Uid| peers.get(uid).and_then(|p| caught.get(p.as_str())).copied();
    let clasp_flagged = |uid: &Uid| judged && effects.get(uid).is_some_and(|e| e.flagged);
    let work: Vec<EpochWork> = served
        .iter()
        .map(|(uid, (_, samples))| {
            let proof = caught_of(uid).and_then(CatchReason::proof);
            EpochWork {
                uid: *uid,
                samples_completed: *samples,
                flagged: clasp_flagged(uid),
                // Forged loss records are a check of its work that failed, as a spot check is.
                spot_check_failed: proof.is_some_and(Proof::is_spot_check),
                merge_audit_failed: proof.is_some_and(|p| matches!(p, Proof::MergeAudit(_))),
            }
        })
        .collect();
    if let Err(error) = scores.update(&work) {
        tracing::warn!(%error, "scores not updated");
    }
    let chain: BTreeMap<Uid, u16> = attribution::to_chain(&scores.all())
        .unwrap_or_default()
        .into_iter()
        .collect();
    let miners = served
        .iter()
        .map(|(uid, (stage, samples))| {
            let effect = effects.get(uid);
            let reason =
                caught_of(uid).or_else(|| clasp_flagged(uid).then_some(CatchReason::Clasp));
            MinerWeight {
                uid: *uid,
                peer_id: peers.get(uid).map(|p| p.to_string()).unwrap_or_default(),
                stage: *stage,
                samples: *samples,
                effect: effect.map(|e| e.effect),
                standard_error: effect.map(|e| e.standard_error),
                flagged: reason.is_some(),
                reason: reason.map(|r| r.to_string()),
                weight: chain.get(uid).copied().unwrap_or(0),
            }
        })
        .collect();
    EpochWeights {
        epoch: plan.epoch,
        records: usable.len() as u64,
        fit_error,
        miners,
        spot_checks: SpotCheckCounts::default(),
    }
}

/// The records whose every miner has a uid, in ledger order.
fn usable<'r>(records: &'r [LossRecord], uids: &BTreeMap<String, Uid>) -> Vec<Usable<'r>> {
    let mut usable = Vec::with_capacity(records.len());
    for (order, record) in records.iter().enumerate() {
        let pathway: Option<Vec<Uid>> = record
            .pathway
            .iter()
            .map(|peer| uids.get(peer).copied())
            .collect();
        if let Some(pathway) = pathway {
            usable.push((order as u64, pathway, record));
        }
    }
    usable
}

/// Samples served to completion, per miner, with the stage it served them at.
fn served(usable: &[Usable<'_>]) -> BTreeMap<Uid, (u32, u64)> {
    let mut served: BTreeMap<Uid, (u32, u64)> = BTreeMap::new();
    for (_, pathway, _) in usable {
        for (stage, uid) in pathway.iter().enumerate() {
            let entry = served.entry(*uid).or_insert((stage as u32, 0));
            entry.1 += 1;
        }
    }
    served
}

/// Fits CLASP to the records a tail vouches for. A tail caught by a spot check (a loss it
/// did not compute, a gradient it did not compute, a sample it never served), now or in a
/// later epoch (`liars`), vouches for none of its losses: they stay out of the fit, where
/// they would shift the blame onto its honest sibling (a stage's effects sum to zero). The
/// other miners on those pathways keep the credit for serving them.
fn fit(
    usable: &[Usable<'_>],
    caught: &BTreeMap<PeerIdStr, CatchReason>,
    liars: &BTreeSet<PeerIdStr>,
) -> Effects {
    let distrusted = |record: &LossRecord| {
        record.pathway.last().is_some_and(|tail| {
            liars.contains(tail.as_str())
                || caught
                    .get(tail.as_str())
                    .and_then(|why| why.proof())
                    .is_some_and(Proof::is_spot_check)
        })
    };
    let fit: Vec<clasp::Record> = usable
        .iter()
        .filter(|(_, _, record)| !distrusted(record))
        .map(|(order, pathway, record)| clasp::Record {
            order: *order,
            pathway: pathway.clone(),
            loss: f64::from(record.loss),
        })
        .collect();
    match clasp::estimate(&fit, &clasp::Config::default()) {
        Ok(estimate) => (
            estimate.miners.into_iter().map(|m| (m.miner, m)).collect(),
            None,
        ),
        Err(error) => (BTreeMap::new(), Some(error.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Miner `i`'s id.
    fn id(i: u8) -> PeerIdStr {
        crate::wire::peer::of(
            &p2p::identity::Keypair::ed25519_from_bytes([i; 32])
                .unwrap()
                .public()
                .to_peer_id(),
        )
    }

    /// Miner `i` as a loss record names it.
    fn peer(i: u8) -> String {
        id(i).into()
    }

    fn plan(epoch: u64) -> EpochPlan {
        let run = bootstrap::RunConfig::default();
        let me = id(100);
        let miners = (0..6).map(id).collect();
        let mut plan = bootstrap::next_plan(&run, &me, None, None, &miners).unwrap();
        plan.epoch = epoch;
        plan
    }

    /// Records over 3 stages × 2 miners (peers 0–5, stage s holding peers 2s and 2s + 1),
    /// pathways cycling through every combination; `harm` adds to the loss of samples that
    /// pass through peer `bad`.
    fn records(n: u64, bad: Option<(String, f32)>) -> Vec<LossRecord> {
        (0..n)
            .map(|i| {
                let pathway: Vec<String> = (0..3u8)
                    .map(|s| peer(2 * s + ((i >> s) & 1) as u8))
                    .collect();
                // A falling trend and a deterministic wobble standing in for noise.
                let mut loss = 3.0 - 0.001 * i as f32 + 0.05 * ((i * 7919 % 13) as f32 / 13.0);
                if let Some((bad, harm)) = &bad {
                    if pathway.contains(bad) {
                        loss += harm;
                    }
                }
                LossRecord {
                    sample: i,
                    pathway,
                    loss,
                    receipts: Vec::new(),
                }
            })
            .collect()
    }

    fn uids() -> BTreeMap<String, Uid> {
        (0..6u8).map(|i| (peer(i), u16::from(i) + 10)).collect()
    }

    #[test]
    fn a_harmful_miner_is_flagged_and_weighs_nothing_while_the_others_share_the_rest() {
        let bad = peer(3);
        let mut scores = Scores::default();
        let weights = weigh(
            &plan(4),
            &records(400, Some((bad.clone(), 0.5))),
            &uids(),
            &BTreeMap::new(),
            &mut scores,
        );
        assert_eq!(weights.epoch, 4);
        assert_eq!(weights.records, 400);
        assert_eq!(weights.fit_error, None);
        assert_eq!(weights.miners.len(), 6);
        for m in &weights.miners {
            assert_eq!(m.samples, 200, "{m:?}");
            if m.peer_id == bad {
                assert!(m.flagged, "{m:?}");
                assert_eq!(m.weight, 0);
                assert!(m.effect.unwrap() > 0.2);
            } else {
                assert!(!m.flagged, "{m:?}");
                assert_eq!(m.weight, u16::MAX, "{m:?}");
            }
        }
    }

    #[test]
    fn the_first_epoch_is_not_judged_by_clasp() {
        let bad = peer(3);
        let weights = weigh(
            &plan(0),
            &records(400, Some((bad.clone(), 0.5))),
            &uids(),
            &BTreeMap::new(),
            &mut Scores::default(),
        );
        let m = weights.miners.iter().find(|m| m.peer_id == bad).unwrap();
        assert!(
            m.effect.unwrap() > 0.2,
            "the effect is still measured: {m:?}"
        );
        assert!(weights.miners.iter().all(|m| !m.flagged));
    }

    #[test]
    fn a_tail_caught_lying_loses_its_weight_and_does_not_shift_the_blame_to_its_sibling() {
        // Peer 5 (a tail) reports losses far below the truth.
        let liar = peer(5);
        let records = records(400, Some((liar.clone(), -0.5)));
        // Without the spot check's catch, CLASP sees the honest sibling as harmful.
        let uncaught = weigh(
            &plan(2),
            &records,
            &uids(),
            &BTreeMap::new(),
            &mut Scores::default(),
        );
        let sibling = uncaught
            .miners
            .iter()
            .find(|m| m.peer_id == peer(4))
            .unwrap();
        assert!(sibling.flagged, "{sibling:?}");

        let caught: BTreeMap<PeerIdStr, CatchReason> = [(
            id(5),
            CatchReason::Caught(Proof::SpotCheck(SpotFailure::LossNotReproduced)),
        )]
        .into();
        let weights = weigh(&plan(2), &records, &uids(), &caught, &mut Scores::default());
        for m in &weights.miners {
            if m.peer_id == liar {
                assert!(m.flagged);
                assert_eq!(m.reason.as_deref(), Some("spot_check: loss_not_reproduced"));
                assert_eq!(m.weight, 0);
            } else {
                assert!(!m.flagged, "{m:?}");
                assert_eq!(m.samples, 200, "serving for the liar still counts: {m:?}");
                assert_eq!(m.weight, u16::MAX, "{m:?}");
            }
        }
    }

    #[test]
    fn a_tail_caught_lying_in_a_later_epoch_does_not_shift_the_blame_either() {
        // Peer 5 lied in epoch 2 and was caught by a check of epoch 3, which ended before
        // epoch 2 was scored (a live run: the lie-loss tail's sibling was flagged).
        let liar = peer(5);
        let records = records(400, Some((liar.clone(), -0.5)));
        let weights = weigh_distrusting(
            &plan(2),
            &records,
            &uids(),
            &BTreeMap::new(),
            &BTreeSet::from([id(5)]),
            &mut Scores::default(),
        );
        let sibling = weights
            .miners
            .iter()
            .find(|m| m.peer_id == peer(4))
            .unwrap();
        assert!(!sibling.flagged, "{sibling:?}");
        assert!(weights.miners.iter().all(|m| !m.flagged), "{weights:?}");
    }

    #[test]
    fn honest_work_is_weighed_by_samples_and_unknown_peers_are_left_out() {
        let mut records = records(400, None);
        // A record naming a peer the metagraph does not hold.
        records[0].pathway[1] = peer(50);
        let mut scores = Scores::default();
        let weights = weigh(&plan(1), &records, &uids(), &BTreeMap::new(), &mut scores);
        assert_eq!(weights.records, 399);
        assert!(weights.miners.iter().all(|m| !m.flagged));
        assert!(weights.miners.iter().all(|m| m.peer_id != peer(50)));
        // Stage 1's peer 2 lost the first record: it served one sample fewer and weighs
        // less than the largest.
        let of = |p: u8| {
            weights
                .miners
                .iter()
                .find(|m| m.peer_id == peer(p))
                .unwrap()
        };
        assert_eq!(of(2).samples, 199);
        assert!(of(2).weight < u16::MAX);
        assert_eq!(of(3).weight, u16::MAX);
    }

    #[test]
    fn too_few_records_still_count_the_work_and_say_why_nothing_was_flagged() {
        let mut scores = Scores::default();
        let weights = weigh(
            &plan(0),
            &records(5, None),
            &uids(),
            &BTreeMap::new(),
            &mut scores,
        );
        assert!(weights.fit_error.is_some());
        assert!(weights
            .miners
            .iter()
            .all(|m| !m.flagged && m.effect.is_none()));
        assert!(weights.miners.iter().any(|m| m.weight == u16::MAX));
    }

    #[test]
    fn a_miner_caught_once_stays_unpaid_for_its_probation() {
        let mut probation = Probation::new();
        let p = id(7);
        let caught: BTreeMap<PeerIdStr, Proof> =
            [(p.clone(), Proof::SpotCheck(SpotFailure::LossNotReproduced))].into();
        let caught = apply_probation(&mut probation, caught, 3);
        assert_eq!(caught.len(), 1);
        // Not caught again in the next epochs: still unpaid, and weighed as caught.
        for epoch in 4..3 + PROBATION_EPOCHS {
            let caught = apply_probation(&mut probation, BTreeMap::new(), epoch);
            let why = caught.get(&p).unwrap_or_else(|| panic!("epoch {epoch}"));
            assert_eq!(
                why.to_string(),
                "probation after spot_check: loss_not_reproduced"
            );
            assert!(why.proof().is_some_and(|p| p.is_spot_check()));
        }
        // Paid again once the probation is over.
        let caught = apply_probation(&mut probation, BTreeMap::new(), 3 + PROBATION_EPOCHS);
        assert!(caught.is_empty());
        assert!(probation.is_empty());
        // A weighing on probation: weight 0, the reason shown.
        let mut scores = Scores::default();
        let on_probation: BTreeMap<PeerIdStr, CatchReason> = [(
            id(3),
            CatchReason::Probation {
                after: Proof::SpotCheck(SpotFailure::WeightsNeverStepped),
            },
        )]
        .into();
        let weights = weigh(
            &plan(5),
            &records(400, None),
            &uids(),
            &on_probation,
            &mut scores,
        );
        let m = weights
            .miners
            .iter()
            .find(|m| m.peer_id == peer(3))
            .unwrap();
        assert!(m.flagged);
        assert_eq!(m.weight, 0);
    }

    #[test]
    fn a_tail_that_forged_receipts_is_listed_unpaid_though_none_of_its_records_was_taken() {
        let forger = id(5);
        let mut scoring = Scoring::default();
        // The router refused every record of the forger; the ledger holds the others.
        let taken: Vec<LossRecord> = records(400, None)
            .into_iter()
            .filter(|r| !r.pathway.contains(&peer(5)))
            .collect();
        scoring.losses(4, taken);
        scoring.caught(4, forger.clone(), Proof::ForgedCredit("losses_bad_receipt"));
        let weights = scoring.score(&plan(4), &uids());
        let m = weights
            .miners
            .iter()
            .find(|m| m.peer_id == peer(5))
            .expect("the forger is listed");
        assert!(m.flagged);
        assert_eq!(m.samples, 0);
        assert_eq!(m.weight, 0);
        assert_eq!(
            m.reason.as_deref(),
            Some("loss_records: losses_bad_receipt")
        );
        assert!(weights
            .miners
            .iter()
            .filter(|m| m.peer_id != peer(5))
            .all(|m| !m.flagged && m.weight > 0));
        // The next epoch it is still unpaid, on probation.
        scoring.losses(5, records(400, None));
        let weights = scoring.score(&plan(5), &uids());
        let m = weights
            .miners
            .iter()
            .find(|m| m.peer_id == peer(5))
            .unwrap();
        assert_eq!(
            m.reason.as_deref(),
            Some("probation after loss_records: losses_bad_receipt")
        );
        assert_eq!(m.weight, 0);
    }

    #[test]
    fn reasons_read_as_status_the_weights_json_and_the_report_show_them() {
        let spot = Proof::SpotCheck(SpotFailure::LossNotReproduced);
        let audit = Proof::MergeAudit(FindingKind::Misbehaviour(
            training::butterfly::MisbehaviourKind::WrongAverage,
        ));
        let inflated = Proof::MergeAudit(FindingKind::InflatedSamples);
        assert_eq!(CatchReason::Clasp.to_string(), "clasp");
        assert_eq!(
            CatchReason::Caught(spot).to_string(),
            "spot_check: loss_not_reproduced"
        );
        assert_eq!(
            CatchReason::Caught(audit).to_string(),
            "merge_audit: WrongAverage"
        );
        assert_eq!(
            CatchReason::Caught(inflated).to_string(),
            "merge_audit: InflatedSamples"
        );
        assert_eq!(
            CatchReason::Probation { after: audit }.to_string(),
            "probation after merge_audit: WrongAverage"
        );
        assert_eq!(CatchReason::Clasp.proof(), None);
        assert_eq!(CatchReason::Probation { after: spot }.proof(), Some(spot));
    }
    #[test]
    fn a_miner_that_dodges_its_checks_is_caught_and_honest_misses_are_not() {
        use super::super::spot::SpotInconclusive;
        let mut scoring = Scoring::default();
        scoring.losses(2, records(400, None));
        let dodge = Outcome::Inconclusive(SpotInconclusive::Superseded);
        // Peer 5 never shows evidence: every check of it ends in a dodge.
        for _ in 0..6 {
            scoring.spot_checked(2, &peer(5), dodge);
        }
        // Peer 4 missed one check among passes (a merge in flight), as honest miners may.
        scoring.spot_checked(2, &peer(4), dodge);
        for _ in 0..5 {
            scoring.spot_checked(2, &peer(4), Outcome::Pass);
        }
        // Peer 3's checks ended on the validator's side only: nothing against it.
        for why in [
            SpotInconclusive::NoScratchStage,
            SpotInconclusive::RecomputeFailed,
            SpotInconclusive::RequestNotEncoded,
            SpotInconclusive::NoSample,
            SpotInconclusive::NoScratchStage,
        ] {
            scoring.spot_checked(2, &peer(3), Outcome::Inconclusive(why));
        }
        let weights = scoring.score(&plan(2), &uids());
        for m in &weights.miners {
            if m.peer_id == peer(5) {
                assert!(m.flagged, "{m:?}");
                assert_eq!(m.reason.as_deref(), Some("spot_check: dodged_checks"));
                assert_eq!(m.weight, 0);
            } else {
                assert!(!m.flagged, "{m:?}");
            }
        }
    }

    #[test]
    fn a_tail_that_dodged_a_check_of_the_epoch_does_not_shift_the_blame_to_its_sibling() {
        // Peer 5 (a tail) reports losses far below the truth and answered the one check of
        // the epoch it got before the epoch was scored `Superseded` (a live run: the `dodge`
        // tail's honest sibling was flagged by CLASP in the epoch it joined).
        let mut scoring = Scoring::default();
        scoring.losses(2, records(400, Some((peer(5), -0.5))));
        scoring.spot_checked(
            2,
            &peer(5),
            Outcome::Inconclusive(crate::services::validator::spot::SpotInconclusive::Superseded),
        );
        let weights = scoring.score(&plan(2), &uids());
        let sibling = weights
            .miners
            .iter()
            .find(|m| m.peer_id == peer(4))
            .unwrap();
        assert!(!sibling.flagged, "{sibling:?}");
        assert!(weights.miners.iter().all(|m| !m.flagged), "{weights:?}");
    }
}
