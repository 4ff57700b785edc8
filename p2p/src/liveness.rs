//! Who is alive, from signed heartbeats: a pure view with the clock passed in.
//!
//! Nodes gossip small [`Heartbeat`]s with a counter that grows by one each beat. [`LiveView`]
//! keeps the newest heartbeat of each peer and when it arrived; a peer is live while its last
//! accepted heartbeat is younger than the expiry (default [`DEFAULT_EXPIRY`]). Guarantees: a
//! heartbeat whose counter is not above the peer's current one is ignored (a replay or a
//! reordered message cannot extend a peer's life or roll its state back); once a peer has
//! expired any counter is accepted again, so a restarted node (counter back at 0) reappears.
//! No IO and no clock reads: every time is an argument.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use libp2p::PeerId;
use serde::{Deserialize, Serialize};

/// How long a heartbeat keeps its peer live by default.
pub const DEFAULT_EXPIRY: Duration = Duration::from_secs(5);

/// Largest encoded heartbeat accepted by [`Heartbeat::from_bytes`]: the fields, plus a
/// [`crate::HotkeyBinding`] of at most [`crate::MAX_BINDING_BYTES`].
pub const MAX_HEARTBEAT_BYTES: usize = 2048;

/// What a node does in the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Holds a pipeline stage and trains.
    Miner,
    /// Audits miners; may hold the orchestrator duty.
    Validator,
}

/// A liveness beacon, gossiped periodically by every node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Heartbeat {
    /// The sender's peer id (base58), checked against the gossip author.
    pub peer_id: String,
    /// The sender's role.
    pub role: Role,
    /// Grows by one per heartbeat of this sender.
    pub counter: u64,
    /// When the sender sent it, in milliseconds since the Unix epoch: receivers refuse a
    /// heartbeat that is too old or not newer than the last one they took from its sender,
    /// so a recorded heartbeat cannot be replayed to keep a dead peer alive.
    pub sent_at_ms: u64,
    /// Hash of the run configuration the sender follows.
    pub run_hash: String,
    /// Hash (blake3 of its JSON, hex) of the stake snapshot the sender follows, when it
    /// follows one rather than the chain: what a node joining with `--bootstrap` alone checks
    /// a fetched snapshot against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metagraph_hash: Option<String>,
    /// The epoch the sender is in, if any.
    pub epoch: Option<u64>,
    /// The pipeline stage the sender holds, if any.
    pub stage: Option<u32>,
    /// Base URL (`http://<ip>:<port>`) of the sender's HTTP server, when it serves one
    /// (`--metrics`): dashboards read its `/status` from there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dashboard: Option<String>,
    /// The sender's proof that it speaks for a Bittensor hotkey (`--hotkey`): without one, a
    /// node that takes its stake from the chain gives the sender no stake.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<crate::HotkeyBinding>,
    /// The dataset (its manifest's blake3, hex) the sender holds whole and serves to peers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset: Option<String>,
    /// Thousandths of a sample per second the sender's stage computes (forward and backward
    /// of one sample), as it measured them: what an orchestrator that places miners by
    /// capacity balances. The sender's word, so the orchestrator bounds it against the
    /// others'.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<u32>,
    /// Thousandths of a sample per second the sender, a head, completed over its last
    /// epoch's training (its pathways' measured rate, latency included): what heads' draws
    /// are proportioned by. The sender's word, bounded like `capacity`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pathway_rate: Option<u32>,
}

/// Why [`Heartbeat::from_bytes`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HeartbeatError {
    /// The input is larger than [`MAX_HEARTBEAT_BYTES`].
    #[error("heartbeat of {0} bytes exceeds the maximum of {MAX_HEARTBEAT_BYTES}")]
    TooLarge(usize),
    /// The input is not a heartbeat.
    #[error("malformed heartbeat")]
    Malformed(#[source] serde_json::Error),
}

impl Heartbeat {
    /// JSON encoding.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a struct of strings and integers always serialises")
    }

    /// Parses a JSON heartbeat of at most [`MAX_HEARTBEAT_BYTES`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, HeartbeatError> {
        if bytes.len() > MAX_HEARTBEAT_BYTES {
            return Err(HeartbeatError::TooLarge(bytes.len()));
        }
        serde_json::from_slice(bytes).map_err(HeartbeatError::Malformed)
    }
}

/// What [`LiveView::observe`] did with a heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Observation {
    /// Stored; the peer is live from `now`.
    Accepted,
    /// Ignored: its counter is not above the one already held for a live peer.
    Stale,
    /// Ignored: the heartbeat names a different peer than its author.
    PeerMismatch,
}

#[derive(Clone, Debug)]
struct Entry {
    heartbeat: Heartbeat,
    seen: Instant,
}

/// The newest heartbeat of every peer and when it was accepted.
#[derive(Clone, Debug)]
pub struct LiveView {
    expiry: Duration,
    peers: HashMap<PeerId, Entry>,
}

impl Default for LiveView {
    fn default() -> Self {
        Self::new(DEFAULT_EXPIRY)
    }
}

impl LiveView {
    /// An empty view where a heartbeat keeps its peer live for `expiry`.
    pub fn new(expiry: Duration) -> Self {
        Self {
            expiry,
            peers: HashMap::new(),
        }
    }

    /// Records `heartbeat`, authored by `peer`, received at `now`.
    pub fn observe(&mut self, peer: PeerId, heartbeat: Heartbeat, now: Instant) -> Observation {
        if heartbeat.peer_id != peer.to_base58() {
            return Observation::PeerMismatch;
        }
        if let Some(entry) = self.peers.get(&peer) {
            if self.fresh(entry, now) && heartbeat.counter <= entry.heartbeat.counter {
                return Observation::Stale;
            }
        }
        self.peers.insert(
            peer,
            Entry {
                heartbeat,
                seen: now,
            },
        );
        Observation::Accepted
    }

    /// Whether `peer` sent an accepted heartbeat less than the expiry before `now`.
    pub fn is_live(&self, peer: &PeerId, now: Instant) -> bool {
        self.peers.get(peer).is_some_and(|e| self.fresh(e, now))
    }

    /// The live peers at `now` with their newest heartbeat, sorted by peer id.
    pub fn live(&self, now: Instant) -> Vec<(PeerId, &Heartbeat)> {
        let mut live: Vec<_> = self
            .peers
            .iter()
            .filter(|(_, e)| self.fresh(e, now))
            .map(|(p, e)| (*p, &e.heartbeat))
            .collect();
        live.sort_by_key(|l| l.0);
        live
    }

    /// The newest accepted heartbeat of `peer`, live or not.
    pub fn heartbeat(&self, peer: &PeerId) -> Option<&Heartbeat> {
        self.peers.get(peer).map(|e| &e.heartbeat)
    }

    /// Forgets peers that are not live at `now`, so the view stays bounded.
    pub fn prune(&mut self, now: Instant) {
        let expiry = self.expiry;
        self.peers
            .retain(|_, e| now.saturating_duration_since(e.seen) < expiry);
    }

    fn fresh(&self, entry: &Entry, now: Instant) -> bool {
        now.saturating_duration_since(entry.seen) < self.expiry
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beat(peer: &PeerId, counter: u64) -> Heartbeat {
        Heartbeat {
            peer_id: peer.to_base58(),
            role: Role::Miner,
            counter,
            sent_at_ms: counter.saturating_mul(1000),
            run_hash: "run".into(),
            metagraph_hash: None,
            epoch: Some(3),
            stage: Some(1),
            dashboard: None,
            binding: None,
            dataset: None,
            capacity: None,
            pathway_rate: None,
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn peer_is_live_until_expiry() {
        let t0 = Instant::now();
        let a = PeerId::random();
        let mut view = LiveView::new(secs(5));
        assert!(!view.is_live(&a, t0));
        assert_eq!(view.observe(a, beat(&a, 1), t0), Observation::Accepted);
        assert!(view.is_live(&a, t0));
        assert!(view.is_live(&a, t0 + Duration::from_millis(4999)));
        assert!(!view.is_live(&a, t0 + secs(5)));
        assert!(view.live(t0 + secs(6)).is_empty());
    }

    #[test]
    fn new_heartbeat_extends_life() {
        let t0 = Instant::now();
        let a = PeerId::random();
        let mut view = LiveView::new(secs(5));
        view.observe(a, beat(&a, 1), t0);
        assert_eq!(
            view.observe(a, beat(&a, 2), t0 + secs(4)),
            Observation::Accepted
        );
        assert!(view.is_live(&a, t0 + secs(8)));
        assert_eq!(view.heartbeat(&a).map(|h| h.counter), Some(2));
    }

    #[test]
    fn regressed_or_replayed_counter_is_ignored() {
        let t0 = Instant::now();
        let a = PeerId::random();
        let mut view = LiveView::new(secs(5));
        view.observe(a, beat(&a, 7), t0);
        assert_eq!(
            view.observe(a, beat(&a, 6), t0 + secs(3)),
            Observation::Stale
        );
        assert_eq!(
            view.observe(a, beat(&a, 7), t0 + secs(3)),
            Observation::Stale
        );
        // Neither replay moved the expiry nor the stored state.
        assert!(!view.is_live(&a, t0 + secs(5)));
        assert_eq!(view.heartbeat(&a).map(|h| h.counter), Some(7));
    }

    #[test]
    fn restarted_peer_is_accepted_after_expiry() {
        let t0 = Instant::now();
        let a = PeerId::random();
        let mut view = LiveView::new(secs(5));
        view.observe(a, beat(&a, 100), t0);
        assert_eq!(
            view.observe(a, beat(&a, 0), t0 + secs(6)),
            Observation::Accepted
        );
        assert!(view.is_live(&a, t0 + secs(7)));
    }

    #[test]
    fn heartbeat_naming_another_peer_is_ignored() {
        let t0 = Instant::now();
        let (a, b) = (PeerId::random(), PeerId::random());
        let mut view = LiveView::default();
        assert_eq!(view.observe(a, beat(&b, 1), t0), Observation::PeerMismatch);
        assert!(!view.is_live(&a, t0) && !view.is_live(&b, t0));
    }

    #[test]
    fn live_lists_only_fresh_peers_sorted_and_prune_forgets_the_rest() {
        let t0 = Instant::now();
        let peers: Vec<PeerId> = (0..4).map(|_| PeerId::random()).collect();
        let mut view = LiveView::new(secs(5));
        for (i, p) in peers.iter().enumerate() {
            view.observe(*p, beat(p, 1), t0 + secs(2 * i as u64));
        }
        let now = t0 + secs(8); // peers seen at 0 and 2 s are past 5 s; 4 and 6 s are not
        let live: Vec<PeerId> = view.live(now).into_iter().map(|(p, _)| p).collect();
        let mut expected = vec![peers[2], peers[3]];
        expected.sort();
        assert_eq!(live, expected);
        view.prune(now);
        assert!(view.heartbeat(&peers[0]).is_none());
        assert!(view.heartbeat(&peers[3]).is_some());
    }

    #[test]
    fn heartbeat_round_trips_and_stays_small() {
        let a = PeerId::random();
        let h = beat(&a, u64::MAX);
        let bytes = h.to_bytes();
        assert!(bytes.len() < 256, "{} bytes", bytes.len());
        assert_eq!(Heartbeat::from_bytes(&bytes).unwrap(), h);
        assert!(matches!(
            Heartbeat::from_bytes(&[b' '; MAX_HEARTBEAT_BYTES + 1]),
            Err(HeartbeatError::TooLarge(_))
        ));
        assert!(matches!(
            Heartbeat::from_bytes(b"{\"peer_id\":1}"),
            Err(HeartbeatError::Malformed(_))
        ));
    }
}
