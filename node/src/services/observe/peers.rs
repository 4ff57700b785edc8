//! Who `/status` (and so every dashboard) shows as what, and whose HTTP server it offers for
//! polling.
//!
//! A heartbeat's `role` and `dashboard` are the sender's own words: anyone with a key can say
//! "validator" and name any URL, and every open dashboard of the run would then show it as a
//! validator and poll that URL. So the run's knowledge decides instead: a live peer is a
//! `validator` only if the metagraph in force gives it a validator permit, a `miner` only if the
//! plan in force names it, and `unverified` otherwise; only validators' and miners' announced
//! URLs (already reduced to `http://<ip>:<port>` by consensus) are offered for polling, and an
//! unverified peer is listed without one. Pure: consensus's view in, the lists out.

use std::collections::{BTreeMap, BTreeSet};

use bootstrap::{EpochPlan, PeerIdStr};
use serde::Serialize;

use crate::services::consensus::api::LivePeers;

/// What the run knows a live peer to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum PeerKind {
    /// A validator with a permit in the metagraph in force.
    Validator,
    /// A miner the plan in force names.
    Miner,
    /// Anyone else whose heartbeat was accepted: shown, never polled.
    Unverified,
}

/// One live peer as `/status` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct LivePeer {
    /// Its peer id.
    pub(crate) peer_id: String,
    /// What the run knows it to be.
    pub(crate) kind: PeerKind,
}

/// The live peers by kind, and the HTTP servers the dashboard may poll.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RunPeers {
    /// Every live peer, sorted by peer id.
    pub(crate) peers: Vec<LivePeer>,
    /// Peer id → `http://<ip>:<port>`, for validators and miners only.
    pub(crate) dashboards: BTreeMap<String, String>,
}

/// Classifies `live` by the permitted `validators` and the plan in force; see the module
/// documentation.
pub(crate) fn run_peers(
    live: &LivePeers,
    validators: &BTreeSet<PeerIdStr>,
    plan: Option<&EpochPlan>,
) -> RunPeers {
    let kind_of = |peer: &PeerIdStr| {
        if validators.contains(peer) {
            PeerKind::Validator
        } else if plan.is_some_and(|p| p.stage_of(peer).is_some()) {
            PeerKind::Miner
        } else {
            PeerKind::Unverified
        }
    };
    let peers: Vec<LivePeer> = live
        .peers
        .iter()
        .map(|peer| LivePeer {
            peer_id: peer.to_string(),
            kind: kind_of(peer),
        })
        .collect();
    let known: BTreeSet<&str> = peers
        .iter()
        .filter(|p| p.kind != PeerKind::Unverified)
        .map(|p| p.peer_id.as_str())
        .collect();
    let dashboards = live
        .dashboards
        .iter()
        .filter(|(peer, _)| known.contains(peer.as_str()))
        .map(|(peer, url)| (peer.clone(), url.clone()))
        .collect();
    RunPeers { peers, dashboards }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::services::consensus::api::fixture;

    #[test]
    fn a_stranger_calling_itself_a_validator_is_listed_unverified_and_never_polled() {
        let (book, miners) = fixture::book(&[0]);
        let plan = book.current();
        let validator = fixture::peer(1);
        let stranger = fixture::peer(99);
        let outsider_miner = fixture::peer(98);
        let live = LivePeers {
            peers: {
                let mut peers = vec![
                    validator.clone(),
                    miners[0].clone(),
                    stranger.clone(),
                    outsider_miner.clone(),
                ];
                peers.sort();
                peers
            },
            dashboards: [
                (&validator, "http://127.0.0.1:9100"),
                (&miners[0], "http://127.0.0.1:9101"),
                (&stranger, "http://127.0.0.1:9666"),
                (&outsider_miner, "http://127.0.0.1:9667"),
            ]
            .into_iter()
            .map(|(p, u)| (p.to_string(), u.to_string()))
            .collect(),
            datasets: Default::default(),
        };
        let validators = BTreeSet::from([validator.clone()]);
        let seen = run_peers(&live, &validators, plan);

        assert_eq!(
            seen.dashboards,
            BTreeMap::from([
                (validator.to_string(), "http://127.0.0.1:9100".to_string()),
                (miners[0].to_string(), "http://127.0.0.1:9101".to_string()),
            ])
        );
        let kind = |peer: &PeerIdStr| {
            seen.peers
                .iter()
                .find(|p| p.peer_id == peer.as_str())
                .map(|p| p.kind)
        };
        assert_eq!(kind(&validator), Some(PeerKind::Validator));
        assert_eq!(kind(&miners[0]), Some(PeerKind::Miner));
        assert_eq!(kind(&stranger), Some(PeerKind::Unverified));
        assert_eq!(kind(&outsider_miner), Some(PeerKind::Unverified));
        // Before any plan, only permitted validators are offered.
        let early = run_peers(&live, &validators, None);
        assert_eq!(early.dashboards.len(), 1);
        assert_eq!(
            early
                .peers
                .iter()
                .filter(|p| p.kind == PeerKind::Miner)
                .count(),
            0
        );
    }

    #[test]
    fn the_status_json_names_each_kind_in_snake_case() {
        let peer = LivePeer {
            peer_id: "p".into(),
            kind: PeerKind::Unverified,
        };
        assert_eq!(
            serde_json::to_string(&peer).unwrap(),
            r#"{"peer_id":"p","kind":"unverified"}"#
        );
    }
}
