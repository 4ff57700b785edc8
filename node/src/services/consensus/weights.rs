//! The validators' weight vectors of the last few epochs and their Yuma consensus
//! ([`attribution::yuma`]), with stakes from the metagraph. Every node keeps one, fed the
//! vectors the router accepted (only from validators with a permit, one per validator and
//! epoch), so every node computes the same consensus from the same vectors. Only closed
//! epochs (before the one in force) are taken: nobody can have scored the open one, so one
//! validator's early vector is never shown as the consensus of an epoch still running.

use std::collections::BTreeMap;

use attribution::{consensus, ValidatorWeights};
use bootstrap::{Metagraph, PeerIdStr};

use crate::services::consensus::api::{ConsensusWeights, MinerConsensus, ValidatorTrust};

/// A weight vector in chain form: `(uid, weight)`.
type Vector = Vec<(u16, u16)>;

/// Epochs whose vectors are kept.
const KEEP_EPOCHS: usize = 3;

/// Weight vectors by epoch, then by validator peer id.
#[derive(Debug, Default)]
pub(crate) struct WeightBook {
    epochs: BTreeMap<u64, BTreeMap<PeerIdStr, Vector>>,
}

impl WeightBook {
    /// Takes `validator`'s vector for `epoch` (its first one counts; an epoch older than the
    /// kept ones is dropped; so is one not closed: `open` is the epoch in force, `None` before
    /// any plan). Returns whether anything changed.
    pub(crate) fn add(
        &mut self,
        validator: PeerIdStr,
        epoch: u64,
        weights: Vector,
        open: Option<u64>,
    ) -> bool {
        if open.is_none_or(|open| epoch >= open) {
            return false;
        }
        if self.epochs.len() >= KEEP_EPOCHS
            && self
                .epochs
                .first_key_value()
                .is_some_and(|(&oldest, _)| epoch < oldest)
        {
            return false;
        }
        let vectors = self.epochs.entry(epoch).or_default();
        if vectors.contains_key(&validator) {
            return false;
        }
        vectors.insert(validator, weights);
        while self.epochs.len() > KEEP_EPOCHS {
            self.epochs.pop_first();
        }
        true
    }

    /// The consensus of the newest epoch with vectors, over the validators of `metagraph`
    /// (their stake); `None` when there is none, or no heard validator has stake.
    pub(crate) fn consensus(&self, metagraph: &Metagraph) -> Option<ConsensusWeights> {
        let (&epoch, vectors) = self.epochs.last_key_value()?;
        let stake_of = |peer: &PeerIdStr| metagraph.by_peer_id(peer).map(|n| n.stake);
        let heard: Vec<(&PeerIdStr, u64, &Vector)> = vectors
            .iter()
            .filter_map(|(peer, w)| Some((peer, stake_of(peer)?, w)))
            .collect();
        let input: Vec<ValidatorWeights> = heard
            .iter()
            .map(|(_, stake, weights)| ValidatorWeights {
                stake: *stake as f64,
                weights: (*weights).clone(),
            })
            .collect();
        let outcome = match consensus(&input, attribution::yuma::DEFAULT_KAPPA) {
            Ok(outcome) => outcome,
            Err(error) => {
                tracing::debug!(%error, epoch, "no weight consensus");
                return None;
            }
        };
        let by_uid: BTreeMap<u16, &bootstrap::Neuron> =
            metagraph.neurons().iter().map(|n| (n.uid, n)).collect();
        let total_stake: f64 = heard.iter().map(|(_, s, _)| *s as f64).sum();
        let miners = outcome
            .miners
            .iter()
            .enumerate()
            .map(|(j, uid)| {
                let weight = outcome.consensus.get(j).copied().unwrap_or(0.0);
                MinerConsensus {
                    uid: *uid,
                    hotkey: by_uid
                        .get(uid)
                        .map(|n| n.hotkey.to_string())
                        .unwrap_or_default(),
                    peer_id: by_uid
                        .get(uid)
                        .map(|n| n.peer_id.to_string())
                        .unwrap_or_default(),
                    weight,
                    incentive: outcome.incentive.get(j).copied().unwrap_or(0.0),
                    flagged: weight <= 0.0,
                    reason: (weight <= 0.0).then(|| "weighed 0 by consensus".to_string()),
                }
            })
            .collect();
        let validators = heard
            .iter()
            .enumerate()
            .map(|(i, (peer, stake, _))| ValidatorTrust {
                peer_id: peer.to_string(),
                stake: if total_stake > 0.0 {
                    *stake as f64 / total_stake
                } else {
                    0.0
                },
                trust: outcome.validator_trust.get(i).copied().unwrap_or(0.0),
            })
            .collect();
        Some(ConsensusWeights {
            epoch,
            miners,
            validators,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metagraph() -> (Metagraph, Vec<PeerIdStr>) {
        let peers: Vec<bootstrap::PeerIdStr> = (1..=5u8)
            .map(|i| {
                bootstrap::PeerIdStr::parse(
                    &p2p::identity::Keypair::ed25519_from_bytes([i; 32])
                        .unwrap()
                        .public()
                        .to_peer_id()
                        .to_string(),
                )
                .unwrap()
            })
            .collect();
        // Peers 0 and 1 are validators with stakes 3 and 1; peers 2–4 are miners.
        let neurons = peers
            .iter()
            .enumerate()
            .map(|(i, p)| bootstrap::LocalNeuron {
                peer_id: p.clone(),
                stake: match i {
                    0 => 3 * bootstrap::RAO_PER_TAO,
                    1 => bootstrap::RAO_PER_TAO,
                    _ => 0,
                },
                validator_permit: i < 2,
            });
        let metagraph = Metagraph::for_local_run(neurons).unwrap();
        (metagraph, peers)
    }

    #[test]
    fn every_node_computes_the_stake_weighted_consensus_and_the_deviant_loses_trust() {
        let (metagraph, peers) = metagraph();
        let uid = |i: usize| metagraph.by_peer_id(&peers[i]).unwrap().uid;
        let (a, b, c) = (uid(2), uid(3), uid(4));
        let mut book = WeightBook::default();
        // The big validator weighs the three miners equally; the small one puts everything
        // on miner a.
        assert!(book.add(
            peers[0].clone(),
            7,
            vec![(a, 65535), (b, 65535), (c, 65535)],
            Some(100)
        ));
        assert!(book.add(peers[1].clone(), 7, vec![(a, 65535)], Some(100)));
        // A second vector of the same validator for the same epoch does not count.
        assert!(!book.add(peers[1].clone(), 7, vec![(b, 65535)], Some(100)));
        let consensus = book.consensus(&metagraph).unwrap();
        assert_eq!(consensus.epoch, 7);
        // Consensus follows the 3/4 of the stake: a third each. Clipped, the small validator
        // still backs a with a third: ranks a = 3/4·1/3 + 1/4·1/3 = 1/3, b = c = 1/4, so the
        // incentives are (1/3, 1/4, 1/4) / (5/6) = 0.4, 0.3, 0.3.
        for m in &consensus.miners {
            assert!((m.weight - 1.0 / 3.0).abs() < 1e-9, "{m:?}");
            let incentive = if m.uid == a { 0.4 } else { 0.3 };
            assert!((m.incentive - incentive).abs() < 1e-9, "{m:?}");
            assert!(!m.peer_id.is_empty());
        }
        let trust = |peer: &PeerIdStr| {
            consensus
                .validators
                .iter()
                .find(|v| v.peer_id == peer.as_str())
                .unwrap()
                .trust
        };
        // The big validator agrees everywhere (trust 1); the small one keeps only the third
        // of its weight that consensus supports.
        assert!((trust(&peers[0]) - 1.0).abs() < 1e-9);
        assert!((trust(&peers[1]) - 1.0 / 3.0).abs() < 1e-9);
    }

    #[test]
    fn a_vector_for_an_epoch_still_open_is_not_taken() {
        let (metagraph, peers) = metagraph();
        let mut book = WeightBook::default();
        // Epoch 7 is the one in force: nobody can have scored it yet.
        assert!(!book.add(peers[1].clone(), 7, vec![(2, 65535)], Some(7)));
        assert!(!book.add(peers[1].clone(), 8, vec![(2, 65535)], Some(7)));
        assert!(
            !book.add(peers[1].clone(), 6, vec![(2, 65535)], None),
            "no plan known"
        );
        assert_eq!(book.consensus(&metagraph), None);
        assert!(book.add(peers[1].clone(), 6, vec![(2, 65535)], Some(7)));
        assert_eq!(book.consensus(&metagraph).unwrap().epoch, 6);
    }

    #[test]
    fn vectors_of_strangers_have_no_say_and_old_epochs_are_forgotten() {
        let (metagraph, peers) = metagraph();
        let mut book = WeightBook::default();
        let stranger =
            PeerIdStr::parse("12D3KooWNtKk9kge2qJwFHP3zgffKj9bEFNSiG5DxGQEqsB6niD4").unwrap();
        assert!(book.add(stranger, 1, vec![(9, 65535)], Some(100)));
        assert_eq!(
            book.consensus(&metagraph),
            None,
            "no staked validator heard"
        );
        for epoch in 2..=5 {
            assert!(book.add(peers[0].clone(), epoch, vec![(2, 65535)], Some(100)));
        }
        assert!(
            !book.add(peers[1].clone(), 1, vec![(2, 65535)], Some(100)),
            "epoch 1 is gone"
        );
        assert_eq!(book.consensus(&metagraph).unwrap().epoch, 5);
    }
}
