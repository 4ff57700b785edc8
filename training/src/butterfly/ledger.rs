//! One node's book of a merge's gossip, and the pure decisions taken from it: which
//! members a holder includes, when a partition is settled, which claim a member takes.
//!
//! No IO and no clock: the caller says whether a commitment arrived before the commit
//! deadline. Guarantees: a message for another merge, or whose author is not its signer,
//! or that does not fit the plan, changes nothing; a member's first commitment is the one
//! kept, and a second, different one marks it as an equivocator (excluded from then on and
//! reported once); a holder's claim with a higher round replaces the previous one, and two
//! different claims with the same round are reported once as equivocation.

use std::cmp::Reverse;
use std::collections::BTreeSet;
use std::sync::Arc;

use super::{
    Commitment, Evidence, Gossip, Hash, MemberId, Misbehaviour, MisbehaviourKind, Plan, SliceHash,
};

/// What observing one gossip message changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    /// Nothing: another merge, a duplicate or a stale round.
    Nothing,
    /// A new commitment from this member.
    Commitment(usize),
    /// A new or newer claim for this partition.
    Slice(usize),
    /// The message shows its author equivocating; this report should be published.
    Conflict(Misbehaviour),
    /// Someone else's report.
    Report(Misbehaviour),
    /// The message does not fit this merge (reason for logs).
    Invalid(&'static str),
}

/// What a member does about one partition once the claims are in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No usable claim: keep this member's own values.
    KeepLocal,
    /// All usable claims agree: fetch `claim.result` from `sources` (holder indices, in
    /// order of preference; this member first if it is one of them).
    Accept {
        /// The agreed claim (the first one among equals).
        claim: SliceHash,
        /// Holders to ask.
        sources: Vec<usize>,
    },
    /// The holders disagree: recompute each claim from the committed inputs.
    Dispute {
        /// The conflicting claims.
        claims: Vec<SliceHash>,
    },
}

/// Outcome of recomputing one disputed claim from the committed inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// The recomputed average has the claimed hash.
    Reproduced,
    /// It does not; carries the hash that was recomputed.
    Refuted(Hash),
    /// It does, but an included input is an outlier among the claim's inputs
    /// ([`crate::butterfly::robust`]): the claim is not taken.
    AdmitsOutlier,
    /// Some input could not be fetched or verified: no verdict.
    Unknown,
}

struct Entry {
    commitment: Commitment,
    on_time: bool,
    encoded: Hash,
}

/// The book of one merge (epoch, stage) as seen by `reporter`.
pub struct Ledger {
    epoch: u64,
    stage: u32,
    plan: Arc<Plan>,
    reporter: MemberId,
    commitments: Vec<Option<Entry>>,
    /// Cap on a commitment's sample count (its member's weight in the average).
    max_samples: u64,
    /// Members whose commitment claimed more samples than the cap.
    capped: BTreeSet<usize>,
    equivocators: BTreeSet<usize>,
    /// Per partition, the latest claim of each holder (slot i is `plan.holders(p)[i]`).
    slices: Vec<[Option<SliceHash>; 2]>,
}

impl Ledger {
    pub fn new(epoch: u64, stage: u32, plan: Arc<Plan>, reporter: MemberId) -> Self {
        let n = plan.members().len();
        let partitions = plan.partitions();
        Ledger {
            epoch,
            stage,
            plan,
            reporter,
            commitments: (0..n).map(|_| None).collect(),
            max_samples: u64::MAX,
            capped: BTreeSet::new(),
            equivocators: BTreeSet::new(),
            slices: vec![[None, None]; partitions],
        }
    }

    /// Caps every commitment's sample count at `max_samples` (the same cap on every member,
    /// so both holders of a partition still compute the same bytes).
    pub fn with_max_samples(mut self, max_samples: u64) -> Self {
        self.max_samples = max_samples;
        self
    }

    /// Members whose commitment claimed more samples than the cap (they weigh the cap).
    pub fn capped(&self) -> Vec<MemberId> {
        self.capped
            .iter()
            .map(|&m| self.plan.member(m).to_string())
            .collect()
    }

    /// Records `message` signed by `from`; `on_time` says whether the commit deadline has
    /// not yet passed.
    pub fn observe(&mut self, from: &str, message: Gossip, on_time: bool) -> Observed {
        if message.merge() != (self.epoch, self.stage) {
            return Observed::Nothing;
        }
        if message.author() != from {
            return Observed::Invalid("author is not the signer");
        }
        match message {
            Gossip::Commitment(c) => self.observe_commitment(c, on_time),
            Gossip::SliceHash(s) => self.observe_slice(s),
            Gossip::Misbehaviour(m) => Observed::Report(m),
        }
    }

    fn observe_commitment(&mut self, c: Commitment, on_time: bool) -> Observed {
        let Some(index) = self.plan.index_of(&c.member) else {
            return Observed::Invalid("commitment from a non-member");
        };
        if c.partition_hashes.len() != self.plan.partitions() {
            return Observed::Invalid("commitment with the wrong number of partitions");
        }
        let encoded = Hash::of_bytes(&Gossip::Commitment(c.clone()).encode());
        let mut c = c;
        if c.samples > self.max_samples {
            self.capped.insert(index);
            c.samples = self.max_samples;
        }
        match &self.commitments[index] {
            None => {
                self.commitments[index] = Some(Entry {
                    commitment: c,
                    on_time,
                    encoded,
                });
                Observed::Commitment(index)
            }
            Some(entry) if entry.encoded == encoded => Observed::Nothing,
            Some(entry) => {
                if !self.equivocators.insert(index) {
                    return Observed::Nothing;
                }
                Observed::Conflict(self.report(
                    index,
                    MisbehaviourKind::Equivocation,
                    Evidence::ConflictingCommitments {
                        first: entry.encoded,
                        second: encoded,
                    },
                ))
            }
        }
    }

    fn observe_slice(&mut self, s: SliceHash) -> Observed {
        let p = s.partition as usize;
        if p >= self.plan.partitions() {
            return Observed::Invalid("claim for a partition out of range");
        }
        let holders = self.plan.holders(p);
        let Some(slot) = self
            .plan
            .index_of(&s.holder)
            .and_then(|h| holders.iter().position(|x| *x == h))
        else {
            return Observed::Invalid("claim from a member that does not hold the partition");
        };
        let sorted_members = s.included.windows(2).all(|w| w[0] < w[1])
            && s.included.iter().all(|m| self.plan.index_of(m).is_some());
        if !sorted_members || s.input_hashes.len() != s.included.len() || s.included.is_empty() {
            return Observed::Invalid("claim with a malformed included list");
        }
        match &self.slices[p][slot] {
            Some(old) if old.round > s.round => Observed::Nothing,
            Some(old) if old.round == s.round && *old == s => Observed::Nothing,
            Some(old) if old.round == s.round => {
                let holder = holders[slot];
                let (first, round) = (old.result, old.round);
                Observed::Conflict(self.report(
                    holder,
                    MisbehaviourKind::Equivocation,
                    Evidence::ConflictingSlices {
                        partition: p as u32,
                        round,
                        first,
                        second: s.result,
                    },
                ))
            }
            _ => {
                self.slices[p][slot] = Some(s);
                Observed::Slice(p)
            }
        }
    }

    /// A report by this ledger's owner against member `accused`.
    pub fn report(
        &self,
        accused: usize,
        kind: MisbehaviourKind,
        evidence: Evidence,
    ) -> Misbehaviour {
        Misbehaviour {
            epoch: self.epoch,
            stage: self.stage,
            reporter: self.reporter.clone(),
            accused: self.plan.member(accused).to_string(),
            kind,
            evidence,
        }
    }

    /// Marks a member as an equivocator (it served bytes that differ from its commitment).
    pub fn exclude(&mut self, member: usize) {
        self.equivocators.insert(member);
    }

    /// Members whose commitment arrived before the deadline and who have not equivocated.
    pub fn on_time(&self) -> BTreeSet<usize> {
        (0..self.commitments.len())
            .filter(|i| !self.equivocators.contains(i))
            .filter(|&i| self.commitments[i].as_ref().is_some_and(|e| e.on_time))
            .collect()
    }

    /// Whether every member of the plan has committed.
    pub fn all_committed(&self) -> bool {
        self.commitments.iter().all(Option::is_some)
    }

    /// A member's commitment, unless it equivocated (late ones included: they still let a
    /// verifier check a claim that included the member).
    /// The members among `inputs` (verified inputs of partition `p`, by member) whose input
    /// is an outlier ([`crate::butterfly::robust::outliers`]), with their committed hashes;
    /// inputs without a known commitment are not compared.
    pub fn outliers<'a>(
        &self,
        p: usize,
        inputs: impl IntoIterator<Item = (usize, &'a [f32])>,
    ) -> Vec<(usize, Hash)> {
        let mut members = Vec::new();
        let mut contributions = Vec::new();
        for (member, values) in inputs {
            let Some(commitment) = self.commitment(member) else {
                continue;
            };
            let Some(&hash) = commitment.partition_hashes.get(p) else {
                continue;
            };
            members.push((member, hash));
            contributions.push(crate::butterfly::Contribution {
                member: self.plan.member(member),
                samples: commitment.samples,
                values,
            });
        }
        if let Some(ratios) = crate::butterfly::robust::distance_ratios(&contributions) {
            let largest = ratios.iter().copied().fold(0.0, f64::max);
            tracing::debug!(
                partition = p,
                largest,
                "distance to the median over the median distance"
            );
        }
        crate::butterfly::robust::outliers(&contributions)
            .into_iter()
            .map(|k| members[k])
            .collect()
    }

    pub fn commitment(&self, member: usize) -> Option<&Commitment> {
        if self.equivocators.contains(&member) {
            return None;
        }
        self.commitments[member].as_ref().map(|e| &e.commitment)
    }

    /// The latest claims for partition `p`.
    pub fn claims(&self, p: usize) -> impl Iterator<Item = &SliceHash> {
        self.slices[p].iter().flatten()
    }

    /// Whether a claim's input hashes match the commitments known here (members with no
    /// known commitment are taken on the holder's word; a verifier will fail to reproduce
    /// the average if the holder lied about them).
    pub fn consistent(&self, s: &SliceHash) -> bool {
        let p = s.partition as usize;
        s.included.iter().zip(&s.input_hashes).all(|(m, h)| {
            self.plan
                .index_of(m)
                .and_then(|i| self.commitment(i))
                .is_none_or(|c| c.partition_hashes[p] == *h)
        })
    }

    /// Whether every partition is [settled](Ledger::settled).
    pub fn all_settled(&self) -> bool {
        let on_time = self.on_time();
        (0..self.plan.partitions()).all(|p| self.settled_given(p, &on_time))
    }

    /// Whether nothing more is expected for partition `p`: every holder that committed on
    /// time has a claim, and the claims agree on the result or, disagreeing, agree on the
    /// included set (a dispute that no further round will resolve).
    pub fn settled(&self, p: usize) -> bool {
        self.settled_given(p, &self.on_time())
    }

    fn settled_given(&self, p: usize, on_time: &BTreeSet<usize>) -> bool {
        let holders = self.plan.holders(p);
        let expected_present =
            (0..2).all(|slot| !on_time.contains(&holders[slot]) || self.slices[p][slot].is_some());
        let claims: Vec<&SliceHash> = self.claims(p).collect();
        let agree = claims.windows(2).all(|w| w[0].result == w[1].result);
        // Same included set, different results: no honest holder narrows further, so the
        // dispute can be settled now rather than at the deadline.
        let stuck = claims.len() == 2 && claims[0].included == claims[1].included;
        expected_present && (agree || stuck)
    }

    /// What member `me` (none for an auditor) does about partition `p`.
    pub fn decide(&self, p: usize, me: Option<usize>) -> Decision {
        let usable: Vec<(usize, &SliceHash)> = (0..2)
            .filter_map(|slot| self.slices[p][slot].as_ref().map(|s| (slot, s)))
            .filter(|(_, s)| self.consistent(s))
            .collect();
        let Some((_, first)) = usable.first() else {
            return Decision::KeepLocal;
        };
        if usable.iter().any(|(_, s)| s.result != first.result) {
            return Decision::Dispute {
                claims: usable.into_iter().map(|(_, s)| s.clone()).collect(),
            };
        }
        let holders = self.plan.holders(p);
        let mut sources: Vec<usize> = usable.iter().map(|(slot, _)| holders[*slot]).collect();
        sources.dedup();
        // Spread the fetches evenly over both holders: the k-th non-holder (by index)
        // starts with holder (k + p) % 2, so each serves half the members, give or take one.
        if let Some(me) = me {
            let rank = (0..me).filter(|m| !holders.contains(m)).count();
            if sources.len() == 2 && (rank + p) % 2 == 1 {
                sources.swap(0, 1);
            }
            if let Some(pos) = sources.iter().position(|s| *s == me) {
                sources.swap(0, pos);
            }
        }
        Decision::Accept {
            claim: (*first).clone(),
            sources,
        }
    }
}

/// The holder's next included set after seeing its co-holder's claim, or `None` to keep
/// the current one. A holder narrows to the intersection with the co-holder's set, so two
/// honest holders meet after one exchange; it refuses to narrow to half or less of what it
/// fetched itself, so a co-holder cannot censor the honest majority (the claims then
/// differ and members settle the dispute by recomputing).
pub(crate) fn narrow(
    fetched: &BTreeSet<usize>,
    current: &BTreeSet<usize>,
    co_holder: &BTreeSet<usize>,
) -> Option<BTreeSet<usize>> {
    let next: BTreeSet<usize> = current.intersection(co_holder).copied().collect();
    if next == *current || 2 * next.len() <= fetched.len() {
        return None;
    }
    Some(next)
}

/// Which of the disputed `claims` to take, given each one's [`Check`], and which claims are
/// wrong. Refuted claims are wrong. Among reproduced ones the largest included set wins
/// (ties: the smallest result hash), the same choice on every member. With none
/// reproduced, nothing is taken.
pub(crate) fn resolve(claims: &[(SliceHash, Check)]) -> (Option<usize>, Vec<usize>) {
    let wrong = (0..claims.len())
        .filter(|&i| matches!(claims[i].1, Check::Refuted(_)))
        .collect();
    let chosen = (0..claims.len())
        .filter(|&i| claims[i].1 == Check::Reproduced)
        .max_by_key(|&i| (claims[i].0.included.len(), Reverse(claims[i].0.result)));
    (chosen, wrong)
}

#[cfg(test)]
#[path = "ledger_tests.rs"]
mod tests;
