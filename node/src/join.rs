//! Joining a run with `--bootstrap` alone: which run configuration and stake snapshot a new
//! node adopts, decided from the validators' heartbeats. Pure: the clock is an argument and
//! the network is `app::join`'s.
//!
//! Every node's heartbeat names the hash of the run configuration it follows and, off the
//! chain, the hash of its stake snapshot (`metagraph.json`). A node started without `--run`
//! (or, off the chain, without `--metagraph`) keeps the newest heartbeat of every validator it
//! hears ([`Vouches`]), fetches the files those hashes name from the peers that advertise
//! them, checks each against its hash, and adopts a run configuration only when validators
//! holding **more than half of the validator stake** advertise it beside the snapshot that
//! gives them that stake ([`decide`]). A validator's vote is its latest heartbeat; a validator
//! that says nothing votes for nothing, so a snapshot whose validators are mostly silent is
//! not adopted yet.
//!
//! What this trusts. On a chain run the stake comes from the chain, so the validators and
//! their stake are known independently of the peers. Off the chain, a snapshot names its own
//! validators: a network of strangers could make up a snapshot in which they hold all the
//! stake, and a node that has never seen the run cannot tell. It trusts such a snapshot on
//! first use, from the network its bootstrap address leads to (the log says so), unless
//! `--metagraph-hash` pins it. A pin (`--run-hash`, `--metagraph-hash`) narrows what is
//! accepted, it does not replace the vote: a node whose pinned run configuration the
//! validators' majority does not follow stops, saying which one they follow.

use std::collections::BTreeMap;
use std::sync::Arc;

use bootstrap::{Metagraph, PeerIdStr, RunConfig};
use p2p::{Heartbeat, Role};

use crate::wire::messages::{self, JoinReply, JoinRequest, Service};
use crate::wire::rpc;

/// Most validators whose heartbeats are kept (a newcomer beyond it is not heard).
pub(crate) const MAX_VOUCHERS: usize = 4096;

/// Most distinct stake snapshots fetched and weighed while joining.
pub(crate) const MAX_SNAPSHOTS: usize = 8;

/// A heartbeat this far from the joining node's clock (either way) is not a vote.
pub(crate) const MAX_SKEW_MS: u64 = 15_000;

/// What a validator's latest heartbeat says it follows.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Claim {
    /// The run configuration's hash, hex.
    pub(crate) run: String,
    /// The stake snapshot's hash, hex (none: the validator follows the chain).
    pub(crate) metagraph: Option<String>,
}

/// What [`Vouches::observe`] did with a heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Heard {
    /// Kept: the author's vote now.
    Kept,
    /// Not a validator's heartbeat, or not its author's own.
    NotAVote,
    /// Sent too long ago (or in the future), or not newer than the author's last.
    Stale,
    /// [`MAX_VOUCHERS`] validators are already kept.
    Full,
}

#[derive(Clone, Debug)]
struct Vote {
    sent_at_ms: u64,
    counter: u64,
    claim: Claim,
}

/// The newest heartbeat of every validator heard, as a vote for what it follows.
#[derive(Clone, Debug, Default)]
pub(crate) struct Vouches {
    votes: BTreeMap<PeerIdStr, Vote>,
}

impl Vouches {
    /// Takes a heartbeat gossiped by `author` (the signer of its envelope), at `now_ms`.
    pub(crate) fn observe(&mut self, author: &PeerIdStr, beat: &Heartbeat, now_ms: u64) -> Heard {
        if beat.role != Role::Validator || beat.peer_id != author.as_str() {
            return Heard::NotAVote;
        }
        if beat.sent_at_ms.abs_diff(now_ms) > MAX_SKEW_MS {
            return Heard::Stale;
        }
        if let Some(last) = self.votes.get(author) {
            if (beat.sent_at_ms, beat.counter) <= (last.sent_at_ms, last.counter) {
                return Heard::Stale;
            }
        } else if self.votes.len() >= MAX_VOUCHERS {
            return Heard::Full;
        }
        self.votes.insert(
            author.clone(),
            Vote {
                sent_at_ms: beat.sent_at_ms,
                counter: beat.counter,
                claim: Claim {
                    run: beat.run_hash.clone(),
                    metagraph: beat.metagraph_hash.clone(),
                },
            },
        );
        Heard::Kept
    }

    /// How many validators have been heard.
    pub(crate) fn heard(&self) -> usize {
        self.votes.len()
    }

    /// The stake snapshots the validators advertise, the most advertised first (ties by
    /// hash), at most [`MAX_SNAPSHOTS`].
    pub(crate) fn snapshots(&self) -> Vec<String> {
        let mut count: BTreeMap<&str, usize> = BTreeMap::new();
        for vote in self.votes.values() {
            if let Some(m) = &vote.claim.metagraph {
                *count.entry(m.as_str()).or_default() += 1;
            }
        }
        let mut ranked: Vec<(&str, usize)> = count.into_iter().collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        ranked
            .into_iter()
            .take(MAX_SNAPSHOTS)
            .map(|(m, _)| m.to_string())
            .collect()
    }

    /// The validators whose latest heartbeat advertises run `run` (any snapshot), to fetch
    /// its configuration from.
    pub(crate) fn advertising_run(&self, run: &str) -> Vec<PeerIdStr> {
        self.votes
            .iter()
            .filter(|(_, v)| v.claim.run == run)
            .map(|(p, _)| p.clone())
            .collect()
    }

    /// The validators whose latest heartbeat advertises snapshot `metagraph`.
    pub(crate) fn advertising_snapshot(&self, metagraph: &str) -> Vec<PeerIdStr> {
        self.votes
            .iter()
            .filter(|(_, v)| v.claim.metagraph.as_deref() == Some(metagraph))
            .map(|(p, _)| p.clone())
            .collect()
    }

    fn claim_of(&self, peer: &PeerIdStr) -> Option<&Claim> {
        self.votes.get(peer).map(|v| &v.claim)
    }
}

/// The stake behind one run configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Backing {
    /// The run configuration's hash, hex.
    pub(crate) run: String,
    /// Stake (rao) of the validators that advertise it with the snapshot.
    pub(crate) stake: u128,
    /// Stake (rao) of every validator of the snapshot.
    pub(crate) total: u128,
    /// How many validators advertise it.
    pub(crate) validators: usize,
}

impl Backing {
    /// The share of the validator stake behind it, in percent (for the log).
    pub(crate) fn percent(&self) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        self.stake as f64 * 100.0 / self.total as f64
    }
}

/// What [`decide`] concluded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Validators with more than half of the stake advertise this run configuration with
    /// the snapshot.
    Adopt(Backing),
    /// No run configuration has a majority yet; the best backed so far, if any.
    Wait(Option<Backing>),
    /// The snapshot gives its validators no stake: nothing can ever be adopted from it.
    NoStake,
}

/// Who votes on a run and with how much stake: the validators of a snapshot, or of the chain.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Electorate {
    /// The validators whose peer is known, and their stake (rao).
    pub(crate) voters: Vec<(PeerIdStr, u64)>,
    /// The stake (rao) of every validator, those whose peer is unknown included: a
    /// majority is of all of it.
    pub(crate) total: u128,
}

impl Electorate {
    /// The validators of a snapshot (it names every validator's peer).
    pub(crate) fn of_snapshot(snapshot: &Metagraph) -> Electorate {
        let voters: Vec<(PeerIdStr, u64)> = snapshot
            .validators()
            .map(|n| (n.peer_id.clone(), n.stake))
            .collect();
        let total = voters.iter().map(|(_, s)| u128::from(*s)).sum();
        Electorate { voters, total }
    }

    /// The validators of the chain: every neuron with a permit counts towards the total; it
    /// votes once its hotkey is bound to a peer (`bound`: the chain's neurons under the peers
    /// whose bindings verified).
    pub(crate) fn of_chain(
        bound: &Metagraph,
        neurons: &[bootstrap::chain::ChainNeuron],
    ) -> Electorate {
        Electorate {
            voters: Electorate::of_snapshot(bound).voters,
            total: neurons
                .iter()
                .filter(|n| n.validator_permit)
                .map(|n| u128::from(n.stake))
                .sum(),
        }
    }
}

/// Weighs the validators' votes: those of `electorate`, under the stake snapshot of hash
/// `snapshot_hash` (hex; none on a chain run). A validator's vote counts when its latest
/// heartbeat names the same snapshot (none on the chain); its stake counts once.
pub(crate) fn decide(
    vouches: &Vouches,
    electorate: &Electorate,
    snapshot_hash: Option<&str>,
) -> Decision {
    let total = electorate.total;
    if total == 0 {
        return Decision::NoStake;
    }
    let stakes = &electorate.voters;
    let mut behind: BTreeMap<&str, (u128, usize)> = BTreeMap::new();
    let mut counted = std::collections::BTreeSet::new();
    for (peer, stake) in stakes {
        if !counted.insert(peer) {
            continue;
        }
        let Some(claim) = vouches.claim_of(peer) else {
            continue;
        };
        if claim.metagraph.as_deref() != snapshot_hash {
            continue;
        }
        let entry = behind.entry(claim.run.as_str()).or_default();
        entry.0 += u128::from(*stake);
        entry.1 += 1;
    }
    let best = behind
        .into_iter()
        .max_by(|a, b| a.1 .0.cmp(&b.1 .0).then(b.0.cmp(a.0)))
        .map(|(run, (stake, validators))| Backing {
            run: run.to_string(),
            stake,
            total,
            validators,
        });
    match best {
        Some(b) if b.stake * 2 > total => Decision::Adopt(b),
        other => Decision::Wait(other),
    }
}

/// What a node in a run serves to joining nodes: the run's name, its configuration and its
/// stake snapshot, each with its hash.
#[derive(Clone, Debug)]
pub(crate) struct JoinFiles {
    run_name: String,
    run_hash: String,
    run_toml: Arc<Vec<u8>>,
    metagraph: Option<(String, Arc<Vec<u8>>)>,
}

impl JoinFiles {
    /// The files of `run` and `metagraph` (the snapshot the node follows, if any).
    pub(crate) fn new(run: &RunConfig, metagraph: Option<&Metagraph>) -> anyhow::Result<JoinFiles> {
        Ok(JoinFiles {
            run_name: run.run_name.clone(),
            run_hash: run.hash().to_hex(),
            run_toml: Arc::new(run.to_toml_string()?.into_bytes()),
            metagraph: metagraph
                .map(|m| (hex::encode(m.hash()), Arc::new(m.to_json().into_bytes()))),
        })
    }

    /// The run configuration's hash, hex, as heartbeats advertise it.
    pub(crate) fn run_hash(&self) -> &str {
        &self.run_hash
    }

    /// The snapshot's hash, hex, as heartbeats advertise it.
    pub(crate) fn metagraph_hash(&self) -> Option<&str> {
        self.metagraph.as_ref().map(|(h, _)| h.as_str())
    }

    /// Answers a [`Service::Join`] request body; a body that does not parse gets
    /// [`rpc::ErrorCode::Malformed`].
    pub(crate) fn answer(&self, body: &[u8]) -> Vec<u8> {
        let Ok((request, _)) = messages::decode::<JoinRequest>(Service::Join, body) else {
            return rpc::error_response(rpc::ErrorCode::Malformed);
        };
        let reply = match request {
            JoinRequest::Summary => messages::encode(
                Service::Join,
                &JoinReply::Summary {
                    run_name: self.run_name.clone(),
                    run_hash: self.run_hash.clone(),
                    metagraph_hash: self.metagraph_hash().map(str::to_string),
                },
                &[],
            ),
            JoinRequest::Run { hash } if hash == self.run_hash => {
                messages::encode(Service::Join, &JoinReply::Bytes, &self.run_toml)
            }
            JoinRequest::Metagraph { hash } if Some(hash.as_str()) == self.metagraph_hash() => {
                let bytes = self
                    .metagraph
                    .as_ref()
                    .map(|(_, b)| b.as_slice())
                    .unwrap_or_default();
                messages::encode(Service::Join, &JoinReply::Bytes, bytes)
            }
            JoinRequest::Run { .. } | JoinRequest::Metagraph { .. } => {
                messages::encode(Service::Join, &JoinReply::Missing, &[])
            }
        };
        reply.unwrap_or_else(|_| rpc::error_response(rpc::ErrorCode::Busy))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bootstrap::{LocalNeuron, RAO_PER_TAO};

    fn peer(i: u8) -> PeerIdStr {
        let key = p2p::identity::Keypair::ed25519_from_bytes([i; 32]).unwrap();
        PeerIdStr::parse(&key.public().to_peer_id().to_base58()).unwrap()
    }

    fn beat(p: &PeerIdStr, role: Role, counter: u64, run: &str, m: Option<&str>) -> Heartbeat {
        Heartbeat {
            peer_id: p.to_string(),
            role,
            counter,
            sent_at_ms: 1_000_000 + counter,
            run_hash: run.into(),
            metagraph_hash: m.map(str::to_string),
            epoch: None,
            stage: None,
            dashboard: None,
            binding: None,
            dataset: None,
            capacity: None,
            pathway_rate: None,
        }
    }

    const NOW: u64 = 1_000_000;

    fn snapshot(stakes: &[(u8, u64, bool)]) -> Metagraph {
        Metagraph::for_local_run(stakes.iter().map(|&(i, tao, permit)| LocalNeuron {
            peer_id: peer(i),
            stake: tao * RAO_PER_TAO,
            validator_permit: permit,
        }))
        .unwrap()
    }

    #[test]
    fn the_stake_majority_decides_not_the_head_count() {
        // Three validators: 100, 50 and 10 TAO. The two small ones agree on another run.
        let m = snapshot(&[
            (1, 100, true),
            (2, 50, true),
            (3, 10, true),
            (4, 1000, false),
        ]);
        let mh = hex::encode(m.hash());
        let mut v = Vouches::default();
        assert_eq!(
            v.observe(
                &peer(1),
                &beat(&peer(1), Role::Validator, 1, "good", Some(&mh)),
                NOW
            ),
            Heard::Kept
        );
        assert_eq!(
            v.observe(
                &peer(2),
                &beat(&peer(2), Role::Validator, 1, "bad", Some(&mh)),
                NOW
            ),
            Heard::Kept
        );
        assert_eq!(
            v.observe(
                &peer(3),
                &beat(&peer(3), Role::Validator, 1, "bad", Some(&mh)),
                NOW
            ),
            Heard::Kept
        );
        match decide(&v, &Electorate::of_snapshot(&m), Some(&mh)) {
            Decision::Adopt(b) => {
                assert_eq!(b.run, "good");
                assert_eq!(b.validators, 1);
                assert_eq!(b.stake, 100 * u128::from(RAO_PER_TAO));
                // The rich neuron without a permit is no validator: its stake is not counted.
                assert_eq!(b.total, 160 * u128::from(RAO_PER_TAO));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_minority_is_not_adopted_and_silence_votes_for_nothing() {
        let m = snapshot(&[(1, 100, true), (2, 50, true), (3, 60, true)]);
        let mh = hex::encode(m.hash());
        let mut v = Vouches::default();
        v.observe(
            &peer(2),
            &beat(&peer(2), Role::Validator, 1, "liar", Some(&mh)),
            NOW,
        );
        v.observe(
            &peer(3),
            &beat(&peer(3), Role::Validator, 1, "good", Some(&mh)),
            NOW,
        );
        // 60 of 210 for "good", 50 for "liar", the largest validator unheard: no majority.
        assert_eq!(
            decide(&v, &Electorate::of_snapshot(&m), Some(&mh)),
            Decision::Wait(Some(Backing {
                run: "good".into(),
                stake: 60 * u128::from(RAO_PER_TAO),
                total: 210 * u128::from(RAO_PER_TAO),
                validators: 1,
            }))
        );
        v.observe(
            &peer(1),
            &beat(&peer(1), Role::Validator, 1, "good", Some(&mh)),
            NOW,
        );
        assert!(
            matches!(decide(&v, &Electorate::of_snapshot(&m), Some(&mh)), Decision::Adopt(b) if b.run == "good")
        );
        // Exactly half is not more than half.
        let even = snapshot(&[(1, 50, true), (2, 50, true)]);
        let eh = hex::encode(even.hash());
        let mut v = Vouches::default();
        v.observe(
            &peer(1),
            &beat(&peer(1), Role::Validator, 1, "a", Some(&eh)),
            NOW,
        );
        v.observe(
            &peer(2),
            &beat(&peer(2), Role::Validator, 1, "b", Some(&eh)),
            NOW,
        );
        assert!(matches!(
            decide(&v, &Electorate::of_snapshot(&even), Some(&eh)),
            Decision::Wait(Some(_))
        ));
    }

    #[test]
    fn a_vote_counts_only_beside_the_snapshot_that_gives_the_stake() {
        let m = snapshot(&[(1, 100, true), (2, 50, true)]);
        let mh = hex::encode(m.hash());
        let mut v = Vouches::default();
        // The big validator advertises the run with another snapshot: not a vote under this one.
        v.observe(
            &peer(1),
            &beat(&peer(1), Role::Validator, 1, "good", Some("other")),
            NOW,
        );
        v.observe(
            &peer(2),
            &beat(&peer(2), Role::Validator, 1, "good", Some(&mh)),
            NOW,
        );
        assert!(
            matches!(decide(&v, &Electorate::of_snapshot(&m), Some(&mh)), Decision::Wait(Some(b)) if b.validators == 1)
        );
        // On the chain (no snapshot hash), only votes naming no snapshot count.
        assert!(matches!(
            decide(&v, &Electorate::of_snapshot(&m), None),
            Decision::Wait(None)
        ));
        // A snapshot without validator stake can never decide.
        let none = snapshot(&[(1, 100, false)]);
        assert_eq!(
            decide(&v, &Electorate::of_snapshot(&none), Some(&mh)),
            Decision::NoStake
        );
    }

    #[test]
    fn only_a_validators_own_fresh_and_newer_heartbeat_is_its_vote() {
        let mut v = Vouches::default();
        let p = peer(1);
        assert_eq!(
            v.observe(&p, &beat(&p, Role::Miner, 1, "r", None), NOW),
            Heard::NotAVote
        );
        // Gossiped by someone else than the peer it names.
        assert_eq!(
            v.observe(&peer(2), &beat(&p, Role::Validator, 1, "r", None), NOW),
            Heard::NotAVote
        );
        let mut old = beat(&p, Role::Validator, 1, "r", None);
        old.sent_at_ms = NOW - MAX_SKEW_MS - 1;
        assert_eq!(v.observe(&p, &old, NOW), Heard::Stale);
        assert_eq!(
            v.observe(&p, &beat(&p, Role::Validator, 5, "r", Some("m")), NOW),
            Heard::Kept
        );
        // A replay of an older one cannot change the vote.
        assert_eq!(
            v.observe(&p, &beat(&p, Role::Validator, 4, "x", None), NOW),
            Heard::Stale
        );
        assert_eq!(v.advertising_run("r"), vec![p.clone()]);
        assert_eq!(v.advertising_snapshot("m"), vec![p.clone()]);
        assert!(v.advertising_run("x").is_empty());
        assert_eq!(v.snapshots(), vec!["m".to_string()]);
    }

    #[test]
    fn the_votes_kept_are_bounded() {
        let mut v = Vouches::default();
        let mut full = 0;
        for i in 0..(MAX_VOUCHERS + 3) {
            let key = p2p::identity::Keypair::generate_ed25519();
            let p = PeerIdStr::parse(&key.public().to_peer_id().to_base58()).unwrap();
            let heard = v.observe(
                &p,
                &beat(&p, Role::Validator, 1, "r", Some(&format!("m{}", i % 20))),
                NOW,
            );
            if heard == Heard::Full {
                full += 1;
            }
        }
        assert_eq!(v.heard(), MAX_VOUCHERS);
        assert_eq!(full, 3);
        assert_eq!(v.snapshots().len(), MAX_SNAPSHOTS);
    }

    #[test]
    fn on_the_chain_unbound_validators_count_in_the_total_but_never_vote() {
        use bootstrap::chain::{decode_neurons_lite, encode_neurons_lite, NeuronSpec};
        // Three permitted validators (300, 200, 400 TAO); only the first two are bound to peers.
        let spec = |uid: u16, tao: u64| NeuronSpec {
            uid,
            netuid: 9,
            hotkey: [uid as u8 + 1; 32],
            coldkey: [uid as u8 + 101; 32],
            active: true,
            stake: tao * RAO_PER_TAO,
            validator_permit: true,
            last_update: 0,
        };
        let neurons = decode_neurons_lite(&encode_neurons_lite(
            &[spec(0, 300), spec(1, 200), spec(2, 400)],
            false,
        ))
        .unwrap()
        .neurons;
        let peers = [peer(1), peer(2)];
        let bound = Metagraph::from_chain(9, 1, &neurons, |hotkey| {
            neurons
                .iter()
                .position(|n| &n.hotkey == hotkey)
                .and_then(|i| peers.get(i).cloned())
        })
        .unwrap();
        let electorate = Electorate::of_chain(&bound, &neurons);
        assert_eq!(electorate.total, 900 * u128::from(RAO_PER_TAO));
        assert_eq!(electorate.voters.len(), 2);
        let mut v = Vouches::default();
        v.observe(
            &peer(1),
            &beat(&peer(1), Role::Validator, 1, "good", None),
            NOW,
        );
        // 300 of 900 is no majority, whoever else is silent.
        assert!(matches!(
            decide(&v, &electorate, None),
            Decision::Wait(Some(_))
        ));
        v.observe(
            &peer(2),
            &beat(&peer(2), Role::Validator, 1, "good", None),
            NOW,
        );
        assert!(
            matches!(decide(&v, &electorate, None), Decision::Adopt(b) if b.stake == 500 * u128::from(RAO_PER_TAO))
        );
    }

    #[test]
    fn a_node_serves_its_files_by_hash_and_nothing_else() {
        let run = RunConfig::default();
        let m = snapshot(&[(1, 100, true)]);
        let files = JoinFiles::new(&run, Some(&m)).unwrap();
        let ask =
            |req: &JoinRequest| files.answer(&messages::encode(Service::Join, req, &[]).unwrap());
        let reply = ask(&JoinRequest::Summary);
        let (summary, _) = messages::decode::<JoinReply>(Service::Join, &reply).unwrap();
        assert_eq!(
            summary,
            JoinReply::Summary {
                run_name: run.run_name.clone(),
                run_hash: run.hash().to_hex(),
                metagraph_hash: Some(hex::encode(m.hash())),
            }
        );
        let reply = ask(&JoinRequest::Run {
            hash: run.hash().to_hex(),
        });
        let (header, toml) = messages::decode::<JoinReply>(Service::Join, &reply).unwrap();
        assert_eq!(header, JoinReply::Bytes);
        let back = RunConfig::from_toml_str(std::str::from_utf8(toml).unwrap()).unwrap();
        assert_eq!(back.hash(), run.hash());
        let reply = ask(&JoinRequest::Metagraph {
            hash: hex::encode(m.hash()),
        });
        let (_, json) = messages::decode::<JoinReply>(Service::Join, &reply).unwrap();
        assert_eq!(Metagraph::from_json_slice(json).unwrap().hash(), m.hash());
        for req in [
            JoinRequest::Run {
                hash: "0".repeat(64),
            },
            JoinRequest::Metagraph {
                hash: run.hash().to_hex(),
            },
        ] {
            let reply = ask(&req);
            assert_eq!(
                messages::decode::<JoinReply>(Service::Join, &reply)
                    .unwrap()
                    .0,
                JoinReply::Missing
            );
        }
        assert_eq!(
            files.answer(&[rpc::JOIN, 0, 0]),
            rpc::error_response(rpc::ErrorCode::Malformed)
        );
        // A node without a snapshot has none to give.
        let bare = JoinFiles::new(&run, None).unwrap();
        let reply = bare.answer(
            &messages::encode(
                Service::Join,
                &JoinRequest::Metagraph {
                    hash: hex::encode(m.hash()),
                },
                &[],
            )
            .unwrap(),
        );
        assert_eq!(
            messages::decode::<JoinReply>(Service::Join, &reply)
                .unwrap()
                .0,
            JoinReply::Missing
        );
    }

    #[test]
    fn equal_snapshots_hash_alike_and_a_changed_stake_does_not() {
        let a = snapshot(&[(1, 100, true), (2, 50, true)]);
        let b = Metagraph::from_json_str(&a.to_json()).unwrap();
        assert_eq!(a.hash(), b.hash());
        let c = snapshot(&[(1, 100, true), (2, 51, true)]);
        assert_ne!(a.hash(), c.hash());
    }
}
