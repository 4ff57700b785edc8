//! The byte budget of inbound request bodies, per peer and in total.
//!
//! A request frame's body is reserved from its length prefix before a buffer is allocated or a
//! body byte read ([`ByteBudget::reserve`]); the [`Reservation`] then travels with the request
//! until it is answered or fails, and gives its bytes back when dropped. So what peers can
//! make the node hold in request bodies is bounded by `per_peer` for each peer and by `total`
//! for all of them together, whatever they claim and however slowly they send. Peers that are
//! not among the run's members (named by the application, [`ByteBudget::set_members`]) may
//! together hold at most half of `total`, so strangers who fill their share, however many ids
//! they make, leave the other half to the run. Guarantees: a reservation is never larger than
//! what was checked against every bound; the books balance (every byte reserved is given back
//! exactly once, by `Drop`, to the pool it was taken from), and a peer holding nothing has no
//! entry. Pure bookkeeping behind a mutex held for a few arithmetic operations; no IO.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use libp2p::PeerId;

use crate::metrics::RequestRefusal;
use crate::Metrics;

/// Request body bytes held per peer and in total, with their bounds. Clones share the books.
#[derive(Clone, Debug)]
pub(crate) struct ByteBudget {
    books: Arc<Mutex<Books>>,
    metrics: Metrics,
}

#[derive(Debug)]
struct Books {
    per_peer_max: u64,
    total_max: u64,
    held: HashMap<PeerId, u64>,
    total: u64,
    /// The run's members.
    members: HashSet<PeerId>,
    /// Bytes held by peers that were not members when they reserved.
    strangers: u64,
}

impl Books {
    /// What all strangers together may hold.
    fn strangers_max(&self) -> u64 {
        self.total_max / 2
    }
}

/// Bytes reserved for one request of one peer; dropping it gives them back.
#[derive(Debug)]
pub(crate) struct Reservation {
    budget: ByteBudget,
    peer: PeerId,
    bytes: u64,
    /// Taken from the strangers' share.
    stranger: bool,
}

impl ByteBudget {
    /// Books with at most `per_peer` bytes held by one peer and `total` by all.
    pub(crate) fn new(per_peer: u64, total: u64, metrics: Metrics) -> Self {
        ByteBudget {
            books: Arc::new(Mutex::new(Books {
                per_peer_max: per_peer,
                total_max: total,
                held: HashMap::new(),
                total: 0,
                members: HashSet::new(),
                strangers: 0,
            })),
            metrics,
        }
    }

    /// Reserves `bytes` for a request of `peer`, or says which bound it would break.
    pub(crate) fn reserve(&self, peer: PeerId, bytes: u64) -> Result<Reservation, RequestRefusal> {
        let mut books = self.books.lock().unwrap_or_else(PoisonError::into_inner);
        let mine = books.held.get(&peer).copied().unwrap_or(0);
        if mine.saturating_add(bytes) > books.per_peer_max {
            return Err(RequestRefusal::PeerBudget);
        }
        if books.total.saturating_add(bytes) > books.total_max {
            return Err(RequestRefusal::TotalBudget);
        }
        let stranger = !books.members.contains(&peer);
        if stranger && books.strangers.saturating_add(bytes) > books.strangers_max() {
            return Err(RequestRefusal::StrangersBudget);
        }
        books.held.insert(peer, mine + bytes);
        books.total += bytes;
        if stranger {
            books.strangers += bytes;
        }
        self.metrics.set_rr_request_bytes_reserved(books.total);
        Ok(Reservation {
            budget: self.clone(),
            peer,
            bytes,
            stranger,
        })
    }

    /// Makes `peers` the run's members, replacing the previous set. Reservations already made
    /// stay in the pool they were taken from.
    pub(crate) fn set_members(&self, peers: Vec<PeerId>) {
        let mut books = self.books.lock().unwrap_or_else(PoisonError::into_inner);
        books.members = peers.into_iter().collect();
    }

    /// Bytes held by `peer` now.
    #[cfg(test)]
    fn held_by(&self, peer: &PeerId) -> u64 {
        let books = self.books.lock().unwrap_or_else(PoisonError::into_inner);
        books.held.get(peer).copied().unwrap_or(0)
    }

    /// Bytes held by everyone now.
    #[cfg(test)]
    fn held(&self) -> u64 {
        self.books
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .total
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut books = self
            .budget
            .books
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        books.total = books.total.saturating_sub(self.bytes);
        if self.stranger {
            books.strangers = books.strangers.saturating_sub(self.bytes);
        }
        if let Some(held) = books.held.get_mut(&self.peer) {
            *held = held.saturating_sub(self.bytes);
            if *held == 0 {
                books.held.remove(&self.peer);
            }
        }
        self.budget
            .metrics
            .set_rr_request_bytes_reserved(books.total);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer() -> PeerId {
        PeerId::random()
    }

    #[test]
    fn a_peer_holds_at_most_its_budget_and_gets_it_back_on_drop() {
        let metrics = Metrics::unregistered();
        let budget = ByteBudget::new(100, 1000, metrics.clone());
        budget.set_members(Vec::new());
        let (a, b) = (peer(), peer());
        let first = budget.reserve(a, 60).unwrap();
        let second = budget.reserve(a, 40).unwrap();
        assert_eq!(
            budget.reserve(a, 1).unwrap_err(),
            RequestRefusal::PeerBudget
        );
        // Another peer is not starved by the first.
        let other = budget.reserve(b, 100).unwrap();
        assert_eq!(metrics.rr_request_bytes_reserved(), 200);
        drop(first);
        assert_eq!(budget.held_by(&a), 40);
        assert!(budget.reserve(a, 60).is_ok(), "room again once dropped");
        drop((second, other));
        assert_eq!((budget.held(), metrics.rr_request_bytes_reserved()), (0, 0));
        assert!(
            budget.books.lock().unwrap().held.is_empty(),
            "no empty entries"
        );
    }

    #[test]
    fn all_peers_together_hold_at_most_the_total() {
        let budget = ByteBudget::new(100, 250, Metrics::unregistered());
        let (a, b, fresh) = (peer(), peer(), peer());
        budget.set_members(vec![a, b, fresh]);
        let held = [
            budget.reserve(a, 100).unwrap(),
            budget.reserve(b, 100).unwrap(),
        ];
        assert_eq!(
            budget.reserve(fresh, 51).unwrap_err(),
            RequestRefusal::TotalBudget
        );
        let last = budget.reserve(fresh, 50).unwrap();
        assert_eq!(budget.held(), 250);
        drop((held, last));
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn strangers_together_hold_at_most_half_and_members_keep_the_rest() {
        let budget = ByteBudget::new(100, 300, Metrics::unregistered());
        let (member, s1, s2) = (peer(), peer(), peer());
        budget.set_members(vec![member]);
        let first = budget.reserve(s1, 100).unwrap();
        let _second = budget.reserve(s2, 50).unwrap();
        // Each within its own budget, but the strangers' share (150) is full.
        assert_eq!(
            budget.reserve(s2, 1).unwrap_err(),
            RequestRefusal::StrangersBudget
        );
        assert_eq!(
            budget.reserve(peer(), 1).unwrap_err(),
            RequestRefusal::StrangersBudget
        );
        let _member = budget.reserve(member, 100).unwrap();
        // A stranger who becomes a member gives back to the strangers' share what it took
        // as a stranger.
        budget.set_members(vec![member, s1]);
        drop(first);
        let _third = budget.reserve(s2, 50).unwrap();
        assert_eq!(budget.held(), 200);
    }

    #[test]
    fn claims_near_the_integer_limit_neither_overflow_nor_pass() {
        let budget = ByteBudget::new(u64::MAX - 1, u64::MAX - 1, Metrics::unregistered());
        let a = peer();
        budget.set_members(vec![a]);
        let _held = budget.reserve(a, u64::MAX - 2).unwrap();
        assert_eq!(
            budget.reserve(a, u64::MAX).unwrap_err(),
            RequestRefusal::PeerBudget
        );
        assert_eq!(
            budget.reserve(peer(), 2).unwrap_err(),
            RequestRefusal::TotalBudget
        );
        // An empty body always fits.
        assert!(budget.reserve(a, 0).is_ok());
    }
}
