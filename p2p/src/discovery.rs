//! When to dial bootstrap peers again and when to run the next discovery round.
//!
//! Pure schedules with the clock passed in; the event loop asks them what is due and feeds
//! back dial outcomes. Guarantees: a bootstrap peer that cannot be reached is retried after
//! [`RETRY_INITIAL`], doubling per consecutive failure up to [`RETRY_MAX`], forever; a
//! connection resets its backoff; a bootstrap peer that disconnects is redialled after
//! [`RETRY_INITIAL`]. Discovery rounds start at the configured interval and back off by
//! doubling to at most [`DISCOVERY_MAX`]; a new peer in the routing table resets the interval,
//! so a network that is still growing is explored quickly and a settled one cheaply.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use libp2p::{Multiaddr, PeerId};

/// Delay before the first redial of an unreachable bootstrap peer.
pub const RETRY_INITIAL: Duration = Duration::from_secs(1);
/// Longest delay between redials of an unreachable bootstrap peer.
pub const RETRY_MAX: Duration = Duration::from_secs(30);
/// Longest interval between discovery rounds.
pub const DISCOVERY_MAX: Duration = Duration::from_secs(30);

#[derive(Debug)]
struct Bootstrap {
    addr: Multiaddr,
    /// Delay applied after the next failure.
    delay: Duration,
    /// When to dial next; `None` while dialing or connected.
    due: Option<Instant>,
    failures: u32,
}

/// Redial schedule of the configured bootstrap peers.
#[derive(Debug, Default)]
pub(crate) struct BootstrapSchedule {
    peers: HashMap<PeerId, Bootstrap>,
}

impl BootstrapSchedule {
    /// All `peers` are due at `now`.
    pub(crate) fn new(peers: impl IntoIterator<Item = (PeerId, Multiaddr)>, now: Instant) -> Self {
        let peers = peers
            .into_iter()
            .map(|(peer, addr)| {
                (
                    peer,
                    Bootstrap {
                        addr,
                        delay: RETRY_INITIAL,
                        due: Some(now),
                        failures: 0,
                    },
                )
            })
            .collect();
        Self { peers }
    }

    /// The addresses due for a dial at `now`; they count as being dialed until the outcome is
    /// reported through [`Self::on_dial_failure`] or [`Self::on_connected`].
    pub(crate) fn take_due(&mut self, now: Instant) -> Vec<Multiaddr> {
        let mut due: Vec<(PeerId, Multiaddr)> = self
            .peers
            .iter_mut()
            .filter(|(_, b)| b.due.is_some_and(|t| t <= now))
            .map(|(p, b)| {
                b.due = None;
                (*p, b.addr.clone())
            })
            .collect();
        due.sort_by_key(|d| d.0);
        due.into_iter().map(|(_, a)| a).collect()
    }

    /// The earliest pending redial.
    pub(crate) fn next_due(&self) -> Option<Instant> {
        self.peers.values().filter_map(|b| b.due).min()
    }

    /// Records a failed dial of `peer` at `now`. For a bootstrap peer returns the delay until
    /// its redial and the count of consecutive failures; `None` for other peers.
    pub(crate) fn on_dial_failure(
        &mut self,
        peer: &PeerId,
        now: Instant,
    ) -> Option<(Duration, u32)> {
        let b = self.peers.get_mut(peer)?;
        let delay = b.delay;
        b.due = Some(now + delay);
        b.delay = (delay * 2).min(RETRY_MAX);
        b.failures = b.failures.saturating_add(1);
        Some((delay, b.failures))
    }

    /// Our dial of `peer` was not started because another dial to it is under way: look
    /// again after the current delay, without counting a failure.
    pub(crate) fn retry_later(&mut self, peer: &PeerId, now: Instant) {
        if let Some(b) = self.peers.get_mut(peer) {
            b.due = Some(now + b.delay);
        }
    }

    /// Records a connection to `peer`: no redial while connected, backoff reset.
    pub(crate) fn on_connected(&mut self, peer: &PeerId) {
        if let Some(b) = self.peers.get_mut(peer) {
            b.due = None;
            b.delay = RETRY_INITIAL;
            b.failures = 0;
        }
    }

    /// Records that the last connection to `peer` closed at `now`: redial after the current
    /// delay.
    pub(crate) fn on_disconnected(&mut self, peer: &PeerId, now: Instant) {
        if let Some(b) = self.peers.get_mut(peer) {
            b.due = Some(now + b.delay);
        }
    }
}

/// Interval schedule of discovery rounds (Kademlia bootstrap queries).
#[derive(Debug)]
pub(crate) struct DiscoverySchedule {
    base: Duration,
    current: Duration,
    next: Instant,
}

impl DiscoverySchedule {
    /// First round at `now`, then every `base`, doubling up to [`DISCOVERY_MAX`] (or `base`, if
    /// larger).
    pub(crate) fn new(base: Duration, now: Instant) -> Self {
        Self {
            base,
            current: base,
            next: now,
        }
    }

    /// When the next round is due.
    pub(crate) fn next_due(&self) -> Instant {
        self.next
    }

    /// Whether a round is due at `now`; if so, schedules the following one.
    pub(crate) fn poll(&mut self, now: Instant) -> bool {
        if now < self.next {
            return false;
        }
        self.next = now + self.current;
        self.current = (self.current * 2).min(DISCOVERY_MAX.max(self.base));
        true
    }

    /// A new peer appeared: go back to the base interval.
    pub(crate) fn reset(&mut self, now: Instant) {
        self.current = self.base;
        self.next = self.next.min(now + self.base);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(port: u16, peer: PeerId) -> Multiaddr {
        format!("/ip4/127.0.0.1/tcp/{port}/p2p/{peer}")
            .parse()
            .unwrap()
    }

    #[test]
    fn unreachable_bootstrap_backs_off_doubling_to_thirty_seconds() {
        let t0 = Instant::now();
        let p = PeerId::random();
        let mut s = BootstrapSchedule::new([(p, addr(1, p))], t0);
        assert_eq!(s.take_due(t0), vec![addr(1, p)]);
        assert!(s.take_due(t0).is_empty(), "dialing peers are not due again");

        let mut now = t0;
        let mut delays = Vec::new();
        for _ in 0..8 {
            let (delay, _) = s.on_dial_failure(&p, now).unwrap();
            delays.push(delay.as_secs());
            assert_eq!(s.next_due(), Some(now + delay));
            assert!(s
                .take_due(now + delay - Duration::from_millis(1))
                .is_empty());
            now += delay;
            assert_eq!(s.take_due(now).len(), 1);
        }
        assert_eq!(delays, vec![1, 2, 4, 8, 16, 30, 30, 30]);
    }

    #[test]
    fn connection_resets_backoff_and_disconnect_schedules_redial() {
        let t0 = Instant::now();
        let p = PeerId::random();
        let mut s = BootstrapSchedule::new([(p, addr(1, p))], t0);
        s.take_due(t0);
        s.on_dial_failure(&p, t0);
        s.on_dial_failure(&p, t0);
        assert_eq!(
            s.on_dial_failure(&p, t0).unwrap(),
            (Duration::from_secs(4), 3)
        );
        s.on_connected(&p);
        assert_eq!(s.next_due(), None);
        s.on_disconnected(&p, t0);
        assert_eq!(s.next_due(), Some(t0 + RETRY_INITIAL));
        s.take_due(t0 + RETRY_INITIAL);
        assert_eq!(s.on_dial_failure(&p, t0).unwrap(), (RETRY_INITIAL, 1));
    }

    #[test]
    fn retry_later_neither_counts_nor_backs_off() {
        let t0 = Instant::now();
        let p = PeerId::random();
        let mut s = BootstrapSchedule::new([(p, addr(1, p))], t0);
        s.take_due(t0);
        s.on_dial_failure(&p, t0);
        s.take_due(t0 + RETRY_INITIAL);
        s.retry_later(&p, t0);
        assert_eq!(s.next_due(), Some(t0 + Duration::from_secs(2)));
        s.take_due(t0 + Duration::from_secs(2));
        assert_eq!(
            s.on_dial_failure(&p, t0).unwrap(),
            (Duration::from_secs(2), 2)
        );
    }

    #[test]
    fn failures_of_other_peers_are_not_scheduled() {
        let t0 = Instant::now();
        let p = PeerId::random();
        let mut s = BootstrapSchedule::new([(p, addr(1, p))], t0);
        assert_eq!(s.on_dial_failure(&PeerId::random(), t0), None);
    }

    #[test]
    fn discovery_backs_off_and_resets_on_new_peers() {
        let t0 = Instant::now();
        let base = Duration::from_secs(2);
        let mut d = DiscoverySchedule::new(base, t0);
        assert!(d.poll(t0));
        assert!(!d.poll(t0 + Duration::from_millis(1999)));
        let mut gaps = Vec::new();
        let mut now = t0;
        for _ in 0..6 {
            let next = d.next_due();
            gaps.push((next - now).as_secs());
            now = next;
            assert!(d.poll(now));
        }
        assert_eq!(gaps, vec![2, 4, 8, 16, 30, 30]);
        d.reset(now);
        assert_eq!(d.next_due(), now + base);
        assert!(d.poll(now + base));
        assert_eq!(d.next_due(), now + base + base);
    }
}
