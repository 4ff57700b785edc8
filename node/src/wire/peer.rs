//! The node's one peer identity, and its two crossings to libp2p.
//!
//! Inside the node a peer is a [`PeerIdStr`]: the validated base58 text that plans, the
//! metagraph and the chain bindings already use. It orders as its text and serialises as its
//! text, so maps keyed by it order and serialise exactly as `String`-keyed maps did, and the
//! JSON the node writes does not change. libp2p's [`p2p::PeerId`] appears only where the p2p
//! client needs one (sending a request, the router's raw events); these two functions are
//! the crossings.
//!
//! Guarantee: `to_libp2p(&of(id)) == Some(id)` for every libp2p id, and the text of
//! `of(id)` is exactly `id.to_string()`.

use bootstrap::PeerIdStr;

/// The node's form of a libp2p peer id.
///
/// Every id libp2p derives from a public key (the only ones a connection, a signed gossip
/// message or the node's own key can carry) is an identity multihash of an Ed25519 or
/// Secp256k1 key, or the sha2-256 of a larger key; both are shapes [`PeerIdStr`] accepts.
pub(crate) fn of(id: &p2p::PeerId) -> PeerIdStr {
    PeerIdStr::from_bytes(&id.to_bytes())
        .expect("libp2p derives every peer id from a public key, a shape PeerIdStr accepts")
}

/// The node's form of a libp2p peer id that arrived from the network: `None` for a shape
/// [`PeerIdStr`] refuses (which [`of`] would not expect), so a router can refuse it.
pub(crate) fn try_of(id: &p2p::PeerId) -> Option<PeerIdStr> {
    PeerIdStr::from_bytes(&id.to_bytes()).ok()
}

/// The libp2p form of a peer, to send it a request; `None` only if libp2p refuses bytes that
/// [`PeerIdStr`] accepted (the two checks disagree), which the caller treats as unreachable.
pub(crate) fn to_libp2p(peer: &PeerIdStr) -> Option<p2p::PeerId> {
    p2p::PeerId::from_bytes(&peer.to_bytes()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_libp2p_id_crosses_both_ways_unchanged() {
        for _ in 0..8 {
            let id = p2p::identity::Keypair::generate_ed25519()
                .public()
                .to_peer_id();
            let ours = of(&id);
            assert_eq!(ours.as_str(), id.to_string());
            assert_eq!(to_libp2p(&ours), Some(id));
        }
    }

    #[test]
    fn a_keys_id_is_the_one_bootstrap_derives() {
        let keypair = p2p::identity::Keypair::generate_ed25519();
        let public = keypair
            .public()
            .try_into_ed25519()
            .expect("an ed25519 keypair has an ed25519 public key")
            .to_bytes();
        assert_eq!(
            of(&keypair.public().to_peer_id()),
            PeerIdStr::from_ed25519_public_key(&public)
        );
    }

    #[test]
    fn text_parsed_from_libp2p_output_is_the_same_peer() {
        let id = p2p::identity::Keypair::generate_ed25519()
            .public()
            .to_peer_id();
        assert_eq!(PeerIdStr::parse(&id.to_string()), Ok(of(&id)));
    }
}
