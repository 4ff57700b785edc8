//! Builders shared by the unit tests.

use crate::metagraph::{Hotkey, LocalNeuron, Metagraph};
use crate::peer_id::PeerIdStr;

/// The `n`th test peer: an Ed25519 peer id whose key is blake3 of `n`.
pub(crate) fn peer(n: u64) -> PeerIdStr {
    PeerIdStr::from_ed25519_public_key(blake3::hash(&n.to_le_bytes()).as_bytes())
}

/// The `n`th test hotkey.
pub(crate) fn hotkey(n: u64) -> Hotkey {
    Hotkey::local_stand_in(&n.to_le_bytes())
}

/// A local-run metagraph of `(peer number, stake in rao, validator permit)`.
pub(crate) fn metagraph(entries: &[(u64, u64, bool)]) -> Metagraph {
    Metagraph::for_local_run(entries.iter().map(|&(n, stake, permit)| LocalNeuron {
        peer_id: peer(n),
        stake,
        validator_permit: permit,
    }))
    .expect("test peers are distinct")
}
