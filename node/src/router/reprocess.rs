//! What arrived too early, kept in bounded queues to be checked again:
//!
//! * pipeline gossip of the next epoch, whose plan is not known yet: at most
//!   [`MAX_PENDING`] messages, and at most [`MAX_PENDING_PER_AUTHOR`] of one author (past its
//!   quota an author's own oldest goes; in a full queue, the oldest message of the author
//!   holding most goes), so no author can push out the others' messages; checked again when
//!   the next plan arrives;
//! * plans of permitted validators this node does not yet see as the orchestrator (it just
//!   started, or the election is changing hands): at most [`MAX_PENDING_PLANS`], each for at
//!   most [`PENDING_PLAN_PATIENCE`], checked again on every tick;
//! * plans whose author, or a miner they name, is not in this node's metagraph yet (it just
//!   started and has not heard their heartbeats, or, with stake from the chain, not verified
//!   their hotkey bindings): the same, in a queue of their own of at most [`MAX_METAGRAPH_PLANS`], one per
//!   author, so that a stranger's plans never push out a permitted validator's. Their
//!   verdict stays a rejection: only a plan that becomes acceptable in time is used.
//!
//! Pure: time is passed in.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bootstrap::PeerIdStr;
use p2p::PeerId;

use crate::wire::messages::PipelineGossip;

/// Gossip of the next epoch kept until its plan arrives (then checked again).
const MAX_PENDING: usize = 256;

/// The most of that gossip kept from one author.
const MAX_PENDING_PER_AUTHOR: usize = 32;

/// Plans of permitted validators kept while their author is not the orchestrator this node
/// knows (it just started, or the election is changing hands).
const MAX_PENDING_PLANS: usize = 4;

/// Plans refused by a metagraph that may not be complete yet, kept as long, one per author.
const MAX_METAGRAPH_PLANS: usize = 4;

/// How long such a plan is kept: a few heartbeats.
const PENDING_PLAN_PATIENCE: Duration = Duration::from_secs(5);

/// A plan kept for the election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeptPlan {
    /// Its author.
    pub(crate) author: PeerIdStr,
    /// The plan as received.
    pub(crate) data: Vec<u8>,
    /// When it was first kept.
    pub(crate) at: Instant,
    /// It was refused by a metagraph that may not be complete yet when last checked.
    pub(crate) for_metagraph: bool,
}

/// The queues of what arrived too early.
#[derive(Debug, Default)]
pub(crate) struct Reprocess {
    gossip: VecDeque<(PeerId, PipelineGossip)>,
    /// How many of `gossip` each author holds.
    held: HashMap<PeerId, usize>,
    plans: VecDeque<KeptPlan>,
    /// Plans refused by a metagraph that may not be complete yet.
    metagraph_plans: VecDeque<KeptPlan>,
    /// A new plan was handed to the services since the gossip was last checked again.
    plan_arrived: bool,
}

impl Reprocess {
    /// Keeps gossip of the next epoch: past the author's quota ([`MAX_PENDING_PER_AUTHOR`])
    /// its own oldest message goes; in a full queue ([`MAX_PENDING`]) the oldest message of the
    /// author holding most goes (the earliest such author on a tie).
    pub(crate) fn keep_gossip(&mut self, author: PeerId, message: PipelineGossip) {
        let held = self.held.get(&author).copied().unwrap_or(0);
        if held >= MAX_PENDING_PER_AUTHOR {
            self.drop_oldest_of(author);
        } else if self.gossip.len() >= MAX_PENDING {
            if let Some(most) = self.author_holding_most() {
                self.drop_oldest_of(most);
            }
        }
        self.gossip.push_back((author, message));
        *self.held.entry(author).or_default() += 1;
    }

    /// The author holding most of the queue; of several, the one whose oldest message is
    /// oldest. At most [`MAX_PENDING`] steps.
    fn author_holding_most(&self) -> Option<PeerId> {
        let most = self.held.values().copied().max()?;
        self.gossip
            .iter()
            .map(|(author, _)| *author)
            .find(|author| self.held.get(author) == Some(&most))
    }

    /// Drops `author`'s oldest message. At most [`MAX_PENDING`] steps.
    fn drop_oldest_of(&mut self, author: PeerId) {
        let Some(at) = self.gossip.iter().position(|(a, _)| *a == author) else {
            return;
        };
        self.gossip.remove(at);
        if let Some(n) = self.held.get_mut(&author) {
            *n -= 1;
            if *n == 0 {
                self.held.remove(&author);
            }
        }
    }

    /// Gossip waiting for its plan.
    pub(crate) fn gossip_len(&self) -> usize {
        self.gossip.len()
    }

    /// Notes that a new plan arrived: the waiting gossip is due.
    pub(crate) fn plan_arrived(&mut self) {
        self.plan_arrived = true;
    }

    /// The waiting gossip, taken out, when a plan arrived since it was last taken.
    pub(crate) fn gossip_due(&mut self) -> Vec<(PeerId, PipelineGossip)> {
        if !std::mem::take(&mut self.plan_arrived) {
            return Vec::new();
        }
        self.held.clear();
        self.gossip.drain(..).collect()
    }

    /// Keeps a plan for the election, received at `now`, dropping the oldest beyond
    /// [`MAX_PENDING_PLANS`].
    pub(crate) fn keep_plan(&mut self, author: PeerIdStr, data: Vec<u8>, now: Instant) {
        if self.plans.len() >= MAX_PENDING_PLANS {
            if let Some(oldest) = self.plans.pop_front() {
                tracing::warn!(author = %oldest.author, "kept plan dropped: too many plans waiting for the election");
            }
        }
        self.plans.push_back(KeptPlan {
            author,
            data,
            at: now,
            for_metagraph: false,
        });
    }

    /// Keeps a plan refused by a metagraph that may not be complete yet, received at `now`: it replaces
    /// that author's kept plan, and beyond [`MAX_METAGRAPH_PLANS`] the oldest goes.
    pub(crate) fn keep_plan_for_metagraph(
        &mut self,
        author: PeerIdStr,
        data: Vec<u8>,
        now: Instant,
    ) {
        self.metagraph_plans.retain(|kept| kept.author != author);
        if self.metagraph_plans.len() >= MAX_METAGRAPH_PLANS {
            if let Some(oldest) = self.metagraph_plans.pop_front() {
                tracing::debug!(author = %oldest.author, "kept plan dropped: too many waiting for the metagraph");
            }
        }
        self.metagraph_plans.push_back(KeptPlan {
            author,
            data,
            at: now,
            for_metagraph: true,
        });
    }

    /// Puts back a plan checked again that still waits: for the election, or, when
    /// `for_metagraph`, for the metagraph to fill in.
    pub(crate) fn keep_plan_again(&mut self, mut plan: KeptPlan, for_metagraph: bool) {
        plan.for_metagraph = for_metagraph;
        if for_metagraph {
            self.metagraph_plans.push_back(plan);
        } else {
            self.plans.push_back(plan);
        }
    }

    /// The kept plans to check again at `now`, taken out; those kept for longer than
    /// [`PENDING_PLAN_PATIENCE`] are dropped.
    pub(crate) fn plans_due(&mut self, now: Instant) -> Vec<KeptPlan> {
        let waiting =
            |plan: &KeptPlan| now.saturating_duration_since(plan.at) < PENDING_PLAN_PATIENCE;
        self.plans.retain(|plan| {
            let keep = waiting(plan);
            if !keep {
                tracing::warn!(author = %plan.author, "kept plan dropped: its author did not become the orchestrator here");
            }
            keep
        });
        self.metagraph_plans.retain(|plan| {
            let keep = waiting(plan);
            if !keep {
                tracing::debug!(author = %plan.author, "kept plan dropped: the metagraph did not come to accept it");
            }
            keep
        });
        let mut due: Vec<KeptPlan> = self.plans.drain(..).collect();
        due.extend(self.metagraph_plans.drain(..));
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(i: u8) -> PeerIdStr {
        PeerIdStr::from_ed25519_public_key(&[i; 32])
    }

    fn message(epoch: u64) -> PipelineGossip {
        PipelineGossip::HeadDone {
            epoch,
            samples: 1,
            dropped: 0,
        }
    }

    #[test]
    fn early_gossip_is_bounded_and_checked_again_once_a_plan_arrives() {
        let mut queue = Reprocess::default();
        let author = p2p::identity::Keypair::generate_ed25519()
            .public()
            .to_peer_id();
        let sent = MAX_PENDING_PER_AUTHOR as u64 + 10;
        for epoch in 0..sent {
            queue.keep_gossip(author, message(epoch));
        }
        assert_eq!(
            queue.gossip_len(),
            MAX_PENDING_PER_AUTHOR,
            "one author's oldest go first"
        );
        assert!(
            queue.gossip_due().is_empty(),
            "nothing is due before a plan"
        );
        queue.plan_arrived();
        let due = queue.gossip_due();
        assert_eq!(due.len(), MAX_PENDING_PER_AUTHOR);
        assert_eq!(due[0].1, message(10));
        assert_eq!(queue.gossip_len(), 0);
        assert!(queue.gossip_due().is_empty(), "due once per plan");
    }

    #[test]
    fn one_author_cannot_flush_the_others_early_gossip() {
        let mut queue = Reprocess::default();
        let key = |i: u8| {
            p2p::identity::Keypair::ed25519_from_bytes([i; 32])
                .unwrap()
                .public()
                .to_peer_id()
        };
        let (honest, flooder) = (key(1), key(2));
        for epoch in 0..3 {
            queue.keep_gossip(honest, message(epoch));
        }
        // The flooder sends far more than the whole queue holds.
        for epoch in 0..(4 * MAX_PENDING as u64) {
            queue.keep_gossip(flooder, message(1_000 + epoch));
        }
        assert!(queue.gossip_len() <= MAX_PENDING);
        queue.plan_arrived();
        let due = queue.gossip_due();
        let from = |author: PeerId| due.iter().filter(|(a, _)| *a == author).count();
        assert_eq!(from(honest), 3, "the honest author's messages all stay");
        assert_eq!(
            from(flooder),
            MAX_PENDING_PER_AUTHOR,
            "the flooder keeps only its quota"
        );
        let newest = due.iter().rev().find(|(a, _)| *a == flooder).unwrap();
        assert_eq!(
            newest.1,
            message(1_000 + 4 * MAX_PENDING as u64 - 1),
            "an author over its quota loses its own oldest"
        );
    }

    #[test]
    fn a_full_queue_makes_room_from_the_author_holding_most() {
        let mut queue = Reprocess::default();
        let key = |i: u8| {
            p2p::identity::Keypair::ed25519_from_bytes([i + 10; 32])
                .unwrap()
                .public()
                .to_peer_id()
        };
        let half = MAX_PENDING_PER_AUTHOR / 2;
        let full_authors = u8::try_from(MAX_PENDING / MAX_PENDING_PER_AUTHOR - 1).unwrap();
        // Author 0 comes first with half its quota; then authors at their quota, and one more
        // half, fill the queue.
        for n in 0..half as u64 {
            queue.keep_gossip(key(0), message(n));
        }
        for a in 1..=full_authors {
            for n in 0..MAX_PENDING_PER_AUTHOR as u64 {
                queue.keep_gossip(key(a), message(n));
            }
        }
        for n in 0..half as u64 {
            queue.keep_gossip(key(full_authors + 1), message(n));
        }
        assert_eq!(queue.gossip_len(), MAX_PENDING);
        // A newcomer still gets in, taking the oldest message of an author holding most, not
        // the oldest message of all (author 0's).
        let newcomer = key(full_authors + 2);
        queue.keep_gossip(newcomer, message(7));
        assert_eq!(queue.gossip_len(), MAX_PENDING);
        queue.plan_arrived();
        let due = queue.gossip_due();
        let from = |author: PeerId| due.iter().filter(|(a, _)| *a == author).count();
        assert_eq!(from(newcomer), 1);
        assert_eq!(from(key(0)), half, "the small author keeps all it sent");
        assert_eq!(
            from(key(1)),
            MAX_PENDING_PER_AUTHOR - 1,
            "the first of the authors holding most gave up its oldest"
        );
        assert_eq!(queue.gossip_len(), 0);
    }

    #[test]
    fn plans_waiting_for_the_election_are_few_and_kept_for_a_while() {
        let mut queue = Reprocess::default();
        let t0 = Instant::now();
        for i in 0..(MAX_PENDING_PLANS as u8 + 2) {
            queue.keep_plan(peer(i), vec![i], t0);
        }
        let due = queue.plans_due(t0 + Duration::from_secs(1));
        assert_eq!(due.len(), MAX_PENDING_PLANS, "the oldest go first");
        assert_eq!(due[0].author, peer(2));
        for plan in due {
            queue.keep_plan_again(plan, false);
        }
        assert_eq!(
            queue
                .plans_due(t0 + PENDING_PLAN_PATIENCE - Duration::from_millis(1))
                .len(),
            MAX_PENDING_PLANS
        );
        queue.keep_plan(peer(9), vec![9], t0);
        assert!(
            queue.plans_due(t0 + PENDING_PLAN_PATIENCE).is_empty(),
            "dropped after the patience"
        );
    }

    #[test]
    fn plans_of_for_metagraphs_are_kept_apart_one_per_author() {
        let mut queue = Reprocess::default();
        let t0 = Instant::now();
        queue.keep_plan(peer(100), vec![100], t0);
        // A stranger's many plans, and several strangers': never more than the queue's bound,
        // one per author, and the permitted validator's plan stays.
        for round in 0..3u8 {
            for i in 0..(MAX_METAGRAPH_PLANS as u8 + 2) {
                queue.keep_plan_for_metagraph(peer(i), vec![i, round], t0);
            }
        }
        let due = queue.plans_due(t0 + Duration::from_secs(1));
        assert_eq!(due.len(), 1 + MAX_METAGRAPH_PLANS);
        assert_eq!(due[0].author, peer(100));
        assert!(!due[0].for_metagraph);
        let unknown: Vec<&KeptPlan> = due.iter().filter(|p| p.for_metagraph).collect();
        assert_eq!(unknown.len(), MAX_METAGRAPH_PLANS);
        assert_eq!(unknown[0].author, peer(2), "the oldest authors went");
        assert_eq!(
            unknown[0].data,
            vec![2, 2],
            "an author's newest plan is kept"
        );
        // Its author became a permitted validator that is not the orchestrator yet: the plan
        // moves to the election's queue, keeping its age.
        let moved = unknown[0].clone();
        queue.keep_plan_again(moved, false);
        let again = queue.plans_due(t0 + Duration::from_secs(2));
        assert_eq!(again.len(), 1);
        assert!(!again[0].for_metagraph);
        queue.keep_plan_for_metagraph(peer(7), vec![7], t0);
        assert!(
            queue.plans_due(t0 + PENDING_PLAN_PATIENCE).is_empty(),
            "dropped after the patience"
        );
    }
}
