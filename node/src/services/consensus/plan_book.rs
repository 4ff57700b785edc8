//! The plans of the last few epochs: what pipeline gossip and requests are judged against
//! (a message of the epoch that just closed arrives after the next plan), and whose stage
//! members may read the merges. Consensus keeps it, one plan per epoch it adopted, and
//! publishes it in its view.

use std::collections::{BTreeMap, BTreeSet};

use bootstrap::{EpochPlan, PeerIdStr};

/// Plans kept for checking messages of recent epochs.
const KEEP_PLANS: usize = 4;

/// The plans of the last few epochs, by epoch.
#[derive(Debug, Clone, Default, PartialEq)]
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

    /// Each kept plan's stage members, by (epoch, stage): who may read the merges.
    pub(crate) fn members(&self) -> BTreeMap<(u64, u32), BTreeSet<PeerIdStr>> {
        let mut members: BTreeMap<(u64, u32), BTreeSet<PeerIdStr>> = BTreeMap::new();
        for (epoch, plan) in &self.plans {
            for (miner, stage) in &plan.assignment {
                members
                    .entry((*epoch, *stage))
                    .or_default()
                    .insert(miner.clone());
            }
        }
        members
    }
}

/// The stage `peer` holds in `plan`.
pub(crate) fn stage_in(plan: &EpochPlan, peer: &str) -> Option<u32> {
    PeerIdStr::parse(peer).ok().and_then(|p| plan.stage_of(&p))
}

/// Plans for the rules' tests of every service: six miners on 3 stages, orchestrated by
/// one validator, one plan per epoch of `epochs`.
#[cfg(test)]
pub(crate) mod fixture {
    use std::collections::BTreeSet;

    use bootstrap::{EpochPlan, PeerIdStr, RunConfig};

    use super::PlanBook;

    /// A peer id drawn from `i`: that of the Ed25519 key [`key`]`(i)`, so that tests can
    /// sign as any peer of the plans (hop receipts).
    pub(crate) fn peer(i: u8) -> PeerIdStr {
        crate::wire::receipt::fixture::peer(i)
    }

    /// The key of [`peer`]`(i)`.
    pub(crate) fn key(i: u8) -> p2p::identity::Keypair {
        crate::wire::receipt::fixture::key(i)
    }

    /// The key of a fixture peer given by its text.
    pub(crate) fn key_of(peer_text: &str) -> p2p::identity::Keypair {
        (0..=u8::MAX)
            .find(|&i| peer(i).as_str() == peer_text)
            .map(key)
            .expect("a fixture peer")
    }

    /// The run the plans are of.
    pub(crate) fn run() -> RunConfig {
        RunConfig {
            epoch_samples: 4,
            ..RunConfig::default()
        }
    }

    /// Six miners on 3 stages, orchestrated by peer 1; plans of `epochs`.
    pub(crate) fn book(epochs: &[u64]) -> (PlanBook, Vec<PeerIdStr>) {
        let run = run();
        let miners: BTreeSet<PeerIdStr> = (10..16).map(peer).collect();
        let mut book = PlanBook::default();
        let mut prev: Option<EpochPlan> = None;
        for &e in epochs {
            let plan =
                bootstrap::next_plan(&run, &peer(1), prev.as_ref(), e.checked_sub(1), &miners)
                    .unwrap();
            assert_eq!(plan.epoch, e);
            book.insert(plan.clone());
            prev = Some(plan);
        }
        (book, miners.into_iter().collect())
    }

    /// The miners of `stage` in `plan`.
    pub(crate) fn on(plan: &EpochPlan, stage: u32) -> Vec<String> {
        plan.miners_of(stage).map(|p| p.to_string()).collect()
    }
}
