//! gossipsub peer scoring: how a node judges the peers it exchanges gossip with.
//!
//! The model is "punish, never reward". Every peer starts at 0 and only misbehaviour moves it,
//! downwards, with the penalty decaying back towards 0 over time:
//!
//! - **Invalid messages (P4)**, on every topic the node subscribes to: a message whose
//!   envelope fails, or that the application reports [`crate::Verdict::Reject`] for, counts
//!   against the peer that propagated it (and every peer that sent us the same message while
//!   it was being validated). The penalty is `INVALID_MESSAGE_WEIGHT × n²` for `n` invalid
//!   messages, decaying over about an hour.
//! - **Behaviour (P7)**: broken IWANT promises and re-grafting during a prune backoff, beyond
//!   a few that honest peers also produce under churn.
//! - **IP colocation (P6)**: many peers behind one address, except loopback.
//! - **Slow peers**: messages that could not be sent because the peer's queue was full.
//!
//! Nothing earns positive score: time in the mesh (P1) and first deliveries (P2) are off, and
//! so is the mesh delivery-rate floor (P3, P3b), because our topics are bursty (a plan per
//! round, heartbeats every few seconds) and a rate floor would punish honest peers in quiet
//! periods. So an honest peer sits at exactly 0 (unless it falls behind, see slow peers, or
//! shares a non-loopback address with more than ten others), and every threshold below is
//! negative: an honest peer is never affected by any of them.
//!
//! What the scores do, from least to most severe (gossipsub's own rules):
//!
//! | score                  | effect                                                           |
//! |------------------------|------------------------------------------------------------------|
//! | `< 0`                  | pruned from our meshes, never grafted: relayed messages reach it |
//! |                        | only through gossip (IHAVE/IWANT)                                |
//! | `< GOSSIP_THRESHOLD`   | no IHAVE/IWANT gossip with it                                    |
//! | `< PUBLISH_THRESHOLD`  | our own messages are not flood-published to it                   |
//! | `< GRAYLIST_THRESHOLD` | everything it sends is ignored                                   |
//!
//! With one topic weight of 1, the count of invalid messages on one topic that crosses each
//! line is: 1 (below 0), 3 (gossip), 5 (publish), 8 (graylist); counts on different topics
//! are squared separately and add up. A peer that sends one bad message is merely
//! taken out of the mesh and still heard; a flood is cut off after a handful.
//!
//! Scores are kept for [`RETAIN_SCORE`] after a peer disconnects, so reconnecting does not
//! wash them. Topic parameters are set for the topics in [`crate::Config::topics`] at start
//! and for each topic subscribed later through [`crate::Client::subscribe`]; gossipsub does
//! not score messages on topics without parameters.

use std::{collections::HashSet, net::IpAddr, time::Duration};

use libp2p::gossipsub::{
    score_parameter_decay_with_base, IdentTopic, PeerScoreParams, PeerScoreThresholds,
    TopicScoreParams,
};

/// Weight of every topic in the score: an invalid message is as bad on the heartbeat topic as
/// on the plan topic, and the node does not know which of its topics matter more.
const TOPIC_WEIGHT: f64 = 1.0;

/// P4 weight: `n` invalid messages on one topic cost `10 × n²`. Chosen against the thresholds
/// below: 1 message makes the score negative, 3 stop gossip, 5 stop publishing to the peer,
/// 8 graylist it.
const INVALID_MESSAGE_WEIGHT: f64 = -10.0;

/// How long the invalid-message counter takes to decay from 1 to below [`DECAY_TO_ZERO`] (then
/// 0): slow, so a misbehaving peer cannot wait a few minutes and start again; one honest
/// mistake is forgotten within the hour.
const INVALID_MESSAGE_DECAY_TIME: Duration = Duration::from_secs(3600);

/// P7 weight: each behaviour penalty beyond [`BEHAVIOUR_PENALTY_THRESHOLD`] costs
/// `10 × excess²`, the same scale as invalid messages.
const BEHAVIOUR_PENALTY_WEIGHT: f64 = -10.0;

/// Behaviour penalties tolerated for free: honest peers break an IWANT promise now and then
/// (a message expired from their cache) or re-graft early when a prune races a reconnect.
const BEHAVIOUR_PENALTY_THRESHOLD: f64 = 6.0;

/// How long the behaviour counter takes to decay from 1 to 0: long enough that a peer
/// misbehaving steadily accumulates, short enough that a burst under churn is forgotten.
const BEHAVIOUR_PENALTY_DECAY_TIME: Duration = Duration::from_secs(600);

/// P6 weight: each peer on an address shared by more than [`IP_COLOCATION_THRESHOLD`] peers
/// costs `10 × surplus²`, against cheap Sybils from one host.
const IP_COLOCATION_WEIGHT: f64 = -10.0;

/// Peers that may share one address for free: a multi-GPU host runs one node per GPU, and a
/// few hosts may share a NAT.
const IP_COLOCATION_THRESHOLD: f64 = 10.0;

/// Addresses exempt from P6. Test networks and single-host runs put every node on loopback;
/// they would otherwise penalise each other as soon as more than
/// [`IP_COLOCATION_THRESHOLD`] run together, and no remote peer can appear with a loopback
/// address.
const IP_COLOCATION_WHITELIST: [IpAddr; 2] = [
    IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
    IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
];

/// Slow-peer weight (libp2p's default): each message dropped because the peer's send queue
/// was full costs 0.2, so a peer that cannot keep up leaves the mesh for a while (any
/// negative score does that) without ever nearing the gossip threshold on that alone.
const SLOW_PEER_WEIGHT: f64 = -0.2;

/// Slow-peer decay per [`DECAY_INTERVAL`] (libp2p's default): fast, since slowness is usually
/// transient (a large request-response transfer sharing the connection).
const SLOW_PEER_DECAY: f64 = 0.2;

/// Bounds how far topic credit can lift a score above 0. No positive topic term is on, so it
/// never binds today; set to one invalid message's penalty in case one is turned on.
const TOPIC_SCORE_CAP: f64 = 10.0;

/// Weight of gossipsub's application-specific score (P5): off. The application judges
/// messages through verdicts, which already feed P4; nothing sets an application score.
const APP_SPECIFIC_WEIGHT: f64 = 0.0;

/// How often counters decay (libp2p's default and minimum).
const DECAY_INTERVAL: Duration = Duration::from_secs(1);

/// A decaying counter below this is 0 (libp2p's default); the decay times above are measured
/// to this value.
const DECAY_TO_ZERO: f64 = 0.1;

/// How long a disconnected peer's score is remembered: as long as one invalid message takes
/// to decay, so reconnecting never clears a penalty early.
const RETAIN_SCORE: Duration = INVALID_MESSAGE_DECAY_TIME;

/// Below this, no IHAVE/IWANT gossip is exchanged with the peer: 3 invalid messages (-90);
/// 2 (-40) still gossip.
const GOSSIP_THRESHOLD: f64 = -50.0;

/// Below this, our own messages are not flood-published to the peer: 5 invalid messages
/// (-250); 4 (-160) still receive them.
const PUBLISH_THRESHOLD: f64 = -200.0;

/// Below this, everything the peer sends is ignored: 8 invalid messages (-640); 7 (-490) are
/// still heard, so a peer with a bug in one message kind is not cut off from the others.
const GRAYLIST_THRESHOLD: f64 = -500.0;

/// Peer exchange (PX) is accepted only from peers above this. No peer can reach it (scores
/// never exceed [`TOPIC_SCORE_CAP`]) and the node finds peers through Kademlia, so PX is
/// effectively never trusted.
const ACCEPT_PX_THRESHOLD: f64 = 100.0;

/// Opportunistic grafting replaces mesh peers when the mesh median is below this, by peers
/// scoring above the median. Honest peers all sit at 0, so none ever qualifies; gossipsub
/// requires a non-negative value.
const OPPORTUNISTIC_GRAFT_THRESHOLD: f64 = 1.0;

// What the module docs promise, checked at compile time: thresholds negative and ordered, so a
// peer at 0 crosses none; PX out of reach.
const _: () = {
    assert!(0.0 > GOSSIP_THRESHOLD);
    assert!(GOSSIP_THRESHOLD > PUBLISH_THRESHOLD);
    assert!(PUBLISH_THRESHOLD > GRAYLIST_THRESHOLD);
    assert!(ACCEPT_PX_THRESHOLD > TOPIC_SCORE_CAP);
};

/// Score parameters of the node, with topic parameters for each of `topics`.
pub(crate) fn peer_score_params<'a>(
    topics: impl IntoIterator<Item = &'a String>,
) -> PeerScoreParams {
    PeerScoreParams {
        topics: topics
            .into_iter()
            .map(|topic| (IdentTopic::new(topic.as_str()).hash(), topic_params()))
            .collect(),
        topic_score_cap: TOPIC_SCORE_CAP,
        app_specific_weight: APP_SPECIFIC_WEIGHT,
        ip_colocation_factor_weight: IP_COLOCATION_WEIGHT,
        ip_colocation_factor_threshold: IP_COLOCATION_THRESHOLD,
        ip_colocation_factor_whitelist: HashSet::from(IP_COLOCATION_WHITELIST),
        behaviour_penalty_weight: BEHAVIOUR_PENALTY_WEIGHT,
        behaviour_penalty_threshold: BEHAVIOUR_PENALTY_THRESHOLD,
        behaviour_penalty_decay: decay(BEHAVIOUR_PENALTY_DECAY_TIME),
        decay_interval: DECAY_INTERVAL,
        decay_to_zero: DECAY_TO_ZERO,
        retain_score: RETAIN_SCORE,
        slow_peer_weight: SLOW_PEER_WEIGHT,
        slow_peer_threshold: 0.0,
        slow_peer_decay: SLOW_PEER_DECAY,
    }
}

/// Score parameters of one topic: only invalid messages count (see the module docs).
pub(crate) fn topic_params() -> TopicScoreParams {
    TopicScoreParams {
        topic_weight: TOPIC_WEIGHT,
        // P1 off. The quantum must be non-zero even then.
        time_in_mesh_weight: 0.0,
        time_in_mesh_quantum: Duration::from_secs(1),
        time_in_mesh_cap: 0.0,
        // P2 off.
        first_message_deliveries_weight: 0.0,
        first_message_deliveries_decay: 0.5,
        first_message_deliveries_cap: 0.0,
        // P3 and P3b off: our topics are bursty.
        mesh_message_deliveries_weight: 0.0,
        mesh_message_deliveries_decay: 0.5,
        mesh_message_deliveries_cap: 0.0,
        mesh_message_deliveries_threshold: 0.0,
        mesh_message_deliveries_window: Duration::from_millis(10),
        mesh_message_deliveries_activation: Duration::from_secs(5),
        mesh_failure_penalty_weight: 0.0,
        mesh_failure_penalty_decay: 0.5,
        // P4.
        invalid_message_deliveries_weight: INVALID_MESSAGE_WEIGHT,
        invalid_message_deliveries_decay: decay(INVALID_MESSAGE_DECAY_TIME),
    }
}

/// The score thresholds; see the table in the module docs.
pub(crate) fn thresholds() -> PeerScoreThresholds {
    PeerScoreThresholds {
        gossip_threshold: GOSSIP_THRESHOLD,
        publish_threshold: PUBLISH_THRESHOLD,
        graylist_threshold: GRAYLIST_THRESHOLD,
        accept_px_threshold: ACCEPT_PX_THRESHOLD,
        opportunistic_graft_threshold: OPPORTUNISTIC_GRAFT_THRESHOLD,
    }
}

/// The per-[`DECAY_INTERVAL`] factor that takes a counter from 1 to [`DECAY_TO_ZERO`] in
/// `time`.
fn decay(time: Duration) -> f64 {
    score_parameter_decay_with_base(time, DECAY_INTERVAL, DECAY_TO_ZERO)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The score of a peer whose only fault is `n` invalid messages on one topic.
    fn after_invalid_messages(n: u32) -> f64 {
        TOPIC_WEIGHT * INVALID_MESSAGE_WEIGHT * f64::from(n * n)
    }

    #[test]
    fn parameters_are_accepted_by_gossipsub() {
        let topics = ["plans".to_owned(), "heartbeats".to_owned()];
        let params = peer_score_params(&topics);
        assert_eq!(params.topics.len(), 2);
        params.validate().expect("valid score parameters");
        thresholds().validate().expect("valid thresholds");
        topic_params().validate().expect("valid topic parameters");
    }

    #[test]
    fn invalid_messages_cross_each_threshold_at_the_documented_count() {
        // (invalid messages, below 0, below gossip, below publish, below graylist)
        let table = [
            (0, false, false, false, false),
            (1, true, false, false, false),
            (2, true, false, false, false),
            (3, true, true, false, false),
            (4, true, true, false, false),
            (5, true, true, true, false),
            (7, true, true, true, false),
            (8, true, true, true, true),
        ];
        for (n, negative, gossip, publish, graylist) in table {
            let score = after_invalid_messages(n);
            assert_eq!(score < 0.0, negative, "{n} messages: {score}");
            assert_eq!(score < GOSSIP_THRESHOLD, gossip, "{n} messages: {score}");
            assert_eq!(score < PUBLISH_THRESHOLD, publish, "{n} messages: {score}");
            assert_eq!(
                score < GRAYLIST_THRESHOLD,
                graylist,
                "{n} messages: {score}"
            );
        }
    }

    #[test]
    fn one_invalid_message_is_forgotten_within_the_decay_time() {
        let factor = topic_params().invalid_message_deliveries_decay;
        let ticks = INVALID_MESSAGE_DECAY_TIME.as_secs_f64() / DECAY_INTERVAL.as_secs_f64();
        let left = factor.powf(ticks);
        assert!((left - DECAY_TO_ZERO).abs() < 1e-9, "{left}");
        // Slow: after ten minutes most of the penalty remains.
        assert!(factor.powf(600.0) > 0.6);
    }

    #[test]
    fn loopback_is_whitelisted_from_ip_colocation() {
        let params = peer_score_params(&[]);
        for ip in ["127.0.0.1", "::1"] {
            let ip: IpAddr = ip.parse().expect("valid literal");
            assert!(params.ip_colocation_factor_whitelist.contains(&ip), "{ip}");
        }
    }
}
