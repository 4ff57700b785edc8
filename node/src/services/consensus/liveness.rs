//! Who is live: the peers whose accepted heartbeats are fresh, with the HTTP server each
//! announces. Consensus feeds it the heartbeats it accepted and publishes a [`LivePeers`]
//! snapshot in its view on every tick; the miner paces its work by it, the orchestrator
//! closes epochs by it, and `/status` shows it. Time is passed in.

use bootstrap::PeerIdStr;
use std::collections::BTreeMap;
use std::time::Instant;

use p2p::{Heartbeat, LiveView, PeerId};

/// What the node's loop and `/status` read of liveness.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LivePeers {
    /// Peers whose heartbeats are fresh, sorted.
    pub(crate) peers: Vec<PeerIdStr>,
    /// The HTTP servers live peers announce, keyed by peer.
    pub(crate) dashboards: BTreeMap<String, String>,
    /// The dataset (manifest blake3, hex) each live peer that serves one announces.
    pub(crate) datasets: BTreeMap<PeerIdStr, String>,
}

/// The live-peer view of accepted heartbeats.
#[derive(Debug)]
pub(crate) struct Liveness {
    view: LiveView,
}

impl Liveness {
    /// A peer counts as live for `timeout` after its last accepted heartbeat.
    pub(crate) fn new(timeout: std::time::Duration) -> Self {
        Liveness {
            view: LiveView::new(timeout),
        }
    }

    /// Takes an accepted heartbeat of `peer`, received at `now`.
    pub(crate) fn observe(&mut self, peer: PeerId, beat: Heartbeat, now: Instant) {
        self.view.observe(peer, beat, now);
    }

    /// Forgets silent peers and says who is live at `now`.
    pub(crate) fn snapshot(&mut self, now: Instant) -> LivePeers {
        self.view.prune(now);
        LivePeers {
            peers: sorted_live(&self.view, now),
            dashboards: dashboards(&self.view, now),
            datasets: live_datasets(&self.view, now),
        }
    }
}

/// The HTTP servers live peers announce, keyed by peer: only `http://<ip>:<port>` (what a
/// node announces), anything else a peer says is dropped.
fn dashboards(live: &LiveView, now: Instant) -> BTreeMap<String, String> {
    live.live(now)
        .iter()
        .filter_map(|(peer, beat)| {
            let url = beat.dashboard.as_deref()?;
            let addr: std::net::SocketAddr = url.strip_prefix("http://")?.parse().ok()?;
            Some((peer.to_string(), format!("http://{addr}")))
        })
        .collect()
}

/// The datasets live peers announce they serve (only well-formed hashes).
fn live_datasets(live: &LiveView, now: Instant) -> BTreeMap<PeerIdStr, String> {
    live.live(now)
        .iter()
        .filter_map(|(peer, beat)| {
            let d = beat.dataset.as_deref()?;
            let ok = d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit());
            ok.then(|| (crate::wire::peer::of(peer), d.to_ascii_lowercase()))
        })
        .collect()
}

fn sorted_live(live: &LiveView, now: Instant) -> Vec<PeerIdStr> {
    let mut peers: Vec<PeerIdStr> = live
        .live(now)
        .iter()
        .map(|(peer, _)| crate::wire::peer::of(peer))
        .collect();
    peers.sort();
    peers
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use p2p::Role;

    use super::*;

    #[test]
    fn only_plain_http_addresses_peers_announce_reach_the_dashboard() {
        let mut live = LiveView::new(Duration::from_secs(30));
        let now = std::time::Instant::now();
        let announced = [
            Some("http://127.0.0.1:9100"),
            Some("javascript:alert(1)"),
            Some("http://evil.example:80"),
            Some("http://127.0.0.1:9100/../admin"),
            None,
        ];
        let mut kept = None;
        for (i, url) in announced.into_iter().enumerate() {
            let peer = p2p::identity::Keypair::generate_ed25519()
                .public()
                .to_peer_id();
            if i == 0 {
                kept = Some(peer.to_string());
            }
            let beat = Heartbeat {
                peer_id: peer.to_string(),
                role: Role::Miner,
                counter: 1,
                sent_at_ms: crate::schedule::unix_ms(std::time::SystemTime::now()),
                run_hash: "run".into(),
                metagraph_hash: None,
                epoch: None,
                stage: None,
                dashboard: url.map(str::to_string),
                binding: None,
                dataset: None,
                capacity: None,
                pathway_rate: None,
            };
            live.observe(peer, beat, now);
        }
        let seen = dashboards(&live, now);
        assert_eq!(
            seen,
            std::collections::BTreeMap::from([(
                kept.unwrap(),
                "http://127.0.0.1:9100".to_string()
            )])
        );
    }
}
