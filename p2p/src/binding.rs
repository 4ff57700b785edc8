//! Hotkey bindings: a Bittensor hotkey and a libp2p peer agreeing that the peer speaks for the
//! hotkey on a subnet until a time, and a [`BindingBook`] of the ones verified so far.
//!
//! The hotkey signs the canonical bytes of a [`BindingClaim`] (layout in
//! `bootstrap::identity::binding`); the peer's libp2p key counter-signs
//! [`PEER_COUNTERSIGN_DOMAIN`](bootstrap::identity::PEER_COUNTERSIGN_DOMAIN) ++ those bytes ++ the hotkey's signature. [`HotkeyBinding`] is
//! the wire form, JSON with text fields (about 460 bytes for an Ed25519 peer, at most
//! [`MAX_BINDING_BYTES`]), made to ride inside a heartbeat. [`HotkeyBinding::verify`] turns
//! it into a [`VerifiedBinding`], the only way to get one.
//!
//! The peer's public key comes from its peer id when the id embeds it (identity multihash, as
//! for every Ed25519 key); otherwise the record must carry it (`peer_public_key`), and it must
//! hash to the peer id.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bootstrap::identity::{BindingClaim, BindingTimeError, HotkeyPair, SIGNATURE_LEN};
use bootstrap::{Hotkey, PeerIdStr};
use libp2p::identity::{Keypair, PublicKey, SigningError};
use libp2p::PeerId;
use serde::{Deserialize, Serialize};

/// Largest encoded [`HotkeyBinding`] accepted, in bytes.
pub const MAX_BINDING_BYTES: usize = 768;
/// Longest SS58 or peer-id text looked at.
const MAX_ID_TEXT: usize = 64;
/// Longest peer signature accepted, in bytes (Ed25519: 64; DER ECDSA: up to 72).
const MAX_PEER_SIGNATURE_BYTES: usize = 72;
/// Longest protobuf-encoded peer public key accepted, in bytes (P-256 ECDSA: 95).
const MAX_PEER_PUBLIC_KEY_BYTES: usize = 128;
/// Multihash code of the identity hash.
const IDENTITY_MULTIHASH: u64 = 0x00;
/// Most hotkeys a [`BindingBook`] holds unless told otherwise (a subnet has at most a few
/// thousand uids).
pub const MAX_BOOK_BINDINGS: usize = 4096;

/// A hotkey binding as it travels: every field text or a number.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HotkeyBinding {
    /// The subnet.
    pub netuid: u16,
    /// The hotkey, SS58.
    pub hotkey: String,
    /// The peer that speaks for it, base58.
    pub peer_id: String,
    /// When the binding lapses, seconds since the Unix epoch.
    pub expires_at: u64,
    /// The hotkey's sr25519 signature of the claim's canonical bytes, hex (64 bytes).
    pub hotkey_signature: String,
    /// The peer's libp2p signature of the counter-signed bytes, hex.
    pub peer_signature: String,
    /// The peer's protobuf-encoded libp2p public key, hex: only when the peer id does not
    /// embed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_public_key: Option<String>,
}

/// A binding whose signatures, peer, subnet and time were checked by
/// [`HotkeyBinding::verify`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VerifiedBinding {
    hotkey: Hotkey,
    peer: PeerId,
    netuid: u16,
    expires_at: u64,
}

impl VerifiedBinding {
    /// The hotkey.
    pub fn hotkey(&self) -> &Hotkey {
        &self.hotkey
    }

    /// The peer that speaks for it.
    pub fn peer(&self) -> &PeerId {
        &self.peer
    }

    /// The subnet.
    pub fn netuid(&self) -> u16 {
        self.netuid
    }

    /// When it lapses, seconds since the Unix epoch.
    pub fn expires_at(&self) -> u64 {
        self.expires_at
    }
}

/// Why a binding could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BindingSignError {
    /// The peer id is not one `bootstrap` accepts (it always is for a libp2p key's id).
    #[error("peer id cannot be bound: {0}")]
    PeerId(#[from] bootstrap::PeerIdError),
    /// The hotkey signature is not the claim's hotkey's.
    #[error("the hotkey signature is not the claim's hotkey's")]
    BadHotkeySignature,
    /// The libp2p key could not sign.
    #[error("the peer key cannot sign: {0}")]
    Signing(#[from] SigningError),
}

/// Why bytes are not a [`HotkeyBinding`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BindingDecodeError {
    /// More than [`MAX_BINDING_BYTES`] bytes: not parsed.
    #[error("binding is {len} bytes; at most {MAX_BINDING_BYTES} are accepted")]
    TooLarge {
        /// Length of the bytes.
        len: usize,
    },
    /// Not the JSON of a binding.
    #[error("binding is not valid JSON: {0}")]
    Json(String),
}

/// Why a binding was rejected by [`HotkeyBinding::verify`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BindingError {
    /// A field does not have the shape it must have.
    #[error("binding field {field} is {problem}")]
    Malformed {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// The binding is for another subnet.
    #[error("binding is for netuid {found}, this run is netuid {expected}")]
    WrongNetuid {
        /// The netuid expected.
        expected: u16,
        /// The netuid in the binding.
        found: u16,
    },
    /// The binding has expired or expires too far ahead.
    #[error(transparent)]
    Time(#[from] BindingTimeError),
    /// The binding names another peer than the one that sent it: a replay.
    #[error("binding is for peer {bound}, not for the peer that sent it")]
    NotSender {
        /// The peer the binding names.
        bound: PeerId,
    },
    /// The hotkey signature is missing.
    #[error("binding has no hotkey signature")]
    MissingHotkeySignature,
    /// The hotkey signature does not verify.
    #[error("binding's hotkey signature does not verify")]
    BadHotkeySignature,
    /// The peer's public key is neither in its id nor (matching the id) in the record.
    #[error("binding's peer public key is unavailable: {0}")]
    PeerKey(&'static str),
    /// The peer counter-signature does not verify.
    #[error("binding's peer signature does not verify")]
    BadPeerSignature,
}

impl HotkeyBinding {
    /// Makes a binding of `peer`'s key to `hotkey`'s on `netuid` until `expires_at`, signing
    /// with both keys.
    pub fn sign(
        hotkey: &HotkeyPair,
        peer: &Keypair,
        netuid: u16,
        expires_at: u64,
    ) -> Result<Self, BindingSignError> {
        let claim = BindingClaim {
            netuid,
            hotkey: hotkey.hotkey(),
            peer_id: PeerIdStr::from_bytes(&peer.public().to_peer_id().to_bytes())?,
            expires_at,
        };
        let hotkey_signature = hotkey.sign(&claim.canonical_bytes());
        Self::countersign(&claim, &hotkey_signature, peer)
    }

    /// Counter-signs a claim the hotkey signed elsewhere (the hotkey need not be on this
    /// machine). `peer` must be the claim's peer and `hotkey_signature` must verify.
    pub fn countersign(
        claim: &BindingClaim,
        hotkey_signature: &[u8; SIGNATURE_LEN],
        peer: &Keypair,
    ) -> Result<Self, BindingSignError> {
        if !claim.verify_hotkey_signature(hotkey_signature) {
            return Err(BindingSignError::BadHotkeySignature);
        }
        let peer_signature = peer.sign(&claim.peer_signed_bytes(hotkey_signature))?;
        let public = peer.public();
        let peer_id = public.to_peer_id();
        let peer_public_key = (peer_id.as_ref().code() != IDENTITY_MULTIHASH)
            .then(|| hex::encode(public.encode_protobuf()));
        Ok(Self {
            netuid: claim.netuid,
            hotkey: claim.hotkey.to_string(),
            peer_id: peer_id.to_base58(),
            expires_at: claim.expires_at,
            hotkey_signature: hex::encode(hotkey_signature),
            peer_signature: hex::encode(peer_signature),
            peer_public_key,
        })
    }

    /// Parses the JSON form, refusing more than [`MAX_BINDING_BYTES`] before parsing.
    pub fn from_json(bytes: &[u8]) -> Result<Self, BindingDecodeError> {
        if bytes.len() > MAX_BINDING_BYTES {
            return Err(BindingDecodeError::TooLarge { len: bytes.len() });
        }
        serde_json::from_slice(bytes).map_err(|e| BindingDecodeError::Json(e.to_string()))
    }

    /// The JSON form.
    pub fn to_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(self)
    }

    /// Checks the binding as received from `sender`, for subnet `netuid`, at `now_unix_secs`.
    ///
    /// Rejects, cheapest check first: fields of the wrong shape, another netuid, an expired
    /// binding or one expiring more than 30 days ahead
    /// ([`bootstrap::identity::MAX_BINDING_LIFETIME_SECS`]), a binding naming another peer
    /// than `sender` (replayed), a missing or bad hotkey signature, a peer key that cannot
    /// be found, and a bad peer counter-signature.
    pub fn verify(
        &self,
        sender: &PeerId,
        netuid: u16,
        now_unix_secs: u64,
    ) -> Result<VerifiedBinding, BindingError> {
        // Shapes first, before decoding anything.
        check_len("hotkey", &self.hotkey, MAX_ID_TEXT)?;
        check_len("peer_id", &self.peer_id, MAX_ID_TEXT)?;
        check_len(
            "hotkey_signature",
            &self.hotkey_signature,
            2 * SIGNATURE_LEN,
        )?;
        check_len(
            "peer_signature",
            &self.peer_signature,
            2 * MAX_PEER_SIGNATURE_BYTES,
        )?;
        if let Some(key) = &self.peer_public_key {
            check_len("peer_public_key", key, 2 * MAX_PEER_PUBLIC_KEY_BYTES)?;
        }

        if self.netuid != netuid {
            return Err(BindingError::WrongNetuid {
                expected: netuid,
                found: self.netuid,
            });
        }
        let hotkey = Hotkey::parse(&self.hotkey).map_err(|_| malformed("hotkey", "not SS58"))?;
        let peer_id_str =
            PeerIdStr::parse(&self.peer_id).map_err(|_| malformed("peer_id", "not a peer id"))?;
        let claim = BindingClaim {
            netuid: self.netuid,
            hotkey,
            peer_id: peer_id_str,
            expires_at: self.expires_at,
        };
        claim.check_time(now_unix_secs)?;
        let peer = PeerId::from_bytes(&claim.peer_id.to_bytes())
            .map_err(|_| malformed("peer_id", "not a peer id"))?;
        if peer != *sender {
            return Err(BindingError::NotSender { bound: peer });
        }

        if self.hotkey_signature.is_empty() {
            return Err(BindingError::MissingHotkeySignature);
        }
        let mut hotkey_signature = [0u8; SIGNATURE_LEN];
        hex::decode_to_slice(&self.hotkey_signature, &mut hotkey_signature)
            .map_err(|_| malformed("hotkey_signature", "not 64 bytes in hex"))?;
        if !claim.verify_hotkey_signature(&hotkey_signature) {
            return Err(BindingError::BadHotkeySignature);
        }

        let public = self.peer_public_key(&peer)?;
        let peer_signature = hex::decode(&self.peer_signature)
            .map_err(|_| malformed("peer_signature", "not hex"))?;
        if !public.verify(&claim.peer_signed_bytes(&hotkey_signature), &peer_signature) {
            return Err(BindingError::BadPeerSignature);
        }
        Ok(VerifiedBinding {
            hotkey: claim.hotkey,
            peer,
            netuid: claim.netuid,
            expires_at: claim.expires_at,
        })
    }

    /// The peer's public key: from the id when it embeds it, else from the record.
    fn peer_public_key(&self, peer: &PeerId) -> Result<PublicKey, BindingError> {
        let multihash = peer.as_ref();
        if multihash.code() == IDENTITY_MULTIHASH {
            if self.peer_public_key.is_some() {
                return Err(malformed(
                    "peer_public_key",
                    "present although the peer id embeds the key",
                ));
            }
            return PublicKey::try_decode_protobuf(multihash.digest()).map_err(|_| {
                BindingError::PeerKey("the peer id's key is not one this build knows")
            });
        }
        let text = self
            .peer_public_key
            .as_deref()
            .ok_or(BindingError::PeerKey(
                "the peer id does not embed its key and the binding does not carry it",
            ))?;
        let bytes = hex::decode(text).map_err(|_| malformed("peer_public_key", "not hex"))?;
        let public = PublicKey::try_decode_protobuf(&bytes)
            .map_err(|_| BindingError::PeerKey("the carried key is not one this build knows"))?;
        if public.to_peer_id() != *peer {
            return Err(BindingError::PeerKey(
                "the carried key is not the peer id's",
            ));
        }
        Ok(public)
    }
}

fn malformed(field: &'static str, problem: &'static str) -> BindingError {
    BindingError::Malformed { field, problem }
}

fn check_len(field: &'static str, text: &str, max: usize) -> Result<(), BindingError> {
    if text.len() > max {
        Err(malformed(field, "too long"))
    } else {
        Ok(())
    }
}

/// Which peer speaks for which hotkey, from verified bindings.
///
/// Rules, all deterministic:
///
/// * A hotkey has at most one peer. A binding for a hotkey already in the book replaces the
///   entry only if it expires later (key rotation or renewal); at equal expiry the greater
///   peer id (by bytes) wins, so every node picks the same one.
/// * A peer speaks for at most one hotkey. A binding of a peer already holding another
///   hotkey wins only if it expires later (equal expiry: the greater hotkey by public key);
///   the loser is dropped from the book. So the peer's newest statement wins — both keys of
///   the newer binding signed it, so nobody else can make a peer switch hotkeys.
/// * Two conflicting bindings end the same whichever arrives first. With three or more
///   entangled ones the outcome can depend on arrival order (a binding turned away is not
///   remembered); bindings ride in every heartbeat, so a turned-away one is offered again.
/// * Entries expire (`expires_at <= now`), with `now` passed in, on every insert and by
///   [`expire`](Self::expire); the expiry index makes that `O(log n)` per entry that lapses,
///   so an insert costs `O(log n)`, never a scan of the book.
/// * The book holds at most its capacity of hotkeys ([`MAX_BOOK_BINDINGS`] by default). A
///   binding that would add a hotkey to a full book is turned away ([`BookUpdate::Full`]);
///   hotkeys already in it still renew, rotate and switch, and room is made only by an entry
///   lapsing or being [`remove`](Self::remove)d, so newcomers cannot push out those bound.
#[derive(Debug, Clone)]
pub struct BindingBook {
    by_hotkey: BTreeMap<Hotkey, Entry>,
    by_peer: HashMap<PeerId, Hotkey>,
    /// Every entry by (expiry, hotkey), soonest first.
    by_expiry: BTreeSet<(u64, Hotkey)>,
    capacity: usize,
}

impl Default for BindingBook {
    fn default() -> Self {
        Self::with_capacity(MAX_BOOK_BINDINGS)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    peer: PeerId,
    expires_at: u64,
}

/// What [`BindingBook::insert`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BookUpdate {
    /// The binding is now in the book.
    Accepted {
        /// The hotkey's previous peer, if it had another one (rotation).
        replaced_peer: Option<PeerId>,
        /// The hotkey the peer spoke for before, now dropped from the book.
        evicted_hotkey: Option<Hotkey>,
    },
    /// The binding had already expired at `now`.
    Expired,
    /// The hotkey's entry is at least as new: nothing changed.
    NotNewer,
    /// The peer speaks for another hotkey under a binding at least as new: nothing changed.
    PeerTaken {
        /// The hotkey the peer keeps speaking for.
        holder: Hotkey,
    },
    /// The binding would add a hotkey to a full book: nothing changed.
    Full,
}

impl BindingBook {
    /// An empty book of at most [`MAX_BOOK_BINDINGS`] hotkeys.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty book of at most `capacity` hotkeys.
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            by_hotkey: BTreeMap::new(),
            by_peer: HashMap::new(),
            by_expiry: BTreeSet::new(),
            capacity,
        }
    }

    /// Adds a verified binding (after dropping what has expired at `now`); see the rules above.
    pub fn insert(&mut self, binding: VerifiedBinding, now: u64) -> BookUpdate {
        self.expire(now);
        if binding.expires_at <= now {
            return BookUpdate::Expired;
        }
        let existing = self.by_hotkey.get(&binding.hotkey).copied();
        if let Some(entry) = existing {
            let newer = (binding.expires_at, binding.peer.to_bytes())
                > (entry.expires_at, entry.peer.to_bytes());
            if !newer {
                return BookUpdate::NotNewer;
            }
        }
        let replaced_peer = existing
            .map(|entry| entry.peer)
            .filter(|peer| *peer != binding.peer);
        let mut evicted_hotkey = None;
        if let Some(holder) = self.by_peer.get(&binding.peer) {
            if *holder != binding.hotkey {
                let held = self.by_hotkey.get(holder).map_or(0, |e| e.expires_at);
                let wins =
                    (binding.expires_at, binding.hotkey.public_key()) > (held, holder.public_key());
                if !wins {
                    return BookUpdate::PeerTaken {
                        holder: holder.clone(),
                    };
                }
                evicted_hotkey = Some(holder.clone());
            }
        }
        if existing.is_none() && evicted_hotkey.is_none() && self.by_hotkey.len() >= self.capacity {
            return BookUpdate::Full;
        }
        if let Some(holder) = &evicted_hotkey {
            self.remove(holder);
        }
        if let Some(entry) = existing {
            self.by_expiry
                .remove(&(entry.expires_at, binding.hotkey.clone()));
        }
        if let Some(old) = replaced_peer {
            self.by_peer.remove(&old);
        }
        self.by_peer.insert(binding.peer, binding.hotkey.clone());
        self.by_expiry
            .insert((binding.expires_at, binding.hotkey.clone()));
        self.by_hotkey.insert(
            binding.hotkey,
            Entry {
                peer: binding.peer,
                expires_at: binding.expires_at,
            },
        );
        BookUpdate::Accepted {
            replaced_peer,
            evicted_hotkey,
        }
    }

    /// Drops every entry expired at `now` (`expires_at <= now`); returns their hotkeys and
    /// peers, soonest expiry first. Costs `O(log n)` per entry dropped.
    pub fn expire(&mut self, now: u64) -> Vec<(Hotkey, PeerId)> {
        let mut gone = Vec::new();
        while self
            .by_expiry
            .first()
            .is_some_and(|(expires_at, _)| *expires_at <= now)
        {
            let Some((_, hotkey)) = self.by_expiry.pop_first() else {
                break;
            };
            if let Some(entry) = self.by_hotkey.remove(&hotkey) {
                self.by_peer.remove(&entry.peer);
                gone.push((hotkey, entry.peer));
            }
        }
        gone
    }

    /// Drops the entry of `hotkey`; returns its peer.
    pub fn remove(&mut self, hotkey: &Hotkey) -> Option<PeerId> {
        let entry = self.by_hotkey.remove(hotkey)?;
        self.by_expiry.remove(&(entry.expires_at, hotkey.clone()));
        self.by_peer.remove(&entry.peer);
        Some(entry.peer)
    }

    /// Drops every entry whose hotkey `keep` refuses; returns their hotkeys and peers.
    pub fn retain(&mut self, mut keep: impl FnMut(&Hotkey) -> bool) -> Vec<(Hotkey, PeerId)> {
        let dropped: Vec<Hotkey> = self
            .by_hotkey
            .keys()
            .filter(|hotkey| !keep(hotkey))
            .cloned()
            .collect();
        dropped
            .into_iter()
            .filter_map(|hotkey| {
                let peer = self.remove(&hotkey)?;
                Some((hotkey, peer))
            })
            .collect()
    }

    /// The most hotkeys the book holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The peer that speaks for `hotkey`.
    pub fn peer_of(&self, hotkey: &Hotkey) -> Option<&PeerId> {
        self.by_hotkey.get(hotkey).map(|entry| &entry.peer)
    }

    /// The hotkey `peer` speaks for.
    pub fn hotkey_of(&self, peer: &PeerId) -> Option<&Hotkey> {
        self.by_peer.get(peer)
    }

    /// When the binding of `hotkey` lapses.
    pub fn expires_at(&self, hotkey: &Hotkey) -> Option<u64> {
        self.by_hotkey.get(hotkey).map(|entry| entry.expires_at)
    }

    /// Number of hotkeys bound.
    pub fn len(&self) -> usize {
        self.by_hotkey.len()
    }

    /// Whether no hotkey is bound.
    pub fn is_empty(&self) -> bool {
        self.by_hotkey.is_empty()
    }

    /// Every (hotkey, peer, expiry), in hotkey order.
    pub fn iter(&self) -> impl Iterator<Item = (&Hotkey, &PeerId, u64)> {
        self.by_hotkey
            .iter()
            .map(|(hotkey, entry)| (hotkey, &entry.peer, entry.expires_at))
    }
}

#[cfg(test)]
mod tests;
