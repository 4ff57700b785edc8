//! The request budget: inbound requests are bounded per peer and in total before anything
//! is decoded, so a flood of one peer cannot starve the others, nor all peers the node.

use bootstrap::PeerIdStr;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::rules::Refusal;

/// Inbound requests one peer may have in progress at once. A previous-stage miner keeps at
/// most its own in-flight bound (16) of samples here, plus evaluations and merge fetches.
pub(crate) const MAX_REQUESTS_PER_PEER: usize = 48;

/// Inbound requests all peers together may have in progress at once.
pub(crate) const MAX_REQUESTS_TOTAL: usize = 256;

/// Counts inbound requests in progress, per peer and in total.
#[derive(Debug, Clone, Default)]
pub(crate) struct RequestBudget {
    inner: Arc<Mutex<BudgetState>>,
}

#[derive(Debug, Default)]
struct BudgetState {
    per_peer: HashMap<PeerIdStr, usize>,
    total: usize,
}

/// One request in progress; dropping it gives the slot back.
#[derive(Debug)]
pub(crate) struct BudgetSlot {
    inner: Arc<Mutex<BudgetState>>,
    peer: PeerIdStr,
}

impl RequestBudget {
    /// Takes a slot for a request of `peer`, or refuses when it or everyone is at the bound.
    pub(crate) fn acquire(&self, peer: &PeerIdStr) -> Result<BudgetSlot, Refusal> {
        let mut state = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mine = state.per_peer.get(peer).copied().unwrap_or(0);
        if mine >= MAX_REQUESTS_PER_PEER || state.total >= MAX_REQUESTS_TOTAL {
            return Err(Refusal::TooManyRequests);
        }
        state.per_peer.insert(peer.clone(), mine + 1);
        state.total += 1;
        Ok(BudgetSlot {
            inner: self.inner.clone(),
            peer: peer.clone(),
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
mod tests {
    use super::*;

    /// A distinct peer id for each `i`.
    fn peer(i: u16) -> PeerIdStr {
        let mut key = [0u8; 32];
        key[..2].copy_from_slice(&i.to_le_bytes());
        PeerIdStr::from_ed25519_public_key(&key)
    }

    #[test]
    fn request_budget_bounds_each_peer_and_gives_slots_back() {
        let budget = RequestBudget::default();
        let (a, b, fresh) = (peer(1000), peer(1001), peer(1002));
        let slots: Vec<BudgetSlot> = (0..MAX_REQUESTS_PER_PEER)
            .map(|_| budget.acquire(&a).unwrap())
            .collect();
        assert_eq!(budget.acquire(&a).unwrap_err(), Refusal::TooManyRequests);
        assert!(budget.acquire(&b).is_ok(), "another peer is not starved");
        drop(slots);
        assert!(budget.acquire(&a).is_ok());
        let many: Vec<BudgetSlot> = (0..MAX_REQUESTS_TOTAL)
            .map(|i| budget.acquire(&peer(i as u16)).unwrap())
            .collect();
        assert_eq!(
            budget.acquire(&fresh).unwrap_err(),
            Refusal::TooManyRequests
        );
        drop(many);
    }
}
