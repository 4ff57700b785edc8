//! Stake from the chain, bound to peers: the metagraph in force when `--subtensor` is given.
//!
//! Two inputs, one output. The chain's neurons come in from the chain reader (a good read
//! replaces the last; a failed one never reaches here, so the last good read stays). Hotkey
//! bindings come in with heartbeats; each is verified (both signatures, the sender, the
//! subnet, the time) before it enters the [`BindingBook`], and a peer's binding is verified
//! again only when it changes. The metagraph is the chain's neurons whose hotkeys have a
//! verified binding, each under its bound peer id: a neuron whose hotkey nobody has proved
//! has no peer, so its stake elects nobody and it is no registered miner. It is rebuilt
//! whenever either input changes or a binding expires.
//!
//! The book is bounded by the subnet: a binding is kept only while its hotkey is one of the
//! neurons of the read in force (none before the first read: heartbeats carry bindings again
//! every few seconds), a read that no longer holds a hotkey drops its binding, and the book
//! never holds more than [`p2p::MAX_BOOK_BINDINGS`] hotkeys (full, it turns newcomers away).
//! Every insert costs `O(log n)`. This node's own binding is kept aside and taken again at
//! every read, so that one given before the first read counts.

use std::collections::{HashMap, HashSet};

use bootstrap::{Hotkey, Metagraph};
use p2p::{BindingBook, BindingError, BookUpdate, HotkeyBinding, PeerId};

use crate::rules::Reason;
use crate::services::consensus::api::{ChainStake, HeartbeatRejected};

/// The chain's side of the orchestration state.
#[derive(Debug)]
pub(crate) struct ChainBook {
    netuid: u16,
    stake: Option<ChainStake>,
    /// The hotkeys of the read in force.
    registered: HashSet<Hotkey>,
    book: BindingBook,
    /// The binding verified for each peer in the book, to skip verifying the same one again
    /// (only peers in the book: it is no larger).
    verified: HashMap<PeerId, HotkeyBinding>,
    /// This node's own binding (its peer and the binding), taken again at every read.
    own: Option<(PeerId, HotkeyBinding)>,
    /// Grows by one whenever the book changes.
    generation: u64,
}

/// Whether the metagraph must be rebuilt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Changed {
    /// It must.
    Yes,
    /// Nothing that counts changed.
    No,
}

impl ChainBook {
    /// Stake of subnet `netuid`, none read yet, nobody bound.
    pub(crate) fn new(netuid: u16) -> Self {
        Self {
            netuid,
            stake: None,
            registered: HashSet::new(),
            book: BindingBook::new(),
            verified: HashMap::new(),
            own: None,
            generation: 0,
        }
    }

    /// How many times the bindings changed.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    /// Takes a good read of the chain at `now_secs` (Unix seconds): bindings of hotkeys it
    /// no longer holds are dropped, and this node's own binding is taken again.
    pub(crate) fn on_stake(&mut self, stake: ChainStake, now_secs: u64) -> Changed {
        if stake.netuid != self.netuid {
            tracing::warn!(
                netuid = stake.netuid,
                ours = self.netuid,
                "stake of another subnet ignored"
            );
            return Changed::No;
        }
        if self.stake.as_ref() == Some(&stake) {
            return Changed::No;
        }
        self.registered = stake.neurons.iter().map(|n| n.hotkey.clone()).collect();
        self.stake = Some(stake);
        let registered = &self.registered;
        let dropped = self.book.retain(|hotkey| registered.contains(hotkey));
        for (hotkey, peer) in &dropped {
            tracing::info!(%hotkey, %peer, "hotkey left the subnet; its binding is dropped");
            self.verified.remove(peer);
        }
        if !dropped.is_empty() {
            self.generation += 1;
        }
        if let Some((me, binding)) = self.own.clone() {
            if let Err(rejected) = self.on_binding(&me, &binding, now_secs) {
                tracing::error!(
                    reason = rejected.label(),
                    "this node's own hotkey binding does not verify"
                );
            }
        }
        Changed::Yes
    }

    /// Checks and takes this node's own binding (`me` is this node), keeping it aside to be
    /// taken again at every read of the chain.
    pub(crate) fn on_own_binding(
        &mut self,
        me: &PeerId,
        binding: &HotkeyBinding,
        now_secs: u64,
    ) -> Result<Changed, HeartbeatRejected> {
        self.own = Some((*me, binding.clone()));
        self.on_binding(me, binding, now_secs)
    }

    /// Checks and takes the binding `sender` carried at `now_secs` (Unix seconds). A binding
    /// that verifies but whose hotkey the subnet does not hold is not kept (`Changed::No`).
    pub(crate) fn on_binding(
        &mut self,
        sender: &PeerId,
        binding: &HotkeyBinding,
        now_secs: u64,
    ) -> Result<Changed, HeartbeatRejected> {
        if self.verified.get(sender) == Some(binding) && binding.expires_at > now_secs {
            return Ok(Changed::No);
        }
        let verified = binding
            .verify(sender, self.netuid, now_secs)
            .map_err(rejection)?;
        let hotkey = verified.hotkey().clone();
        if !self.registered.contains(&hotkey) {
            tracing::debug!(peer = %sender, %hotkey, "hotkey not on the subnet; binding not kept");
            return Ok(Changed::No);
        }
        match self.book.insert(verified, now_secs) {
            BookUpdate::Accepted {
                replaced_peer,
                evicted_hotkey,
            } => {
                tracing::info!(
                    peer = %sender,
                    %hotkey,
                    expires_at = binding.expires_at,
                    replaced_peer = ?replaced_peer,
                    evicted_hotkey = ?evicted_hotkey,
                    "hotkey binding verified"
                );
                if let Some(old) = replaced_peer {
                    self.verified.remove(&old);
                }
                self.verified.insert(*sender, binding.clone());
                self.generation += 1;
                Ok(Changed::Yes)
            }
            BookUpdate::NotNewer => {
                // The same binding again, or an older one: remembered only for the peer the
                // book holds for the hotkey (a binding turned away is looked at again when it
                // comes back: the one in the book may have lapsed by then).
                if self.book.peer_of(&hotkey) == Some(sender) {
                    self.verified.insert(*sender, binding.clone());
                }
                Ok(Changed::No)
            }
            BookUpdate::PeerTaken { holder } => {
                tracing::warn!(peer = %sender, %hotkey, %holder, "peer already speaks for another hotkey; binding not taken");
                Ok(Changed::No)
            }
            BookUpdate::Full => {
                tracing::warn!(peer = %sender, %hotkey, capacity = self.book.capacity(), "binding book full; binding not taken");
                Ok(Changed::No)
            }
            BookUpdate::Expired => Err(HeartbeatRejected::StaleBinding),
        }
    }

    /// Drops bindings expired at `now_secs`.
    pub(crate) fn expire(&mut self, now_secs: u64) -> Changed {
        let gone = self.book.expire(now_secs);
        if gone.is_empty() {
            return Changed::No;
        }
        for (hotkey, peer) in &gone {
            tracing::info!(%hotkey, "hotkey binding expired; its stake no longer counts");
            self.verified.remove(peer);
        }
        self.generation += 1;
        Changed::Yes
    }

    /// Hotkeys of the snapshot in force with a verified binding.
    pub(crate) fn bound_hotkeys(&self) -> usize {
        self.stake.as_ref().map_or(0, |s| {
            s.neurons
                .iter()
                .filter(|n| self.book.peer_of(&n.hotkey).is_some())
                .count()
        })
    }

    /// Every verified binding: hotkey (SS58) → peer id.
    pub(crate) fn bindings(&self) -> std::collections::BTreeMap<String, String> {
        self.book
            .iter()
            .map(|(hotkey, peer, _)| (hotkey.to_string(), peer.to_base58()))
            .collect()
    }

    /// The metagraph: the chain's neurons under their bound peers (`None` before any read).
    pub(crate) fn metagraph(&self) -> Option<Metagraph> {
        let stake = self.stake.as_ref()?;
        let built = Metagraph::from_chain(stake.netuid, stake.block, &stake.neurons, |hotkey| {
            self.book
                .peer_of(hotkey)
                .and_then(crate::wire::peer::try_of)
        });
        match built {
            Ok(metagraph) => Some(metagraph),
            Err(error) => {
                tracing::warn!(%error, block = stake.block, "chain stake not usable");
                None
            }
        }
    }
}

/// Why a hotkey binding does not verify; [`Reason::label`] is its metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BindingRejected {
    /// Not of the binding's shape.
    Malformed,
    /// For another subnet.
    WrongNetuid,
    /// Signed for another peer (replayed by this one).
    NotSender,
    /// The hotkey's signature is missing or does not verify.
    BadHotkeySignature,
    /// The peer's signature does not verify.
    BadPeerSignature,
    /// Refused for a reason this build does not name.
    Invalid,
}

impl Reason for BindingRejected {
    fn label(&self) -> &'static str {
        match self {
            BindingRejected::Malformed => "binding_malformed",
            BindingRejected::WrongNetuid => "binding_wrong_netuid",
            BindingRejected::NotSender => "binding_not_sender",
            BindingRejected::BadHotkeySignature => "binding_bad_hotkey_signature",
            BindingRejected::BadPeerSignature => "binding_bad_peer_signature",
            BindingRejected::Invalid => "binding_invalid",
        }
    }
}

/// The heartbeat verdict for a binding that does not verify.
fn rejection(error: BindingError) -> HeartbeatRejected {
    let bad = match error {
        BindingError::Time(_) => return HeartbeatRejected::StaleBinding,
        BindingError::Malformed { .. } => BindingRejected::Malformed,
        BindingError::WrongNetuid { .. } => BindingRejected::WrongNetuid,
        BindingError::NotSender { .. } => BindingRejected::NotSender,
        BindingError::MissingHotkeySignature | BindingError::BadHotkeySignature => {
            BindingRejected::BadHotkeySignature
        }
        BindingError::PeerKey(_) | BindingError::BadPeerSignature => {
            BindingRejected::BadPeerSignature
        }
        _ => BindingRejected::Invalid,
    };
    HeartbeatRejected::BadBinding(bad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bootstrap::chain::{decode_neurons_lite, encode_neurons_lite, NeuronSpec};
    use bootstrap::identity::HotkeyPair;
    use p2p::identity::Keypair;

    const NETUID: u16 = 9;
    const NOW: u64 = 1_800_000_000;

    fn hotkey(i: u8) -> HotkeyPair {
        HotkeyPair::from_seed(&[i; 32])
    }

    fn peer(i: u8) -> Keypair {
        Keypair::ed25519_from_bytes([i; 32]).unwrap()
    }

    /// Chain stake: hotkey 1 a validator with 100 TAO (uid 0), hotkey 2 a miner (uid 1).
    fn stake() -> ChainStake {
        let spec = |uid: u16, key: &HotkeyPair, stake: u64, permit: bool| NeuronSpec {
            uid,
            netuid: NETUID,
            hotkey: key.public_key(),
            coldkey: [0; 32],
            active: true,
            stake,
            validator_permit: permit,
            last_update: 0,
        };
        let bytes = encode_neurons_lite(
            &[
                spec(0, &hotkey(1), 100 * bootstrap::RAO_PER_TAO, true),
                spec(1, &hotkey(2), 0, false),
            ],
            false,
        );
        ChainStake {
            netuid: NETUID,
            block: 42,
            block_hash: "0x00".into(),
            neurons: decode_neurons_lite(&bytes).unwrap().neurons,
            wrapped: false,
        }
    }

    fn bind(key: &HotkeyPair, peer: &Keypair, expires_at: u64) -> HotkeyBinding {
        HotkeyBinding::sign(key, peer, NETUID, expires_at).unwrap()
    }

    fn id(peer: &Keypair) -> PeerId {
        peer.public().to_peer_id()
    }

    #[test]
    fn only_hotkeys_with_a_verified_binding_get_a_peer_and_their_stake() {
        let mut book = ChainBook::new(NETUID);
        assert!(book.metagraph().is_none(), "nothing before the first read");
        assert_eq!(book.on_stake(stake(), NOW), Changed::Yes);
        assert_eq!(
            book.on_stake(stake(), NOW),
            Changed::No,
            "the same read again"
        );
        assert!(
            book.metagraph().unwrap().is_empty(),
            "nobody proved a hotkey yet"
        );

        let (validator, miner) = (peer(10), peer(11));
        let good = bind(&hotkey(1), &validator, NOW + 3600);
        assert_eq!(
            book.on_binding(&id(&validator), &good, NOW),
            Ok(Changed::Yes)
        );
        assert_eq!(
            book.on_binding(&id(&validator), &good, NOW + 1),
            Ok(Changed::No),
            "the same binding is not taken twice"
        );
        let m = book.metagraph().unwrap();
        assert_eq!(m.len(), 1);
        let n = m
            .by_peer_id(&bootstrap::PeerIdStr::parse(&id(&validator).to_base58()).unwrap())
            .unwrap();
        assert_eq!(
            (n.uid, n.stake, n.validator_permit),
            (0, 100 * bootstrap::RAO_PER_TAO, true)
        );

        // Replayed by another peer, forged by a key that is not the hotkey, for another
        // subnet, or expired: refused, and nothing changes.
        let thief = peer(12);
        assert_eq!(
            book.on_binding(&id(&thief), &good, NOW),
            Err(HeartbeatRejected::BadBinding(BindingRejected::NotSender))
        );
        let mut forged = bind(&hotkey(3), &thief, NOW + 3600);
        forged.hotkey = hotkey(2).hotkey().to_string();
        assert_eq!(
            book.on_binding(&id(&thief), &forged, NOW),
            Err(HeartbeatRejected::BadBinding(
                BindingRejected::BadHotkeySignature
            ))
        );
        let other_subnet = HotkeyBinding::sign(&hotkey(2), &thief, NETUID + 1, NOW + 3600).unwrap();
        assert_eq!(
            book.on_binding(&id(&thief), &other_subnet, NOW),
            Err(HeartbeatRejected::BadBinding(BindingRejected::WrongNetuid))
        );
        let expired = bind(&hotkey(2), &miner, NOW - 1);
        assert_eq!(
            book.on_binding(&id(&miner), &expired, NOW),
            Err(HeartbeatRejected::StaleBinding)
        );
        assert_eq!(book.metagraph().unwrap().len(), 1);

        // A hotkey the subnet does not hold is not kept.
        let stranger = peer(13);
        let unregistered = bind(&hotkey(4), &stranger, NOW + 3600);
        assert_eq!(
            book.on_binding(&id(&stranger), &unregistered, NOW),
            Ok(Changed::No)
        );
        assert_eq!(book.metagraph().unwrap().len(), 1);
        assert_eq!(book.bound_hotkeys(), 1);

        // The miner binds; later the validator's binding lapses and its stake goes with it.
        let miner_binding = bind(&hotkey(2), &miner, NOW + 7200);
        assert_eq!(
            book.on_binding(&id(&miner), &miner_binding, NOW),
            Ok(Changed::Yes)
        );
        assert_eq!(book.metagraph().unwrap().len(), 2);
        assert_eq!(book.expire(NOW + 3600), Changed::Yes);
        let m = book.metagraph().unwrap();
        assert_eq!(m.len(), 1);
        assert_eq!(m.neurons()[0].uid, 1);
        assert_eq!(book.bindings().len(), 1, "only the miner's binding is left");
    }

    #[test]
    fn bindings_are_kept_only_for_hotkeys_on_the_subnet() {
        let mut book = ChainBook::new(NETUID);
        let (validator, miner, stranger) = (peer(10), peer(11), peer(13));
        let validator_binding = bind(&hotkey(1), &validator, NOW + 3600);
        // Before the chain is read nobody is known to be registered: nothing is kept (every
        // heartbeat carries the binding again).
        assert_eq!(
            book.on_binding(&id(&validator), &validator_binding, NOW),
            Ok(Changed::No)
        );
        assert!(book.bindings().is_empty());
        book.on_stake(stake(), NOW);
        assert_eq!(
            book.on_binding(&id(&validator), &validator_binding, NOW),
            Ok(Changed::Yes)
        );
        // Hotkeys the subnet does not hold leave nothing behind, however many.
        for i in 20..60 {
            let binding = bind(&hotkey(i), &stranger, NOW + 3600);
            assert_eq!(
                book.on_binding(&id(&stranger), &binding, NOW),
                Ok(Changed::No)
            );
        }
        assert_eq!(book.bindings().len(), 1);
        // The miner binds, then its hotkey leaves the subnet: its binding goes at the next
        // read, and comes back when the hotkey is registered again.
        let miner_binding = bind(&hotkey(2), &miner, NOW + 3600);
        assert_eq!(
            book.on_binding(&id(&miner), &miner_binding, NOW),
            Ok(Changed::Yes)
        );
        assert_eq!(book.bindings().len(), 2);
        let mut without_miner = stake();
        without_miner
            .neurons
            .retain(|n| n.hotkey != hotkey(2).hotkey());
        without_miner.block += 1;
        assert_eq!(book.on_stake(without_miner, NOW), Changed::Yes);
        assert_eq!(
            book.bindings().len(),
            1,
            "the deregistered hotkey's binding is gone"
        );
        assert_eq!(book.metagraph().unwrap().len(), 1);
        let mut again = stake();
        again.block += 2;
        book.on_stake(again, NOW);
        assert_eq!(
            book.on_binding(&id(&miner), &miner_binding, NOW + 1),
            Ok(Changed::Yes),
            "taken again, not skipped as already verified"
        );
        assert_eq!(book.metagraph().unwrap().len(), 2);
    }

    #[test]
    fn this_nodes_own_binding_given_before_the_first_read_counts_at_it() {
        let mut book = ChainBook::new(NETUID);
        let me = peer(10);
        let own = bind(&hotkey(1), &me, NOW + 3600);
        assert_eq!(book.on_own_binding(&id(&me), &own, NOW), Ok(Changed::No));
        assert_eq!(book.on_stake(stake(), NOW), Changed::Yes);
        assert_eq!(book.bindings().len(), 1);
        assert_eq!(book.metagraph().unwrap().len(), 1);
    }

    #[test]
    fn stake_of_another_subnet_is_ignored() {
        let mut book = ChainBook::new(NETUID + 1);
        assert_eq!(book.on_stake(stake(), NOW), Changed::No);
        assert!(book.metagraph().is_none());
    }
}
