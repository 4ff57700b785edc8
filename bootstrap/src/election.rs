//! Who holds the orchestrator duty: a pure ranking of validators, and a tracker that follows
//! liveness and epoch boundaries.
//!
//! **Ranking.** Candidates are the neurons of the metagraph with a validator permit and at
//! least the run's minimum stake. Higher stake ranks first; equal stakes are ordered by the
//! blake3 hash of the peer id's bytes (the multihash, as libp2p's `PeerId::to_bytes` gives it),
//! lowest hash first. The hash rather than the id itself decides ties so that no one can pick a
//! peer id that wins them (ids of one key type share a prefix). The ranking depends only on the
//! metagraph's content, never on the order of its entries.
//!
//! **Election.** The orchestrator is the highest-ranked candidate that is live, so any two
//! nodes with the same metagraph and the same set of live peers elect the same peer
//! ([`elect`]). How the duty moves over time, without interrupting an epoch, is the
//! [`OrchestratorTracker`]'s job.

#[cfg(test)]
mod tests;
mod tracker;

use std::collections::BTreeSet;

use crate::metagraph::Metagraph;
use crate::peer_id::PeerIdStr;

pub use tracker::{
    Decision, OrchestratorTracker, Phase, PlanRejected, TrackerConfig, View, MIN_EPOCH_GAP,
};

/// A validator eligible for the orchestrator duty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The validator's peer id.
    pub peer_id: PeerIdStr,
    /// Its uid in the metagraph.
    pub uid: u16,
    /// Its stake, in rao.
    pub stake: u64,
    /// [`tie_break_hash`] of the peer id: lower wins among equal stakes.
    pub tie_break: [u8; 32],
}

/// The eligible validators of a metagraph, best first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ranking {
    candidates: Vec<Candidate>,
}

/// The hash that orders validators of equal stake: blake3 of the peer id's multihash bytes.
pub fn tie_break_hash(peer_id: &PeerIdStr) -> [u8; 32] {
    *blake3::hash(&peer_id.to_bytes()).as_bytes()
}

impl Ranking {
    /// Ranks the validators of `metagraph` that hold a permit and at least `min_stake` rao.
    pub fn new(metagraph: &Metagraph, min_stake: u64) -> Self {
        let mut candidates: Vec<Candidate> = metagraph
            .validators()
            .filter(|n| n.stake >= min_stake)
            .map(|n| Candidate {
                peer_id: n.peer_id.clone(),
                uid: n.uid,
                stake: n.stake,
                tie_break: tie_break_hash(&n.peer_id),
            })
            .collect();
        // Peer ids are unique in a metagraph, so the last key never ties: a total order.
        candidates.sort_by(|a, b| {
            b.stake
                .cmp(&a.stake)
                .then_with(|| a.tie_break.cmp(&b.tie_break))
                .then_with(|| a.peer_id.cmp(&b.peer_id))
        });
        Self { candidates }
    }

    /// All candidates, best first.
    pub fn candidates(&self) -> &[Candidate] {
        &self.candidates
    }

    /// Position of `peer_id` in the ranking (0 is best), if it is a candidate.
    pub fn rank_of(&self, peer_id: &PeerIdStr) -> Option<usize> {
        self.candidates.iter().position(|c| c.peer_id == *peer_id)
    }

    /// The best candidate for which `is_live` holds.
    pub fn first_live(&self, mut is_live: impl FnMut(&PeerIdStr) -> bool) -> Option<&Candidate> {
        self.candidates.iter().find(|c| is_live(&c.peer_id))
    }
}

/// The orchestrator among `live` peers: the best-ranked eligible validator of `metagraph`
/// (permit, at least `min_stake` rao) that is in `live`. Peers of `live` that are not such
/// validators are ignored; the order of `live` does not matter.
pub fn elect<'a>(
    metagraph: &Metagraph,
    min_stake: u64,
    live: impl IntoIterator<Item = &'a PeerIdStr>,
) -> Option<PeerIdStr> {
    let live: BTreeSet<&PeerIdStr> = live.into_iter().collect();
    Ranking::new(metagraph, min_stake)
        .first_live(|p| live.contains(p))
        .map(|c| c.peer_id.clone())
}
