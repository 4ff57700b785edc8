//! The metagraph snapshot: who holds stake in the subnet and which peer id speaks for them.
//!
//! Every node of a run loads the same snapshot, so stake is common knowledge and election is a
//! pure function of it. The file is JSON:
//!
//! ```json
//! {"netuid": 9, "block": 4200000, "neurons": [
//!   {"uid": 0, "hotkey": "5Grw…", "peer_id": "12D3KooW…", "stake": 1000000000000,
//!    "validator_permit": true}
//! ]}
//! ```
//!
//! Stake is in rao ([`RAO_PER_TAO`] rao = 1 TAO). Every listed field is required; other fields
//! (coldkey, trust, …) are ignored, so richer exports load unchanged.
//!
//! Guarantees of a [`Metagraph`]: uids, peer ids and hotkeys are unique; every peer id and
//! hotkey is well-formed; neurons are held in uid order, whatever order the file used.

mod hotkey;
mod parse;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

pub use hotkey::{Hotkey, HotkeyError};

use crate::peer_id::{PeerIdError, PeerIdStr};

/// Rao in one TAO.
pub const RAO_PER_TAO: u64 = 1_000_000_000;
/// Largest metagraph file read, in bytes: a 4096-neuron snapshot is about 1 MiB.
pub const MAX_METAGRAPH_BYTES: usize = 16 << 20;
/// Subnet id written by [`Metagraph::for_local_run`].
pub const LOCAL_NETUID: u16 = 0;

/// One registered neuron of the subnet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Neuron {
    /// Position in the subnet, unique.
    pub uid: u16,
    /// The neuron's hotkey (SS58).
    pub hotkey: Hotkey,
    /// The libp2p peer id the hotkey is bound to.
    pub peer_id: PeerIdStr,
    /// Stake behind the hotkey, in rao.
    pub stake: u64,
    /// Whether the chain lets this neuron set weights (act as a validator).
    pub validator_permit: bool,
}

/// A neuron of a local run, before it gets a uid and a stand-in hotkey.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalNeuron {
    /// The node's libp2p peer id.
    pub peer_id: PeerIdStr,
    /// Stake in rao.
    pub stake: u64,
    /// Whether the node may be a validator.
    pub validator_permit: bool,
}

/// A validated snapshot of the subnet's neurons.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Metagraph {
    netuid: u16,
    block: u64,
    /// Sorted by uid.
    neurons: Vec<Neuron>,
    #[serde(skip)]
    by_peer: BTreeMap<PeerIdStr, usize>,
}

/// Why a metagraph could not be loaded or built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetagraphError {
    /// The file is larger than [`MAX_METAGRAPH_BYTES`]; it was not parsed.
    #[error("metagraph is {len} bytes; at most {max} are accepted")]
    TooLarge {
        /// Size of the input.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The file is not JSON.
    #[error("metagraph is not valid JSON: {0}")]
    Json(#[source] serde_json::Error),
    /// The file is JSON but not an object.
    #[error("metagraph is not a JSON object")]
    NotAnObject,
    /// A top-level field (`netuid`, `block`, `neurons`) is missing or malformed.
    #[error("metagraph field `{field}`: {problem}")]
    Field {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        problem: FieldProblem,
    },
    /// A field of one neuron is missing or malformed.
    #[error("neuron #{index} ({}): field `{field}`: {problem}", UidLabel(*uid))]
    Neuron {
        /// Position of the entry in the `neurons` array.
        index: usize,
        /// The entry's uid, when it could be read.
        uid: Option<u16>,
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        problem: FieldProblem,
    },
    /// An entry of `neurons` is not a JSON object.
    #[error("neuron #{index}: not a JSON object")]
    NeuronNotAnObject {
        /// Position of the entry in the `neurons` array.
        index: usize,
    },
    /// Two entries share a uid.
    #[error("neuron #{index} (uid {uid}): field `uid`: already used by neuron #{first_index}")]
    DuplicateUid {
        /// Position of the later entry.
        index: usize,
        /// The shared uid.
        uid: u16,
        /// Position of the earlier entry.
        first_index: usize,
    },
    /// Two entries share a peer id.
    #[error("neuron #{index} (uid {uid}): field `peer_id`: {peer_id} already belongs to uid {first_uid}")]
    DuplicatePeerId {
        /// Position of the later entry.
        index: usize,
        /// The later entry's uid.
        uid: u16,
        /// The shared peer id.
        peer_id: PeerIdStr,
        /// The earlier entry's uid.
        first_uid: u16,
    },
    /// Two entries share a hotkey.
    #[error(
        "neuron #{index} (uid {uid}): field `hotkey`: {hotkey} already belongs to uid {first_uid}"
    )]
    DuplicateHotkey {
        /// Position of the later entry.
        index: usize,
        /// The later entry's uid.
        uid: u16,
        /// The shared hotkey.
        hotkey: Hotkey,
        /// The earlier entry's uid.
        first_uid: u16,
    },
    /// A neuron of a chain answer says it belongs to another subnet than the one asked for.
    #[error("uid {uid} is a neuron of netuid {netuid}, not of netuid {expected}")]
    WrongNetuid {
        /// The neuron's uid.
        uid: u16,
        /// The subnet the neuron names.
        netuid: u16,
        /// The subnet asked for.
        expected: u16,
    },
    /// A local run with more neurons than uids exist.
    #[error("a local run has {count} neurons; uids stop at {}", u16::MAX)]
    TooManyNeurons {
        /// Number of neurons given.
        count: usize,
    },
}

/// What is wrong with one field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FieldProblem {
    /// The field is absent (or `null`).
    #[error("missing")]
    Missing,
    /// The field has the wrong JSON type.
    #[error("expected {expected}")]
    WrongType {
        /// The type wanted.
        expected: &'static str,
    },
    /// A number that does not fit the field's type.
    #[error("{value} is out of range for {expected}")]
    OutOfRange {
        /// The type wanted.
        expected: &'static str,
        /// The number as written.
        value: String,
    },
    /// The peer id does not parse.
    #[error(transparent)]
    PeerId(#[from] PeerIdError),
    /// The hotkey does not parse.
    #[error(transparent)]
    Hotkey(#[from] HotkeyError),
}

/// Shows an optional uid in error messages.
struct UidLabel(Option<u16>);

impl fmt::Display for UidLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(uid) => write!(f, "uid {uid}"),
            None => f.write_str("uid unknown"),
        }
    }
}

impl Metagraph {
    /// The snapshot of `netuid` at `block` from the chain's neurons, as far as this node can
    /// bind them to peers: a neuron counts only when `peer_of` knows the peer id that proved
    /// (by a verified binding) to speak for its hotkey. Stake is the chain's stake list (the
    /// subnet's alpha on dynamic-TAO runtimes, see [`crate::chain`]); the validator permit is
    /// the chain's. Fails on a neuron of another subnet and on the duplicates [`Self::new`]
    /// refuses.
    pub fn from_chain(
        netuid: u16,
        block: u64,
        neurons: &[crate::chain::ChainNeuron],
        mut peer_of: impl FnMut(&Hotkey) -> Option<PeerIdStr>,
    ) -> Result<Self, MetagraphError> {
        let mut bound = Vec::new();
        for n in neurons {
            if n.netuid != netuid {
                return Err(MetagraphError::WrongNetuid {
                    uid: n.uid,
                    netuid: n.netuid,
                    expected: netuid,
                });
            }
            if let Some(peer_id) = peer_of(&n.hotkey) {
                bound.push(Neuron {
                    uid: n.uid,
                    hotkey: n.hotkey.clone(),
                    peer_id,
                    stake: n.stake,
                    validator_permit: n.validator_permit,
                });
            }
        }
        Self::new(netuid, block, bound)
    }

    /// Checks `neurons` for duplicates and builds the snapshot. Errors name entries by their
    /// position in `neurons`.
    pub fn new(netuid: u16, block: u64, neurons: Vec<Neuron>) -> Result<Self, MetagraphError> {
        let mut first_of_uid = BTreeMap::new();
        let mut first_of_peer = BTreeMap::new();
        let mut first_of_hotkey = BTreeMap::new();
        for (index, n) in neurons.iter().enumerate() {
            if let Some(&first_index) = first_of_uid.get(&n.uid) {
                return Err(MetagraphError::DuplicateUid {
                    index,
                    uid: n.uid,
                    first_index,
                });
            }
            if let Some(&first_uid) = first_of_peer.get(&n.peer_id) {
                return Err(MetagraphError::DuplicatePeerId {
                    index,
                    uid: n.uid,
                    peer_id: n.peer_id.clone(),
                    first_uid,
                });
            }
            if let Some(&first_uid) = first_of_hotkey.get(&n.hotkey) {
                return Err(MetagraphError::DuplicateHotkey {
                    index,
                    uid: n.uid,
                    hotkey: n.hotkey.clone(),
                    first_uid,
                });
            }
            first_of_uid.insert(n.uid, index);
            first_of_peer.insert(&n.peer_id, n.uid);
            first_of_hotkey.insert(&n.hotkey, n.uid);
        }
        let mut neurons = neurons;
        neurons.sort_by_key(|n| n.uid);
        let by_peer = neurons
            .iter()
            .enumerate()
            .map(|(i, n)| (n.peer_id.clone(), i))
            .collect();
        Ok(Self {
            netuid,
            block,
            neurons,
            by_peer,
        })
    }

    /// Parses and validates a metagraph file's bytes.
    pub fn from_json_slice(bytes: &[u8]) -> Result<Self, MetagraphError> {
        parse::from_json_slice(bytes)
    }

    /// Parses and validates a metagraph file's text.
    pub fn from_json_str(text: &str) -> Result<Self, MetagraphError> {
        Self::from_json_slice(text.as_bytes())
    }

    /// A snapshot for a local run: netuid [`LOCAL_NETUID`], block 0, uids in the order given,
    /// and stand-in hotkeys derived from the peer ids (see [`Hotkey`]; no chain checks them).
    pub fn for_local_run(
        entries: impl IntoIterator<Item = LocalNeuron>,
    ) -> Result<Self, MetagraphError> {
        let entries: Vec<LocalNeuron> = entries.into_iter().collect();
        let count = entries.len();
        let neurons = entries
            .into_iter()
            .enumerate()
            .map(|(i, e)| {
                let uid = u16::try_from(i).map_err(|_| MetagraphError::TooManyNeurons { count })?;
                Ok(Neuron {
                    uid,
                    hotkey: Hotkey::local_stand_in(&e.peer_id.to_bytes()),
                    peer_id: e.peer_id,
                    stake: e.stake,
                    validator_permit: e.validator_permit,
                })
            })
            .collect::<Result<Vec<_>, MetagraphError>>()?;
        Self::new(LOCAL_NETUID, 0, neurons)
    }

    /// The snapshot as JSON, in the format [`Metagraph::from_json_str`] reads, neurons in uid
    /// order.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self)
            .expect("a metagraph holds only strings, integers and booleans")
    }

    /// blake3 of [`Metagraph::to_json`]: what heartbeats advertise and a joining node checks
    /// a fetched snapshot against (the JSON is canonical: the fields in one order, neurons in
    /// uid order, so equal snapshots hash alike).
    pub fn hash(&self) -> [u8; 32] {
        *blake3::hash(self.to_json().as_bytes()).as_bytes()
    }

    /// The subnet id.
    pub fn netuid(&self) -> u16 {
        self.netuid
    }

    /// The chain block the snapshot was taken at.
    pub fn block(&self) -> u64 {
        self.block
    }

    /// All neurons, in uid order.
    pub fn neurons(&self) -> &[Neuron] {
        &self.neurons
    }

    /// Number of neurons.
    pub fn len(&self) -> usize {
        self.neurons.len()
    }

    /// Whether the snapshot has no neurons.
    pub fn is_empty(&self) -> bool {
        self.neurons.is_empty()
    }

    /// The neuron bound to `peer_id`.
    pub fn by_peer_id(&self, peer_id: &PeerIdStr) -> Option<&Neuron> {
        self.by_peer.get(peer_id).map(|&i| &self.neurons[i])
    }

    /// The neuron with `uid`.
    pub fn by_uid(&self, uid: u16) -> Option<&Neuron> {
        self.neurons
            .binary_search_by_key(&uid, |n| n.uid)
            .ok()
            .map(|i| &self.neurons[i])
    }

    /// Neurons with a validator permit, in uid order.
    pub fn validators(&self) -> impl Iterator<Item = &Neuron> {
        self.neurons.iter().filter(|n| n.validator_permit)
    }
}
